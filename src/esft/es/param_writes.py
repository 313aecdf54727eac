"""Writing a lane copy's parameters: storage given back to a freed tensor (`materialise`) and the fp32 sum
rounded into a lower-precision parameter block by block (`add_rounded`); used by esft.es.noise.MasterWeights."""

from __future__ import annotations

import torch


def materialise(param: torch.Tensor) -> torch.Tensor:
    """`param` with storage for all its elements again: a lane copy's projections are freed while the lean engine
    holds their packed copies (esft.generation.releasing) and come back here, just before their deferred write
    (`MasterWeights.fill`) or a perturb / restore rewrites every element (their old contents are gone, and nothing
    reads them first)."""
    storage = param.untyped_storage()
    needed = (param.storage_offset() + param.numel()) * param.element_size()
    if storage.nbytes() < needed:
        storage.resize_(needed)
    return param


#: elements per block of `add_rounded`: 1 MB of fp32, within the L2 or L3 cache between its two passes. One
#: SmolLM2-135M perturbation on one Zen 4 core took 0.11 s with 2^16, 0.075 s with 2^18, 0.067 s with 2^20.
ROUNDING_BLOCK = 1 << 18


def add_rounded(master: torch.Tensor, eps: torch.Tensor, step: float, out: torch.Tensor) -> None:
    """out <- torch.add(master, eps, alpha=step).to(out.dtype), block by block through one small fp32 buffer.

    Why blocks: the whole-tensor fp32 sum is a fresh allocation the size of the tensor (113 MB for SmolLM2's
    embedding), whose pages the kernel must fault in on every perturbation; a block is reused hot from the cache.
    The sum is elementwise and the blocks are multiples of every vector width, so each element goes through the
    same arithmetic as in the whole-tensor call: the result is bit for bit the same."""
    m, e, o = master.reshape(-1), eps.reshape(-1), out.view(-1)
    n = m.numel()
    if n <= ROUNDING_BLOCK:
        o.copy_(torch.add(m, e, alpha=step))
        return
    buf = torch.empty(ROUNDING_BLOCK, dtype=torch.float32, device=m.device)
    for start in range(0, n, ROUNDING_BLOCK):
        stop = min(n, start + ROUNDING_BLOCK)
        part = buf[: stop - start]
        torch.add(m[start:stop], e[start:stop], alpha=step, out=part)
        o[start:stop].copy_(part)
