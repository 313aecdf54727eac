"""Compiled CPU kernels (esft.kernels). Run: `pytest tests/test_kernels.py -q`.

The decode-attention kernel must do what the lean step's torch ops do: rotary embedding bit for bit, the new key
and value appended at the right column (keys in the tiled layout), and attention equal to SDPA's to float
rounding, for every grouped-query shape, with and without padding masks. The glue kernels (RMSNorm, residual,
SwiGLU) must match the torch ops to float rounding, and the lm_head screen must never lose the argmax. Skipped,
with the build error, where no C++ compiler is available (the lean step then uses the torch ops).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from esft import kernels
from esft.generation.lean_step import rotate_half as _rotate_half


@pytest.fixture(scope="module")
def ext():
    module = kernels.load_decode_attention()
    if module is None:
        pytest.skip(f"decode_attention kernel not built: {kernels.build_error()}")
    return module


def _tiled(keys, tile):
    """Logical keys [R, kv, L, hd] (L a multiple of tile) -> the kernel's layout [R, kv, L / tile, hd, tile]."""
    r, kv, length, hd = keys.shape
    return keys.reshape(r, kv, length // tile, tile, hd).transpose(3, 4).contiguous()


def _untiled(keys_t):
    r, kv, tiles, hd, tile = keys_t.shape
    return keys_t.transpose(3, 4).reshape(r, kv, tiles * tile, hd)


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
    length = -(-(col + 12) // ext.KEY_TILE) * ext.KEY_TILE
    k_cache = torch.randn(capacity, kv, length, hd, generator=g)
    v_cache = torch.randn(capacity, kv, length, hd, generator=g)
    mask = torch.ones(capacity, length, dtype=torch.bool)
    if use_mask:
        mask[:, : col // 2 + 1] = torch.rand(capacity, col // 2 + 1, generator=g) > 0.4
    mask[:, col] = True  # the new token always attends to itself (the lean step sets it)
    keys_t, values = _tiled(k_cache, ext.KEY_TILE), v_cache.clone()
    out = ext.decode_attention(q, k, v, cos, sin, keys_t, values, mask, col, hd ** -0.5, use_mask)
    ref = _reference(q, k, v, cos, sin, k_cache, v_cache, mask, col, hd ** -0.5, use_mask)
    assert torch.equal(_untiled(keys_t), k_cache)  # rotated key written bit-identically, nothing else
    assert torch.equal(values, v_cache)
    assert out.shape == (rows, heads, hd)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("rows, capacity, heads, kv, hd, col", [
    (30, 32, 9, 3, 64, 200), (5, 8, 14, 2, 64, 17), (3, 3, 4, 4, 32, 49), (4, 4, 16, 2, 16, 70)])
@pytest.mark.parametrize("use_mask", [True, False])
def test_bf16_cache_rounds_once_and_attends_in_fp32(ext, rows, capacity, heads, kv, hd, col, use_mask):
    """bf16 rollouts: q, k, v (a bf16 matmul's output), the caches and the output in bf16. The rotated key is
    appended rounded as torch rounds (`.to(torch.bfloat16)`), and the output is fp32 attention over the widened
    values, rounded once."""
    g = torch.Generator().manual_seed(rows * 7 + col)
    q, k, v = (torch.randn(rows, h, hd, generator=g).to(torch.bfloat16) for h in (heads, kv, kv))
    cos, sin = torch.randn(rows, hd, generator=g), torch.randn(rows, hd, generator=g)
    length = -(-(col + 12) // ext.KEY_TILE) * ext.KEY_TILE
    k_cache = torch.randn(capacity, kv, length, hd, generator=g).to(torch.bfloat16)
    v_cache = torch.randn(capacity, kv, length, hd, generator=g).to(torch.bfloat16)
    mask = torch.ones(capacity, length, dtype=torch.bool)
    if use_mask:
        mask[:, : col // 2 + 1] = torch.rand(capacity, col // 2 + 1, generator=g) > 0.4
    mask[:, col] = True
    keys_t, values = _tiled(k_cache, ext.KEY_TILE), v_cache.clone()
    out = ext.decode_attention(q, k, v, cos, sin, keys_t, values, mask, col, hd ** -0.5, use_mask)
    # the fp32 reference appends the new column unrounded: the kernel must have stored it rounded
    ref_k, ref_v = k_cache.float(), v_cache.float()
    _reference(q.float(), k.float(), v.float(), cos, sin, ref_k, ref_v, mask, col, hd ** -0.5, use_mask)
    assert torch.equal(_untiled(keys_t), ref_k.to(torch.bfloat16))
    assert torch.equal(values, ref_v.to(torch.bfloat16))
    wide_k, wide_v = ref_k.to(torch.bfloat16).float(), ref_v.to(torch.bfloat16).float()  # with the new column
    ref = _attend_only(q.float(), cos, sin, wide_k, wide_v, mask, col, hd ** -0.5, use_mask, kv)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, heads, hd)
    # one rounding of an output that matches the fp32 reference to ~1e-6
    torch.testing.assert_close(out.float(), ref, atol=1e-5, rtol=2.0 ** -8)
    assert (out == ref.to(torch.bfloat16)).float().mean() > 0.99


def _attend_only(q, cos, sin, k_cache, v_cache, mask, col, scale, use_mask, kv):
    """SDPA of the rotated query over columns 0..col of fp32 caches that already hold the new column."""
    n, heads, hd = q.shape
    qq = q[:, None].transpose(1, 2)
    qq = qq * cos[:, None, None, :] + _rotate_half(qq) * sin[:, None, None, :]
    keys, values = k_cache[:n, :, : col + 1], v_cache[:n, :, : col + 1]
    if use_mask:
        add = torch.zeros(n, col + 1).masked_fill_(~mask[:n, : col + 1], float("-inf"))[:, None, None, :]
        out = F.scaled_dot_product_attention(qq.reshape(n, kv, heads // kv, hd), keys, values, attn_mask=add,
                                             scale=scale)
    else:
        out = F.scaled_dot_product_attention(qq, keys, values, scale=scale, enable_gqa=True)
    return out.reshape(n, heads, hd)


def test_cache_dtypes_must_agree(ext):
    rows, kv, heads, hd, col = 2, 1, 2, 8, 3
    q, k = torch.randn(rows, heads, hd), torch.randn(rows, kv, hd)
    keys_t = torch.zeros(rows, kv, 1, hd, ext.KEY_TILE)
    values = torch.zeros(rows, kv, ext.KEY_TILE, hd, dtype=torch.bfloat16)
    mask = torch.ones(rows, ext.KEY_TILE, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="caches must both be fp32 or both bf16"):
        ext.decode_attention(q, k, k, q[:, 0], q[:, 0], keys_t, values, mask, col, 1.0, False)
    with pytest.raises(RuntimeError, match="must have the caches' dtype"):  # fp32 projections, bf16 caches
        ext.decode_attention(q, k, k, q[:, 0], q[:, 0], keys_t.bfloat16(), values, mask, col, 1.0, False)


def test_masked_columns_are_ignored_whatever_they_hold(ext):
    """Padding columns get exactly zero weight: NaN or huge values there must not leak."""
    rows, kv, heads, hd, col = 2, 1, 2, 8, 4
    length = ext.KEY_TILE
    q, k, v = torch.randn(rows, heads, hd), torch.randn(rows, kv, hd), torch.randn(rows, kv, hd)
    cos, sin = torch.ones(rows, hd), torch.zeros(rows, hd)
    keys_t, values = torch.randn(rows, kv, 1, hd, length), torch.randn(rows, kv, length, hd)
    mask = torch.ones(rows, length, dtype=torch.bool)
    mask[:, :2] = False
    clean = ext.decode_attention(q, k, v, cos, sin, keys_t.clone(), values.clone(), mask, col, 1.0, True)
    keys_t[..., :2] = 1e30  # columns 0 and 1 of the one tile
    values[:, :, :2] = 1e30
    dirty = ext.decode_attention(q, k, v, cos, sin, keys_t, values, mask, col, 1.0, True)
    assert torch.equal(clean, dirty) and torch.isfinite(dirty).all()


def test_bad_input_is_refused(ext):
    t = ext.KEY_TILE
    q, k = torch.randn(2, 4, 8), torch.randn(2, 2, 8)
    keys_t, values = torch.randn(2, 2, 1, 8, t), torch.randn(2, 2, t, 8)
    mask = torch.ones(2, t, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="bad shapes"):
        ext.decode_attention(q, k, k, q[:, 0], q[:, 0], keys_t, values, mask, t, 1.0, False)  # column past capacity
    with pytest.raises(RuntimeError, match="tiled"):
        ext.decode_attention(q, k, k, q[:, 0], q[:, 0], _untiled(keys_t).contiguous(), values, mask, 1, 1.0, False)
    with pytest.raises(RuntimeError, match="fp32"):
        ext.decode_attention(q.double(), k, k, q[:, 0], q[:, 0], keys_t, values, mask, 1, 1.0, False)


def test_row_strided_projections_read_like_contiguous_ones(ext):
    """The fused step passes q, k, v as column slices of one q|k|v matmul output."""
    rows, heads, kv, hd, col = 6, 9, 3, 64, 70
    t = ext.KEY_TILE
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(rows, (heads + 2 * kv) * hd, generator=g)
    q = qkv[:, : heads * hd].view(rows, heads, hd)
    k = qkv[:, heads * hd : (heads + kv) * hd].view(rows, kv, hd)
    v = qkv[:, (heads + kv) * hd :].view(rows, kv, hd)
    assert not q.is_contiguous()
    cos, sin = torch.randn(rows, hd, generator=g), torch.randn(rows, hd, generator=g)
    keys_t, values = torch.randn(rows, kv, 2, hd, t, generator=g), torch.randn(rows, kv, 2 * t, hd, generator=g)
    mask = torch.ones(rows, 2 * t, dtype=torch.bool)
    caches = [(keys_t.clone(), values.clone()) for _ in range(2)]
    a = ext.decode_attention(q, k, v, cos, sin, *caches[0], mask, col, 0.125, False)
    b = ext.decode_attention(q.contiguous(), k.contiguous(), v.contiguous(), cos, sin, *caches[1], mask, col, 0.125,
                             False)
    assert torch.equal(a, b) and torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])


def _torch_rms(x, w, eps):
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))


def test_rms_norm_and_residual_match_torch(ext):
    g = torch.Generator().manual_seed(0)
    x, d, w = torch.randn(7, 576, generator=g) * 3, torch.randn(7, 576, generator=g), torch.randn(576, generator=g)
    torch.testing.assert_close(ext.rms_norm(x, w, 1e-5), _torch_rms(x, w, 1e-5), atol=1e-6, rtol=2e-6)
    residual = x + d
    h = ext.add_rms_norm(x, d, w, 1e-5)
    assert torch.equal(x, residual)  # x += d in place, exactly as `residual + out`
    torch.testing.assert_close(h, _torch_rms(residual, w, 1e-5), atol=1e-6, rtol=2e-6)
    with pytest.raises(RuntimeError, match="contiguous 2-D fp32"):
        ext.rms_norm(x.double(), w, 1e-5)


def test_silu_mul_matches_torch_over_the_whole_range(ext):
    g = torch.Generator().manual_seed(1)
    gu = torch.randn(9, 2 * 1536, generator=g) * 8
    gu[0, :6] = torch.tensor([-120.0, -88.5, -30.0, 0.0, 40.0, 100.0])  # the clamped ends of the exp
    ref = F.silu(gu[:, :1536]) * gu[:, 1536:]
    torch.testing.assert_close(ext.silu_mul(gu), ref, atol=1e-6, rtol=2e-6)


def _same_bits(a, b):
    """Equal bit for bit, except that any NaN equals any NaN (torch's vectorised bf16 conversion keeps other NaN
    bits than its scalar one)."""
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16}
    nan = a.isnan()
    return (a.dtype == b.dtype and torch.equal(nan, b.isnan())
            and torch.equal(a.view(ints[a.dtype])[~nan], b.view(ints[b.dtype])[~nan]))


