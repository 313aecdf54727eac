"""Compiled CPU kernels (esft.kernels). Run: `pytest tests/test_kernels.py -q`.

The decode-attention kernel must do what the lean step's torch ops do: rotary embedding bit for bit, the new key
and value appended at the right column (keys in the transposed layout), and attention equal to SDPA's to float
rounding, for every grouped-query shape, with and without padding masks. Skipped, with the build error, where no
C++ compiler is available (the lean step then uses the torch ops).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from esft import kernels
from esft.lean import _rotate_half


@pytest.fixture(scope="module")
def ext():
    module = kernels.load_decode_attention()
    if module is None:
        pytest.skip(f"decode_attention kernel not built: {kernels.build_error()}")
    return module


def _reference(q, k, v, cos, sin, k_cache, v_cache, mask, col, scale, use_mask):
    """The lean step's torch ops: rotary, cache append, SDPA (packed query + mask, or enable_gqa)."""
    n, heads, hd = q.shape
    kv = k.shape[1]
    c, s = cos[:, None, None, :], sin[:, None, None, :]
    qq, kk, vv = q[:, None].transpose(1, 2), k[:, None].transpose(1, 2), v[:, None].transpose(1, 2)
    qq = qq * c + _rotate_half(qq) * s
    kk = kk * c + _rotate_half(kk) * s
    k_cache[:n, :, col : col + 1].copy_(kk)
    v_cache[:n, :, col : col + 1].copy_(vv)
    used = col + 1
    keys, values = k_cache[:n, :, :used], v_cache[:n, :, :used]
    if use_mask:
        add = torch.zeros(n, used).masked_fill_(~mask[:n, :used], float("-inf"))[:, None, None, :]
        out = F.scaled_dot_product_attention(qq.reshape(n, kv, heads // kv, hd), keys, values, attn_mask=add,
                                             scale=scale)
    else:
        out = F.scaled_dot_product_attention(qq, keys, values, scale=scale, enable_gqa=True)
    return out.reshape(n, heads, hd)


@pytest.mark.parametrize("rows, capacity, heads, kv, hd, col", [
    (30, 32, 9, 3, 64, 200),   # SmolLM2-135M: 3 query heads per kv head; fewer live rows than buffer rows
    (5, 8, 14, 2, 64, 17),     # Qwen2.5-0.5B: 7 per group (the 16-wide register blocks)
    (3, 3, 4, 4, 32, 49),      # plain multi-head attention, a tail of keys shorter than a block
    (7, 7, 8, 1, 128, 0),      # multi-query, first column, head_dim 128
    (4, 4, 16, 2, 16, 70),     # head_dim below one 64-wide block
])
@pytest.mark.parametrize("use_mask", [True, False])
def test_decode_attention_matches_torch(ext, rows, capacity, heads, kv, hd, col, use_mask):
    g = torch.Generator().manual_seed(rows * 100 + col)
    q, k, v = (torch.randn(rows, h, hd, generator=g) for h in (heads, kv, kv))
    cos, sin = torch.randn(rows, hd, generator=g), torch.randn(rows, hd, generator=g)
    length = col + 12
    k_cache = torch.randn(capacity, kv, length, hd, generator=g)
    v_cache = torch.randn(capacity, kv, length, hd, generator=g)
    mask = torch.ones(capacity, length, dtype=torch.bool)
    if use_mask:
        mask[:, : col // 2 + 1] = torch.rand(capacity, col // 2 + 1, generator=g) > 0.4
    mask[:, col] = True  # the new token always attends to itself (the lean step sets it)
    keys_t, values = k_cache.transpose(2, 3).contiguous(), v_cache.clone()
    out = ext.decode_attention(q, k, v, cos, sin, keys_t, values, mask, col, hd ** -0.5, use_mask)
    ref = _reference(q, k, v, cos, sin, k_cache, v_cache, mask, col, hd ** -0.5, use_mask)
    assert torch.equal(keys_t.transpose(2, 3), k_cache)  # rotated key written bit-identically, nothing else
    assert torch.equal(values, v_cache)
    assert out.shape == (rows, heads, hd)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)


def test_masked_columns_are_ignored_whatever_they_hold(ext):
    """Padding columns get exactly zero weight: NaN or huge values there must not leak."""
    rows, kv, heads, hd, length, col = 2, 1, 2, 8, 6, 4
    q, k, v = torch.randn(rows, heads, hd), torch.randn(rows, kv, hd), torch.randn(rows, kv, hd)
    cos, sin = torch.ones(rows, hd), torch.zeros(rows, hd)
    keys_t, values = torch.randn(rows, kv, hd, length), torch.randn(rows, kv, length, hd)
    mask = torch.ones(rows, length, dtype=torch.bool)
    mask[:, :2] = False
    clean = ext.decode_attention(q, k, v, cos, sin, keys_t.clone(), values.clone(), mask, col, 1.0, True)
    keys_t[..., :2] = 1e30
    values[:, :, :2] = 1e30
    dirty = ext.decode_attention(q, k, v, cos, sin, keys_t, values, mask, col, 1.0, True)
    assert torch.equal(clean, dirty) and torch.isfinite(dirty).all()


def test_bad_input_is_refused(ext):
    q, k = torch.randn(2, 4, 8), torch.randn(2, 2, 8)
    keys_t, values = torch.randn(2, 2, 8, 5), torch.randn(2, 2, 5, 8)
    mask = torch.ones(2, 5, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="bad shapes"):
        ext.decode_attention(q, k, k, q[:, 0], q[:, 0], keys_t, values, mask, 5, 1.0, False)  # column past capacity
    with pytest.raises(RuntimeError, match="fp32"):
        ext.decode_attention(q.double(), k, k, q[:, 0], q[:, 0], keys_t, values, mask, 1, 1.0, False)


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setattr(kernels, "_CACHE", {})
    monkeypatch.setattr(kernels, "_ERRORS", {})
    monkeypatch.setenv("ESFT_NO_KERNELS", "1")
    assert kernels.load_decode_attention() is None
    assert "ESFT_NO_KERNELS" in kernels.build_error()
