"""Tasks of the study: `get_task(name)` returns a `Task` (data, prompt format, scorer).

Trained tasks: countdown, math, chemistry (SciKnowEval Chemistry 4-choice MCQ), boolq.
Holdout tasks (forgetting): mmlu, ifeval.
"""

from __future__ import annotations

from importlib import import_module

from esft.tasks.base import Example, Messages, Task, completion_text, last_boxed, wilson_interval

# name -> "module:Class"; imported lazily so `esft --help` stays fast.
_REGISTRY: dict[str, str] = {
    "countdown": "esft.tasks.countdown:CountdownTask",
    "math": "esft.tasks.hendrycks_math:MathTask",
    "chemistry": "esft.tasks.mcq:ChemistryTask",
    "mmlu": "esft.tasks.mcq:MMLUTask",
    "boolq": "esft.tasks.boolq:BoolQTask",
    "ifeval": "esft.tasks.ifeval:IFEvalTask",
}

TASK_NAMES: tuple[str, ...] = tuple(_REGISTRY)
TRAIN_TASKS: tuple[str, ...] = ("countdown", "math", "chemistry", "boolq")
HOLDOUT_TASKS: tuple[str, ...] = ("mmlu", "ifeval")


def get_task(name: str, **options) -> Task:
    """Instantiate a task by name (case-insensitive). `options` go to the task's constructor."""
    key = name.strip().lower()
    if key not in _REGISTRY:
        raise ValueError(f"unknown task {name!r}; available tasks: {', '.join(TASK_NAMES)}")
    module_name, cls_name = _REGISTRY[key].split(":")
    cls = getattr(import_module(module_name), cls_name)
    return cls(**options)


__all__ = [
    "Example", "Messages", "Task", "TASK_NAMES", "TRAIN_TASKS", "HOLDOUT_TASKS",
    "completion_text", "get_task", "last_boxed", "wilson_interval",
]