def test_bf16_glue_is_the_fp32_glue_rounded_once(ext):
    """bf16 rollouts: the glue reads a bf16 matmul output (widened exactly) and writes the next bf16 matmul's
    input: bit for bit the fp32 kernel on the widened input, then torch's rounding (`.to(torch.bfloat16)`)."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(7, 576, generator=g) * 3, torch.randn(576, generator=g)
    d = torch.randn(7, 576, generator=g).to(torch.bfloat16)
    x[0, 2] = float("nan")  # a diverged row
    x[1, :2] = torch.tensor([1e-30, 3.0e37])  # tiny and huge values in one row
    low = ext.rms_norm(x, w, 1e-5, True)
    assert low.dtype == torch.bfloat16 and _same_bits(low, ext.rms_norm(x, w, 1e-5).to(torch.bfloat16))
    x2 = x.clone()
    h_low = ext.add_rms_norm(x, d, w, 1e-5, True)
    h_ref = ext.add_rms_norm(x2, d.float(), w, 1e-5)
    assert _same_bits(x, x2)  # the residual stream stays fp32, += the widened bf16 delta
    assert _same_bits(h_low, h_ref.to(torch.bfloat16))
    gu = (torch.randn(9, 2 * 1536, generator=g) * 8).to(torch.bfloat16)
    out = ext.silu_mul(gu)
    assert out.dtype == torch.bfloat16 and torch.equal(out, ext.silu_mul(gu.float()).to(torch.bfloat16))


@pytest.mark.parametrize("heads, kv, hd, rows", [(9, 3, 64, 130), (4, 4, 32, 7), (6, 2, 16, 1), (2, 1, 128, 65)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_qkv_is_the_torch_rotation_bit_for_bit(ext, heads, kv, hd, rows, dtype):
    """The lean prefill's rotary: q and k of a fused q|k|v projection (fp32, or a bf16 matmul's output widened
    exactly) rotated as `x * cos + rotate_half(x) * sin`, v widened, each row with its own position's cos / sin;
    non-finite values pass through as the torch ops pass them."""
    g = torch.Generator().manual_seed(5)
    qkv = (torch.randn(rows, (heads + 2 * kv) * hd, generator=g) * 4).to(dtype)
    qkv[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")]).to(dtype)
    qkv[-1, heads * hd + 1] = float("inf")  # in a key
    cos, sin = torch.randn(rows, hd, generator=g), torch.randn(rows, hd, generator=g)
    x = qkv.to(torch.float32)
    q_end, k_end = heads * hd, (heads + kv) * hd

    def rotated(y, n):
        y = y.view(rows, n, hd)
        return ((y * cos[:, None]) + (_rotate_half(y) * sin[:, None])).reshape(rows, n * hd)

    q, k, v = ext.rotary_qkv(qkv, cos, sin, heads, kv)
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    assert _same_bits(q, rotated(x[:, :q_end], heads))
    assert _same_bits(k, rotated(x[:, q_end:k_end], kv))
    assert _same_bits(v, x[:, k_end:].contiguous())


def test_rotary_qkv_refuses_bad_input(ext):
    qkv, cs = torch.randn(5, 5 * 16), torch.randn(5, 16)
    for args, match in [((qkv, cs, cs, 3, 2), "width"), ((qkv[:, :65].contiguous(), cs[:, :13], cs[:, :13], 3, 1), "even"),
                        ((qkv, cs[:4], cs, 3, 1), "cos and sin"), ((qkv.double(), cs, cs, 3, 1), "fp32 or bf16"),
                        ((qkv, cs.double(), cs, 3, 1), "fp32")]:
        with pytest.raises(RuntimeError, match=match):
            ext.rotary_qkv(*args)


def test_norms_of_many_rows_split_between_threads_give_the_one_thread_bits(ext):
    """The prefill's norms run rows on several threads: each row's bits are those of one thread, and of the row
    normed alone."""
    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(333, 576, generator=g) * 3, torch.randn(576, generator=g)
    d = torch.randn(333, 576, generator=g).to(torch.bfloat16)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            x2 = x.clone()
            results.append((ext.rms_norm(x, w, 1e-5, True), ext.add_rms_norm(x2, d, w, 1e-5), x2))
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))
    alone = torch.cat([ext.rms_norm(x[r:r + 1], w, 1e-5, True) for r in range(x.shape[0])])
    assert torch.equal(results[0][0], alone)


def _bf16_logits(h, w):
    return F.linear(h.bfloat16(), w.bfloat16())


@pytest.mark.parametrize("spread", [0.02, 1.0])
def test_screen_keeps_every_possible_argmax(ext, spread):
    """The exact argmax is always among the candidates, and the candidates are few (near-ties are kept)."""
    from esft.generation.packed import LMHeadScreen, bf16_matmul_is_native
    from esft.generation.vocab import VocabRows

    if not bf16_matmul_is_native():
        pytest.skip("no native bf16 matmul on this CPU (the screen is not used here)")
    g = torch.Generator().manual_seed(3)
    w = torch.randn(5000, 64, generator=g) * spread
    w[7] = w[9] * (1 + 1e-6)  # a near-tie
    h = torch.randn(12, 64, generator=g) * 4
    h[0] = w[9] * 50
    screen = LMHeadScreen(VocabRows(w), 12)
    approx = _bf16_logits(h, w)
    cols, keep = ext.screen_candidates(approx, torch.linalg.vector_norm(h, dim=1), screen.row_norms, screen.c_prod,
                                       screen.c_out)
    exact = F.linear(h, w)
    best = exact.argmax(-1)
    assert torch.equal(cols, cols.sort().values)
    for r in range(12):
        assert int(best[r]) in cols[keep[r]].tolist()
    assert {7, 9} <= set(cols[keep[0]].tolist())
    assert keep.sum(1).float().mean() < 50
    # the whole screen: the pick equals the fp32 argmax, also when that token is suppressed (eos before
    # min_new_tokens): then it is the best of the others
    picked = screen.logits(h, ext, torch.tensor([], dtype=torch.long))
    assert torch.equal(picked.greedy(), best)
    banned = best[3:4]
    picked = screen.logits(h, ext, banned)
    assert int(picked.greedy()[3]) == int(exact[3].index_fill(0, banned, float("-inf")).argmax())
    assert not (picked.greedy() == banned).any()


def test_screen_refuses_non_finite_rows(ext):
    h, w = torch.randn(3, 16), torch.randn(100, 16)
    approx = _bf16_logits(h, w)
    approx[1, 5] = float("nan")
    cols, keep = ext.screen_candidates(approx, torch.linalg.vector_norm(h, dim=1), torch.linalg.vector_norm(w, dim=1),
                                       0.008, 0.008)
    assert not keep[1].any() and keep[0].any() and keep[2].any()


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setattr(kernels, "_CACHE", {})
    monkeypatch.setattr(kernels, "_ERRORS", {})
    monkeypatch.setenv("ESFT_NO_KERNELS", "1")
    assert kernels.load_decode_attention() is None
    assert "ESFT_NO_KERNELS" in kernels.build_error()


def test_each_checkout_and_environment_builds_in_a_folder_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    here = kernels.build_dir("decode_attention")
    assert here.parent == tmp_path / "esft" and here.name.startswith("decode_attention_")
    other = kernels.build_dir("decode_attention", source=tmp_path / "other" / "decode_attention.cpp")
    assert other != here and other.parent == here.parent  # another checkout: no rebuild in turn
    monkeypatch.setattr(kernels.sys, "prefix", "/another/venv")
    assert kernels.build_dir("decode_attention") not in (here, other)  # another environment's torch headers


def test_a_lock_of_a_killed_build_is_removed_and_a_young_one_waited_for(tmp_path):
    import os

    assert kernels.clear_stale_lock(tmp_path, "decode_attention") is None
    lock = tmp_path / "lock"
    lock.write_text("")
    now = lock.stat().st_mtime + 60  # another process's build, a minute in
    assert "waiting for another process's build" in kernels.clear_stale_lock(tmp_path, "decode_attention", now)
    assert lock.exists()
    os.utime(lock, (now - kernels.STALE_LOCK_S - 60,) * 2)  # left by a build killed long ago
    line = kernels.clear_stale_lock(tmp_path, "decode_attention", now)
    assert line.startswith(f"esft: removed {lock}, left 16 min ago") and not lock.exists()


def test_the_kernel_builds_where_a_lock_was_left_by_a_killed_build(ext, tmp_path, monkeypatch, capsys):
    # the real build (about 30 s on 2 cores; where `ext` could be built): torch would wait on the old lock forever
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "_CACHE", {})
    monkeypatch.setattr(kernels, "_ERRORS", {})
    folder = kernels.build_dir("decode_attention")
    folder.mkdir(parents=True)
    (folder / "lock").write_text("")
    old = (folder / "lock").stat().st_mtime - kernels.STALE_LOCK_S - 1
    import os

    os.utime(folder / "lock", (old, old))
    assert kernels.load_decode_attention() is not None, kernels.build_error()
    assert "by a build of the decode_attention kernel that was killed" in capsys.readouterr().err


def test_arm_cpus_with_other_features_build_in_folders_of_their_own(tmp_path):
    """The build uses -march=native. An arm64 /proc/cpuinfo has no "flags" line (it says "Features"), so every
    arm64 CPU got the same tag: a cache shared between a Graviton3 (SVE) and a Graviton2 handed the SVE binary to
    the CPU without SVE, which dies of an illegal instruction instead of using the torch ops."""
    block = ("processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics"
             "{extra}\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: {part}\n\n")
    n1, v1 = tmp_path / "graviton2", tmp_path / "graviton3"
    n1.write_text(block.format(extra="", part="0xd0c"))
    v1.write_text(block.format(extra=" sve sve2 bf16 i8mm", part="0xd40"))
    assert kernels._cpu_tag(n1) != kernels._cpu_tag(v1)
    assert kernels._cpu_tag(n1) == kernels._cpu_tag(n1)


@pytest.mark.parametrize("env", [{"CXX": "/nonexistent/g++"}, {"CXX": "", "PATH": "/nonexistent"}])
def test_a_missing_compiler_is_named_in_one_line_and_no_build_is_tried(tmp_path, monkeypatch, capfd, env):
    """Without a C++ compiler torch's builder printed a screen-wide warning that the compiler "is not compatible",
    then failed, and the reason recorded (what the lean engine's warning shows) was its last line, "ninja: build
    stopped: subcommand failed.", which says nothing of the missing compiler."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "_CACHE", {})
    monkeypatch.setattr(kernels, "_ERRORS", {})
    for key, value in env.items():
        if value:
            monkeypatch.setenv(key, value)
        else:
            monkeypatch.delenv(key, raising=False)
    assert kernels.load_decode_attention() is None
    why = kernels.build_error()
    assert "no C++ compiler" in why and (env.get("CXX") or "c++") in why
    assert "WARNING" not in capfd.readouterr().err
    assert not list(tmp_path.rglob("build.ninja"))  # refused before torch wrote a build


