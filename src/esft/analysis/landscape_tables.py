"""The report's tables of the landscape section (esft.analysis.landscape; paper Figures 3, 4 and 5): each task's
scores as a percentage, or as a mean reward for a task scored outside [0, 1] (esft.analysis.score_text).

A task's score name is the one its result recorded from the per-example scores (`score`); a result without one
(computed before results recorded it) is named from the values the table holds. A mean reward's barrier test
needs the sample standard error of its scores (esft.analysis.barrier): where the result has none, its SE and
barrier cells are n/a rather than a binomial figure that means nothing on its scale.

Beside the accuracies stands each task's best constant answer of the same examples with its 95% interval
(esft.analysis.constant): a column of the interpolation table, a caption line under a sweep's; n/a for a result
computed before results recorded it, nothing for a mean reward."""

from __future__ import annotations

from typing import Any, Sequence

from esft.analysis.barrier import PAIRED, SAMPLE
from esft.analysis.constant import KEY, LABEL, NOT_RECORDED, baseline_notes, baseline_text, shown
from esft.analysis.score_text import interval_notes, interval_text, score_text
from esft.tables import NA, fmt
from esft.tasks.labels import ACCURACY, MEAN_REWARD, score_name


def _name(res: dict[str, Any], task: str, values: Sequence[float | None]) -> str:
    return (res.get("score") or {}).get(task) or score_name(values)


def interpolation_names(res: dict[str, Any], tasks: Sequence[str]) -> dict[str, str]:
    """ACCURACY or MEAN_REWARD per task of an interpolation result."""
    return {t: _name(res, t, res["accuracy"][t]) for t in tasks}


def interpolation_rows(res: dict[str, Any], tasks: Sequence[str]) -> list[list[Any]]:
    """Per task: the score at both ends, the minimum on the path, the largest drop below the straight line, its
    standard error (binomial for an accuracy, of the scores for a mean reward), whether it is a barrier and,
    when some task is an accuracy, its best constant answer (n/a for a mean reward)."""
    rows = []
    names = interpolation_names(res, tasks)
    constant = shown(res, names) if ACCURACY in names.values() else None
    for t in tasks:
        acc, bar = res["accuracy"][t], res["barrier"][t]
        cell = score_text(acc, names[t])
        # a paired test of one example has no SE and no verdict (n/a, not "no")
        known = (names[t] == ACCURACY or bar.get("se_of") in (SAMPLE, PAIRED)) and not (
            bar.get("se_of") == PAIRED and bar.get("se") is None)
        rows.append([t, cell(acc[0]), cell(acc[-1]), cell(bar["min_accuracy"]),
                     f"{bar['max_drop']:+.3f} at t={bar['at']:.2f}", _se_cell(res, t, names[t]) if known else NA,
                     ("yes" if bar["barrier"] else "no") if known else NA]
                    + ([] if constant is None else [baseline_text(constant[t])]))
    return rows


def _se_cell(res: dict[str, Any], task: str, name: str) -> str:
    """A barrier's standard error; for an accuracy whose line stands at 0% or 100%, where the binomial SE is 0,
    `0 (line at 100.0% [51.0, 100.0])`: the line's value with its 95% Wilson interval over the result's n
    examples (a result computed before the SE was 0 there holds a floor such as 5e-07 instead: printed as 0)."""
    bar = res["barrier"][task]
    line, n = bar.get("line_at"), (res.get("n") or {}).get(task)
    if name != ACCURACY or bar.get("se_of") in (SAMPLE, PAIRED) or line is None or line * (1 - line) > 0:
        return fmt(bar["se"])
    return f"0 (line at {interval_text(ACCURACY, n)(line)})" if n else "0"


def interpolation_header(res: dict[str, Any], tasks: Sequence[str], labels: tuple[str, str]) -> list[str]:
    """The columns of `interpolation_rows`, named after the tasks' scores: "acc" and "binomial SE" for
    accuracies, "mean reward" and "sample SE" for mean rewards, both for a mix."""
    kinds = set(interpolation_names(res, tasks).values())
    score = {ACCURACY: "acc", MEAN_REWARD: MEAN_REWARD}
    se = {ACCURACY: "binomial SE", MEAN_REWARD: "sample SE"}
    order = [k for k in (ACCURACY, MEAN_REWARD) if k in kinds] or [ACCURACY]
    what, error = " or ".join(score[k] for k in order), " or ".join(se[k] for k in order)
    verdict = "barrier (> 2 SE)"
    z = _paired_z(res, tasks)
    if z is not None:
        error, verdict = "paired SE", f"barrier (> {z:.2f} SE)"
    return (["task"] + [f"{lab} {what}" for lab in labels]
            + ["min on path", "largest drop below the line", error, verdict]
            + ([f"{LABEL} (95% CI)"] if ACCURACY in kinds else []))


