"""The report's tables of the landscape section (esft.analysis.landscape; paper Figures 3, 4 and 5): each task's
scores as a percentage, or as a mean reward for a task scored outside [0, 1] (esft.analysis.score_text)."""

from __future__ import annotations

from typing import Any, Sequence

from esft.analysis.score_text import score_text
from esft.tables import fmt


def interpolation_rows(res: dict[str, Any], tasks: Sequence[str]) -> list[list[Any]]:
    """Per task: accuracy at both ends, the minimum on the path, the largest drop below the straight line, its
    binomial standard error and whether it is a barrier."""
    rows = []
    for t in tasks:
        acc, bar = res["accuracy"][t], res["barrier"][t]
        shown = score_text(acc)
        rows.append([t, shown(acc[0]), shown(acc[-1]), shown(bar["min_accuracy"]),
                     f"{bar['max_drop']:+.3f} at t={bar['at']:.2f}", fmt(bar["se"]), "yes" if bar["barrier"] else "no"])
    return rows


def sweep_rows(res: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """(header, rows) of a direction sweep: per direction and task, the accuracy at each distance (a task's cells
    printed alike in every direction, chosen from all of them)."""
    mags = res["magnitudes"]
    tasks = list(next(iter(res["directions"].values()))["accuracy"]) if res["directions"] else []
    shown = {t: score_text([v for d in res["directions"].values() for v in d["accuracy"][t]]) for t in tasks}
    rows = []
    for label, d in res["directions"].items():
        for t in tasks:
            rows.append([label, fmt(d["norm"]), t] + [shown[t](v) for v in d["accuracy"][t]])
    return ["direction", "its norm", "task"] + [f"|d|={fmt(m, 3)}" for m in mags], rows
