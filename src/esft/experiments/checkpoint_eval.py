"""Evaluation of a stage's intermediate checkpoints (spec: `evaluation.checkpoints`), so that a sequential study
sees how accuracy on earlier tasks moves during a later stage, not only at stage ends.

After a training stage's final evaluation (esft.experiments.stage_eval), each checkpoint its runs saved before their
end is evaluated on the chosen tasks with the same settings as the final evaluation (greedy; the spec's pass@k is
not sampled on checkpoints), into

    <stage>/eval/steps/<step>/<task>.json   (+ <task>.jsonl, every completion)

where <step> (six digits) counts the stage's training steps (ES iterations, GRPO optimizer steps) from its start:
in a chain (grpo->es) the steps of its runs add up, and the end of each run but the last is a checkpoint too. The
stage's end is its final evaluation (`<stage>/eval/<task>.json`), not repeated here. Resumable as the final
evaluation is: a task of a checkpoint evaluated with today's settings and the same weights is not evaluated again,
so an interrupted run loses at most one task of one checkpoint.

Which checkpoints exist is the trainers' cadence (ES `checkpoint_every`, GRPO `save_steps`: 0 saves none, and then
there is nothing to evaluate). A run with `save_total_limit` deletes older checkpoints while it trains, before the
runner can evaluate them: only those left are evaluated (files evaluated earlier are kept and read).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from esft.experiments.plan import BASE, Stage
from esft.experiments.spec import Spec
from esft.experiments.stage_eval import EVAL_DIR, evaluate_stage, is_current

STEPS_DIR = f"{EVAL_DIR}/steps"


def step_dir(step: int) -> str:
    """The folder, under the stage's, of the checkpoint at the stage's `step`."""
    return f"{STEPS_DIR}/{step:06d}"


def checkpoint_tasks(spec: Spec, stage: Stage) -> list[str]:
    """The tasks the stage's checkpoints are evaluated on: the spec's choice among those the stage evaluates at its
    end (a single-task stage with `after_single_task: trained` evaluates fewer), so every curve ends at a point."""
    if stage.kind == BASE:
        return []
    return [task for task in spec.evaluation.checkpoints if task in stage.eval_tasks]


def stage_checkpoints(stage: Stage, root: Path) -> list[tuple[int, Path]]:
    """(step from the stage's start, folder) of every intermediate checkpoint of the stage's runs, by step: a run's
    checkpoints before its budget (a shared run continued to a larger budget holds later ones, which belong to
    another stage), and the end of each run of a chain but the last."""
    found: dict[int, Path] = {}
    offset = 0
    for i, step in enumerate(stage.steps):
        for n, folder in step.component.spec.checkpoints(root / step.run_dir):
            if 0 < n < step.budget:
                found.setdefault(offset + n, folder)  # ES keeps a budget's snapshot beside its periodic copy
        offset += step.budget
        if i < len(stage.steps) - 1:
            found[offset] = root / step.model_dir()
    return sorted(found.items())


def checkpoints_current(spec: Spec, stage: Stage, root: Path) -> bool:
    """True when every existing checkpoint of the stage was evaluated on every chosen task with today's settings."""
    tasks = checkpoint_tasks(spec, stage)
    return all(is_current(root / stage.key, spec, task, str(folder.resolve()), root, step_dir(n), with_passk=False)
               for n, folder in (stage_checkpoints(stage, root) if tasks else []) for task in tasks)


def evaluate_checkpoints(spec: Spec, stage: Stage, root: Path,
                         load_model: Callable[[str, str, str | None], tuple[Any, Any]],
                         progress: bool = True) -> dict[int, dict[str, Any]]:
    """{step: {task: summary}} of the stage's intermediate checkpoints (module docstring); {} when the spec asks
    for none. Each checkpoint's model is loaded only when one of its tasks is left to evaluate."""
    tasks = checkpoint_tasks(spec, stage)
    out: dict[int, dict[str, Any]] = {}
    for n, folder in stage_checkpoints(stage, root) if tasks else []:
        if progress:
            print(f"  checkpoint at step {n} of {stage.key} ({folder.name})", flush=True)
        out[n] = evaluate_stage(spec, str(folder.resolve()), tasks, root / stage.key, load_model, progress, root,
                                subdir=step_dir(n), with_passk=False)
    return out


__all__ = ["STEPS_DIR", "checkpoint_tasks", "checkpoints_current", "evaluate_checkpoints", "stage_checkpoints",
           "step_dir"]
