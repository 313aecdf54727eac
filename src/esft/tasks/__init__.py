"""Tasks of the study: `get_task(name)` returns a `Task` (data, prompt format, scorer).

Trained tasks: countdown, math, chemistry (SciKnowEval Chemistry 4-choice MCQ), boolq.
Holdout tasks (forgetting): mmlu, ifeval.

A task name may carry constructor options after a colon, as comma-separated `key=value` pairs:

    countdown:numbers=2,max_number=20,ops=+*          procedural Countdown (esft.tasks.countdown_variants)
    countdown:numbers=2..3,ops=+-*,ask_format=true    2 or 3 numbers; a worked puzzle shows the answer format
    countdown:numbers=2,ops=+*,ask_format=1,shots=2   two worked puzzles: one addition, one multiplication
    boolq:max_passage_chars=400

Such a name works wherever a task name is accepted (`--task`, `--tasks`, experiment specs), and so do tasks from
outside the package (esft.tasks.custom, docs/custom-tasks.md): `my_package.module:MyTask`, a name an installed
package registers in the entry-point group `esft.tasks`, and a data file or Hugging Face dataset with a reward
(`data.jsonl:prompt_field=question,reward=math`). In a comma-separated
list of tasks a piece that starts with `key=` continues the previous task's options, so
`--tasks countdown:numbers=2,ops=+,boolq` is two tasks. Values are converted by the option's type (integers,
true/false, text; `none` or `null` is None for an option that may be None, `str | None` included, while a `str`
option keeps the text); an unknown option or a bad value is a ValueError naming the task's options. Task options
given as text (`--task-options '{tag: none}'`, a spec's task_options) are read the same way for a dataclass task:
built-in, installed or `module:Class`.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from importlib import import_module
from urllib.parse import quote

from esft.tasks.base import (Example, Messages, Task, UnknownTaskOption, completion_text, last_boxed,
                             wilson_interval)

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


#: Constructor fields a task name may not set.
_FIXED_FIELDS = ("name", "splits")


def parse_task_name(name: str) -> tuple[str, dict[str, str]]:
    """`"countdown:numbers=2,ops=+*"` -> `("countdown", {"numbers": "2", "ops": "+*"})`; values stay text.

    The base name is lower-cased; option keys are lower-cased, values kept as written. Raises ValueError for an
    empty name, an option without `=`, an empty key or value, or a key given twice."""
    base, sep, rest = str(name).strip().partition(":")
    base = base.strip().lower()
    if not base:
        raise ValueError(f"empty task name in {name!r}")
    if not sep:
        return base, {}
    if not rest.strip():
        raise ValueError(f"task {name!r}: no options after ':' (write e.g. {base}:key=value)")
    from esft.tasks.custom import parse_options

    return base, parse_options(name, rest)


#: a piece of a comma-separated task list that is an option of the task before it: `key=value`
_OPTION_PIECE = re.compile(r"[A-Za-z_]\w*\s*=")


def split_task_list(items: str | typing.Iterable[str]) -> list[str]:
    """Task names from a comma-separated string or a list whose items may have been split at every comma.

    A piece that starts with an option's name and '=' continues the previous task's options:
    `"countdown:numbers=2,ops=+,boolq"` -> `["countdown:numbers=2,ops=+", "boolq"]`; any other piece is a task, a
    data file too whose folder's name holds '=' (`runs/lr=0.1/sums.jsonl`). A reward regex that a comma cut
    (`data.jsonl:reward=regex:(a,b)`) is refused, pointing to `--reward` (a ValueError)."""
    from esft.tasks.verifiers import regex_comma_error, regex_cut_at_comma

    pieces = items.split(",") if isinstance(items, str) else [p for item in items for p in str(item).split(",")]
    out: list[str] = []
    for piece in (p.strip() for p in pieces):
        if not piece:
            continue
        if out and regex_cut_at_comma(out[-1]):  # the comma was inside a reward regex, not between tasks
            raise regex_comma_error(f"{out[-1]},{piece}")
        if _OPTION_PIECE.match(piece):
            if not out or ":" not in out[-1]:
                raise ValueError(f"option {piece!r} does not follow a task name with options (name:key=value)")
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


def _task_class(base: str, name: str) -> typing.Any:
    """The registered class of `base`, else what an installed package registers under it (esft.tasks.custom)."""
    if base in _REGISTRY:
        module_name, cls_name = _REGISTRY[base].split(":")
        return getattr(import_module(module_name), cls_name)
    from esft.tasks.custom import entry_point_names, entry_point_task

    found = entry_point_task(base)
    if found is None:
        plugins = entry_point_names()
        extra = f"; installed: {', '.join(plugins)}" if plugins else ""
        cls, _, options = name.rpartition(":")
        if cls.count(":") == 1 and "=" in options and all(p.isidentifier() for p in cls.replace(":", ".").split(".")):
            # module:Class:key=value, as built-in tasks take options: a class takes them from --task-options
            given = ", ".join(": ".join(p.partition("=")[::2]) for p in options.split(","))
            extra += (f"; a task class takes its options from --task-options (a YAML config's task_options), not "
                      f"after a second ':': {cls} with --task-options '{{{given}}}'")
        raise ValueError(f"unknown task {name!r}; available tasks: {', '.join(TASK_NAMES)}{extra} (or module:Class, "
                         "a data file .jsonl/.json/.csv with --prompt-field/--answer-field/--reward, or owner/dataset)")
    return found


def _convert_options(cls: type, name: str, raw: dict[str, str]) -> dict[str, typing.Any]:
    """Text option values converted by the type of the constructor field they set."""
    from esft.tasks.custom import typed_options

    _refuse_unknown(name, raw, _settable(cls))
    return typed_options(cls, name, raw)


def _settable(cls: type) -> set[str]:
    """The options a built-in task class takes: its constructor's fields, but those fixed per task."""
    return {f.name for f in dataclasses.fields(cls) if f.init and f.name not in _FIXED_FIELDS}


