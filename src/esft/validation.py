"""The names half of esft's one validation layer: the task (with its options) and the model a config names exist,
checked without loading either. esft.config checks types and ranges whenever a config is built; this module adds
what needs the task registry and the model registry, so `esft train ...`, `esft eval` and experiment specs refuse a
misspelt task, a bad task option or a missing model folder before any model loads.

    build_config(ESConfig, PRESETS, preset, file, flags, check=check_names)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from esft.config import ConfigError


def check_task(key: str, name: Any, options: dict[str, Any] | None = None) -> Any:
    """`name` builds a task with `options` (cheap: task data loads lazily), returned; else ConfigError under
    `key`."""
    from esft.tasks import TASK_NAMES, get_task

    try:
        return get_task(str(name), **(options or {}))
    except (ValueError, TypeError) as exc:
        raise ConfigError(key, name, f"a task of {', '.join(TASK_NAMES)} with valid options ({exc})") from None


def check_labels(config: Any, task: Any) -> None:
    """What needs the task's labels: the class-balanced fitness rule and a balanced held-out set (its size
    within what the rarest label allows)."""
    from esft.tasks.base import Task

    labels = task.label_set() if isinstance(task, Task) else None
    if getattr(config, "fitness_rule", None) == "balanced" and labels is None:
        raise ConfigError("fitness_rule", "balanced", "'mean' or 'dart' for this task: 'balanced' needs a task with "
                          "labels (boolq, chemistry, mmlu, a Countdown variant with several operators)")
    if getattr(config, "class_balanced", False) and labels is None:
        raise ConfigError("class_balanced", True, "false for this task: a class-balanced reward needs a task with "
                          "labels (boolq, chemistry, mmlu, a Countdown variant with several operators)")
    if getattr(config, "eval_balanced", False) and labels is not None and getattr(config, "eval_limit", 0):
        from esft.tasks.labels import balanced_indices

        try:
            balanced_indices([task.balance_key(r) for r in task.load("test")], config.eval_limit, label_set=labels)
        except ValueError as exc:
            raise ConfigError("eval_limit", config.eval_limit, f"a balanced held-out set that exists ({exc})") from None


def check_model(key: str, name: Any) -> None:
    """`name` is an embedded model, a Hugging Face model folder, or a hub id `org/name` (tried only at load)."""
    from esft.models import known_model_names

    text = str(name)
    if text.lower() in known_model_names():
        return
    path = Path(text).expanduser()
    accepted = (f"an embedded model ({', '.join(known_model_names())}), a Hugging Face model folder "
                "(with config.json) or a hub id org/name")
    if path.exists():
        if not (path / "config.json").exists():
            raise ConfigError(key, name, f"{accepted}; {path} has no config.json")
        return
    looks_like_hub_id = text.count("/") == 1 and not text.startswith((".", "/", "~")) and all(text.split("/"))
    if not looks_like_hub_id:
        raise ConfigError(key, name, accepted)


def check_names(config: Any) -> None:
    """The task(s) and model of an ESConfig, GRPOConfig or EvalConfig (fields it lacks are skipped)."""
    if hasattr(config, "model"):
        check_model("model", config.model)
    from esft.tasks.custom import external_kind

    if hasattr(config, "task") and hasattr(config, "task_kwargs"):
        options = config.task_kwargs()
        if external_kind(str(config.task)):  # a data file's task needs its field options to build at all
            task = check_task("task", config.task, options)
            options = {}
        else:
            task = check_task("task", config.task)
        if options:  # the name is fine: a failure now is the options' (task_options, max_passage_chars)
            try:
                task = check_task("task", config.task, options)
            except ConfigError as exc:
                raise ConfigError("task_options", options, f"options of task {config.task!r} "
                                  f"({exc.accepted.partition('(')[2].rstrip(')')})") from None
        check_labels(config, task)
    if hasattr(config, "tasks"):
        from esft.config import passage_cut

        for name in config.tasks:  # as esft.evaluation builds them
            options = passage_cut(name, getattr(config, "max_passage_chars", None))
            if external_kind(str(name)):  # as esft.evaluation builds it: the data-task options reach data tasks
                options.update(getattr(config, "task_options", None) or {})
            check_task("tasks", name, options)


__all__ = ["check_labels", "check_model", "check_names", "check_task"]
