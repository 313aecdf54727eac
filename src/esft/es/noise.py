"""Seeded Gaussian perturbations of model parameters, regenerated from integer seeds and never stored.

Every perturbation eps of a population member is a function of (member seed, tensor name): the tensor's
generator is seeded with a stable hash of both, so the noise can be rebuilt on any replica (distributed
executors), at update time and at replay time without keeping it in memory.

`MasterWeights` owns an fp32 master copy of the selected parameters. It is the single source of truth:

* perturb:  param <- (master + sign * sigma * eps).to(param.dtype)
* restore:  param <- master.to(param.dtype)           (bit-identical to before the perturbation)
* update:   master += scale * sum_k c_k eps_k  summed in fp32, one tensor at a time; param <- master

Restoring by copying (not by subtracting the noise again) and accumulating in fp32 avoids the two bf16 traps
of public code (a restore by subtraction is not exact in bf16; a bf16 sum of member updates drops small
steps). Noise is drawn on the master's device: a CUDA generator gives
different numbers from a CPU one, so replay must use the device the run used.

Speed (esft bench, docs/performance.md): regenerating N(0,1) for 134.5M parameters costs ~0.7-1 s of one core,
and torch's CPU generator is sequential per tensor. Tensors have independent generators, so perturb / apply
draw several tensors at once on `workers` threads (default: torch's thread count); every tensor's values and
the order of every floating-point sum are unchanged, so results are bit-identical to one thread. Noise mode
"table" goes further: eps for (seed, tensor) is a window of one shared, fixed N(0,1) table at an offset hashed
from (seed, name) (Salimans et al. 2017's shared noise table), so a perturbation is a memory-bound add instead
of a generator pass. The table (2^26 floats, or twice the largest tensor) can be smaller than the model (135M
parameters for SmolLM2), so one member's windows for two tensors may overlap and repeat values; but each
window's offset is an independent uniform draw per (seed, tensor), so over seeds E[eps eps^T] is the identity up
to the table's sample moments, and two windows at different offsets are uncorrelated (shifted copies of an i.i.d.
sequence): the ES estimator and the random-walk law hold in expectation. The numbers differ from
"per-tensor", so a run must keep one mode (it is part of the run config).
"""

from __future__ import annotations

import copy
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import torch

from esft.es.param_writes import (add_rounded, add_update, materialise, released, rounded_tiles, sq_norm,
                                  update_buffer)

from esft.es.noise_seeds import (NOISE_MODES, TABLE_BLOCK, TABLE_MIN, noise_table, table_size,  # noqa: F401
                                 table_window, tensor_seed)


def gaussian(seed: int, name: str, shape: Sequence[int] | torch.Size, *, mode: str = "per-tensor",
             device: torch.device | str = "cpu", out: torch.Tensor | None = None,
             table: torch.Tensor | None = None) -> torch.Tensor:
    """Standard normal fp32 noise for (member seed, tensor name); `out` (fp32, numel >= prod(shape)) avoids
    a fresh allocation — the values do not depend on whether `out` is given. Mode "table" reads a window of
    `table` (default: the table sized for this tensor alone; `MasterWeights` passes the one sized for the model)
    and returns a copy."""
    if mode == "table":
        shape = torch.Size(shape)
        table = noise_table(table_size(shape.numel()), device) if table is None else table
        window = table_window(seed, name, shape, table)
        if out is None:
            return window.clone()
        return out.view(-1)[: shape.numel()].view(shape).copy_(window)
    gen = torch.Generator(device=device)
    gen.manual_seed(tensor_seed(seed, name, mode))
    shape = torch.Size(shape)
    if out is None:
        return torch.randn(shape, generator=gen, dtype=torch.float32, device=device)
    view = out.view(-1)[: shape.numel()].view(shape)
    return torch.randn(shape, generator=gen, dtype=torch.float32, device=device, out=view)


# ---- parameter selection ----------------------------------------------------------------------------------