def _refuse_unknown(name: str, options: typing.Iterable[str], settable: set[str]) -> None:
    unknown = [key for key in options if key not in settable]
    if unknown:
        raise UnknownTaskOption(f"task {name!r}: unknown option {unknown[0]!r}; options: {', '.join(sorted(settable))}")


def get_task(name: str, **options) -> Task:
    """Instantiate a task by name (case-insensitive), with any `:key=value` options of the name (see the module
    docstring). `options` go to the task's constructor too; giving one option both ways is an error."""
    from esft.tasks.custom import external_kind, external_task, instantiate, script_class

    registered = str(name).partition(":")[0].strip().lower() in _REGISTRY  # `countdown:numbers` is not module:Class
    # module:Class, a data file, a hub dataset, a script's class recorded for a task object
    if not registered and (external_kind(name) is not None or script_class(name)):
        return external_task(name, options)
    base, raw = parse_task_name(name)
    cls = _task_class(base, name)
    if base not in _REGISTRY and not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        if raw:
            raise ValueError(f"task {name!r}: options in the name need a dataclass task; pass them as task options")
        return instantiate(cls, name, options)
    named = _convert_options(cls, name, raw)
    clash = sorted(set(named) & set(options))
    if clash:
        raise ValueError(f"task {name!r}: option {clash[0]!r} is set in the name and as an option")
    # text given as an option (a quoted YAML value) is read as the same text in the name would be: "false" is
    # no true value
    settable = _settable(cls)
    text = {k: v for k, v in options.items() if isinstance(v, str) and k in settable}
    if text:
        options = {**options, **_convert_options(cls, name, text)}
    if base not in _REGISTRY:  # an installed dataclass task: also wrapped when it is not a Task subclass
        return instantiate(cls, name, {**named, **options})
    _refuse_unknown(name, sorted(options), settable)  # as for the name's options, not the constructor's TypeError
    try:
        return cls(**named, **options)
    except TypeError as exc:
        if raw:  # a bad value of a name option: say so in the task's terms
            raise ValueError(f"task {name!r}: {exc}") from None
        raise


def is_task_name(name: str) -> bool:
    """True when `get_task(name)` would succeed (registered base name, valid options)."""
    try:
        get_task(name)
    except ValueError:
        return False
    return True


def task_file_stem(name: str) -> str:
    """A file name for a task name: options kept readable, path and shell-glob characters escaped (`/` -> %2F)."""
    return quote(str(name).strip(), safe="=,:+-._")


__all__ = [
    "Example", "Messages", "Task", "TASK_NAMES", "TRAIN_TASKS", "HOLDOUT_TASKS", "UnknownTaskOption",
    "completion_text", "get_task", "is_task_name", "last_boxed", "parse_task_name", "split_task_list",
    "task_file_stem", "wilson_interval",
]
