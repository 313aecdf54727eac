"""Writing parameters block by block, for esft.es.noise.MasterWeights: storage given back to a lane copy's freed
tensor (`materialise`), the fp32 sum rounded into a lower-precision parameter (`add_rounded`), the table-noise
update (`add_update`), and the accurate squared norm of an update (`sq_norm`).

Every block is a multiple of every vector width and the ops are elementwise, so each element goes through the
same arithmetic as in one whole-tensor call: blocks change the memory traffic, never the bits. Where the compiled
`param_passes` kernel loads (esft.kernels), `add_rounded` and `add_update` run it instead of the torch ops: one
pass per element with the same arithmetic, so the same bits (`add_rounded_torch` and `add_update_torch` keep the
torch ops, for machines without a compiler and for the tests that compare both)."""

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


def release(params) -> None:
    """Free the storage of `params` (their shapes stay): a lane copy's parameters that the engine writes when it
    reads them (`MasterWeights.fill`), as the lean engine frees them once packed (esft.generation.releasing)."""
    for param in params:
        param.untyped_storage().resize_(0)


def released(param: torch.Tensor) -> bool:
    """True when `param` has elements but no storage for them (freed by the lean engine, `materialise` undoes it)."""
    return param.numel() > 0 and param.untyped_storage().nbytes() < (param.storage_offset() + param.numel()) * \
        param.element_size()


#: elements per block of `add_rounded`: 1 MB of fp32, within the L2 or L3 cache between its two passes. One
#: SmolLM2-135M perturbation on one Zen 4 core took 0.11 s with 2^16, 0.075 s with 2^18, 0.067 s with 2^20.
ROUNDING_BLOCK = 1 << 18


def compiled_passes(*tensors: torch.Tensor, out: torch.Tensor | None = None):
    """The compiled `param_passes` module where it loads and can take these tensors (fp32 `tensors` and an fp32 or
    bf16 `out`, all contiguous on the CPU), else None: the caller runs the torch ops."""
    if not all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors):
        return None
    if out is not None and not (out.device.type == "cpu" and out.dtype in (torch.float32, torch.bfloat16)
                                and out.is_contiguous()):
        return None
    from esft.kernels import load_param_passes

    return load_param_passes()


def add_rounded(master: torch.Tensor, eps: torch.Tensor, step: float, out: torch.Tensor) -> None:
    """out <- torch.add(master, eps, alpha=step).to(out.dtype) (fp32 `out` too), in one compiled pass where the
    kernel loads (`compiled_passes`), else `add_rounded_torch`."""
    passes = compiled_passes(master, eps, out=out)
    if passes is None or master.shape != eps.shape or master.numel() != out.numel():
        add_rounded_torch(master, eps, step, out)
        return
    passes.add_rounded(master.view(-1), eps.view(-1), float(step), out.view(-1))


def add_rounded_torch(master: torch.Tensor, eps: torch.Tensor, step: float, out: torch.Tensor) -> None:
    """out <- torch.add(master, eps, alpha=step).to(out.dtype) with torch ops, block by block through one small fp32
    buffer (an fp32 `out` in one pass, with no buffer).

    Why blocks: the whole-tensor fp32 sum is a fresh allocation the size of the tensor (113 MB for SmolLM2's
    embedding), whose pages the kernel must fault in on every perturbation; a block is reused hot from the cache.
    The sum is elementwise and the blocks are multiples of every vector width, so each element goes through the
    same arithmetic as in the whole-tensor call: the result is bit for bit the same."""
    if out.dtype == torch.float32:
        torch.add(master, eps, alpha=step, out=out)  # one pass, no temporary
        return
    if not out.is_contiguous():  # a parameter stored transposed: no flat view to write blocks through
        out.copy_(torch.add(master, eps, alpha=step))
        return
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


def rounded_tiles(masters: list[torch.Tensor], eps: list[torch.Tensor] | None, step: float) -> torch.Tensor | None:
    """round(master + step * eps) (round(master) where `eps` is None) of 2-D fp32 `masters` with the same columns,
    stacked by rows, written straight into the AMX linear's tile layout (esft.generation.packed.tile_layout): what
    `add_rounded` into bf16 weights, a torch.cat and the engine's pack give, bit for bit, in one pass. None where
    the compiled kernel does not run here or cannot take these tensors (both sides multiples of 32, contiguous)."""
    tensors = masters + (eps or [])
    if not all(t.device.type == "cpu" and t.dtype == torch.float32 and t.dim() == 2 and t.is_contiguous()
               and t.shape[1] == masters[0].shape[1] and t.shape[0] % 32 == 0 and t.shape[1] % 32 == 0
               for t in tensors):
        return None
    from esft.kernels import load_amx_linear

    amx = load_amx_linear()
    return None if amx is None else amx.rounded_tiles(masters, eps or [], float(step))


