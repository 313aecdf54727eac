"""The report's first two sections (esft.analysis.report_builder): the runs, and the held-out accuracy each logged,
beside the constant-answer baseline of the same examples and the study's Table 1 row for its task."""

from __future__ import annotations

from typing import Any, Callable

from esft import paper
from esft.analysis.constant import baseline_text
from esft.analysis.runs import Run, logged_steps
from esft.analysis.score_text import reward_text
from esft.rundir import lock_held
from esft.tables import NA, pct
from esft.tasks.display import shown_task
from esft.tasks.labels import MEAN_REWARD


def _task(r: Run) -> str:
    """The run's task(s) as the tables show them (esft.tasks.display.shown_task: a data file by its name)."""
    t = r.config.get("task") or r.config.get("task_name")
    return ",".join(shown_task(x) for x in t) if isinstance(t, list) else shown_task(t or "?")


def precision(r: Run) -> str:
    """The run's recorded precision, weight dtypes and master-weight dtype."""
    info = r.config.get("_run") or {}
    dt = info.get("param_dtypes") or r.config.get("dtype") or r.config.get("torch_dtype")
    master = info.get("master_dtype") or r.config.get("master_dtype")
    parts = []
    if info.get("precision"):
        parts.append(str(info["precision"]))
    if dt:
        parts.append(f"weights {dt if isinstance(dt, str) else ','.join(dt)}")
    if master:
        parts.append(f"masters {master}")
    return "; ".join(parts) or "not recorded"


def run_rows(runs: list[Run], name: Callable[[Run], str], shown: Callable[[Any], str] = str) -> list[list[Any]]:
    """One row per run: name, algorithm, task, seed, start (model or checkpoint, through `shown`), steps (with
    "so far, still running" while a trainer holds the run's lock: its numbers are not final), final checkpoint,
    precision."""
    return [[name(r), r.algorithm, _task(r), r.seed, shown(r.model) if r.model else "?",
             f"{logged_steps(r)} so far, still running" if lock_held(r.path) else logged_steps(r),
             r.final.name if r.final else "none", precision(r)] for r in runs]


def accuracy_rows(runs: list[Run], name: Callable[[Run], str]) -> list[list[Any]]:
    """First and last held-out accuracy each run logged, the constant-answer baseline of the last one's examples
    (none for a mean reward), beside the study's Table 1 row for its task; a run whose scores leave [0, 1] shows
    its mean reward (`reward_text`, "mean reward" after each value). A first evaluation on other examples than the
    last (a resume changed eval_limit or eval_balanced: another count or recorded baseline) says so."""
    rows = []
    for r in runs:
        first, last = r.accuracy_at("first"), r.accuracy_at("last")
        if last is None:
            continue
        ci = last.get("ci95")
        shown, unit = (reward_text, " mean reward") if r.score_name() == MEAN_REWARD else (pct, "")
        sets = [(e.get("n"), e.get("constant_baseline"), e.get("constant_answer")) for e in (first or {}, last)]
        # a value either evaluation did not record (an older esft's) tells nothing
        other = first is not None and any(a != b and None not in (a, b) for a, b in zip(*sets))
        start = (first or {}).get("ci95")  # the start's interval too: a change means little without both
        rows.append([name(r), r.algorithm, _task(r),
                     shown(first["accuracy"]) + unit + (f" [{shown(start[0])}, {shown(start[1])}]" if start else "")
                     + f" (step {first['step']}"
                     + (f"; other examples, n={first.get('n')})" if other else ")") if first else NA,
                     shown(last["accuracy"]) + f"{unit} (step {last['step']})",
                     f"[{shown(ci[0])}, {shown(ci[1])}]" if ci else NA, last.get("n") or NA,
                     pct(last.get("format_rate")) if last.get("format_rate") is not None else NA,
                     baseline_text(last if unit == "" and "constant_baseline" in last else None),
                     paper.accuracy_reference(r.task)])
    return rows
