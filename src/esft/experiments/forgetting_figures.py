"""Within-stage forgetting figures of a sequential experiment (`tables/forgetting_<track>_seed-<seed>.png`), drawn
when the spec evaluates intermediate checkpoints (`evaluation.checkpoints`, esft.experiments.checkpoint_eval).

One panel per sequential track and seed: the accuracy of every checkpoint-evaluated task over the training steps of
the whole chain (stage 1's steps, then stage 2's after them, ...; 0 is the base model), one line per task, its 95%
Wilson interval as a band. Each stage's final evaluation is its stage-end point (a square), the grey dashed lines
mark where one stage ends and the next begins, and each task's constant-answer baseline is a dotted line in the
task's colour over the light band of its interval. A track whose stages have no checkpoint evaluated gets no figure.

With two seeds or more, `tables/forgetting_<track>_mean.png` also draws each task's mean over the seeds at the
steps they share, its band the mean +- the sample standard deviation (ddof=1, as the tables give it), each seed
as a thin line (`mean_over_seeds`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from esft.experiments.records import Experiment, accuracy, checkpoint_evaluations, interval, table_slug, task_name
from esft.figure_marks import constant_line
from esft.passk_figure import FALLBACK_COLORS, save_figure


@dataclass
class TaskCurve:
    """One task's points along a track: (step, accuracy, interval or None) in %, and which of them end a stage."""

    task: str
    points: list[tuple[float, float, tuple[float, float] | None]] = field(default_factory=list)
    stage_ends: list[tuple[float, float]] = field(default_factory=list)
    constant: tuple[float, tuple[float, float] | None] | None = None


@dataclass
class TrackCurves:
    track: str
    display: str
    seed: int | None
    """None for a mean over `seeds`"""
    curves: list[TaskCurve]
    boundaries: list[tuple[float, str]]
    """(step at which a stage ends, its task)"""
    seeds: list[TrackCurves] = field(default_factory=list)
    """the per-seed curves a mean was taken over"""


def checkpoint_task_list(exp: Experiment) -> list[str]:
    """The tasks the spec evaluates at checkpoints, as plan.json's spec records them ([] when off)."""
    return list(exp.spec.get("evaluation", {}).get("checkpoints") or [])


def _stage_budget(record: dict[str, Any]) -> int:
    """Training steps of a stage: the budgets of its runs added up (a chain's too), as checkpoint_eval counts."""
    return sum(int(step.get("budget") or 0) for step in record.get("steps", []))


def _add_point(curve: TaskCurve, x: float, record: dict[str, Any], metric: str) -> bool:
    value = accuracy(record, curve.task, metric)
    if value is None:
        return False
    curve.points.append((x, value, interval(record, curve.task, metric)))
    summary = record["eval"][curve.task]
    if curve.constant is None and summary.get("constant_baseline") is not None:
        ci = summary.get("constant_baseline_ci95")
        curve.constant = (100 * float(summary["constant_baseline"]), (100 * ci[0], 100 * ci[1]) if ci else None)
    return True


def track_curves(exp: Experiment, track: str, display: str, seed: int,
                 steps: dict[str, dict[int, dict[str, dict[str, Any]]]]) -> TrackCurves | None:
    """The points of one sequential track and seed (module docstring), None when none of its stages has a
    checkpoint evaluated. `steps`: records.checkpoint_evaluations(exp)."""
    curves = [TaskCurve(task) for task in checkpoint_task_list(exp)]
    stages = [s for s in exp.stages if s["kind"] == "train" and s["seed"] == seed and s["track"] == track
              and "/sequential/" in f"/{s['key']}/"]
    if not any(s["key"] in steps for s in stages):
        return None
    for curve in curves:
        _add_point(curve, 0, exp.base or {}, exp.ifeval_metric)
    offset, boundaries = 0, []
    for stage in stages:
        record = exp.results.get(stage["key"])
        if record is None:  # a later stage cannot be placed without this one's length
            break
        for n, by_task in sorted(steps.get(stage["key"], {}).items()):
            for curve in curves:
                if curve.task in by_task:
                    _add_point(curve, offset + n, {"eval": {curve.task: _as_summary(by_task[curve.task])}},
                               "accuracy")
        offset += _stage_budget(record)
        boundaries.append((offset, stage["task"]))
        for curve in curves:
            if _add_point(curve, offset, record, exp.ifeval_metric):
                curve.stage_ends.append(curve.points[-1][:2])
    return TrackCurves(track, display, seed, curves, boundaries)