def test_without_a_compiler_auto_rolls_out_in_fp32_on_a_cpu_with_native_bf16(tmp_path, monkeypatch):
    """bf16 weights take the packed fast path only beside the fused-attention kernel: without it the lean engine
    drops both for HF's bf16 forward (two warnings per run). `rollout_dtype: auto` on a CPU whose flags name a
    native bf16 dot product, with a probe that confirms it, picked bf16 all the same, on a machine without a C++
    compiler (and no finished build); it now keeps fp32 and records why."""
    from esft.config import FAST_CPU_GENERATION
    from esft.es.build import rollout_precision
    from esft.es.es_config import ESConfig
    from esft.generation import precision

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    monkeypatch.delenv("ESFT_NO_KERNELS", raising=False)
    monkeypatch.setattr(kernels, "_CACHE", {})
    monkeypatch.setattr(kernels, "_ERRORS", {})
    monkeypatch.setattr(precision, "cpu_flags", lambda: ["avx512f", "amx_bf16"])
    monkeypatch.setattr(precision, "probe_bf16_speedup", lambda: 2.5)
    chosen = rollout_precision(ESConfig(generation_options=dict(FAST_CPU_GENERATION), device="cpu"))
    assert chosen.dtype == "float32", chosen.reason
    assert "no C++ compiler" in chosen.reason and "/nonexistent/g++" in chosen.reason
    assert chosen.native_flags == ("amx_bf16",) and chosen.probe_speedup == 2.5
    assert not list(tmp_path.rglob("build.ninja"))


