"""The report's tables of the landscape section (esft.analysis.landscape; paper Figures 3, 4 and 5): each task's
scores as a percentage, or as a mean reward for a task scored outside [0, 1] (esft.analysis.score_text).

A task's score name is the one its result recorded from the per-example scores (`score`); a result without one
(computed before results recorded it) is named from the values the table holds. A mean reward's barrier test
needs the sample standard error of its scores (esft.analysis.barrier): where the result has none, its SE and
barrier cells are n/a rather than a binomial figure that means nothing on its scale."""

from __future__ import annotations

from typing import Any, Sequence

from esft.analysis.barrier import SAMPLE
from esft.analysis.score_text import score_text
from esft.tables import NA, fmt
from esft.tasks.labels import ACCURACY, MEAN_REWARD, score_name


def _name(res: dict[str, Any], task: str, values: Sequence[float | None]) -> str:
    return (res.get("score") or {}).get(task) or score_name(values)


def interpolation_names(res: dict[str, Any], tasks: Sequence[str]) -> dict[str, str]:
    """ACCURACY or MEAN_REWARD per task of an interpolation result."""
    return {t: _name(res, t, res["accuracy"][t]) for t in tasks}


def interpolation_rows(res: dict[str, Any], tasks: Sequence[str]) -> list[list[Any]]:
    """Per task: the score at both ends, the minimum on the path, the largest drop below the straight line, its
    standard error (binomial for an accuracy, of the scores for a mean reward) and whether it is a barrier."""
    rows = []
    names = interpolation_names(res, tasks)
    for t in tasks:
        acc, bar = res["accuracy"][t], res["barrier"][t]
        shown = score_text(acc, names[t])
        known = names[t] == ACCURACY or bar.get("se_of") == SAMPLE
        rows.append([t, shown(acc[0]), shown(acc[-1]), shown(bar["min_accuracy"]),
                     f"{bar['max_drop']:+.3f} at t={bar['at']:.2f}", fmt(bar["se"]) if known else NA,
                     ("yes" if bar["barrier"] else "no") if known else NA])
    return rows


def interpolation_header(res: dict[str, Any], tasks: Sequence[str], labels: tuple[str, str]) -> list[str]:
    """The columns of `interpolation_rows`, named after the tasks' scores: "acc" and "binomial SE" for
    accuracies, "mean reward" and "sample SE" for mean rewards, both for a mix."""
    kinds = set(interpolation_names(res, tasks).values())
    score = {ACCURACY: "acc", MEAN_REWARD: MEAN_REWARD}
    se = {ACCURACY: "binomial SE", MEAN_REWARD: "sample SE"}
    order = [k for k in (ACCURACY, MEAN_REWARD) if k in kinds] or [ACCURACY]
    what, error = " or ".join(score[k] for k in order), " or ".join(se[k] for k in order)
    return (["task"] + [f"{lab} {what}" for lab in labels]
            + ["min on path", "largest drop below the line", error, "barrier (> 2 SE)"])


def interpolation_notes(res: dict[str, Any], tasks: Sequence[str]) -> list[str]:
    """The note under the table when some task is a mean reward (none otherwise)."""
    rewards = [t for t, k in interpolation_names(res, tasks).items() if k == MEAN_REWARD]
    if not rewards:
        return []
    return [f"Mean reward, a plain number on its reward function's scale (not %): {', '.join(rewards)}; the drop is "
            "on that scale, and its SE is the sample standard error of the per-example scores at the point of the "
            "largest drop (an accuracy's is the binomial one of the line's value); n/a where the result holds no "
            "per-example scores (recompute the report)."]


def sweep_names(res: dict[str, Any]) -> dict[str, str]:
    """ACCURACY or MEAN_REWARD per task of a direction sweep (from every direction's values without a record)."""
    tasks = list(next(iter(res["directions"].values()))["accuracy"]) if res["directions"] else []
    return {t: _name(res, t, [v for d in res["directions"].values() for v in d["accuracy"][t]]) for t in tasks}


def sweep_notes(res: dict[str, Any]) -> list[str]:
    """The note under a sweep's table when some task is a mean reward (none otherwise)."""
    rewards = [t for t, k in sweep_names(res).items() if k == MEAN_REWARD]
    return [f"Mean reward, a plain number on its reward function's scale (not %): {', '.join(rewards)}."] \
        if rewards else []


def sweep_rows(res: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """(header, rows) of a direction sweep: per direction and task, the accuracy at each distance (a task's cells
    printed alike in every direction, chosen from all of them)."""
    mags = res["magnitudes"]
    names = sweep_names(res)
    tasks = list(names)
    shown = {t: score_text((), name) for t, name in names.items()}
    rows = []
    for label, d in res["directions"].items():
        for t in tasks:
            rows.append([label, fmt(d["norm"]), t] + [shown[t](v) for v in d["accuracy"][t]])
    return ["direction", "its norm", "task"] + [f"|d|={fmt(m, 3)}" for m in mags], rows
