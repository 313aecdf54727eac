"""The lean prefill writes its K/V straight into the KVCache (`layout_prefill(writes_cache=True)`, `CacheRows`):
no forward of more than one row fills a DynamicCache, and the logits, positions and cache are the bits of the
path that copies a DynamicCache afterwards."""

from __future__ import annotations

import pytest
import torch

from esft.generation import encode_prompts, lean, left_pad
from esft.generation.prefill import CacheRows, layout_prefill
from test_lean import PROMPTS, SHARED, _fast_kernels, _tiny

pytestmark = pytest.mark.usefixtures("one_thread")


def _cache_rows_seen(monkeypatch) -> list[int]:
    """The batch size of every DynamicCache.update from now on (the list fills as they come)."""
    from transformers import DynamicCache

    real, seen = DynamicCache.update, []

    def spy(self, keys, values, layer, *args, **kwargs):
        seen.append(keys.shape[0])
        return real(self, keys, values, layer, *args, **kwargs)

    monkeypatch.setattr(DynamicCache, "update", spy)
    return seen


def _layouts(model, lm, ids, mask, share, buckets, monkeypatch):
    """layout_prefill both ways, with the batch sizes of every DynamicCache.update each made."""
    seen = _cache_rows_seen(monkeypatch)
    out = []
    for writes in (True, False):
        seen.clear()
        out.append((layout_prefill(model, lm, ids, mask, lean._lean_prefill(lm), 4, share, buckets,
                                   head=lm.head_logits, writes_cache=writes), list(seen)))
    return out


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("share, buckets", [(True, 3), (True, 1), (False, 2), (False, 1)])
def test_the_lean_prefill_writing_the_kv_cache_gives_the_copied_caches_bits(tokenizer, kind, dtype, share, buckets,
                                                                             monkeypatch):
    options = _fast_kernels()
    if not (options.get("packed_linear") and options.get("fused_attention")):
        pytest.skip("the lean prefill needs both fast kernels")
    if dtype == torch.bfloat16 and lean.packed_linear_reason(dtype) is not None:
        pytest.skip(lean.packed_linear_reason(dtype))
    import esft.generation.prefill as prefill

    # no per-forward cost: the prompts' lengths (37-47 tokens, and 5 and 31) then split into `buckets` groups
    monkeypatch.setattr(prefill, "PREFILL_BUCKET_TOKENS", 0)
    groups = []
    real_buckets = prefill.length_buckets
    monkeypatch.setattr(prefill, "length_buckets", lambda *a, **k: groups.append(real_buckets(*a, **k)) or groups[-1])
    model = _tiny(kind).to(dtype)
    ids, mask = left_pad(encode_prompts(tokenizer, SHARED + PROMPTS[2:4] if not share else SHARED), 2, "cpu")
    with torch.inference_mode():
        lm = lean.LeanModel(model, packed=True, fused_attention=True)
        assert lm.fused_projections and lm.key_tile
        ((logits, cache, pos), direct_rows), ((ref_logits, ref, ref_pos), copied_rows) = _layouts(
            model, lm, ids, mask, share, buckets, monkeypatch)
    assert all(len(g) == buckets for g in groups) and len(groups) == (2 if buckets > 1 else 0)
    # only the shared prefix's batch-1 forward keeps a DynamicCache; the copying path holds whole groups
    assert set(direct_rows) <= {1} and (not share or direct_rows)
    assert max(copied_rows) > 1
    assert torch.equal(logits, ref_logits) and torch.equal(pos, ref_pos)
    assert cache.length == ref.length and cache.capacity == ref.capacity
    assert torch.equal(cache.mask, ref.mask)
    for i in range(len(lm.layers)):
        assert cache.k[i].dtype == ref.k[i].dtype == (lm.cache_dtype or torch.float32)
        assert torch.equal(cache.keys(i), ref.keys(i))
        assert torch.equal(cache.v[i][:, :, :cache.length], ref.v[i][:, :, :ref.length])


def test_cache_rows_puts_the_prefix_then_the_new_columns_at_the_given_rows_and_columns():
    """Pure torch: the prefix's K/V (one row) go before each row's new ones, at `cols` of rows `rows`, rounded to
    the cache's dtype; `update` returns the fp32 K/V the attention reads."""
    from types import SimpleNamespace

    from esft.generation.kv_cache import KVCache

    stub = SimpleNamespace(n_kv=2, head_dim=3, layers=[None])
    cache = KVCache(stub, rows=4, capacity=8, dtype=torch.bfloat16, device="cpu", key_tile=4)
    cache.zero(8)
    g = torch.Generator().manual_seed(0)
    pk, pv = (torch.randn(1, 2, 2, 3, generator=g) for _ in range(2))
    k, v = (torch.randn(2, 2, 3, 3, generator=g) for _ in range(2))
    prefix = SimpleNamespace(layers=[SimpleNamespace(keys=pk, values=pv)])
    rows, cols = torch.tensor([3, 1]), torch.tensor([0, 1, 5, 6, 7])
    keys, values = CacheRows(cache, rows, cols, prefix).update(k, v, 0)
    assert keys.dtype == torch.float32 and keys.shape == (2, 2, 5, 3)
    assert torch.equal(keys[:, :, :2], pk.expand(2, -1, -1, -1)) and torch.equal(keys[:, :, 2:], k)
    assert torch.equal(values[:, :, :2], pv.expand(2, -1, -1, -1)) and torch.equal(values[:, :, 2:], v)
    cache.length = 8
    stored_k, stored_v = cache.keys(0), cache.v[0]
    for j, r in enumerate(rows.tolist()):
        assert torch.equal(stored_k[r][:, cols], keys[j].to(torch.bfloat16))
        assert torch.equal(stored_v[r][:, cols], values[j].to(torch.bfloat16))
    untouched = [c for c in range(8) if c not in cols.tolist()]
    assert not stored_k[[3, 1]][:, :, untouched].any() and not stored_k[[0, 2]].any()
    assert not stored_v[[0, 2]].any()


def test_lean_decoding_fills_no_dynamic_cache_of_many_rows(tokenizer, monkeypatch):
    """`esft.generation.generate` with the fast kernels: the prompt's K/V go straight into the KVCache."""
    from esft.generation import GenerationConfig, generate

    options = _fast_kernels()
    if not (options.get("packed_linear") and options.get("fused_attention")):
        pytest.skip("the lean prefill needs both fast kernels")
    seen = _cache_rows_seen(monkeypatch)
    for share, buckets in ((True, 2), (False, 1)):
        config = GenerationConfig(max_new_tokens=3, batch_size=4, share_prefix=share, prefill_buckets=buckets,
                                  **options)
        assert all(len(g.completion_ids) <= 3 for g in generate(_tiny(), tokenizer, SHARED, config))
    assert set(seen) <= {1}