def test_a_failed_builds_reason_is_the_compilers_error_not_ninjas_last_line():
    exc = RuntimeError(
        "Error building extension 'esft_decode_attention_x': [1/2] c++ -MMD -c decode_attention.cpp\n"
        "FAILED: decode_attention.o \nc++ -MMD -c decode_attention.cpp -o decode_attention.o\n"
        "/usr/include/torch/extension.h:5:10: fatal error: Python.h: No such file or directory\n"
        "compilation terminated.\nninja: build stopped: subcommand failed.\n")
    assert kernels.build_reason(exc) == ("RuntimeError: /usr/include/torch/extension.h:5:10: fatal error: Python.h: "
                                         "No such file or directory")
    assert kernels.build_reason(OSError(30, "Read-only file system", "/x/lock")) == (
        "OSError: [Errno 30] Read-only file system: '/x/lock'")
    assert kernels.build_reason(RuntimeError("")) == "RuntimeError"


def test_a_finished_build_still_loads_without_a_compiler(tmp_path, monkeypatch):
    """A cache built earlier (a container image whose compiler was removed afterwards) loads: ninja finds it up to
    date and compiles nothing, so the missing compiler refuses only a build that has to run."""
    import torch.utils.cpp_extension as cpp_extension

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(kernels, "_CACHE", {})
    monkeypatch.setattr(kernels, "_ERRORS", {})
    folder = kernels.build_dir("decode_attention")
    folder.mkdir(parents=True)
    (folder / f"esft_decode_attention_{kernels._cpu_tag()}.so").write_bytes(b"")
    built = object()
    monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: built)
    assert kernels.load_decode_attention() is built, kernels.build_error()


