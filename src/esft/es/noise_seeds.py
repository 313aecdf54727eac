"""The seeds of ES noise: the stable per-tensor seed hash, and the shared N(0,1) table that "table" noise reads
windows of (esft.es.noise explains both modes; it re-exports these names)."""

from __future__ import annotations

import hashlib
import threading
from typing import Sequence

import torch

NOISE_MODES = ("per-tensor", "shared-seed", "table")
_SEED_MASK = (1 << 63) - 1

#: noise-table geometry: blocks of 2^22 floats, each from its own seeded generator, so a table of any size has the
#: same prefix; at least 2^26 floats (256 MB) and at least twice the largest perturbed tensor
TABLE_BLOCK = 1 << 22
TABLE_MIN = 1 << 26
_TABLES: dict[tuple[int, str], torch.Tensor] = {}
_TABLES_LOCK = threading.Lock()


def tensor_seed(seed: int, name: str, mode: str = "per-tensor") -> int:
    """Generator seed for one tensor of one member.

    "per-tensor": sha256(f"{seed}:{name}") truncated to 63 bits, stable across processes and Python versions
    (Python's `hash` is salted per process). "shared-seed": the member seed itself for every tensor, which
    reproduces the public code's trap (same-shaped tensors get identical noise); only for comparison studies.
    """
    if mode in ("per-tensor", "table"):
        digest = hashlib.sha256(f"{int(seed)}:{name}".encode()).digest()
        return int.from_bytes(digest[:8], "little") & _SEED_MASK
    if mode == "shared-seed":
        return int(seed) & _SEED_MASK
    raise ValueError(f"unknown noise mode {mode!r}; choose one of {NOISE_MODES}")


def table_size(largest: int) -> int:
    """Floats in the noise table for tensors of at most `largest` elements."""
    blocks = -(-max(TABLE_MIN, 2 * int(largest)) // TABLE_BLOCK)
    return blocks * TABLE_BLOCK


def noise_table(size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The shared fp32 N(0,1) table of `size` floats (a multiple of TABLE_BLOCK), built once per process and
    device. Block b is drawn by a generator seeded with tensor_seed(b, "noise-table"), so it is the same on every
    replica and for every table size. Read-only: callers must never modify it."""
    device = torch.device(device)
    key = (int(size), str(device))
    with _TABLES_LOCK:
        table = _TABLES.get(key)
        if table is None:
            if size % TABLE_BLOCK:
                raise ValueError(f"table size must be a multiple of {TABLE_BLOCK}")
            table = torch.empty(size, dtype=torch.float32, device=device)
            gen = torch.Generator(device=device)
            for b in range(size // TABLE_BLOCK):
                gen.manual_seed(tensor_seed(b, "noise-table"))
                torch.randn(TABLE_BLOCK, generator=gen, dtype=torch.float32, device=device,
                            out=table[b * TABLE_BLOCK:(b + 1) * TABLE_BLOCK])
            _TABLES[key] = table
    return table


def table_window(seed: int, name: str, shape: Sequence[int] | torch.Size, table: torch.Tensor) -> torch.Tensor:
    """eps of (seed, tensor) in "table" mode: a read-only view of `table` at an offset hashed from (seed, name)."""
    shape = torch.Size(shape)
    n = shape.numel()
    if n > table.numel():
        raise ValueError(f"tensor of {n} elements does not fit a noise table of {table.numel()}")
    offset = tensor_seed(seed, name, "table") % (table.numel() - n + 1)
    return table[offset:offset + n].view(shape)
