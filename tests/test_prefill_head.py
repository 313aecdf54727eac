"""The prefill's lm_head applied after the layout (`layout_prefill(head=...)`), and, where the bf16 screen
computes the decode steps' logits, the fp32 lm_head packed slice by slice for the prefill only
(`LeanModel.head_logits`), never whole.

Both must change no bit: the same head calls on the same rows give the same logits, and the slices' logits are
those of the whole packed matrix."""

from __future__ import annotations

import pytest
import torch

from esft.generation import GenerationConfig, encode_prompts, generate, lean, left_pad

from test_lean import PROMPTS, _eosy, _fast_kernels, _tiny

pytestmark = pytest.mark.usefixtures("one_thread")

SHARED = [[{"role": "system", "content": "Answer with \\boxed{yes} or \\boxed{no}."},
           {"role": "user", "content": text}]
          for text in ("Is water wet?", "Is the sea salty? Think first.", "Do cats fly?", "Is ice cold, really?")]


def _fast_lean(model, batch_hint: int, screen: bool = False) -> "lean.LeanModel":
    options = _fast_kernels()
    if not (options.get("packed_linear") and options.get("fused_attention")):
        pytest.skip("the lean prefill needs both fast kernels")
    if screen and "screened_lm_head" not in options:
        pytest.skip("lm_head screening needs a CPU with native bf16")
    return lean.LeanModel(model, packed=True, fused_attention=True, batch_hint=batch_hint, screen_lm_head=screen)


def _whole_head(lm: "lean.LeanModel"):
    """The head as a prefill projecting its own rows applied it: the whole packed matrix, forward by forward."""
    return lambda hidden: [lm.linear(h, lm.lm_head, lm.lm_bias) for h in hidden]


@pytest.mark.parametrize("screen", [False, True])
@pytest.mark.parametrize("share, buckets", [(True, 3), (False, 1), (False, 2)])
def test_head_after_the_layout_gives_the_logits_the_prefill_computed(tokenizer, share, buckets, screen):
    """layout_prefill(head=...) equals, bit for bit, a prefill that projects its rows itself with the whole
    packed lm_head (what the lean prefills did before): logits, cache and positions. `screen`: the head is
    packed slice by slice and multiplies buckets of fewer rows than the batch hint."""
    model = _tiny("llama")
    ids, mask = left_pad(encode_prompts(tokenizer, SHARED), 2, "cpu")
    with torch.inference_mode():
        lm = _fast_lean(model, ids.shape[0], screen=screen)
        whole = _whole_head(_fast_lean(model, ids.shape[0]))
        hidden_prefill = lean._lean_prefill(lm)

        def projecting(model, ids, mask, pos, cache=None):  # the head inside the prefill
            out, cache = hidden_prefill(model, ids, mask, pos, cache)
            return whole([out])[0], cache

        got, got_cache, got_pos = lean.layout_prefill(model, lm, ids, mask, hidden_prefill, 4, share, buckets,
                                                      head=lm.head_logits)
        ref, ref_cache, ref_pos = lean.layout_prefill(model, lm, ids, mask, projecting, 4, share, buckets)
    assert lm._lm_head is None if screen else lm._lm_head is not None  # sliced: the whole matrix never packed
    assert got.shape == (ids.shape[0], model.config.vocab_size)
    assert torch.equal(got, ref) and torch.equal(got_pos, ref_pos)
    assert torch.equal(got_cache.mask, ref_cache.mask)
    n = got_cache.length  # (the columns beyond are unwritten buffer)
    assert n == ref_cache.length
    for i in range(len(lm.layers)):
        assert torch.equal(got_cache.keys(i), ref_cache.keys(i))
        assert torch.equal(got_cache.v[i][:, :, :n], ref_cache.v[i][:, :, :n])


def test_prefix_forward_projects_no_row(tokenizer):
    """With a shared prefix, head() sees the remainders' rows only, in one call: every prompt once."""
    model = _tiny("llama")
    ids, mask = left_pad(encode_prompts(tokenizer, SHARED), 2, "cpu")
    calls, forwards = [], []
    with torch.inference_mode():
        lm = _fast_lean(model, ids.shape[0])
        prefill = lean._lean_prefill(lm)

        def counted(model, ids, *args):
            forwards.append(ids.shape[0])
            return prefill(model, ids, *args)

        def head(hidden):
            calls.append([h.shape[0] for h in hidden])
            return lm.head_logits(hidden)

        lean.layout_prefill(model, lm, ids, mask, counted, 4, True, 2, head=head)
    assert forwards[0] == 1 and len(forwards) >= 2  # the prefix's batch-1 forward ran, then the remainders'
    assert calls == [forwards[1:]] and sum(forwards[1:]) == ids.shape[0]


def test_screened_decoding_never_packs_the_whole_fp32_head_and_changes_no_token(tokenizer, monkeypatch):
    """With the screen, no step of a generate call holds the whole packed fp32 lm_head, and greedy completions
    equal those of a lean model whose prefill multiplies by the whole packed matrix."""
    model = _eosy(_tiny("llama", seed=4), tokenizer, at=12)
    _fast_lean(model, 5, screen=True)  # skips where the screen cannot run
    cfg = GenerationConfig(max_new_tokens=40, batch_size=5, share_prefix=True, prefill_buckets=2, **_fast_kernels())
    held = []
    real_step = lean.decode_step

    def step(lean_model, *args, **kwargs):
        held.append(lean_model._lm_head is not None)
        return real_step(lean_model, *args, **kwargs)

    monkeypatch.setattr(lean, "decode_step", step)
    sliced = generate(model, tokenizer, PROMPTS, cfg)
    assert len(held) > 10 and not any(held)
    monkeypatch.setattr(lean.LeanModel, "head_logits", lambda self, hidden: _whole_head(self)(hidden))
    held.clear()
    whole = generate(model, tokenizer, PROMPTS, cfg)
    assert held and all(held)  # (the whole matrix, packed by the prefill, kept)
    assert [g.completion_ids for g in sliced] == [g.completion_ids for g in whole]


@pytest.mark.parametrize("rows", [8192, 5000, 49152])
def test_sliced_head_gives_the_bits_of_the_whole_packed_head(monkeypatch, rows):
    """Slices of 8192 rows, of 5000 (a short last slice) and one slice: the logits of the whole packed matrix,
    bit for bit, for row counts at and below the batch hint (a bucket of a batch), several forwards in one call;
    nothing kept afterwards."""
    from esft.generation import lean_step
    from esft.generation.packed import pack_weight, packed_linear

    monkeypatch.setattr(lean_step, "HEAD_SLICE_ROWS", rows)
    model = _tiny("llama")
    weight = model.lm_head.weight
    g = torch.Generator().manual_seed(rows)
    for hint, counts in ((16, (16, 5, 3, 1)), (4, (4,)), (9, (9, 1))):
        lm = _fast_lean(model, hint, screen=True)
        assert lm._lm_head is None  # on demand: nothing packed by the constructor
        hidden = [torch.randn(n, model.config.hidden_size, generator=g) for n in counts]
        whole = pack_weight(weight, hint)
        got = lm.head_logits(hidden)
        assert len(got) == len(hidden)
        for h, logits in zip(hidden, got):
            assert torch.equal(logits, packed_linear(h, whole))
        assert lm._lm_head is None
    unscreened = _fast_lean(model, 4)
    assert unscreened._lm_head is not None  # every step reads it: packed whole, up front
    h = torch.randn(4, model.config.hidden_size, generator=g)
    assert torch.equal(unscreened.head_logits([h])[0], packed_linear(h, pack_weight(weight, 4)))
