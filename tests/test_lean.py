"""Lean decode path (esft.lean). Run: `pytest tests/test_lean.py -q` (the real-model check is marked slow).

The lean step must reproduce the Hugging Face forward: bit-identical logits step by step, and greedy completions
equal to `model.generate` whatever the padding, eos pattern, cache growth and architecture (Llama, Qwen2 with
q/k/v bias, Qwen3 with q/k norms); unsupported models fall back to the HF forward.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from esft.generation import GenerationConfig, generate, lean
from esft.generation.hf_step import hf_prefill as _prefill

from conftest import make_tiny_model, prefix_caches

PROMPTS = [
    [{"role": "system", "content": "Answer with \\boxed{yes} or \\boxed{no}."},
     {"role": "user", "content": "Is water wet? Think about it carefully and explain."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three primes and explain."}],
    "plain text prompt without template",
    [{"role": "user", "content": "x"}],
    [{"role": "user", "content": "Write a poem about the sea, the wind and the long grey evening light."}],
]


pytestmark = pytest.mark.usefixtures("one_thread")


def _tiny(kind: str = "llama", seed: int = 0):
    if kind == "llama":
        return make_tiny_model(seed=seed)
    torch.manual_seed(seed)
    if kind == "qwen2":
        from transformers import Qwen2Config, Qwen2ForCausalLM

        cfg = Qwen2Config(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                          tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
        model = Qwen2ForCausalLM(cfg)
    elif kind == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        cfg = Qwen3Config(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                          tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
        model = Qwen3ForCausalLM(cfg)
    else:
        raise ValueError(kind)
    with torch.no_grad():  # random biases / norm gains, so those code paths matter
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval().requires_grad_(False)


def _eosy(model, tokenizer, at: int = 100):
    """Make some rows stop early (and get dropped mid-batch) and others run on: the eos row of the output matrix
    becomes a copy of the row of a token that row 0 generates at step `at`, so eos ties with it and wins the
    argmax (first index) wherever that token would have been generated."""
    first = generate(model, tokenizer, PROMPTS[:1], GenerationConfig(max_new_tokens=at + 1, engine="hf"))[0]
    token = first.completion_ids[at]
    with torch.no_grad():
        model.lm_head.weight[2] = model.lm_head.weight[token]
    return model


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_supported(kind):
    assert lean.unsupported_reason(_tiny(kind)) is None


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_greedy_equals_hf_generate(tokenizer, kind):
    model = _eosy(_tiny(kind), tokenizer)
    cfg = dict(max_new_tokens=300, batch_size=5)  # > 256: the KV buffer grows mid-generation
    ours = generate(model, tokenizer, PROMPTS, GenerationConfig(engine="esft", **cfg))
    ref = generate(model, tokenizer, PROMPTS, GenerationConfig(engine="hf", **cfg))
    assert [g.completion_ids for g in ours] == [g.completion_ids for g in ref]
    lengths = [len(g.completion_ids) for g in ours]
    assert ours[0].finished and len(set(lengths)) > 1  # rows were dropped at different steps
    assert max(lengths) == 300  # and some row outgrew the initial KV buffer


def test_bf16_model_greedy_equals_hf_generate(tokenizer):
    """A bf16 model on the exact path computes in bf16 throughout, as the HF forward does (rotary tables included):
    the same completions as `model.generate`."""
    model = _eosy(_tiny("llama").to(torch.bfloat16), tokenizer, at=30)
    cfg = dict(max_new_tokens=60, batch_size=5)
    ours = generate(model, tokenizer, PROMPTS, GenerationConfig(engine="esft", **cfg))
    ref = generate(model, tokenizer, PROMPTS, GenerationConfig(engine="hf", **cfg))
    assert [g.completion_ids for g in ours] == [g.completion_ids for g in ref]


def test_lean_equals_hf_forward_loop(tokenizer):
    model = _eosy(_tiny("llama", seed=3), tokenizer, at=20)
    cfg = dict(max_new_tokens=40, batch_size=3)
    a = generate(model, tokenizer, PROMPTS, GenerationConfig(lean=True, **cfg))
    b = generate(model, tokenizer, PROMPTS, GenerationConfig(lean=False, **cfg))
    assert [g.completion_ids for g in a] == [g.completion_ids for g in b]


def test_min_new_tokens_suppresses_eos_in_both_engines(tokenizer):
    model = _eosy(_tiny("llama"), tokenizer, at=3)
    free = generate(model, tokenizer, PROMPTS, GenerationConfig(max_new_tokens=30))
    assert min(len(g.completion_ids) for g in free) < 10
    cfg = dict(max_new_tokens=30, min_new_tokens=10, batch_size=5)
    ours = generate(model, tokenizer, PROMPTS, GenerationConfig(engine="esft", **cfg))
    ref = generate(model, tokenizer, PROMPTS, GenerationConfig(engine="hf", **cfg))
    assert [g.completion_ids for g in ours] == [g.completion_ids for g in ref]
    assert all(len(g.completion_ids) > 10 and 2 not in g.completion_ids[:10] for g in ours)


def test_sampling_runs_and_is_seeded(tokenizer):
    model = _tiny("llama")
    cfg = GenerationConfig(max_new_tokens=10, temperature=1.0, top_p=0.9, seed=5)
    a = generate(model, tokenizer, PROMPTS, cfg)
    b = generate(model, tokenizer, PROMPTS, cfg)
    assert [g.completion_ids for g in a] == [g.completion_ids for g in b]


def test_forward_hooks_force_the_hf_forward(tokenizer):
    model = _tiny("llama")
    calls = []
    handle = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: calls.append(1))
    assert "forward hooks" in lean.unsupported_reason(model)
    generate(model, tokenizer, PROMPTS[:2], GenerationConfig(max_new_tokens=3))
    assert len(calls) == 3  # prefill + 2 decode steps went through the hooked module
    handle.remove()
    assert lean.unsupported_reason(model) is None


def test_unsupported_models_fall_back(tokenizer):
    model = _tiny("llama")
    model.config._attn_implementation = "eager"
    assert "eager" in lean.unsupported_reason(model)
    with pytest.raises(ValueError):
        lean.LeanModel(model)
    gens = generate(model, tokenizer, PROMPTS[:2], GenerationConfig(max_new_tokens=4))  # HF forward loop
    assert all(len(g.completion_ids) <= 4 for g in gens)


SYSTEM = "You are a careful assistant. Read the question, think step by step, and answer in one short sentence."
SHARED = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in
          ("Is the sky blue?", "How many legs does a spider have, and why?", "x", "Name a prime.")]


def test_common_prefix():
    assert lean.common_prefix([[1, 2, 3], [1, 2, 4, 5], [1, 2]]) == 2
    assert lean.common_prefix([[1], [2]]) == 0


def test_length_buckets_minimise_padding():
    lengths = [10, 50, 11, 49, 12, 48, 30]
    groups = lean.length_buckets(lengths, 3)
    assert sorted(i for g in groups for i in g) == list(range(7))
    assert [sorted(lengths[i] for i in g) for g in groups] == [[48, 49, 50], [30], [10, 11, 12]]
    assert lean.length_buckets(lengths, 1) == [[1, 3, 5, 6, 4, 2, 0]]
    # a forward's own cost: a group is split off only when it saves more padding than that
    assert len(lean.length_buckets(lengths, 3, bucket_tokens=10)) == 3  # 216 + 30 padded-equivalent < 236 + 20
    assert len(lean.length_buckets(lengths, 3, bucket_tokens=40)) == 2
    assert len(lean.length_buckets(lengths, 3, bucket_tokens=200)) == 1
    near = [43, 42, 43, 41, 43, 39]  # decode-heavy-like: buckets would save 10 positions
    assert lean.length_buckets(near, 4, bucket_tokens=lean.PREFILL_BUCKET_TOKENS) == [[0, 2, 4, 1, 3, 5]]


@pytest.mark.parametrize("share, buckets", [(True, 1), (True, 3), (False, 2)])
def test_layout_prefill_matches_plain_prefill(tokenizer, share, buckets):
    from esft.generation import encode_prompts, left_pad

    model = _tiny("llama")
    rows = encode_prompts(tokenizer, SHARED + ["unrelated text, no template"] if not share else SHARED)
    ids, mask = left_pad(rows, 2, "cpu")
    with torch.inference_mode():
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        ref, _ = _prefill(model, ids, mask, pos)
        lm = lean.LeanModel(model)
        logits, cache, next_pos = lean.layout_prefill(model, lm, ids, mask, _prefill, 4, share, buckets)
        assert torch.allclose(logits, ref, atol=1e-5, rtol=1e-5)
        assert next_pos.tolist() == mask.sum(-1).tolist()  # positions continue exactly as in a plain prefill
        assert cache.mask.sum(-1).tolist() == mask.sum(-1).tolist()  # every prompt token is attended, once
        # the next decode step from this layout agrees with the plain path
        plain_logits, plain, plain_pos = lean.layout_prefill(model, lm, ids, mask, _prefill, 4, False, 1)
        assert torch.equal(plain_logits, ref)  # no option: the plain HF prefill, bit for bit
        cos, sin = lm.rope_tables(128, logits)
        tok = ref.argmax(-1)
        a = lean.decode_step(lm, cache, tok, next_pos, cos, sin)
        b = lean.decode_step(lm, plain, tok, plain_pos, cos, sin)
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


def test_tiled_key_cache_holds_what_the_plain_layout_holds():
    """KVCache(key_tile=T) (the compiled kernel's layout) against the logical layout: writes at arbitrary rows and
    columns, growth past capacity, row compaction and zeroing give the same keys. Pure torch."""
    from types import SimpleNamespace

    stub = SimpleNamespace(n_kv=2, head_dim=3, layers=[None, None])
    g = torch.Generator().manual_seed(0)
    caches = [lean.KVCache(stub, 5, 6, torch.float32, "cpu", key_tile=t) for t in (None, 4)]
    assert caches[1].capacity == 8 and caches[1].k[0].shape == (5, 2, 2, 3, 4)  # capacity rounded up to tiles
    for c in caches:
        c.zero(6)
    first = torch.randn(5, 2, 6, 3, generator=g)
    grown = torch.randn(5, 2, 4, 3, generator=g)
    later = torch.randn(3, 2, 2, 3, generator=g)
    for c in caches:
        for i in range(2):
            c.put_keys(i, torch.arange(5), torch.arange(6), first + i)
        c.length = 6
        c.ensure(11)  # grows (doubling), copying the used columns
        for i in range(2):
            c.put_keys(i, torch.arange(5), torch.arange(6, 10), grown)
            c.put_keys(i, torch.tensor([0, 2, 4]), torch.tensor([6, 9]), later - i)  # some rows, scattered columns
        c.length = 10
    assert caches[1].capacity % 4 == 0 and caches[1].capacity >= 11
    for i in range(2):
        assert torch.equal(caches[0].keys(i), caches[1].keys(i))
    for c in caches:
        c.keep(torch.tensor([1, 2, 4]))
    for i in range(2):
        assert caches[1].keys(i).shape == (3, 2, 10, 3)
        assert torch.equal(caches[0].keys(i), caches[1].keys(i))


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_lean_prefill_matches_hf_prefill(tokenizer, kind):
    """The fast path's prefill (stacked packed matmuls, compiled glue, SDPA) against the HF forward: same logits
    and K/V to float rounding, with left padding and with a shared prefix passed as the cache."""
    from esft.generation import encode_prompts, left_pad

    options = _fast_kernels()
    if not (options.get("packed_linear") and options.get("fused_attention")):
        pytest.skip("the lean prefill needs both fast kernels")
    model = _tiny(kind)
    ids, mask = left_pad(encode_prompts(tokenizer, PROMPTS), 2, "cpu")
    with torch.inference_mode():
        lm = lean.LeanModel(model, packed=True, fused_attention=True)
        assert lm.fused_projections
        fast_prefill = lean._lean_prefill(lm)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        ref, ref_cache = _prefill(model, ids, mask, pos)
        hidden, got_cache = fast_prefill(model, ids, mask, pos)
        got = lm.head_logits([hidden])[0]  # the lean prefill returns hidden states; layout_prefill applies the head
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)
        keep = mask.bool()[:, None, :, None]  # padding columns hold don't-care values in both
        for a, b in zip(got_cache.layers, ref_cache.layers):
            torch.testing.assert_close(a.keys * keep, b.keys * keep, atol=2e-5, rtol=1e-4)
            torch.testing.assert_close(a.values * keep, b.values * keep, atol=2e-5, rtol=1e-4)
        # a prefix already in the cache (share_prefix): the suffix attends to it
        p = 3
        pre = ids[:1, :p].clone()
        pre[0] = torch.tensor([11, 12, 13])
        _, pre_cache = _prefill(model, pre, torch.ones_like(pre), torch.arange(p)[None])
        caches = prefix_caches(model, pre_cache, ids.shape[0])
        full_mask = torch.cat([mask.new_ones((ids.shape[0], p)), mask], dim=1)
        ref, _ = _prefill(model, ids, full_mask, pos + p, caches[0])
        got = lm.head_logits([fast_prefill(model, ids, full_mask, pos + p, caches[1])[0]])[0]
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)


def test_short_prefix_is_not_shared(tokenizer):
    from esft.generation import left_pad

    model = _tiny("llama")
    ids, mask = left_pad([[5, 6, 7, 8], [5, 6, 9, 10, 11]], 2, "cpu")
    with torch.inference_mode():
        ref, _ = _prefill(model, ids, mask, (mask.cumsum(-1) - 1).clamp(min=0))
        logits, cache, _ = lean.layout_prefill(model, lean.LeanModel(model), ids, mask, _prefill, 4, True, 1)
    assert torch.equal(logits, ref) and cache.length == ids.shape[1]  # 2 shared tokens < min_prefix: plain path


def test_shared_prefix_greedy_equals_hf_generate(tokenizer):
    model = _eosy(_tiny("llama", seed=1), tokenizer, at=30)
    cfg = dict(max_new_tokens=40, batch_size=4)
    ref = generate(model, tokenizer, SHARED, GenerationConfig(engine="hf", **cfg))
    for extra in (dict(share_prefix=True), dict(share_prefix=True, prefill_buckets=2), dict(prefill_buckets=3)):
        ours = generate(model, tokenizer, SHARED, GenerationConfig(**extra, **cfg))
        assert [g.completion_ids for g in ours] == [g.completion_ids for g in ref], extra


@pytest.mark.slow
def test_real_model_greedy_equals_hf_generate(tokenizer):
    """SmolLM2-135M on BoolQ prompts (eos allowed) and on free-form prompts: identical to `model.generate`."""
    from esft.models import load_model
    from esft.tasks.boolq import BoolQTask

    model, _ = load_model("smollm2-135m", dtype="float32", device="cpu")
    assert lean.unsupported_reason(model) is None
    task = BoolQTask(max_passage_chars=200)
    prompts = [task.prompt(ex) for ex in task.load("test", 12)] + PROMPTS
    cfg = dict(max_new_tokens=48, batch_size=8)
    ours = generate(model, tokenizer, prompts, GenerationConfig(engine="esft", **cfg))
    ref = generate(model, tokenizer, prompts, GenerationConfig(engine="hf", **cfg))
    assert [g.completion_ids for g in ours] == [g.completion_ids for g in ref]
    # opt-in shared-prefix / bucketed prefill (not bit-exact, see GenerationConfig.share_prefix): equal here
    shared = generate(model, tokenizer, prompts[:12], GenerationConfig(share_prefix=True, prefill_buckets=4, **cfg))
    assert [g.completion_ids for g in shared] == [g.completion_ids for g in ref[:12]]
    # the fast CPU kernels (oneDNN packed linears, compiled attention; ~1e-6 relative): equal here too
    fast = generate(model, tokenizer, prompts, GenerationConfig(**_fast_kernels(), **cfg))
    assert [g.completion_ids for g in fast] == [g.completion_ids for g in ref]


class _TorchRotary:
    """The compiled glue with the prefill's rotary (`rotary_qkv`) replaced by the torch ops it stands for: q and k
    rotated as strided views of the widened projection, v a view of it (the layout the prefill had before)."""

    def __init__(self, ext):
        self._ext = ext

    def __getattr__(self, name):
        return getattr(self._ext, name)

    def rotary_qkv(self, qkv, cos, sin, heads, kv):
        x, hd = qkv.to(torch.float32), cos.shape[1]
        q_end, k_end = heads * hd, (heads + kv) * hd

        def rotated(y, n):
            y = y.view(-1, n, hd)
            return ((y * cos[:, None]) + (lean.rotate_half(y) * sin[:, None])).view(-1, n * hd)

        return rotated(x[:, :q_end], heads), rotated(x[:, q_end:k_end], kv), x[:, k_end:]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_prefill_rotary_kernel_gives_the_torch_ops_bits(tokenizer, kind, dtype):
    """The lean prefill's compiled rotary (one pass from the q|k|v projection to rotated fp32 q, k and v) changes
    no bit of its hidden states or K/V against the torch ops, with left padding and with a shared prefix."""
    from esft.generation import encode_prompts, left_pad

    options = _fast_kernels()
    if not (options.get("packed_linear") and options.get("fused_attention")):
        pytest.skip("the lean prefill needs both fast kernels")
    if dtype == torch.bfloat16 and lean.packed_linear_reason(dtype) is not None:
        pytest.skip(lean.packed_linear_reason(dtype))
    model = _tiny(kind).to(dtype)
    ids, mask = left_pad(encode_prompts(tokenizer, PROMPTS), 2, "cpu")
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        lm = lean.LeanModel(model, packed=True, fused_attention=True)
        assert lm.fused_projections and lm.low_precision == (dtype == torch.bfloat16)
        prefill, compiled = lean._lean_prefill(lm), lm.fused
        # a prefix already in the cache (share_prefix): the suffix's positions start after it
        pre = torch.tensor([[11, 12, 13]])
        _, pre_cache = _prefill(model, pre, torch.ones_like(pre), torch.arange(3)[None])
        prefixed = prefix_caches(model, pre_cache, ids.shape[0])
        full_mask = torch.cat([mask.new_ones((ids.shape[0], 3)), mask], dim=1)
        outs = []
        for glue, cache in zip((compiled, _TorchRotary(compiled)), prefixed):
            lm.fused = glue
            outs.append((prefill(model, ids, mask, pos), prefill(model, ids, full_mask, pos + 3, cache)))
        lm.fused = compiled
    for (h_kernel, c_kernel), (h_torch, c_torch) in zip(*outs):
        assert torch.equal(h_kernel, h_torch)
        for a, b in zip(c_kernel.layers, c_torch.layers):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def _fast_kernels() -> dict:
    """The opt-in CPU kernels this machine can run (packed oneDNN linears, the compiled attention kernel)."""
    options = {}
    if lean.packed_linear_reason(torch.float32) is None:
        options["packed_linear"] = True
    if lean.fused_attention_reason(torch.float32) is None:
        options["fused_attention"] = True
    if not options:
        pytest.skip("neither oneDNN packed linears nor the compiled attention kernel is available here")
    if len(options) == 2 and lean.bf16_matmul_is_native():
        options["screened_lm_head"] = True
    return options


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_packed_linear_and_fused_attention_greedy_equal_hf_generate(tokenizer, kind):
    model = _eosy(_tiny(kind), tokenizer)
    cfg = dict(max_new_tokens=300, batch_size=5)  # rows drop mid-batch, and the (transposed) key buffer grows
    ref = generate(model, tokenizer, PROMPTS, GenerationConfig(engine="hf", **cfg))
    options = _fast_kernels()
    for extra in ({k: v} for k, v in options.items() if k != "screened_lm_head"):  # that one needs both others
        ours = generate(model, tokenizer, PROMPTS, GenerationConfig(**extra, **cfg))
        assert [g.completion_ids for g in ours] == [g.completion_ids for g in ref], extra
    ours = generate(model, tokenizer, PROMPTS, GenerationConfig(share_prefix=True, prefill_buckets=2, **options, **cfg))
    assert [g.completion_ids for g in ours] == [g.completion_ids for g in ref]


def test_screened_lm_head_keeps_greedy_and_eos_suppression(tokenizer, monkeypatch):
    """Screening changes which logits are computed, never the argmax: greedy output equals `model.generate`'s,
    also while eos is suppressed (min_new_tokens) and after rows drop out."""
    options = _fast_kernels()
    if "screened_lm_head" not in options:
        pytest.skip("lm_head screening needs both fast kernels and a bf16-capable CPU")
    model = _eosy(_tiny("llama", seed=4), tokenizer, at=12)
    screened = []
    real_logits = lean.LMHeadScreen.logits

    def counting(self, h, kernels, suppress):
        out = real_logits(self, h, kernels, suppress)
        screened.append(None if out is None else int(torch.isfinite(out.values).sum()))
        return out

    monkeypatch.setattr(lean.LMHeadScreen, "logits", counting)
    for cfg in (dict(max_new_tokens=60, batch_size=5), dict(max_new_tokens=40, min_new_tokens=20, batch_size=5)):
        ref = generate(model, tokenizer, PROMPTS, GenerationConfig(engine="hf", **cfg))
        ours = generate(model, tokenizer, PROMPTS, GenerationConfig(**options, **cfg))
        assert [g.completion_ids for g in ours] == [g.completion_ids for g in ref], cfg
        if cfg.get("min_new_tokens"):
            assert all(len(g.completion_ids) >= 20 for g in ours)
    assert len(screened) > 50 and None not in screened  # the screen really ran, and never had to give up
    assert max(screened) < 5 * 50  # a handful of exact logits per row, not the vocabulary
    # sampling ignores the option (it needs every logit): same samples as without it
    sampled = dict(max_new_tokens=20, batch_size=5, temperature=1.0, seed=3)
    plain = {k: v for k, v in options.items() if k != "screened_lm_head"}
    a = generate(model, tokenizer, PROMPTS, GenerationConfig(**options, **sampled))
    b = generate(model, tokenizer, PROMPTS, GenerationConfig(**plain, **sampled))
    assert [g.completion_ids for g in a] == [g.completion_ids for g in b]


@pytest.mark.parametrize("padded", [True, False])
def test_packed_and_fused_step_logits_close_to_plain_step(tokenizer, padded):
    model = _tiny("qwen2")
    options = _fast_kernels()
    b, w = 5, 9
    ids = torch.randint(3, 40000, (b, w), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(b, w, dtype=torch.long)
    if padded:
        mask[1::2, :3] = 0
    with torch.inference_mode():
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        caches, models = [], []
        for kw in ({}, {"packed": options.get("packed_linear", False),
                        "fused_attention": options.get("fused_attention", False)}):
            logits, hf_cache = _prefill(model, ids, mask, pos)
            lm = lean.LeanModel(model, **kw)
            cache = lean.KVCache(lm, b, w + 2, torch.float32, "cpu", key_tile=lm.key_tile)
            cache.load_prefill(hf_cache, mask)
            caches.append(cache)
            models.append(lm)
        assert models[1].linear is not F.linear or models[1].fused is not None  # something fast is really on
        cos, sin = models[0].rope_tables(64, logits)
        token, p = logits.argmax(-1), pos[:, -1] + 1
        for step in range(6):
            for c in caches:
                c.ensure(c.length + 1)
            plain = lean.decode_step(models[0], caches[0], token, p, cos, sin)
            fast = lean.decode_step(models[1], caches[1], token, p, cos, sin)
            assert torch.allclose(fast, plain, atol=1e-5, rtol=1e-5), (step, (fast - plain).abs().max())
            if step == 2:  # drop a row in both: compaction must keep the two layouts in step
                for c in caches:
                    c.keep(torch.tensor([0, 2, 3, 4]))
                token, p, plain = token[[0, 2, 3, 4]], p[[0, 2, 3, 4]], plain[[0, 2, 3, 4]]
            token, p = plain.argmax(-1), p + 1
        # the tiled key buffer holds exactly the keys the plain cache holds
        n, used = caches[0].rows, caches[0].length
        if models[1].fused is not None:
            assert torch.allclose(caches[1].keys(0), caches[0].keys(0), atol=1e-5)


def test_fast_options_fall_back_with_a_warning_when_unavailable(tokenizer, monkeypatch):
    from esft import kernels

    model = _eosy(_tiny("llama", seed=2), tokenizer, at=10)
    cfg = dict(max_new_tokens=20, batch_size=5)
    ref = generate(model, tokenizer, PROMPTS, GenerationConfig(engine="hf", **cfg))
    monkeypatch.setattr(kernels, "_CACHE", {})
    monkeypatch.setattr(kernels, "_ERRORS", {})
    monkeypatch.setenv("ESFT_NO_KERNELS", "1")  # as on a machine without a C++ compiler
    monkeypatch.setattr(lean, "_WARNED", set())
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)  # as with a torch without oneDNN
    from esft.generation import packed

    for module in (lean, packed):  # on a CPU with native bf16, where the screen would run with the other two
        monkeypatch.setattr(module, "bf16_matmul_is_native", lambda: True)
    with pytest.warns(UserWarning) as caught:
        ours = generate(model, tokenizer, PROMPTS, GenerationConfig(packed_linear=True, fused_attention=True,
                                                                    screened_lm_head=True, **cfg))
    messages = " | ".join(str(w.message) for w in caught)
    assert "packed_linear ignored" in messages and "fused_attention ignored" in messages
    assert "screened_lm_head ignored" in messages
    assert [g.completion_ids for g in ours] == [g.completion_ids for g in ref]


def test_the_screen_is_skipped_without_a_word_on_a_cpu_without_native_bf16(tokenizer, monkeypatch):
    """The fast options ask for the bf16-screened lm_head; on a CPU whose bf16 dot products are emulated the fp32
    head is the faster one, so the screen is off by design there, not a fallback to warn about on every run."""
    import warnings

    model = _eosy(_tiny("llama", seed=2), tokenizer, at=10)
    cfg = dict(max_new_tokens=20, batch_size=5)
    ref = generate(model, tokenizer, PROMPTS, GenerationConfig(packed_linear=True, fused_attention=True, **cfg))
    monkeypatch.setattr(lean, "_WARNED", set())
    from esft.generation import packed

    for module in (lean, packed):  # as on a CPU without AVX512-BF16 or AMX
        monkeypatch.setattr(module, "bf16_matmul_is_native", lambda: False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = generate(model, tokenizer, PROMPTS, GenerationConfig(packed_linear=True, fused_attention=True,
                                                                    screened_lm_head=True, **cfg))
    assert not [w for w in caught if "screened_lm_head" in str(w.message)]
    assert [g.completion_ids for g in ours] == [g.completion_ids for g in ref]
