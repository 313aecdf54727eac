"""The lean KV cache (esft.generation.kv_cache.KVCache) on its own: growth, row compaction, zeroing and prefill
loading, in the logical and the tiled key layout. Pure torch, a stub model shape.

Run: pytest tests/test_kv_cache_audit.py -q
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from esft.generation.kv_cache import KVBuffers, KVCache, reusing_kv

SHAPE = SimpleNamespace(n_kv=2, head_dim=3, layers=[None, None])


def _filled(tile, rows=4, capacity=6, length=5):
    """A cache whose first `length` columns hold distinct keys / values per layer, with a ragged mask."""
    cache = KVCache(SHAPE, rows, capacity, torch.float32, "cpu", key_tile=tile)
    keys = torch.arange(rows * 2 * length * 3, dtype=torch.float32).view(rows, 2, length, 3)
    for i in range(2):
        cache.put_keys(i, torch.arange(rows), torch.arange(length), keys + 1000 * i)
        cache.v[i][:, :, :length] = -keys - 1000 * i
    cache.mask[:, :length] = torch.arange(length)[None, :] >= torch.arange(rows)[:, None]  # row r: r pad columns
    cache.length = length
    return cache, keys


@pytest.mark.parametrize("tile", [None, 4])
def test_a_new_cache_has_no_live_columns(tile):
    cache = KVCache(SHAPE, 3, 5, torch.float32, "cpu", key_tile=tile)
    assert cache.length == 0 and cache.rows == 3 and not cache.mask.any()
    assert cache.keys(0).shape == (3, 2, 0, 3)


@pytest.mark.parametrize("tile", [None, 4])
def test_ensure_doubles_only_when_needed_and_keeps_the_used_columns(tile):
    cache, keys = _filled(tile)
    first = cache.capacity  # 6, or 8 rounded up to whole tiles
    buffers = [*cache.k, *cache.v, cache.mask]
    cache.ensure(first)  # fits: nothing reallocated
    assert cache.capacity == first and all(a is b for a, b in zip(buffers, [*cache.k, *cache.v, cache.mask]))
    cache.ensure(first + 1)  # one more column: the capacity doubles (amortised growth), not + 1
    assert cache.capacity == 2 * first
    cache.ensure(5 * first + 1)  # beyond double: exactly what is asked (rounded up to whole tiles)
    want = 5 * first + 1 if tile is None else -(-(5 * first + 1) // tile) * tile
    assert cache.capacity == want and cache.k[0].numel() == 4 * 2 * 3 * want and cache.v[0].shape[2] == want
    for i in range(2):
        assert torch.equal(cache.keys(i), keys + 1000 * i)
        assert torch.equal(cache.v[i][:, :, :5], -keys - 1000 * i)
    assert cache.mask[:, :5].tolist() == [[c >= r for c in range(5)] for r in range(4)]
    assert not cache.mask[:, 5:].any()  # new columns start unattended
    last = torch.tensor([want - 1])
    cache.put_keys(0, torch.arange(4), last, torch.ones(4, 2, 1, 3))  # the last column is writable
    cache.length = want
    assert torch.equal(cache.keys(0)[:, :, -1], torch.ones(4, 2, 3))


@pytest.mark.parametrize("tile", [None, 4])
def test_keep_moves_the_kept_rows_to_the_front(tile):
    cache, keys = _filled(tile)
    cache.keep(torch.tensor([1, 3]))
    assert cache.rows == 2
    for i in range(2):
        assert torch.equal(cache.keys(i), keys[[1, 3]] + 1000 * i)
        assert torch.equal(cache.v[i][:2, :, :5], -keys[[1, 3]] - 1000 * i)
    assert cache.mask[:2, :5].tolist() == [[c >= r for c in range(5)] for r in (1, 3)]


@pytest.mark.parametrize("tile", [None, 4])
@pytest.mark.parametrize("index", [[0, 1, 3], [0, 1, 2, 3], [1, 2, 3], [0, 2], [2]])
def test_keep_copies_only_from_the_first_dropped_row_on_and_keeps_every_row(tile, index):
    """Rows before the first dropped one are already in place (the copy starts there); every kept row, moved or
    not, ends up where `index` puts it, with its keys, values and mask."""
    cache, keys = _filled(tile)
    cache.keep(torch.tensor(index))
    assert cache.rows == len(index)
    for i in range(2):
        assert torch.equal(cache.keys(i), keys[index] + 1000 * i)
        assert torch.equal(cache.v[i][:len(index), :, :5], -keys[index] - 1000 * i)
    assert cache.mask[:len(index), :5].tolist() == [[c >= r for c in range(5)] for r in index]


@pytest.mark.parametrize("tile", [None, 4])
def test_zero_makes_the_columns_finite(tile):
    """Gap columns are masked, but masked attention multiplies them by 0, and 0 * NaN is NaN: zero() clears
    whatever the uninitialised buffers held (here NaN) in every row."""
    cache = KVCache(SHAPE, 3, 8, torch.float32, "cpu", key_tile=tile)
    for buf in (*cache.k, *cache.v):
        buf.fill_(float("nan"))
    cache.zero(5)
    cache.length = 5
    for i in range(2):
        assert torch.equal(cache.keys(i), torch.zeros(3, 2, 5, 3))
        assert torch.equal(cache.v[i][:, :, :5], torch.zeros(3, 2, 5, 3))


@pytest.mark.parametrize("tile", [None, 4])
def test_load_prefill_copies_the_prompt_and_its_mask(tile):
    rows, width = 3, 5
    g = torch.Generator().manual_seed(0)
    layers = [SimpleNamespace(keys=torch.randn(rows, 2, width, 3, generator=g),
                              values=torch.randn(rows, 2, width, 3, generator=g)) for _ in range(2)]
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 1]])
    cache = KVCache(SHAPE, rows, width + 4, torch.float32, "cpu", key_tile=tile)
    cache.load_prefill(SimpleNamespace(layers=layers), mask)
    assert cache.length == width and cache.mask[:, :width].tolist() == mask.bool().tolist()
    for i, layer in enumerate(layers):
        assert torch.equal(cache.keys(i), layer.keys)
        assert torch.equal(cache.v[i][:, :, :width], layer.values)


def _pointers(cache: KVCache) -> set[int]:
    return {t.data_ptr() for t in cache.k + cache.v}


@pytest.mark.parametrize("tile", [None, 4])
def test_caches_made_while_reusing_take_the_buffers_the_last_one_gave_back(tile):
    """An ES lane's members: each cache made inside `reusing_kv` takes the key/value buffers the previous one
    released, when its shape and dtype match; outside the context nothing is kept."""
    buffers = KVBuffers()
    with reusing_kv(buffers):
        first = KVCache(SHAPE, 3, 5, torch.float32, "cpu", key_tile=tile)
        held = _pointers(first)
        size = sum(t.nbytes for t in first.k + first.v)
        first.release()
        assert buffers.nbytes == size and first.k == [] and first.v == []
        second = KVCache(SHAPE, 3, 5, torch.float32, "cpu", key_tile=tile)
        assert _pointers(second) == held and buffers.nbytes == 0
        second.release()
        other = KVCache(SHAPE, 2, 5, torch.float32, "cpu", key_tile=tile)  # another batch: its own buffers
        assert not _pointers(other) & held and buffers.nbytes == size
        half = KVCache(SHAPE, 3, 5, torch.bfloat16, "cpu", key_tile=tile)  # another dtype: the same
        assert not _pointers(half) & held and buffers.nbytes == size
    outside = KVCache(SHAPE, 3, 5, torch.float32, "cpu", key_tile=tile)
    assert not _pointers(outside) & held
    outside.release()
    assert buffers.nbytes == size  # given to no one
    buffers.clear()
    assert buffers.nbytes == 0
