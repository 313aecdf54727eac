"""The lean engine's own glue (esft.generation.lean) pinned where a slip would leave tests/test_lean.py passing:
eos allowed again exactly at min_new_tokens under the screened lm_head, an unavailable option warned about once,
and packed + fused decoding prefilling through the stacked projections (`_lean_prefill`).

Run: pytest -q tests/test_lean_audit.py   (~30 s)
"""

from __future__ import annotations

import warnings

import pytest
import torch

from esft.generation import GenerationConfig, generate, lean

from conftest import make_tiny_model, prefix_caches

PROMPTS = [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three primes and explain."}],
    "plain text prompt without template",
    [{"role": "user", "content": "x"}],
    [{"role": "user", "content": "Write a poem about the sea, the wind and the long grey evening light."}],
]

pytestmark = pytest.mark.usefixtures("one_thread")


def _fast_options(screen: bool = False) -> dict:
    """packed_linear + fused_attention (+ screened_lm_head), or a skip where this machine cannot run them."""
    if lean.packed_linear_reason(torch.float32) or lean.fused_attention_reason(torch.float32):
        pytest.skip("needs both fast CPU kernels (oneDNN packed linears, the compiled attention kernel)")
    options = dict(packed_linear=True, fused_attention=True)
    if screen:
        if not lean.bf16_matmul_is_native():
            pytest.skip("lm_head screening needs a bf16-capable CPU")
        options["screened_lm_head"] = True
    return options


def _eos_ties_at(model, tokenizer, at: int):
    """Row 0 of PROMPTS may stop exactly at token `at`: the eos row of the output matrix becomes a copy of the row
    of the token row 0 generates there, so eos ties with it and wins the argmax (first index)."""
    first = generate(model, tokenizer, PROMPTS[:1], GenerationConfig(max_new_tokens=at + 1, engine="hf"))[0]
    with torch.no_grad():
        model.lm_head.weight[2] = model.lm_head.weight[first.completion_ids[at]]
    return model


def test_eos_is_allowed_again_exactly_at_min_new_tokens(tokenizer):
    """min_new_tokens=12: eos is masked for tokens 0..11 and allowed at token 12. The screened lm_head does the
    masking itself (`LeanStep` passes eos while step + 1 < min_new_tokens): one step too many and row 0, whose eos
    falls exactly on token 12, runs on where `model.generate` stops."""
    options = _fast_options(screen=True)
    at = 12
    model = _eos_ties_at(make_tiny_model(seed=4), tokenizer, at)
    cfg = dict(max_new_tokens=30, min_new_tokens=at, batch_size=4)
    ref = generate(model, tokenizer, PROMPTS, GenerationConfig(engine="hf", **cfg))
    assert len(ref[0].completion_ids) == at + 1 and ref[0].completion_ids[-1] == 2
    for extra in ({}, options):
        ours = generate(model, tokenizer, PROMPTS, GenerationConfig(**extra, **cfg))
        assert [g.completion_ids for g in ours] == [g.completion_ids for g in ref], extra