def _torch_like_load(folder, seen, patience=5.0):
    """Stands in for torch's `load`: like its FileBaton it waits while the folder's lock file exists (here at most
    `patience` seconds, where torch waits forever), then "loads"."""
    import time as clock

    def load(**kwargs):
        seen.append((folder / "lock").exists())
        end = clock.monotonic() + patience
        while (folder / "lock").exists():
            if clock.monotonic() > end:
                raise TimeoutError("torch would wait on this lock forever")
            clock.sleep(0.05)
        return "module"

    return load


def _fresh_build_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "_CACHE", {})
    monkeypatch.setattr(kernels, "_ERRORS", {})
    folder = kernels.build_dir("decode_attention")
    folder.mkdir(parents=True)
    return folder


def test_a_lock_left_a_minute_ago_by_a_killed_build_is_not_waited_on_forever(tmp_path, monkeypatch, capsys):
    """A build killed outright (kill -9, the OOM killer) minutes before the next run left torch's lock, younger
    than STALE_LOCK_S: the next run said "waiting for another process's build" and waited forever, as no process
    would ever remove it."""
    import torch.utils.cpp_extension as cpp_extension

    import socket

    folder = _fresh_build_folder(tmp_path, monkeypatch)
    (folder / "esft.lock").write_text(f"{socket.gethostname()}\n999999\n")  # what the killed build wrote there
    (folder / "lock").write_text("")  # no build holds it: its process is gone
    seen: list[bool] = []
    monkeypatch.setattr(cpp_extension, "load", _torch_like_load(folder, seen))
    assert kernels.load_decode_attention() == "module", kernels.build_error()
    assert seen == [False] and "by a build of the decode_attention kernel that was killed" in capsys.readouterr().err


