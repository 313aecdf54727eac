"""Seeded Gaussian perturbations of model parameters, regenerated from integer seeds and never stored.

Every perturbation eps of a population member is a function of (member seed, tensor name): the tensor's
generator is seeded with a stable hash of both, so the noise can be rebuilt on any replica (distributed
executors), at update time and at replay time without keeping it in memory.

`MasterWeights` owns an fp32 master copy of the selected parameters. It is the single source of truth:

* perturb:  param <- (master + sign * sigma * eps).to(param.dtype)
* restore:  param <- master.to(param.dtype)           (bit-identical to before the perturbation)
* update:   master += scale * sum_k c_k eps_k  summed in fp32, one tensor at a time; param <- master

Restoring by copying (not by subtracting the noise again) and accumulating in fp32 avoids the two bf16 traps
of public code (REFERENCE.md section 4, trap 2). Noise is drawn on the master's device: a CUDA generator gives
different numbers from a CPU one, so replay must use the device the run used.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import torch

NOISE_MODES = ("per-tensor", "shared-seed")
_SEED_MASK = (1 << 63) - 1


def tensor_seed(seed: int, name: str, mode: str = "per-tensor") -> int:
    """Generator seed for one tensor of one member.

    "per-tensor": sha256(f"{seed}:{name}") truncated to 63 bits, stable across processes and Python versions
    (Python's `hash` is salted per process). "shared-seed": the member seed itself for every tensor, which
    reproduces the public code's trap (same-shaped tensors get identical noise); only for comparison studies.
    """
    if mode == "per-tensor":
        digest = hashlib.sha256(f"{int(seed)}:{name}".encode()).digest()
        return int.from_bytes(digest[:8], "little") & _SEED_MASK
    if mode == "shared-seed":
        return int(seed) & _SEED_MASK
    raise ValueError(f"unknown noise mode {mode!r}; choose one of {NOISE_MODES}")


def gaussian(seed: int, name: str, shape: Sequence[int] | torch.Size, *, mode: str = "per-tensor",
             device: torch.device | str = "cpu", out: torch.Tensor | None = None) -> torch.Tensor:
    """Standard normal fp32 noise for (member seed, tensor name); `out` (fp32, numel >= prod(shape)) avoids
    a fresh allocation — the values do not depend on whether `out` is given."""
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
        raise ValueError(f"no parameters selected (include={list(include or [])}, exclude={list(exclude or [])})")
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
    exact restore) plus, only inside perturb / apply, one or two scratch buffers the size of the largest tensor;
    never a second full-model copy.
    """

    def __init__(self, model: torch.nn.Module, include: Iterable[str] | None = None,
                 exclude: Iterable[str] | None = None, noise: str = "per-tensor"):
        if noise not in NOISE_MODES:
            raise ValueError(f"unknown noise mode {noise!r}; choose one of {NOISE_MODES}")
        self.mode = noise
        self.params = select_parameters(model, include, exclude)
        with torch.no_grad():
            self.master: dict[str, torch.Tensor] = {
                n: p.detach().to(dtype=torch.float32, copy=True) for n, p in self.params.items()
            }
        self._largest = max(p.numel() for p in self.params.values())
        self._device = next(iter(self.params.values())).device
        self.perturbed: tuple[int, int] | None = None

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
        m = self.master[name]
        return gaussian(seed, name, m.shape, mode=self.mode, device=m.device, out=out)

    def _view(self, buf: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return buf[: like.numel()].view(like.shape)

    def _scratch(self) -> torch.Tensor:
        # Allocated per call, not kept: during generation no scratch exists, so the run's peak memory is
        # max(generation, update) rather than their sum.
        return torch.empty(self._largest, dtype=torch.float32, device=self._device)

    # -- perturb / restore
    @torch.no_grad()
    def perturb(self, seed: int, sign: int, sigma: float) -> None:
        """param <- (master + sign * sigma * eps(seed)).to(param.dtype), in place, for every selected tensor.

        Computed as torch.add(master, eps, alpha=sign * sigma) (one fused pass; the kernel may use FMA), the same
        formula everywhere, so a member's weights are a deterministic function of (master, seed, sign, sigma)."""
        if self.perturbed is not None:
            raise RuntimeError("perturb() called on already perturbed weights; call restore() first")
        step = float(sign) * float(sigma)
        scratch = self._scratch()
        for name, param in self.params.items():
            eps = self.noise(seed, name, out=scratch)
            if param.dtype == torch.float32:
                torch.add(self.master[name], eps, alpha=step, out=param.data)  # one pass, no temporary
            else:
                param.copy_(torch.add(self.master[name], eps, alpha=step))
        self.perturbed = (int(seed), int(sign))

    @torch.no_grad()
    def restore(self) -> None:
        """param <- master: bit-identical to the unperturbed weights (a copy, never a subtraction)."""
        for name, param in self.params.items():
            param.copy_(self.master[name])
        self.perturbed = None

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
        if update.is_zero:
            return 0.0
        if update.kind == "gradient" and optimizer is None:
            raise ValueError("a 'gradient' update needs an optimizer")
        sq = 0.0
        acc_buf, scratch = self._scratch(), self._scratch()  # one tensor's accumulator at a time
        for name, param in self.params.items():
            master = self.master[name]
            acc = self.direction(name, update, acc=acc_buf, scratch=scratch)
            if update.kind == "sgd":
                acc.mul_(float(update.scale))
                master.add_(acc)
                # vector_norm reduces without a temporary (a .double().pow(2) would allocate 3x the tensor)
                sq += float(torch.linalg.vector_norm(acc)) ** 2
            elif update.kind == "gradient":
                before = self._view(scratch, master)
                before.copy_(master)
                acc.mul_(float(update.scale))
                master.grad = acc
                # Per-tensor step: Adam-type optimizers are elementwise, so stepping one tensor at a time gives
                # the same result as one global step and needs one gradient buffer instead of a model's worth.
                optimizer.step()
                master.grad = None
                sq += float(torch.linalg.vector_norm(before.sub_(master))) ** 2
            else:
                raise ValueError(f"unknown update kind {update.kind!r}")
            param.copy_(master)
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