def test_an_unavailable_option_is_warned_about_once(tokenizer, monkeypatch):
    """The module's promise: an option this machine cannot run gives a warning once, not at every decode call
    (an evaluation decodes batch after batch)."""
    from esft import kernels

    monkeypatch.setattr(kernels, "_CACHE", {})
    monkeypatch.setattr(kernels, "_ERRORS", {})
    monkeypatch.setenv("ESFT_NO_KERNELS", "1")  # as on a machine without a C++ compiler
    monkeypatch.setattr(lean, "_WARNED", set())
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)  # as with a torch without oneDNN
    model = make_tiny_model(seed=2)
    cfg = GenerationConfig(packed_linear=True, fused_attention=True, max_new_tokens=2, batch_size=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            generate(model, tokenizer, PROMPTS[:2], cfg)
    messages = [str(w.message) for w in caught]
    assert sum("packed_linear ignored" in m for m in messages) == 1, messages
    assert sum("fused_attention ignored" in m for m in messages) == 1, messages


def test_packed_and_fused_decoding_prefills_through_the_stacked_projections(tokenizer, monkeypatch):
    """With both fast kernels and no low-rank population the prompt runs through `_lean_prefill` (the decode
    step's stacked matmuls), not the HF forward: the same greedy tokens as `model.generate`, by the fast route."""
    options = _fast_options()
    built = []
    real = lean._lean_prefill
    monkeypatch.setattr(lean, "_lean_prefill", lambda lm: built.append(lm) or real(lm))
    model = make_tiny_model(seed=1)
    cfg = dict(max_new_tokens=12, batch_size=4)
    ref = generate(model, tokenizer, PROMPTS, GenerationConfig(engine="hf", **cfg))
    ours = generate(model, tokenizer, PROMPTS, GenerationConfig(**options, **cfg))
    assert built and all(lm.fused_projections for lm in built)
    assert [g.completion_ids for g in ours] == [g.completion_ids for g in ref]


def test_options_are_the_config_less_what_cannot_run(monkeypatch):
    """`_options`: each fast option as asked where it can run, silently; the screen never under sampling (it needs
    every logit) nor under a low-rank population (its rows perturb the lm_head), and skipped there without a
    warning; bf16 weights run packed_linear and fused_attention both or neither (fp32 activations or HF's bf16)."""
    _fast_options(screen=True)
    monkeypatch.setattr(lean, "_WARNED", set())
    model = make_tiny_model()

    def options(model, delta=None, **asked):
        return lean._options(model, GenerationConfig(**asked), delta)

    both = dict(packed_linear=True, fused_attention=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these warns
        assert options(model) == (False, False, False)
        assert options(model, packed_linear=True) == (True, False, False)
        assert options(model, fused_attention=True) == (False, True, False)
        assert options(model, **both, screened_lm_head=True) == (True, True, True)
        assert options(model, **both, screened_lm_head=True, temperature=1.0) == (True, True, False)
        assert options(model, object(), **both, screened_lm_head=True) == (True, True, False)
    if lean.packed_linear_reason(torch.bfloat16) or lean.fused_attention_reason(torch.bfloat16):
        return
    low = make_tiny_model().to(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert options(low, **both) == (True, True, False)
    for one in ("packed_linear", "fused_attention"):
        monkeypatch.setattr(lean, "_WARNED", set())
        with pytest.warns(UserWarning, match="bf16 weights need both"):
            assert options(low, **{one: True}) == (False, False, False)


def test_head_prefill_matches_hf_prefill(tokenizer):
    """packed_linear alone prefills through the HF base model and the lean lm_head (`_lean_head_prefill`): the
    logits and K/V of the HF prefill, for left-padded rows (each at its own positions) and with a shared prefix
    passed in as the cache (share_prefix), which the suffix must attend to."""
    from esft.generation import encode_prompts, left_pad
    from esft.generation.hf_step import hf_prefill

    if lean.packed_linear_reason(torch.float32):
        pytest.skip("needs oneDNN packed linears")
    model = make_tiny_model(seed=5)
    ids, mask = left_pad(encode_prompts(tokenizer, PROMPTS), 2, "cpu")
    assert not bool(mask.all())  # some rows are left-padded
    with torch.inference_mode():
        lm = lean.LeanModel(model, packed=True)
        assert not lm.fused_projections
        prefill = lean._lean_head_prefill(lm)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        ref, ref_cache = hf_prefill(model, ids, mask, pos)
        hidden, got_cache = prefill(model, ids, mask, pos)
        torch.testing.assert_close(lm.head_logits([hidden])[0], ref, atol=2e-5, rtol=1e-4)
        keep = mask.bool()[:, None, :, None]  # padding columns hold don't-care values
        for a, b in zip(got_cache.layers, ref_cache.layers):
            torch.testing.assert_close(a.keys * keep, b.keys * keep, atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(a.values * keep, b.values * keep, atol=1e-6, rtol=1e-5)
        p = 3
        pre = torch.tensor([[11, 12, 13]])
        _, pre_cache = hf_prefill(model, pre, torch.ones_like(pre), torch.arange(p)[None])
        caches = prefix_caches(model, pre_cache, ids.shape[0])
        full_mask = torch.cat([mask.new_ones((ids.shape[0], p)), mask], dim=1)
        ref, _ = hf_prefill(model, ids, full_mask, pos + p, caches[0])
        hidden, cache = prefill(model, ids, full_mask, pos + p, caches[1])
        assert cache is caches[1] and cache.get_seq_length() == p + ids.shape[1]
        torch.testing.assert_close(lm.head_logits([hidden])[0], ref, atol=2e-5, rtol=1e-4)


def test_bf16_lean_prefill_hands_the_head_fp32_hidden_states(tokenizer):
    """bf16 weights (LeanModel.low_precision): the layers' matmuls take bf16, but the final norm's output stays
    fp32 for the lm_head, as in the decode step (`low and i < last`): the prompt's logits are not rounded twice."""
    from esft.generation import encode_prompts, left_pad

    if lean.packed_linear_reason(torch.bfloat16) or lean.fused_attention_reason(torch.bfloat16):
        pytest.skip("needs both fast CPU kernels for bf16 weights")
    model = make_tiny_model(seed=6).to(torch.bfloat16)
    ids, mask = left_pad(encode_prompts(tokenizer, PROMPTS), 2, "cpu")
    with torch.inference_mode():
        lm = lean.LeanModel(model, packed=True, fused_attention=True)
        assert lm.fused_projections and lm.low_precision
        hidden, _ = lean._lean_prefill(lm)(model, ids, mask, (mask.cumsum(-1) - 1).clamp(min=0))
    assert hidden.dtype == torch.float32 and bool(torch.isfinite(hidden).all())


def test_lean_sampling_keys_each_row_by_its_prompt():
    """`lean_decode` hands `row_keys` to the loop: a sampled row draws from its prompt's stream, so the second
    batch's rows sample what they sample in one big batch, and the lean engine matches the HF forward's."""
    model = make_tiny_model(seed=7)
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16], [17, 18]]
    from esft.generation import left_pad
    from esft.generation.engine import decode

    cfg = GenerationConfig(max_new_tokens=8, temperature=1.0, seed=11)
    whole_ids, whole_mask = left_pad(prompts, 0, "cpu")
    part_ids, part_mask = left_pad(prompts[2:], 0, "cpu")
    with torch.inference_mode():
        whole = decode(model, whole_ids, whole_mask, cfg, [2], row_keys=[0, 1, 2, 3])
        part = decode(model, part_ids, part_mask, cfg, [2], row_keys=[2, 3])
        hf = decode(model, part_ids, part_mask, GenerationConfig(max_new_tokens=8, temperature=1.0, seed=11,
                                                                 lean=False), [2], row_keys=[2, 3])
    assert part == whole[2:] == hf
