"""Marks several esft figures share: the best constant answer's accuracy as a dotted grey line over the light band
of its 95% interval (the run figure's held-out panel, the landscape and sparsity figures, the pass@k figure)."""

from __future__ import annotations

from typing import Any, Sequence


def constant_line(ax: Any, value: float, ci95: Sequence[float] | None, label: str, scale: float = 1.0) -> None:
    """The constant-answer baseline `value` on `ax`, its interval `ci95` (None: none known) as a band, in the
    axis' units (`scale` 100 for an axis in %), with `label` as its legend entry."""
    lo, hi = ci95 if ci95 is not None else (value, value)  # no interval: a band of no height, the line alone
    ax.axhspan(scale * lo, scale * hi, color="grey", alpha=0.15, lw=0)
    ax.axhline(scale * value, color="grey", ls=":", lw=1.5, label=label)


__all__ = ["constant_line"]