#: Name patterns of normalisation gains (RMSNorm / LayerNorm); pass as `exclude` to keep them frozen
#: (the study reports that RMSNorm gains saturate and break the random-walk law).
NORM_PATTERNS: tuple[str, ...] = (r"norm",)


def select_parameters(model: torch.nn.Module, include: Iterable[str] | None = None,
                      exclude: Iterable[str] | None = None) -> dict[str, torch.nn.Parameter]:
    """Floating-point parameters to perturb, by name, in the model's registration order.

    `include` / `exclude` are regular expressions searched in the parameter name (`re.search`); a parameter is
    kept when it matches any include pattern (all when None) and no exclude pattern. Tied weights (e.g. input
    embedding and lm_head) appear once, under their first name, because `named_parameters` de-duplicates by
    identity — so they are perturbed once and counted once in d.
    """
    inc = [re.compile(p) for p in (include or [])]
    exc = [re.compile(p) for p in (exclude or [])]
    chosen: dict[str, torch.nn.Parameter] = {}
    for name, param in model.named_parameters():
        if not param.is_floating_point():
            continue
        if inc and not any(p.search(name) for p in inc):
            continue
        if any(p.search(name) for p in exc):
            continue
        chosen[name] = param
    if not chosen:
        names = [name for name, param in model.named_parameters() if param.is_floating_point()]
        raise ValueError(f"no parameters selected (include={list(include or [])}, exclude={list(exclude or [])}) "
                         f"among the model's {len(names)} floating-point parameters, e.g. "
                         f"{', '.join(names[:2] + names[2:][-1:])}")
    return chosen


# ---- the update description shared with the strategy ---------------------------------------------------------

@dataclass(frozen=True)
class Update:
    """A parameter update as a weighted sum of seeded noise: direction = sum_k coefficients[k] * eps(seeds[k]).

    kind "sgd":      master += scale * direction                     (paper: scale = alpha / N)
    kind "gradient": master.grad = scale * direction; optimizer.step() (scale = -1 / (N sigma): torch minimises,
                     esft maximises reward, so the gradient handed to torch is minus the fitness gradient)
    Coefficients already include each member's sign (antithetic pairs are folded into one term per seed).
    """

    seeds: tuple[int, ...]
    coefficients: tuple[float, ...]
    scale: float
    kind: str = "sgd"

    @property
    def is_zero(self) -> bool:
        return self.scale == 0.0 or all(c == 0.0 for c in self.coefficients)


# ---- master weights -------------------------------------------------------------------------------------------