def _paired_z(res: dict[str, Any], tasks: Sequence[str]) -> float | None:
    """The paired test's threshold when every task's barrier is the paired one (esft.analysis.barrier), else None
    (a result computed before: its tests of the means)."""
    bars = [res["barrier"][t] for t in tasks]
    return bars[0]["z_crit"] if bars and all(b.get("se_of") == PAIRED for b in bars) else None


def interpolation_notes(res: dict[str, Any], tasks: Sequence[str]) -> list[str]:
    """The notes under the table: where the result recorded no constant answer, that it is n/a; when some task
    is a mean reward, how to read it."""
    names = interpolation_names(res, tasks)
    rewards = [t for t, k in names.items() if k == MEAN_REWARD]
    old = [NOT_RECORDED] if KEY not in res and ACCURACY in names.values() else []
    zero = [t for t, k in names.items() if k == ACCURACY and _se_cell(res, t, k).startswith("0 (")]
    old += [f"Binomial SE 0 ({', '.join(zero)}): the line stands at 0% or 100% at the largest drop, where "
            "sqrt(p (1 - p) / n) is 0 and any drop counts as a barrier; beside it the line's value with its 95% "
            "Wilson interval over the evaluated examples, [a, b] in %."] if zero else []
    z = _paired_z(res, tasks)
    if z is not None:
        interior = len(res["t"]) - 2
        old += [f"Paired SE: the standard error over the examples of each one's drop below its own straight line "
                f"between its scores at the two ends (all points score the same examples); a barrier when the "
                f"largest drop exceeds {z:.2f} SE, the one-sided 2.5% normal quantile Bonferroni-corrected over "
                f"the path's {interior} interior point{'s' if interior != 1 else ''} (esft.analysis.barrier)."]
    if not rewards:
        return old
    return old + [
        f"Mean reward, a plain number on its reward function's scale (not %): {', '.join(rewards)}; the drop is "
        "on that scale" + ("." if z is not None else
                           ", and its SE is the sample standard error of the per-example scores at the point of the "
                           "largest drop (an accuracy's is the binomial one of the line's value); n/a where the "
                           "result holds no per-example scores (recompute the report).")]


def sweep_names(res: dict[str, Any]) -> dict[str, str]:
    """ACCURACY or MEAN_REWARD per task of a direction sweep (from every direction's values without a record)."""
    tasks = list(next(iter(res["directions"].values()))["accuracy"]) if res["directions"] else []
    return {t: _name(res, t, [v for d in res["directions"].values() for v in d["accuracy"][t]]) for t in tasks}


def sweep_notes(res: dict[str, Any]) -> list[str]:
    """The notes under a sweep's table: each accuracy task's best constant answer (esft.analysis.constant), and
    how to read a mean reward when some task is one."""
    names = sweep_names(res)
    rewards = [t for t, k in names.items() if k == MEAN_REWARD]
    reward_note = [f"Mean reward, a plain number on its reward function's scale (not %): {', '.join(rewards)}."]
    return baseline_notes(res, names) + interval_notes(res, names) + (reward_note if rewards else [])


def sweep_rows(res: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """(header, rows) of a direction sweep: per direction and task, the accuracy at each distance with its 95%
    Wilson interval over the result's n examples (a task's cells printed alike in every direction, chosen from
    all of them)."""
    mags = res["magnitudes"]
    names = sweep_names(res)
    tasks = list(names)
    cell = {t: interval_text(name, (res.get("n") or {}).get(t)) for t, name in names.items()}
    rows = []
    for label, d in res["directions"].items():
        for t in tasks:
            rows.append([label, fmt(d["norm"]), t] + [cell[t](v) for v in d["accuracy"][t]])
    return ["direction", "its norm", "task"] + [f"|d|={fmt(m, 3)}" for m in mags], rows
