"""Task constructor values as a run's config.yaml records them (esft.tasks.custom.task_record): a value YAML can
hold as it is, and a stand-in, `<not recorded: TYPE>`, for one it cannot (a function, an array) or whose value is
unknown; a task string whose options hold a stand-in is refused (`check_recorded`), so that a resume never builds
the task with other values than the run's.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any


#: config.yaml's stand-in for a constructor value it cannot hold (`task_record`)
NOT_RECORDED = "<not recorded>"
_NOT_RECORDED = re.compile(r"<not recorded(?:: ([^<>]*))?>")


def constructor_values(task: Any) -> dict[str, Any]:
    """The constructor arguments of `task`'s class with a value other than their default: a dataclass field's as it
    is, when YAML can hold it; NOT_RECORDED for one that is not a dataclass field (its value is unknown)."""
    import inspect

    try:
        params = inspect.signature(type(task)).parameters
    except (TypeError, ValueError):  # a class whose signature cannot be read: nothing known to rebuild it with
        return {"class": NOT_RECORDED}
    fields = {f.name: f for f in dataclasses.fields(task) if f.init} if dataclasses.is_dataclass(task) else {}
    opts: dict[str, Any] = {}
    for name in params:
        f = fields.get(name)
        if f is None:
            opts[name] = NOT_RECORDED
            continue
        value = getattr(task, name)
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        if default is dataclasses.MISSING or not same_value(value, default):
            opts[name] = recordable(value)
    return opts


def same_value(value: Any, default: Any) -> bool:
    """`value == default` for values of the same type (an array compares elementwise: never the same here)."""
    try:
        return type(value) is type(default) and bool(value == default)
    except Exception:
        return False


def recordable(value: Any) -> Any:
    """`value` as YAML holds it (a tuple as a list), or `<not recorded: TYPE>` when YAML cannot hold it exactly."""
    def plain(v: Any) -> bool:
        if type(v) in (str, int, float, bool, type(None)):
            return True
        if type(v) in (list, tuple):
            return all(map(plain, v))
        return type(v) is dict and all(type(k) is str and plain(x) for k, x in v.items())

    if plain(value):
        return list(value) if isinstance(value, tuple) else value
    cls = type(value)
    kind = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    return f"<not recorded: {kind}>"


def unrecorded_options(options: dict[str, Any]) -> list[str]:
    """The options that stand for a constructor value config.yaml could not hold (`task_record`)."""
    return [k for k, v in options.items() if isinstance(v, str) and _NOT_RECORDED.fullmatch(v)]


def check_recorded(name: str, options: dict[str, Any]) -> None:
    """Refuse a task whose options config.yaml could not hold: only the script that trained it could pass it again."""
    missing = unrecorded_options(options)
    if missing:
        what = ", ".join(f"{k}: {_NOT_RECORDED.fullmatch(options[k]).group(1) or 'value unknown'}"
                         for k in missing)
        raise ValueError(f"task {name!r} was a task object whose constructor values config.yaml cannot hold ({what}),"
                         " so only the script that trained the run can build it: resume the run from that script, "
                         "passing the same task object again (esft.train_es(config, task=...) or esft.train_grpo, "
                         "docs/custom-tasks.md)")


__all__ = ["NOT_RECORDED", "check_recorded", "constructor_values", "recordable", "same_value",
           "unrecorded_options"]