def test_a_young_lock_of_a_build_on_another_host_is_left_alone(tmp_path, monkeypatch, capsys):
    """A shared home directory's file system may keep flocks per host: holding esft's flock says nothing of a
    build on another machine, whose torch lock is only removed once old (`clear_stale_lock`)."""
    import torch.utils.cpp_extension as cpp_extension

    folder = _fresh_build_folder(tmp_path, monkeypatch)
    (folder / "esft.lock").write_text("another-host\n1234\n")
    (folder / "lock").write_text("")  # that host's build, a moment ago
    seen: list[bool] = []
    monkeypatch.setattr(cpp_extension, "load", _torch_like_load(folder, seen, patience=0.3))
    assert kernels.load_decode_attention() is None  # torch would still be waiting for it
    assert seen == [True] and (folder / "lock").exists()
    assert "waiting for another process's build" in capsys.readouterr().err


def test_a_build_in_another_process_is_waited_for_and_its_lock_left_alone(tmp_path, monkeypatch, capsys):
    import subprocess
    import sys
    import time as clock

    import torch.utils.cpp_extension as cpp_extension

    folder = _fresh_build_folder(tmp_path, monkeypatch)
    # the other process: takes esft's build lock as `_load` does, and torch's lock file, for 1.5 s
    other = subprocess.Popen([sys.executable, "-c", (
        "import sys, time, esft.kernels as k\n"
        "from pathlib import Path\n"
        "folder = Path(sys.argv[1])\n"
        "with k.build_lock(folder, 'decode_attention'):\n"
        "    (folder / 'lock').write_text('')\n"
        "    print('building', flush=True)\n"
        "    time.sleep(1.5)\n"
        "    (folder / 'lock').unlink()\n"), str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "building"
        seen: list[bool] = []
        monkeypatch.setattr(cpp_extension, "load", _torch_like_load(folder, seen))
        start = clock.monotonic()
        assert kernels.load_decode_attention() == "module", kernels.build_error()
        assert clock.monotonic() - start > 0.5 and seen == [False]  # waited for it, then found its build done
    finally:
        assert other.wait(timeout=30) == 0
    err = capsys.readouterr().err
    assert "waiting for another process's build of the decode_attention kernel" in err and "removed" not in err


def test_a_finished_build_in_a_read_only_cache_is_used_and_a_stale_one_is_not(ext, tmp_path, monkeypatch):
    """A cache folder this process cannot write (a read-only mount, a container image's cache): torch's loader
    fails on creating its lock file even where the build is finished, so the kernel went unused ("OSError: [Errno
    30] Read-only file system: '.../lock'")."""
    import errno
    import os
    import shutil

    import torch.utils.cpp_extension as cpp_extension

    library = f"esft_decode_attention_{kernels._cpu_tag()}.so"
    built = Path(ext.__file__)  # the module the fixture built (or found) in this machine's cache
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = kernels.build_dir("decode_attention")
    folder.mkdir(parents=True)
    shutil.copy(built, folder / library)

    def read_only(**kwargs):  # what torch's loader does there: its lock file cannot be created
        raise OSError(errno.EROFS, "Read-only file system", str(folder / "lock"))

    monkeypatch.setattr(cpp_extension, "load", read_only)
    monkeypatch.setattr(kernels, "_CACHE", {})
    monkeypatch.setattr(kernels, "_ERRORS", {})
    module = kernels.load_decode_attention()
    assert module is not None, kernels.build_error()
    x, w = torch.randn(3, 8), torch.randn(8)
    assert torch.equal(module.rms_norm(x, w, 1e-5), ext.rms_norm(x, w, 1e-5))  # the same kernel, working
    # older than the source: it may be another version's build, so it is not used, and the reason says why
    source = Path(kernels.__file__).with_name("decode_attention.cpp")
    old = source.stat().st_mtime - 60
    os.utime(folder / library, (old, old))
    monkeypatch.setattr(kernels, "_CACHE", {})
    monkeypatch.setattr(kernels, "_ERRORS", {})
    assert kernels.load_decode_attention() is None
    assert "Read-only file system" in kernels.build_error() and "TORCH_EXTENSIONS_DIR" in kernels.build_error()


def test_a_lanes_thread_share_survives_the_glue_and_attention_kernels(ext):
    """An ES lane is a thread that sets its own torch thread count (LocalExecutor), and lanes may get unequal shares.
    ATen's at::parallel_for, compiled into an extension, sets a thread's OpenMP team to torch's global count (the
    last count any thread set) on its first call in that thread, undoing the lane's share; the kernels split their
    loops with esft_kernels::parallel_range instead."""
    import threading

    before = torch.get_num_threads()
    seen = []

    def lane(which, share_set, global_set):
        torch.get_num_threads()  # a new thread's first ATen call sets its team from the global count (as a lane does)
        torch.set_num_threads(1)  # then this lane's share
        share_set.set()
        global_set.wait(30)  # another lane has set its own share since
        if which == "silu_mul":
            ext.silu_mul(torch.randn(64, 256))
        elif which == "attention":
            rows, kv, g, hd, cap = 4, 2, 2, 16, 64
            q, k, v = torch.randn(rows, kv * g, hd), torch.randn(rows, kv, hd), torch.randn(rows, kv, hd)
            cos, sin = torch.ones(rows, hd), torch.zeros(rows, hd)
            k_cache = torch.zeros(rows, kv, cap // ext.KEY_TILE, hd, ext.KEY_TILE)
            v_cache = torch.zeros(rows, kv, cap, hd)
            mask = torch.ones(rows, cap, dtype=torch.bool)
            ext.decode_attention(q, k, v, cos, sin, k_cache, v_cache, mask, 0, hd ** -0.5, False)
        else:
            approx = torch.randn(8, 512).to(torch.bfloat16)
            ext.screen_candidates(approx, torch.rand(8) + 1, torch.rand(512) + 1, 1e-3, 1e-2)
        seen.append((which, torch.get_num_threads()))

    try:
        for which in ("silu_mul", "attention", "screen"):
            share_set, global_set = threading.Event(), threading.Event()
            worker = threading.Thread(target=lane, args=(which, share_set, global_set))
            worker.start()
            share_set.wait(30)
            torch.set_num_threads(2)
            global_set.set()
            worker.join()
    finally:
        torch.set_num_threads(before)
    assert seen == [("silu_mul", 1), ("attention", 1), ("screen", 1)]
