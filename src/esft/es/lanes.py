"""What a member lane of esft.es.executor.LocalExecutor needs from the process: its own copy of the model
(`rollout_replica`), the memory for it (`lanes_that_fit`), glibc's allocator kept from hoarding the copies' freed
blocks (`map_large_blocks`), and torch's OpenMP backend, whose per-thread team sizes give each lane its share of the
cores (`openmp_backend`)."""

from __future__ import annotations

import copy
import ctypes
import functools
import math
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


def return_freed_heap() -> bool:
    """Give the pages of the heap's freed blocks back to the kernel (glibc's `malloc_trim(0)`); True where it
    released any. Called once, when lane copies have been made: a copy's plain matrices, released right after it
    is made (the engine writes each when it reads it), leave ~400 MiB of freed heap for SmolLM2 in fp32, and when
    a small block allocated meanwhile lies above them glibc cannot shrink the heap past it, so those pages stay
    resident. On a Zen 5 EPYC that happened in 2 of 14 probed runs of the cpu preset, whose peak RSS then read
    2.16-2.17 GB against 2.03-2.14 in the others (docs/performance.md, "A Zen 5 EPYC")."""
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):  # not glibc
        return False


@functools.lru_cache(maxsize=1)
def openmp_backend() -> bool:
    """torch's intra-op pool is OpenMP: `torch.set_num_threads` then sets the calling thread's team size."""
    info = torch.__config__.parallel_info()
    return "ATen parallel backend: OpenMP" in info


#: A lane's peak over its weights' bytes (its rollout dtype's). Measured on the cpu preset with SmolLM2-135M
#: (docs/results/bench/peak-rss-2026-12-02b): each fp32 lane added ~892 MiB for 513 MiB of weights, each bf16
#: lane ~539 MiB for 257 MiB (packed projections, K/V cache, the lm_head screen, freed heap kept by glibc), so
#: 1.74x and 2.10x. A larger model's K/V cache and screen weigh less beside its weights: 2.1x overestimates it.
LANE_PEAK_OVER_WEIGHTS = 2.1


def lane_bytes(model: Any, dtype: torch.dtype | None = None) -> int:
    """Estimated peak bytes of one lane copy of `model` whose floating parameters are `dtype` (None: as they
    are); `parameters()` yields a tied weight once."""
    weights = sum(p.numel() * (dtype.itemsize if dtype is not None and p.is_floating_point() else p.element_size())
                  for p in model.parameters())
    return int(weights * LANE_PEAK_OVER_WEIGHTS)


def lanes_that_fit(lanes: int, copies_per_lane_zero: int, per_lane: int, available: int | None) -> int:
    """How many of `lanes` lanes (1 <= result <= lanes) have memory for their copies: lane 0 needs
    `copies_per_lane_zero` (0 when it runs on the model itself, 1 when every lane is a copy), every other lane one
    copy of `per_lane` bytes. `available` None (unknown) leaves `lanes` as they are; one lane is never refused
    (its copy, if any, is part of running at all)."""
    if available is None or lanes <= 1 or per_lane <= 0:
        return max(1, lanes)
    spare = available - copies_per_lane_zero * per_lane
    return max(1, min(lanes, 1 + math.floor(spare / per_lane)))


def available_memory(meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup") -> int | None:
    """Bytes the process can still take without swapping: the kernel's MemAvailable, lowered to what a cgroup
    memory limit (v2 `memory.max`, v1 `memory/memory.limit_in_bytes`) leaves over the group's usage net of its
    inactive page cache, which the kernel reclaims first. None when neither is readable."""
    available = _meminfo_available(meminfo)
    for limit_name, usage_name, stat_name in (("memory.max", "memory.current", "memory.stat"),
                                              ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes",
                                               "memory/memory.stat")):
        try:
            limit_text = open(f"{cgroup}/{limit_name}").read().strip()
            usage = int(open(f"{cgroup}/{usage_name}").read())
        except (OSError, ValueError):
            continue
        if limit_text == "max" or int(limit_text) >= 1 << 60:  # no limit (v1 writes a huge page-aligned number)
            break
        left = int(limit_text) - max(0, usage - _stat_value(f"{cgroup}/{stat_name}", "inactive_file"))
        available = left if available is None else min(available, left)
        break
    return available


def _meminfo_available(path: str) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _stat_value(path: str, key: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0