#: elements per block of `add_update`: its working set (accumulator, noise windows, master and parameter blocks,
#: ~20 MB in fp32) stays in a 32 MB L3. Measured on SmolLM2-135M, Zen 4, 2 threads (docs/performance.md), median
#: of one update: 0.19-0.23 s with whole-tensor passes, 0.26-0.32 s with 2^16, 0.18-0.21 s with 2^18, 0.14-0.17 s
#: with 2^20.
UPDATE_BLOCK = 1 << 20

#: elements per row of `sq_norm`: an fp32 sum over 1024 squares stays within ~1e-7 relative
NORM_ROW = 1 << 10


def sq_norm(t: torch.Tensor) -> float:
    """Squared L2 norm of `t`: fp32 norms of rows of NORM_ROW elements (the tail its own row), squared and summed
    in float64. Accurate (within 1e-6 of the float64 norm even for 2^24 equal values, where one fp32 reduction
    over a whole SmolLM2-135M update was 4e-4 off, measured), the same bits at any thread count (each row is
    reduced on one thread), and about as fast as one fp32 reduction."""
    flat = t.reshape(-1)
    k = flat.numel() // NORM_ROW * NORM_ROW
    sq = float(torch.linalg.vector_norm(flat[:k].view(-1, NORM_ROW), dim=1).double().square().sum()) if k else 0.0
    if k < flat.numel():
        sq += float(torch.linalg.vector_norm(flat[k:])) ** 2
    return sq


def update_buffer(largest: int, device) -> torch.Tensor:
    """The accumulator `add_update` needs for tensors of up to `largest` elements."""
    return torch.empty(min(UPDATE_BLOCK, largest), dtype=torch.float32, device=device)


def add_update(master: torch.Tensor, eps: list[tuple[torch.Tensor, float]], scale: float, buf: torch.Tensor,
               out: torch.Tensor | None = None) -> float:
    """master += scale * sum_k c_k eps_k, and out <- master (rounded to out's dtype), block by block through `buf`
    (`update_buffer`); returns the squared norm of the change. Each block in one compiled pass where the kernel
    loads (`compiled_passes`), else `add_update_torch`; the norm is `sq_norm` of each block either way."""
    windows = [e for e, _ in eps]
    passes = compiled_passes(master, *windows, out=out)
    if passes is None or any(e.numel() != master.numel() for e in windows):
        return add_update_torch(master, eps, scale, buf, out)
    m = master.view(-1)
    o = out.view(-1) if out is not None else None
    flats, coefs = [e.reshape(-1) for e in windows], [float(c) for _, c in eps]
    n, sq = m.numel(), 0.0
    for start in range(0, n, UPDATE_BLOCK):
        stop = min(n, start + UPDATE_BLOCK)
        acc = buf[: stop - start]
        passes.add_update(m[start:stop], [e[start:stop] for e in flats], coefs, float(scale), acc,
                          None if o is None else o[start:stop])
        sq += sq_norm(acc)
    return sq


def add_update_torch(master: torch.Tensor, eps: list[tuple[torch.Tensor, float]], scale: float, buf: torch.Tensor,
                     out: torch.Tensor | None = None) -> float:
    """`add_update` with torch ops.

    Per element the arithmetic of the whole-tensor passes: acc = 0; acc += c_k * eps_k in order; acc *= scale;
    master += acc. Whole-tensor passes read and write ~10 model-sized arrays per update; here each block is
    accumulated, applied and copied while it sits in the cache (~4 arrays). `master` and `out` contiguous."""
    m = master.view(-1)
    o = out.view(-1) if out is not None else None
    flats = [(e.reshape(-1), c) for e, c in eps]
    n, sq = m.numel(), 0.0
    for start in range(0, n, UPDATE_BLOCK):
        stop = min(n, start + UPDATE_BLOCK)
        acc = buf[: stop - start]
        acc.zero_()
        for e, c in flats:
            acc.add_(e[start:stop], alpha=c)
        acc.mul_(scale)
        block = m[start:stop]
        block.add_(acc)
        if o is not None:
            o[start:stop].copy_(block)
        sq += sq_norm(acc)
    return sq
