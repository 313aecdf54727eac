"""The lean step's KV cache: preallocated per-layer buffers sliced to the used length, compacted in place when
rows finish; and `reusing_kv`, under which one cache's buffers serve the next (an ES lane's members)."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import torch


class KVBuffers:
    """Key/value buffers handed from one KVCache to the next of the same shape (`reusing_kv`).

    Why: an ES lane generates the same batch for every member, so each member's cache has the same buffers. Made
    anew per member, the cpu preset's ~166 MiB of per-layer K/V blocks (each under glibc's mmap threshold) come
    from the heap between the member's packed weights and small allocations that outlive it, and the heap creeps:
    its peak RSS read 2.08-2.17 GB over five runs against 2.07-2.08 GB with the buffers kept (docs/performance.md,
    "A Zen 5 EPYC"). A buffer's contents are undefined either way, as torch.empty's, so the results keep their
    bits."""

    def __init__(self) -> None:
        self._free: dict[tuple, list[torch.Tensor]] = {}

    def take(self, shape: tuple[int, ...], dtype: torch.dtype, device: Any) -> torch.Tensor:
        """A buffer of this shape, dtype and device: one given back earlier, else a new (uninitialised) one."""
        free = self._free.get((tuple(shape), dtype, torch.device(device)))
        return free.pop() if free else torch.empty(shape, dtype=dtype, device=device)

    def give(self, tensors: Iterable[torch.Tensor]) -> None:
        for t in tensors:
            self._free.setdefault((tuple(t.shape), t.dtype, t.device), []).append(t)

    def clear(self) -> None:
        """Free every buffer held (the owner's batch, and so the caches' shapes, changes)."""
        self._free.clear()

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for free in self._free.values() for t in free)


_REUSE = threading.local()


@contextmanager
def reusing_kv(buffers: KVBuffers) -> Iterator[KVBuffers]:
    """Inside this context (on this thread), KVCaches take their key/value buffers from `buffers` and give them
    back when released (`KVCache.release`, at the end of each lean decode)."""
    previous = getattr(_REUSE, "buffers", None)
    _REUSE.buffers = buffers
    try:
        yield buffers
    finally:
        _REUSE.buffers = previous


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: Any, buffers: KVBuffers | None) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device) if buffers is None else buffers.take(shape, dtype, device)


class KVCache:
    """Preallocated keys/values [rows, kv_heads, capacity, head_dim] per layer, plus the attended-column mask.

    Columns 0..length-1 are in use; a step writes column `length`. Capacity grows by doubling (amortised copy),
    so a 1024-token budget does not allocate 1024 columns for rows that stop after 30. `keep(rows)` compacts the
    batch in place when rows finish.

    `key_tile=T` (what the compiled attention kernel reads, T = its KEY_TILE) stores each layer's keys as
    [rows, kv_heads, capacity / T, head_dim, T]: transposed within tiles of T columns, so that the kernel reads
    each tile as one contiguous block. That is not a view of the logical layout, so keys are written with
    `put_keys` and read back with `keys`; values keep the logical layout either way.

    `lean`: the model's shape, anything with `n_kv`, `head_dim` and `layers` (a `lean_step.LeanModel`).
    """

    def __init__(self, lean: Any, rows: int, capacity: int, dtype: torch.dtype, device,
                 key_tile: int | None = None):
        self.lean = lean
        self.key_tile = key_tile
        self._buffers: KVBuffers | None = getattr(_REUSE, "buffers", None)
        if key_tile:
            capacity = -(-capacity // key_tile) * key_tile
        self.k = [self._new_keys(rows, capacity, dtype, device) for _ in lean.layers]
        self.v = [_empty((rows, lean.n_kv, capacity, lean.head_dim), dtype, device, self._buffers)
                  for _ in lean.layers]
        self.mask = torch.zeros((rows, capacity), dtype=torch.bool, device=device)
        self.rows = rows
        self.length = 0

    def _new_keys(self, rows: int, capacity: int, dtype, device) -> torch.Tensor:
        kv, hd = self.lean.n_kv, self.lean.head_dim
        if not self.key_tile:
            return _empty((rows, kv, capacity, hd), dtype, device, self._buffers)
        return _empty((rows, kv, capacity // self.key_tile, hd, self.key_tile), dtype, device, self._buffers)

    def _key_span(self, columns: int) -> int:
        """Extent along the keys' third axis holding columns 0..columns-1 (tiles when tiled)."""
        return -(-columns // self.key_tile) if self.key_tile else columns

    @property
    def capacity(self) -> int:
        return self.mask.shape[1]

    def put_keys(self, layer: int, rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor) -> None:
        """Write keys [len(rows), kv_heads, len(cols), head_dim] at rows x columns (1-D index tensors)."""
        buf = self.k[layer]
        keys = keys.to(buf.dtype)  # (a bf16 cache rounds fp32 keys once, here)
        if not self.key_tile:
            buf[rows[:, None], :, cols[None, :]] = keys.transpose(1, 2)
            return
        t = self.key_tile
        # advanced indices on axes 0, 2, 4 broadcast to [rows, cols] and come first: [rows, cols, kv, head_dim]
        buf[rows[:, None], :, (cols // t)[None, :], :, (cols % t)[None, :]] = keys.transpose(1, 2)

    def keys(self, layer: int) -> torch.Tensor:
        """The live keys in the logical layout [rows, kv_heads, length, head_dim] (a copy when tiled)."""
        buf = self.k[layer][: self.rows]
        if not self.key_tile:
            return buf[:, :, : self.length]
        r, kv, tiles, hd, t = buf.shape
        return buf.transpose(3, 4).reshape(r, kv, tiles * t, hd)[:, :, : self.length]

    def zero(self, columns: int) -> None:
        """Zero columns 0..columns-1 of every row (gap columns stay masked but must be finite: 0 * NaN leaks)."""
        for buf in self.k:
            buf[:, :, : self._key_span(columns)].zero_()
        for buf in self.v:
            buf[:, :, :columns].zero_()

    def load_prefill(self, hf_cache, attention_mask: torch.Tensor) -> None:
        """Copy the prompt K/V out of a Hugging Face DynamicCache filled by the prefill forward."""
        rows, width = attention_mask.shape
        for i, layer in enumerate(hf_cache.layers):
            if self.key_tile:
                self.put_keys(i, torch.arange(rows), torch.arange(width), layer.keys)
            else:
                self.k[i][:, :, :width].copy_(layer.keys)
            self.v[i][:, :, :width].copy_(layer.values)  # (copy_ rounds to a bf16 cache)
        self.mask[:, :width] = attention_mask.bool()
        self.length = width

    def ensure(self, columns: int) -> None:
        if columns <= self.capacity:
            return
        new = max(columns, 2 * self.capacity)
        if self.key_tile:
            new = -(-new // self.key_tile) * self.key_tile
        span = self._key_span(self.length)
        for i, old in enumerate(self.k):
            buf = self._new_keys(old.shape[0], new, old.dtype, old.device)
            buf[:, :, :span].copy_(old[:, :, :span])
            self.k[i] = buf
        for i, old in enumerate(self.v):
            buf = _empty((old.shape[0], old.shape[1], new, old.shape[3]), old.dtype, old.device, self._buffers)
            buf[:, :, : self.length].copy_(old[:, :, : self.length])
            self.v[i] = buf
        mask = self.mask.new_zeros((self.mask.shape[0], new))
        mask[:, : self.length] = self.mask[:, : self.length]
        self.mask = mask

    def keep(self, index: torch.Tensor) -> None:
        """Keep only rows `index` (ascending), moved to the front; only the used columns of the rows that move are
        copied (those before the first dropped row stay where they are)."""
        n, used = int(index.numel()), self.length
        moved = (index != torch.arange(n, device=index.device)).nonzero()
        first = int(moved[0, 0]) if moved.numel() else n
        index = index[first:]
        span = self._key_span(used)
        for buf in self.k:
            buf[first:n, :, :span] = buf[index, :, :span]
        for buf in self.v:
            buf[first:n, :, :used] = buf[index, :, :used]
        self.mask[first:n, :used] = self.mask[index, :used]
        self.rows = n

    def release(self) -> None:
        """Give the key/value buffers to the `reusing_kv` context the cache was made in, if any; the cache is
        empty afterwards."""
        if self._buffers is not None:
            self._buffers.give(self.k + self.v)
        self.k, self.v, self.rows, self.length = [], [], 0, 0