def _as_summary(point: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint_evaluations entry as an evaluation summary `accuracy`/`interval` read (the metric applied)."""
    return {"accuracy": point["accuracy"], "ci95": point["ci95"], "constant_baseline": point["constant_baseline"],
            "constant_baseline_ci95": point["constant_baseline_ci95"]}


def mean_over_seeds(per_seed: list[TrackCurves]) -> TrackCurves | None:
    """One track's curves averaged over its seeds: for each task, at every step all the seeds have, the mean
    accuracy with mean +- the sample standard deviation (ddof=1) as its interval, clipped to 0-100; stage ends the
    same way; the first seed's constant-answer baseline (the same examples for every seed). Only the seeds whose
    chain reached as far as the furthest one's (the same stage boundaries) are averaged: a seed with a stage still
    to run would end the mean early. None with fewer than two such seeds."""
    if not per_seed:
        return None
    furthest = max((data.boundaries for data in per_seed), key=len)
    used = [data for data in per_seed if data.boundaries == furthest]
    if len(used) < 2:
        return None
    curves = []
    for i, first in enumerate(used[0].curves):
        mean = TaskCurve(first.task, constant=next((d.curves[i].constant for d in used
                                                    if d.curves[i].constant is not None), None))
        by_seed = [{x: y for x, y, _ in d.curves[i].points} for d in used]
        for x in sorted(set.intersection(*(set(points) for points in by_seed))):
            mean.points.append(_mean_point(x, [points[x] for points in by_seed]))
        ends = [dict(d.curves[i].stage_ends) for d in used]
        for x in sorted(set.intersection(*(set(e) for e in ends))):
            mean.stage_ends.append(_mean_point(x, [e[x] for e in ends])[:2])
        curves.append(mean)
    return TrackCurves(used[0].track, used[0].display, None, curves, list(furthest), used)


def _mean_point(x: float, values: list[float]) -> tuple[float, float, tuple[float, float]]:
    """(x, mean, (mean - sd, mean + sd) within 0-100) of the seeds' accuracies (%), sd with ddof=1."""
    mean = sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    return x, mean, (max(0.0, mean - sd), min(100.0, mean + sd))


def forgetting_figure(data: TrackCurves, title: str) -> Any:
    """A matplotlib Figure (not registered with pyplot) of one track's curves (module docstring)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.4, 4.2))
    ax = fig.subplots()
    for i, curve in enumerate(data.curves):
        color = FALLBACK_COLORS[i % len(FALLBACK_COLORS)]
        _draw_curve(ax, curve, color)
        for seed in data.seeds:  # thin, unlabelled: the mean's spread, seed by seed
            points = seed.curves[i].points
            ax.plot([p[0] for p in points], [p[1] for p in points], color=color, lw=0.8, alpha=0.35,
                    clip_on=False)
    for x, task in data.boundaries[:-1]:
        ax.axvline(x, color="grey", ls="--", lw=1)
    start = 0.0
    for x, task in data.boundaries:
        ax.text((start + x) / 2, 101, task_name(task, short=True), ha="center", va="bottom", fontsize=8)
        start = x
    ax.set_ylim(0, 100)
    ax.set_xlim(0, max([x for x, _ in data.boundaries] or [1]))
    ax.set_xlabel("training steps of the chain (ES iterations / GRPO steps; 0 = base model)")
    ax.set_ylabel("accuracy (%)")
    ax.grid(True, alpha=0.3)
    bands = (f"bands: mean ± sample std\nover {len(data.seeds)} seeds (baselines':\n95% Wilson CI)\n"
             "thin lines: each seed" if data.seeds else "bands: 95% Wilson CI")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=f"{bands}\nsquares: stage ends",
              title_fontsize=7)
    fig.suptitle(title, fontsize=10, wrap=True)
    fig.tight_layout()
    return fig


def _draw_curve(ax: Any, curve: TaskCurve, color: str) -> None:
    """One task: its line, its interval band, its stage-end squares and its constant-answer baseline."""
    xs = [p[0] for p in curve.points]
    ax.plot(xs, [p[1] for p in curve.points], color=color, marker="o", ms=3, label=task_name(curve.task),
            clip_on=False)
    banded = [p for p in curve.points if p[2] is not None]
    if banded:
        ax.fill_between([p[0] for p in banded], [p[2][0] for p in banded], [p[2][1] for p in banded],
                        color=color, alpha=0.15, lw=0)
    if curve.stage_ends:
        ax.scatter([x for x, _ in curve.stage_ends], [y for _, y in curve.stage_ends], color=color, marker="s",
                   s=24, zorder=3, clip_on=False)
    if curve.constant is not None:
        value, ci = curve.constant
        constant_line(ax, value, ci, f"{task_name(curve.task)}: constant answer", color=color)


def write_forgetting_figures(exp: Experiment, folder: str | Path) -> list[Path]:
    """`<folder>/forgetting_<track>_seed-<seed>.png` for every sequential track and seed with checkpoint
    evaluations, and `forgetting_<track>_mean.png` for a track with two seeds or more to average
    (`mean_over_seeds`); [] when the spec evaluates no checkpoints."""
    if not checkpoint_task_list(exp):
        return []
    steps = checkpoint_evaluations(exp)
    written, model = [], exp.spec.get("model")
    for track, display in exp.tracks("sequential"):
        per_seed = [data for seed in exp.seeds if (data := track_curves(exp, track, display, seed, steps))]
        for data in per_seed:
            title = f"{display}, seed {data.seed}: accuracy during sequential training ({model})"
            written.append(save_figure(forgetting_figure(data, title),
                                       Path(folder) / f"forgetting_{table_slug(track)}_seed-{data.seed}.png"))
        if (mean := mean_over_seeds(per_seed)) is not None:
            seeds = ", ".join(str(d.seed) for d in mean.seeds)
            title = f"{display}, mean of seeds {seeds}: accuracy during sequential training ({model})"
            written.append(save_figure(forgetting_figure(mean, title),
                                       Path(folder) / f"forgetting_{table_slug(track)}_mean.png"))
    return written


__all__ = ["TaskCurve", "TrackCurves", "forgetting_figure", "mean_over_seeds", "track_curves",
           "write_forgetting_figures"]
