"""The constant-answer baseline of the examples the landscape and functional-sparsity analyses evaluate.

Every accuracy esft shows stands beside the accuracy of always giving the most frequent gold answer of the same
examples, with its 95% Wilson interval (esft.tasks.labels.constant_baseline): BoolQ's 75% means little next to an
"always yes" of 62%. The analyses record it once per task, from the examples they prepared, under `KEY` of each
result ({task: baseline or None}); the tables print it and the figures draw it as a dotted horizontal line.

A task scored as a mean reward on another scale (esft.tasks.labels.score_name) shows none, as elsewhere; a result
computed before results recorded the baseline (an older report cache) shows n/a.
"""

from __future__ import annotations

from typing import Any, Mapping

from esft.figure_marks import constant_line
from esft.tables import NA
from esft.tasks.labels import ACCURACY

#: the key of an analysis result that holds {task: baseline or None}
KEY = "constant_baseline"
LABEL = "best constant answer"
#: the caption of a result computed before results recorded the baseline (an older report cache)
NOT_RECORDED = (f"{LABEL.capitalize()}: n/a (this result was computed before results recorded it; recompute the "
                "report to see it).")


def task_baselines(tasks: Mapping[str, tuple[Any, list]]) -> dict[str, dict[str, Any] | None]:
    """{task: {constant_baseline, constant_baseline_ci95, constant_answer}} of each task's prepared examples
    (Task.constant_baseline); None where a gold answer is unknown or no task object comes with the examples."""
    out: dict[str, dict[str, Any] | None] = {}
    for name, (task, examples) in tasks.items():
        found = task.constant_baseline([{"example": ex} for ex in examples]) if task is not None and examples else {}
        out[name] = found or None
    return out


def shown(res: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, dict[str, Any] | None]:
    """The baseline to show per task of `names` ({task: ACCURACY or MEAN_REWARD}): the recorded one for an
    accuracy, None for a mean reward, a task without one, or a result that recorded none."""
    recorded = res.get(KEY) or {}
    return {t: recorded.get(t) if name == ACCURACY else None for t, name in names.items()}


def baseline_text(b: Mapping[str, Any] | None) -> str:
    """`'yes' 62.5% [30.6, 86.3]`: the answer, the baseline and its 95% interval in %; n/a without one."""
    if not b:
        return NA
    lo, hi = b.get("constant_baseline_ci95") or (b["constant_baseline"],) * 2
    answer = str(b.get("constant_answer", ""))
    answer = answer if len(answer) <= 16 else answer[:16] + "..."
    return f"'{answer}' {100 * b['constant_baseline']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def baseline_notes(res: Mapping[str, Any], names: Mapping[str, str]) -> list[str]:
    """Caption lines under a table of `res`: one per accuracy task with a baseline; a single n/a line where the
    result recorded none (computed before results did); nothing for mean rewards alone."""
    accuracies = [t for t, name in names.items() if name == ACCURACY]
    if not accuracies:
        return []
    if KEY not in res:
        return [NOT_RECORDED]
    found = shown(res, names)
    return [f"{LABEL.capitalize()} of the same examples, {t}: {baseline_text(found[t])} (95% Wilson interval)."
            for t in accuracies if found[t]]


def draw_baseline(ax: Any, b: Mapping[str, Any] | None) -> bool:
    """The baseline as a dotted grey horizontal line (its 95% interval a light band) with a legend entry; False,
    nothing drawn, without one."""
    if not b:
        return False
    constant_line(ax, b["constant_baseline"], b.get("constant_baseline_ci95"), label=f"{LABEL} {baseline_text(b)}")
    return True


__all__ = ["KEY", "LABEL", "NOT_RECORDED", "baseline_notes", "baseline_text", "draw_baseline", "shown",
           "task_baselines"]