class MasterWeights:
    """fp32 master copy of the selected parameters of a model, with exact perturb / restore / update.

    Memory: one fp32 copy of the selected parameters (for an fp32 model this *is* the snapshot needed for an
    exact restore) plus, only inside perturb / apply, one or two scratch buffers per noise worker, each the size of
    the largest tensor that worker draws (the largest tensor once, not once per worker); never a second full-model
    copy.
    """

    def __init__(self, model: torch.nn.Module, include: Iterable[str] | None = None,
                 exclude: Iterable[str] | None = None, noise: str = "per-tensor", workers: int | None = None,
                 share_storage: bool = False):
        if noise not in NOISE_MODES:
            raise ValueError(f"unknown noise mode {noise!r}; choose one of {NOISE_MODES}")
        self.mode = noise
        self.params = select_parameters(model, include, exclude)
        # share_storage: the masters *are* the model's fp32 parameters (no second copy). Only for a model that is
        # never perturbed, because rollouts run on other copies bound with `bind` (bf16 rollouts): perturb() on
        # this object is then refused, and restore/apply have nothing to copy.
        # Masters are contiguous (the table update walks them as flat blocks), so a parameter stored transposed
        # gets a contiguous copy rather than shared storage.
        self.shared = bool(share_storage) and all(p.dtype == torch.float32 and p.is_contiguous()
                                                  for p in self.params.values())
        with torch.no_grad():
            self.master: dict[str, torch.Tensor] = {
                n: p.detach() if self.shared else p.detach().to(dtype=torch.float32, copy=True,
                                                                memory_format=torch.contiguous_format)
                for n, p in self.params.items()
            }
        self._largest = max(p.numel() for p in self.params.values())
        self._device = next(iter(self.params.values())).device
        self.perturbed: tuple[int, int] | None = None
        # Deferred writes (bound copies only, `bind`): a parameter the lean engine has freed (esft.generation.
        # releasing) is left unwritten by perturb / restore and written with the latest of them, `_op`, when the
        # engine reads it (`fill`). The model's own parameters are never freed, so never deferred.
        self._bound = False
        self._op: tuple = ("restore",)  # the latest perturb / restore: what every parameter of a copy should hold
        self._names_by_id: dict[int, str] = {}
        self.workers = workers
        """threads drawing noise in perturb / apply (None: torch.get_num_threads() for generated noise, 1 for
        "table" noise, whose adds are memory-bound and already parallel inside torch)"""
        self._table: torch.Tensor | None = None
        if noise == "table":  # built (or fetched) now: a one-time cost of the run, not of its first perturbation
            self._table = noise_table(table_size(self._largest), self._device)

    def bind(self, model: torch.nn.Module, cast: bool = False) -> "MasterWeights":
        """The same masters, selection and noise acting on another copy of the model (a parallel member lane of
        `esft.es.executor.LocalExecutor`): its perturb / restore write that copy's parameters. The masters are
        shared, not copied, so an update applied through `self` reaches every bound copy at its next perturb or
        restore. Each bound object has its own perturbation state. `cast`: the copy's parameters may have another
        floating dtype (bf16 rollouts: perturb writes round(master + sign * sigma * eps) into them)."""
        other = copy.copy(self)
        theirs = dict(model.named_parameters())
        if any(n not in theirs or theirs[n].shape != p.shape
               or (theirs[n].dtype != p.dtype and not (cast and theirs[n].is_floating_point()))
               for n, p in self.params.items()):
            raise ValueError("bind(): the model's selected parameters differ in names, shapes or dtypes")
        other.params = {n: theirs[n] for n in self.params}
        if any(other.params[n] is p for n, p in self.params.items()):
            raise ValueError("bind(): the model shares parameters with the bound one; pass a copy")
        other.perturbed = None
        other.shared = False
        # a copy's released parameters are written when the engine reads them (`fill`), not by perturb / restore
        other._bound = True
        other._names_by_id = {id(p): n for n, p in other.params.items()}
        return other

    # -- introspection
    @property
    def names(self) -> list[str]:
        return list(self.params)

    @property
    def num_params(self) -> int:
        """d: number of perturbed scalars (tied weights counted once)."""
        return sum(p.numel() for p in self.params.values())

    @property
    def dtypes(self) -> dict[str, int]:
        """Parameter dtypes of the model (string -> number of tensors), for the run's precision record."""
        out: dict[str, int] = {}
        for p in self.params.values():
            key = str(p.dtype).replace("torch.", "")
            out[key] = out.get(key, 0) + 1
        return out

    def noise(self, seed: int, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        """eps(seed) of one tensor. Treat the result as read-only: in "table" mode it is a view of the shared
        table (no copy, `out` unused)."""
        m = self.master[name]
        if self.mode == "table":
            if self._table is None:
                self._table = noise_table(table_size(self._largest), self._device)
            return table_window(seed, name, m.shape, self._table)
        return gaussian(seed, name, m.shape, mode=self.mode, device=m.device, out=out)

    def _n_workers(self) -> int:
        if self.workers is not None:
            return max(1, int(self.workers))
        if self.mode == "table" or self._device.type != "cpu":
            return 1
        return max(1, min(torch.get_num_threads(), len(self.params)))

    def _map(self, fn: Callable[[str, list[torch.Tensor]], float | None], buffers: int) -> list:
        """fn(name, scratch buffers) for every selected tensor, results in parameter order.

        With several workers, each thread owns its own scratch buffers and tensors are handed out largest first
        (the embedding alone is ~20% of a small model). torch releases the GIL inside its kernels, so the
        per-tensor generators run concurrently; no library call draws several seeded streams at once.
        """
        names = list(self.params)
        workers = min(self._n_workers(), len(names))
        if workers <= 1 or buffers == 0:
            bufs = [self._scratch() for _ in range(buffers)]
            return [fn(n, bufs) for n in names]
        local = threading.local()

        def run(name: str):
            # sized to the tensor, not the model's largest: tensors go out largest first, so a thread's first is
            # its largest, and only the thread that draws the largest holds buffers of its size
            need = self.params[name].numel()
            bufs = getattr(local, "bufs", None)
            if bufs is None or bufs[0].numel() < need:
                bufs = local.bufs = [self._scratch(need) for _ in range(buffers)]
            with torch.no_grad():  # grad mode is thread-local: the caller's no_grad does not reach workers
                return fn(name, bufs)

        order = sorted(range(len(names)), key=lambda i: -self.params[names[i]].numel())
        results: list = [None] * len(names)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="esft-noise") as pool:
            futures = {i: pool.submit(run, names[i]) for i in order}
            for i, fut in futures.items():
                results[i] = fut.result()
        return results

    def _view(self, buf: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return buf[: like.numel()].view(like.shape)

    def _scratch(self, numel: int | None = None) -> torch.Tensor:
        # Allocated per call, not kept: during generation no scratch exists, so the run's peak memory is
        # max(generation, update) rather than their sum.
        return torch.empty(self._largest if numel is None else numel, dtype=torch.float32, device=self._device)

    # -- perturb / restore
    @torch.no_grad()
    def perturb(self, seed: int, sign: int, sigma: float, replace: bool = False) -> None:
        """param <- (master + sign * sigma * eps(seed)).to(param.dtype), in place, for every selected tensor.

        Computed as torch.add(master, eps, alpha=sign * sigma) (one fused pass; the kernel may use FMA), the same
        formula everywhere, so a member's weights are a deterministic function of (master, seed, sign, sigma).
        Every selected parameter is written from the masters, never from its current value, so `replace=True`
        may perturb weights that are already perturbed: the result is bit-identical to restore() then perturb(),
        without the restore's copy (an executor evaluating members back to back restores once, at the end).
        On a bound copy, parameters the lean engine has freed are written later, when it reads them (`fill`)."""
        if self.perturbed is not None and not replace:
            raise RuntimeError("perturb() called on already perturbed weights; call restore() first")
        if self.shared:
            raise RuntimeError("perturb() on masters that share the model's storage; perturb a bound copy")
        step = float(sign) * float(sigma)
        # marked before the first write, so that an exception or Ctrl-C part-way still gets the model restored
        self.perturbed = (int(seed), int(sign))
        op = self._op = ("perturb", int(seed), step)

        def one(name: str, bufs: list[torch.Tensor]) -> None:
            if not self._defer(name):
                self._write(name, op, bufs[0] if bufs else None)

        self._map(one, buffers=0 if self.mode == "table" else 1)

    @torch.no_grad()
    def restore(self) -> None:
        """param <- master: bit-identical to the unperturbed weights (a copy, never a subtraction); for a
        lower-precision copy (`bind(cast=True)`), the masters rounded once."""
        self._op = ("restore",)
        if not self.shared:
            for name in self.params:
                if not self._defer(name):
                    self._write(name, ("restore",))
        self.perturbed = None

    def _defer(self, name: str) -> bool:
        """Leave a bound copy's released parameter unwritten until the engine reads it (`fill`); True if so."""
        return self._bound and released(self.params[name])

    def _write(self, name: str, op: tuple, buf: torch.Tensor | None = None) -> None:
        """One parameter of the current member (op ("perturb", seed, step)) or of the centre (("restore",))."""
        param = materialise(self.params[name])
        if op[0] == "restore":
            param.copy_(self.master[name])
            return
        _, seed, step = op
        add_rounded(self.master[name], self.noise(seed, name, out=buf), step, param.data)

    @torch.no_grad()
    def fill(self, tensors: Iterable[torch.Tensor] | None = None) -> None:
        """Write the deferred parameters among `tensors` (None: all of them) exactly as perturb / restore would
        have: the same function of (master, seed, sign, sigma) per tensor, so the bits do not depend on when.
        The lean engine calls this layer by layer as it packs (esft.generation.fill_released), so a lane copy
        holds one layer of plain projections at a time. Masters must not change between the perturb / restore
        and the fill (the executor applies updates only between populations, after every lane's generation)."""
        if not self._bound:
            return
        names = list(self.params) if tensors is None else [self._names_by_id[id(t)] for t in tensors
                                                            if id(t) in self._names_by_id]
        for name in names:  # freed before the latest perturb / restore, or after it (`VocabRows.free`)
            if released(self.params[name]):
                self._write(name, self._op)

    @torch.no_grad()
    def rows(self, tensor: torch.Tensor, index: torch.Tensor | slice, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows `index` (int64 row ids, or a slice) of a bound copy's 2-D parameter `tensor` as the latest perturb /
        restore makes them, computed from the masters whether or not the parameter is written or freed: the
        engine's source for a freed vocabulary matrix (esft.generation.vocab). The same elementwise arithmetic as
        the whole-tensor write, so the same bits for rows whose length is a multiple of the vector widths (the
        engine asks only then). Table noise only: other modes would draw the whole tensor's noise per call.
        `out`: a buffer of the rows' shape and dtype the result may be written to. Read-only: a slice of a restore
        may be a view of the masters."""
        if self.mode != "table":
            raise ValueError("rows() needs table noise")
        name = self._names_by_id[id(tensor)]
        master = self.master[name][index]
        if self._op[0] == "restore":
            return master.to(tensor.dtype)
        _, seed, step = self._op
        eps = self.noise(seed, name)[index]
        if tensor.dtype == torch.float32:
            return torch.add(master, eps, alpha=step, out=out)
        out = torch.empty(master.shape, dtype=tensor.dtype, device=master.device) if out is None else out
        add_rounded(master, eps, step, out)
        return out

    @torch.no_grad()
    def tiles(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
        """Freed bf16 parameters of a bound copy (`tensors`, with the same columns) as the latest perturb / restore
        makes them, stacked by rows and written straight into the AMX linear's tile layout (`rounded_tiles`):
        the engine's packed weight without the parameters' own storage, a stacking copy or a pack (the lean engine
        asks layer by layer, esft.generation.packed.released_tiles). None where that cannot run here: the engine
        then has them written (`fill`), stacks and packs them."""
        if not self._bound or any(t.dtype != torch.bfloat16 for t in tensors):
            return None
        names = [self._names_by_id[id(t)] for t in tensors]
        restore = self._op[0] == "restore"
        eps = None if restore else [self.noise(self._op[1], n) for n in names]
        return rounded_tiles([self.master[n] for n in names], eps, 0.0 if restore else self._op[2])

    @property
    def deferred(self) -> list[str]:
        """Names of the parameters whose write waits for `fill` (empty unless this is a bound copy)."""
        return [n for n, p in self.params.items() if released(p)] if self._bound else []

    # -- update
    @torch.no_grad()
    def direction(self, name: str, update: Update, acc: torch.Tensor | None = None,
                  scratch: torch.Tensor | None = None) -> torch.Tensor:
        """sum_k c_k eps_k for one tensor, accumulated in fp32 in a fixed order (deterministic)."""
        m = self.master[name]
        acc = torch.empty_like(m) if acc is None else self._view(acc, m)
        scratch = self._scratch() if scratch is None else scratch
        acc.zero_()
        for seed, coef in zip(update.seeds, update.coefficients):
            if coef == 0.0:
                continue
            acc.add_(self.noise(seed, name, out=scratch), alpha=float(coef))
        return acc

    @torch.no_grad()
    def apply(self, update: Update, optimizer: torch.optim.Optimizer | None = None) -> float:
        """Apply an update to the masters (one tensor at a time) and copy them into the model.

        Returns the L2 norm of the change of the master weights (0.0 for a zero update, which is skipped
        entirely so an all-equal-fitness iteration cannot introduce rounding or NaN).
        """
        if self.perturbed is not None:
            raise RuntimeError("apply() on perturbed weights; call restore() first")
        # a malformed call is refused whatever its values, so a caller's bug cannot hide behind a zero update
        if update.kind not in ("sgd", "gradient"):
            raise ValueError(f"unknown update kind {update.kind!r}")
        if update.kind == "gradient" and optimizer is None:
            raise ValueError("a 'gradient' update needs an optimizer")
        if update.is_zero:
            return 0.0
        if update.kind == "sgd" and self.mode == "table":
            return self._apply_table_sgd(update)
        if update.kind == "sgd":
            def one(name: str, bufs: list[torch.Tensor]) -> float:
                master, param = self.master[name], self.params[name]
                acc = self.direction(name, update, acc=bufs[0], scratch=bufs[1])
                acc.mul_(float(update.scale))
                master.add_(acc)
                if not self.shared:
                    param.copy_(master)
                return sq_norm(acc)

            # tensors are independent, so they may run on several threads; the norm is summed in parameter
            # order afterwards (sum adds left to right), exactly as a single loop would
            return sum(self._map(one, buffers=2), 0.0) ** 0.5
        sq = 0.0
        acc_buf, scratch = self._scratch(), self._scratch()  # one tensor's accumulator at a time
        for name, param in self.params.items():
            # sequential: the optimizer steps whichever masters hold a .grad, so tensors must not overlap
            master = self.master[name]
            acc = self.direction(name, update, acc=acc_buf, scratch=scratch)
            before = self._view(scratch, master)
            before.copy_(master)
            acc.mul_(float(update.scale))
            master.grad = acc
            # Per-tensor step: Adam-type optimizers are elementwise, so stepping one tensor at a time gives
            # the same result as one global step and needs one gradient buffer instead of a model's worth.
            optimizer.step()
            master.grad = None
            sq += sq_norm(before.sub_(master))
            if not self.shared:
                param.copy_(master)
        return sq ** 0.5

    def _apply_table_sgd(self, update: Update) -> float:
        """The "sgd" update with table noise block by block (`add_update`: the masters of whole-tensor passes, bit
        for bit, with ~2.5x less memory traffic); the table's windows are views, so noise costs no draw."""
        terms = [(seed, float(coef)) for seed, coef in zip(update.seeds, update.coefficients) if coef != 0.0]
        buf, sq = update_buffer(self._largest, self._device), 0.0
        for name, param in self.params.items():
            out = None if self.shared or not param.is_contiguous() else param
            sq += add_update(self.master[name], [(self.noise(s, name), c) for s, c in terms], update.scale, buf, out)
            if out is None and not self.shared:
                param.copy_(self.master[name])
        return sq ** 0.5

    # -- state
    @torch.no_grad()
    def sync_from_model(self) -> None:
        """Reload masters from the model's parameters (after loading fp32 weights into the model)."""
        for name, param in self.params.items():
            self.master[name].copy_(param)

    @torch.no_grad()
    def load_masters(self, tensors: dict[str, torch.Tensor]) -> None:
        """Set masters from saved fp32 tensors and copy them into the model."""
        missing = set(self.master) - set(tensors)
        if missing:
            raise KeyError(f"saved masters lack {sorted(missing)[:5]}")
        for name, master in self.master.items():
            master.copy_(tensors[name])
            self.params[name].copy_(master)

    def all_fp32(self) -> bool:
        return all(p.dtype == torch.float32 for p in self.params.values())

    def iter_masters(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.master.items())
