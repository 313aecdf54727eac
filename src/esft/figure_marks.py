"""Marks several esft figures share: the best constant answer's accuracy as a dotted grey line over the light band
of its 95% interval (the run figure's held-out panel, the landscape and sparsity figures, the pass@k figure), and
the 95% Wilson interval of each accuracy a landscape or sparsity point was measured with."""

from __future__ import annotations

from typing import Any, Sequence


def constant_line(ax: Any, value: float, ci95: Sequence[float] | None, label: str, scale: float = 1.0,
                  color: str = "grey") -> None:
    """The constant-answer baseline `value` on `ax`, its interval `ci95` (None: none known) as a band, in the
    axis' units (`scale` 100 for an axis in %), with `label` as its legend entry; `color` the task's where one
    figure holds several tasks' baselines."""
    lo, hi = ci95 if ci95 is not None else (value, value)  # no interval: a band of no height, the line alone
    ax.axhspan(scale * lo, scale * hi, color=color, alpha=0.15, lw=0)
    ax.axhline(scale * value, color=color, ls=":", lw=1.5, label=label)


def interval_bars(ax: Any, xs: Sequence[float], values: Sequence[float], n: int, color: str,
                  label: str | None = None) -> None:
    """Each accuracy of `values` (at `xs`), measured over `n` examples, with its 95% Wilson interval as a thin bar
    in `color`: the tables print these intervals beside the same numbers, and without them a step of one or two
    examples reads as an effect."""
    from esft.tasks.labels import wilson_interval

    bounds = [wilson_interval(v * n, n) for v in values]
    ax.errorbar(xs, values, yerr=[[max(0.0, v - lo) for v, (lo, _) in zip(values, bounds)],
                                  [max(0.0, hi - v) for v, (_, hi) in zip(values, bounds)]],
                fmt="none", ecolor=color, elinewidth=1, alpha=0.5, label=label)


def bars_label(n: int) -> str:
    """The legend entry of `interval_bars` over `n` examples."""
    return f"95% Wilson interval of each point (n={n})"


__all__ = ["bars_label", "constant_line", "interval_bars"]
