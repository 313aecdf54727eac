"""What a member lane of esft.es.executor.LocalExecutor needs from the process: its own copy of the model
(`rollout_replica`), glibc's allocator kept from hoarding the copies' freed blocks (`map_large_blocks`), and
torch's OpenMP backend, whose per-thread team sizes give each lane its share of the cores (`openmp_backend`)."""

from __future__ import annotations

import copy
import ctypes
import functools
from typing import Any

import torch


def rollout_replica(model: Any, dtype: torch.dtype | None = None) -> Any:
    """A copy of `model` for a member lane. With `dtype` (bf16 rollouts) its floating parameters are new, empty
    tensors of that dtype (to be written by `MasterWeights.bind(...).perturb` / `restore`; unselected ones by the
    executor's sync), so the copy never holds a second fp32 model, not even while it is made; tied weights stay
    tied. Buffers are copied as they are."""
    if dtype is None:
        return copy.deepcopy(model)
    memo: dict[int, Any] = {}
    for p in model.parameters():  # de-duplicated: a tied weight gets one copy
        if p.is_floating_point():
            memo[id(p)] = torch.nn.Parameter(torch.empty(p.shape, dtype=dtype, device=p.device), requires_grad=False)
    return copy.deepcopy(model, memo)


#: glibc's mmap threshold while lanes run (`map_large_blocks`): above every per-layer block of SmolLM2-sized models
#: (plain and packed projections, a layer's K/V cache: under 8 MB in fp32), below the whole-model ones (embedding,
#: lm_head, noise table). Measured on the cpu preset, two lanes, Zen 4 (docs/performance.md, "Page faults"):
#: with 1 MiB every member's packed weights and caches came from fresh mappings, faulted in and zeroed by the
#: kernel: 13-44% more generation time and ~2x the perturbation time than with 8 MiB, for 0.05-0.34 GB less
#: peak RSS.
MMAP_THRESHOLD = 8 << 20


@functools.lru_cache(maxsize=1)
def map_large_blocks(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's malloc mmap threshold at `threshold` bytes (True where it took). Lane copies free their
    projections, packed weights and caches at every generation and allocate them again for the next member, on
    two threads. glibc's default raises its threshold to the largest block freed (up to 32 MB), after which
    whole-model blocks stay in per-thread heaps beside the other lane's: +1.2 GB resident on the cpu preset
    (docs/performance.md, "Memory"). A fixed threshold maps whole-model blocks one by one and gives them back
    when freed, while per-layer blocks are reused from the heap, already faulted in (`MMAP_THRESHOLD`).
    Process-wide, set once, when the first lane copy is made."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, int(threshold)))  # -3: M_MMAP_THRESHOLD (fixed, no longer dynamic)
    except (OSError, AttributeError):  # not glibc
        return False


@functools.lru_cache(maxsize=1)
def openmp_backend() -> bool:
    """torch's intra-op pool is OpenMP: `torch.set_num_threads` then sets the calling thread's team size."""
    info = torch.__config__.parallel_info()
    return "ATen parallel backend: OpenMP" in info
