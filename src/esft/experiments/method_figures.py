"""The pass@k figure of each task of a single-task experiment, beside its methods table (`tables/passk_<task>.png`).

One line per model the methods table has a row for: the base model, then every method (each seed its own line, in
the method's colour, when the experiment has several), from the sampled evaluations of `evaluation.passk`
(`<stage>/eval/<task>.passk.json`, kept in each stage's result.json); the error bars are each evaluation's own
95% interval, the dotted line the constant-answer baseline and, for a task answered by one of a few labels, the
dashed line the pass@k of a random guess among them (esft.passk_figure). A task the spec samples no pass@k
on gets no figure; one whose scores are not 0/1 gets a figure whose panel says why pass@k is n/a
(esft.passk.not_right_or_wrong), as its table's cells read n/a.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from esft.experiments.plan import task_slug
from esft.experiments.records import Experiment, constant_baseline, task_name
from esft.passk_figure import (SEED_STYLES, baseline_from_summary, chance_from_summary, curve_from_summary,
                               passk_figure, save_figure, skipped_note)


def sampled_summary(record: dict[str, Any] | None, task: str) -> dict[str, Any] | None:
    """The sampled evaluation (pass@k, mean@n, maj@k) of `task` in a stage's result.json, None when not sampled."""
    return ((((record or {}).get("eval") or {}).get(task) or {}).get("sampled")) or None


def method_summaries(exp: Experiment, task: str) -> list[tuple[str, str, int, dict[str, Any]]]:
    """(legend label, method, seed index, sampled summary) of the base model and each single-task method's
    evaluation of `task`, in the methods table's order; models without a sampled evaluation are left out."""
    out = []
    base = sampled_summary(exp.base, task)
    if base:
        out.append(("Base", "Base", 0, base))
    several = len(exp.seeds) > 1
    for track, display in exp.tracks("single-task"):
        for i, seed in enumerate(exp.seeds):
            summary = sampled_summary(exp.find("single-task", seed, track, task), task)
            if summary:
                out.append((f"{display} (seed {seed})" if several else display, display, i, summary))
    return out


def method_figure(exp: Experiment, task: str) -> Any | None:
    """The pass@k figure of `task` (module docstring), None when no model of it was sampled or the experiment
    trains no single-task method."""
    found = method_summaries(exp, task)
    if not found or not exp.tracks("single-task"):  # as the methods table, which a sequential experiment lacks
        return None
    curves = [curve_from_summary(label, summary, method, SEED_STYLES[i % len(SEED_STYLES)])
              for label, method, i, summary in found]
    constant = constant_baseline(exp, task)
    # every model is sampled on the same task, so any summary that recorded the chance curve has the same one
    chance = next((c for c in (chance_from_summary(s) for *_, s in found) if c is not None), None)
    pk = exp.spec.get("evaluation", {}).get("passk") or {}
    questions = sorted({s.get("questions", s.get("n")) for *_, s in found})
    subtitle = (f"{pk.get('samples')} samples per question at temperature {pk.get('temperature')}, top_p "
                f"{pk.get('top_p')}; {'/'.join(str(q) for q in questions)} questions")
    return passk_figure([c for c in curves if c is not None],
                        f"pass@k on {task_name(task)} ({exp.spec.get('model')})",
                        baseline_from_summary(constant) if constant else None,
                        note=skipped_note([(label, summary) for label, _, _, summary in found]), subtitle=subtitle,
                        chance=chance)


def write_method_figures(exp: Experiment, folder: str | Path) -> list[Path]:
    """`<folder>/passk_<task>.png` for every task of the experiment that has a sampled evaluation."""
    written = []
    for task in exp.tasks:
        fig = method_figure(exp, task)
        if fig is not None:
            written.append(save_figure(fig, Path(folder) / f"passk_{task_slug(task)}.png"))
    return written


__all__ = ["method_figure", "method_summaries", "sampled_summary", "write_method_figures"]
