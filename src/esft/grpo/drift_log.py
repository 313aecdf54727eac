"""Weight drift ||theta_t - theta_0||^2 after every optimizer step, without writing a checkpoint per step.

`drift.jsonl` holds one record per step with the same keys as ES's `esft.es.replay.drift` (`step`, `total`,
`num_params`, `per_tensor`, `numel`), so the drift analysis reads ES and GRPO runs alike. theta_0 is an fp32
copy of the initial weights (or the frozen KL reference, which is the same tensor values, so no second copy);
differences are taken and squared in float64 chunk by chunk, which is exact for fp32 inputs and keeps the extra
memory to a few MB instead of a float64 copy of the largest tensor.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterable

import torch
from transformers import TrainerCallback

from esft.rundir import append_jsonl

_CHUNK = 1 << 20  # elements per float64 chunk (8 MB)


@torch.no_grad()
def squared_drift(params: Iterable[tuple[str, torch.Tensor]], base: dict[str, torch.Tensor]
                  ) -> tuple[float, dict[str, float]]:
    """(sum over tensors, per tensor) of ||p - base[name]||^2, accumulated in float64."""
    per: dict[str, float] = {}
    for name, p in params:
        a = p.detach().reshape(-1)
        b = base[name].detach().reshape(-1).to(a.device)
        acc = torch.zeros((), dtype=torch.float64, device=a.device)
        for start in range(0, a.numel(), _CHUNK):
            d = a[start:start + _CHUNK].double() - b[start:start + _CHUNK].double()
            acc += d.square().sum()
        per[name] = float(acc)
    return sum(per.values()), per


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """fp32 copy of every parameter (tied weights once, as named_parameters lists them)."""
    return {n: p.detach().to(torch.float32, copy=True) for n, p in model.named_parameters()}


class DriftCallback(TrainerCallback):
    """Appends ||theta_t - theta_0||^2 (total and per tensor) to `path` after every optimizer step."""

    def __init__(self, path: str | Path, base: dict[str, torch.Tensor]):
        self.path = Path(path)
        self.base = base
        self.numel = {n: int(t.numel()) for n, t in base.items()}
        self.last_seconds = 0.0
        self.last: tuple[int, float] | None = None  # (step, total) of the latest record

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any):
        t0 = time.perf_counter()
        params = [(n, p) for n, p in model.named_parameters() if n in self.base]
        total, per = squared_drift(params, self.base)
        append_jsonl(self.path, {"step": int(state.global_step), "total": total,
                                 "num_params": sum(self.numel.values()), "per_tensor": per, "numel": self.numel})
        self.last = (int(state.global_step), total)
        self.last_seconds = time.perf_counter() - t0
        return control
