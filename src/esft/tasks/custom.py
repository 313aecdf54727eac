"""Tasks from outside the package, resolved by `esft.tasks.get_task` like the built-in names:

    my_package.module:MyTask      a Task subclass (built with the task options), a Task instance, or any object
                                  with load(split) / prompt(example) / score(completion, example)
    NAME                          a name an installed package registers in the entry-point group `esft.tasks`
                                  (pyproject: [project.entry-points."esft.tasks"] NAME = "pkg.module:MyTask")
    data.jsonl | data.csv         the user's rows and a reward (esft.tasks.dataset_task.DatasetTask); options as
    owner/dataset                 for every task: `data.jsonl:prompt_field=question,reward=math` or task_options
                                  (the CLI's --prompt-field, --answer-field, --system-prompt, --reward)

Every form is a string, so a config that names such a task still rebuilds it from `config.yaml` (resume, replay,
experiments). `task_spec(obj)` gives the string of a task object passed to the Python API, where it has one.
"""

from __future__ import annotations

import dataclasses
import re
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from esft.tasks.base import Example, Messages, Task, UnknownTaskOption, checks_format, task_name
from esft.tasks.common import construct
from esft.tasks.dataset_task import DatasetTask, is_data_file, reward_parts
from esft.tasks.task_values import check_recorded, constructor_values, recordable, same_value, unrecorded_options
from esft.tasks.verifiers import import_object, regex_comma_error, regex_cut_at_comma

ENTRY_POINT_GROUP = "esft.tasks"

_IDENT = r"[A-Za-z_]\w*"
_IMPORT_PATH = re.compile(rf"{_IDENT}(?:\.{_IDENT})*:{_IDENT}(?:\.{_IDENT})*")
_HUB_NAME = re.compile(r"[\w.-]+/[\w.-]+")
#: the CLI's data-task flags, as DatasetTask options
DATA_TASK_FLAGS = ("prompt_field", "answer_field", "system_prompt", "reward")


_DATA_SPEC = re.compile(r"(.*?\.(?:jsonl|json|csv|tsv)(?:\.gz)?)(?::(.*))?", re.IGNORECASE | re.DOTALL)


def split_options(spec: str) -> tuple[str, str]:
    """(source, option text) of `data.jsonl:key=value,...` or `owner/name[:config]:key=value,...` (a hub config
    has no '=': the options begin at the first ':'-separated part that holds one)."""
    m = _DATA_SPEC.fullmatch(spec)
    if m:
        return m.group(1), m.group(2) or ""
    parts = spec.split(":")
    for i in range(1, len(parts)):
        if "=" in parts[i]:
            return ":".join(parts[:i]), ":".join(parts[i:])
    return spec, ""


#: suffixes of data files esft does not read, with the pandas reader that converts each (None: no such reader)
OTHER_DATA_SUFFIXES = {".parquet": "read_parquet", ".feather": "read_feather", ".xlsx": "read_excel",
                       ".xls": "read_excel", ".arrow": None, ".txt": None, ".ndjson": None, ".zip": None, ".bz2": None,
                       ".xz": None, ".zst": None}


def external_kind(name: str) -> str | None:
    """"import", "data" or "hub" for a task string that names a task outside the registry, "file" for a file esft
    does not read (an existing file, or a data suffix such as .parquet, that is not .jsonl/.json/.csv/.tsv: building
    it says so), else None (a registered or entry-point name, with or without options)."""
    text = str(name).strip()
    source, _ = split_options(text)
    if is_data_file(source):
        return "data"
    if _IMPORT_PATH.fullmatch(text):
        return "import"
    path = Path(source)
    if path.suffix and (path.suffix.lower() in OTHER_DATA_SUFFIXES or path.is_file()):
        return "file"
    if _HUB_NAME.fullmatch(source.partition(":")[0]) and not path.exists():
        return "hub"
    return None


def unread_file_error(source: str) -> ValueError:
    """The refusal of a task file esft does not read (external_kind "file"): the suffixes it reads, how to convert."""
    path = Path(source)
    suffix = path.suffix.lower()
    reader = OTHER_DATA_SUFFIXES.get(suffix)
    how = (f" (pandas: pd.{reader}({source!r}).to_json({path.stem + '.jsonl'!r}, orient='records', lines=True))"
           if reader else "")
    return ValueError(f"task data file {source}: esft reads .jsonl, .json, .csv and .tsv files (each may be "
                      f"gzip-compressed, .gz), not {suffix}: convert it to JSONL, one object per line{how}")


def absolute_data_task(name: str) -> str:
    """`name` with its data file's path, and a `test_file` option's, made absolute where each names an existing file
    relative to the working directory (other options kept), so that a run's config.yaml rebuilds the task from any
    directory (--resume, replay, report); any other task string unchanged."""
    text = str(name).strip()
    if external_kind(text) != "data":
        return name
    source, options = split_options(text)
    options = _TEST_FILE_OPTION.sub(lambda m: m.group(1) + absolute_file(m.group(2).strip()), options)
    made = absolute_file(source) + (f":{options}" if options else "")
    return name if made == text else made


_TEST_FILE_OPTION = re.compile(r"((?:^|,)\s*test_file\s*=\s*)([^,]+)", re.IGNORECASE)


def absolute_file(text: str) -> str:
    """`text` made an absolute path where it names an existing file relative to the working directory."""
    path = Path(text).expanduser()
    return text if path.is_absolute() or not path.is_file() else str(path.resolve())


def absolute_task_options(options: dict[str, Any]) -> dict[str, Any]:
    """A data task's options with `test_file` made absolute (`absolute_file`), as `absolute_data_task` does."""
    value = options.get("test_file")
    return {**options, "test_file": absolute_file(value)} if isinstance(value, str) else options


def parse_options(name: str, text: str) -> dict[str, str]:
    """`key=value,...` -> dict of text values (keys lower-cased); ValueError on a malformed or repeated option."""
    options: dict[str, str] = {}
    pieces = text.split(",")
    for i, piece in enumerate(pieces):
        if i and regex_cut_at_comma(",".join(pieces[:i])):  # a comma inside a reward regex
            raise regex_comma_error(f"{name.partition(text)[0]}{','.join(pieces[:i + 1])}")
        key, eq, value = piece.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not eq or not key or not value:
            raise ValueError(f"task {name!r}: option {piece.strip()!r} is not key=value")
        if key in options:
            raise ValueError(f"task {name!r}: option {key!r} given twice")
        options[key] = value
    return options


def _data_task(name: str, kind: str, options: dict[str, Any]) -> DatasetTask:
    from esft.config_flags import converter  # ground floor too: option text -> the field's type
    import typing

    source, text = split_options(str(name).strip())
    named = parse_options(name, text) if text else {}
    fields = {f.name: f for f in dataclasses.fields(DatasetTask) if f.init and f.name not in ("splits", "source")}
    hints = typing.get_type_hints(DatasetTask)
    values: dict[str, Any] = {}
    for key, value in {**named, **options}.items():
        if key not in fields:
            raise UnknownTaskOption(f"task {name!r}: unknown option {key!r}; options of a data task: "
                             f"{', '.join(sorted(fields))}")
        if value is None and type(None) not in typing.get_args(hints[key]):  # `split_seed: null` drew a new split
            raise ValueError(f"task {name!r}: option {key!r} may not be null (leave it out for its default)")
        if value is not None and not isinstance(value, str) and _takes_text(hints[key]):
            raise ValueError(f"task {name!r}: option {key!r} takes text, got {value!r}")
        try:
            values[key] = converter(hints[key])(value) if isinstance(value, str) and hints[key] is not str else value
        except (ValueError, TypeError) as exc:
            raise ValueError(f"task {name!r}: bad value {value!r} for option {key!r}: {exc}") from None
    clash = sorted(set(named) & set(options))
    if clash:
        raise ValueError(f"task {name!r}: option {clash[0]!r} is set in the name and as an option")
    task = DatasetTask(source=source, **values)
    task.validate()  # the data and the reward, checked before any model loads
    return task


def _takes_text(hint: Any) -> bool:
    """A field typed `str` or `str | None` (a field name, a path, a prompt), where a YAML list or number is a
    mistake that would surface later as an unrelated error (e.g. "unhashable type: 'list'")."""
    import typing

    return hint is str or set(typing.get_args(hint)) == {str, type(None)}


def entry_point_names() -> list[str]:
    """Names installed packages register in the `esft.tasks` entry-point group."""
    return sorted({ep.name.lower() for ep in entry_points(group=ENTRY_POINT_GROUP)})


def entry_point_task(base: str) -> Any | None:
    """The object an installed package registers under `base` (lower-case match), or None."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name.lower() == base:
            try:
                return ep.load()
            except Exception as exc:  # a broken plug-in: say which one
                raise ValueError(f"task {base!r} (entry point {ep.value!r}): cannot load: "
                                 f"{type(exc).__name__}: {exc}") from None
    return None


def instantiate(obj: Any, name: str, options: dict[str, Any]) -> Task:
    """A task from what an import path or an entry point names: a class is built with `options`, an object is used
    as it is (then options are an error). Objects that are not Task instances get the Task defaults around them."""
    if isinstance(obj, type):
        if dataclasses.is_dataclass(obj):  # YAML holds a tuple field as a list (task_record): the tuple again
            options = typed_options(obj, name, options)
            tuples = _tuple_fields(obj)
            options = {k: tuple(v) if k in tuples and isinstance(v, list) else v for k, v in options.items()}
        obj = construct(obj, name, options)
    elif options:
        raise ValueError(f"task {name!r} is an object, not a class: it takes no options (got {sorted(options)})")
    missing = [m for m in ("load", "prompt", "score") if not callable(getattr(obj, m, None))]
    if missing:
        raise ValueError(f"task {name!r} ({type(obj).__name__}) is not a task: it has no {', '.join(missing)} "
                         "(a task needs load(split), prompt(example) and score(completion, example))")
    return obj if isinstance(obj, Task) else TaskAdapter(obj)


def as_task(obj: Any) -> Task:
    """The Task that trains and evaluates a task object or class passed to the Python API (esft.train_es,
    esft.train_grpo, ESTrainer, GRPO's run): what get_task builds for `--task module:Class` naming it, so a run
    started from a script and its resume from config.yaml, its Ray workers, `esft eval` and `esft report` prompt,
    score and label it alike. An esft Task is itself; any other object is used through a TaskAdapter (a prompt
    given as text becomes the user turn of a chat, and the label defaults apply)."""
    return instantiate(obj, obj.__name__ if isinstance(obj, type) else task_name(obj), {})


def typed_options(cls: type, name: str, options: dict[str, Any]) -> dict[str, Any]:
    """`options` with each text value of a dataclass field read by the field's type, as the same text in a task
    name is (esft.tasks): `none` is None for a field that may be None, `false` is False, `5` is 5; a `str` field
    keeps its text, and values that are not text pass as they are. A ValueError names a text the type refuses."""
    import argparse
    import typing

    from esft.config_flags import converter

    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation that does not resolve here: no type to read the text by
        return options
    settable = {f.name for f in dataclasses.fields(cls) if f.init}
    out = dict(options)
    for key, value in options.items():
        if isinstance(value, str) and key in settable and key in hints:
            try:
                out[key] = converter(hints[key])(value)
            except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:  # the last: a bad true/false
                raise ValueError(f"task {name!r}: bad value {value!r} for option {key!r}: {exc}") from None
    return out


def _tuple_fields(cls: type) -> set[str]:
    """The fields of a dataclass that hold a tuple: by their default, or by their annotation (`tuple`,
    `tuple[int, ...] | None`, a default_factory's field)."""
    import types
    import typing

    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation that does not resolve here: the defaults alone tell
        hints = {}
    out = set()
    for f in dataclasses.fields(cls):
        hint = hints.get(f.name)
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        kinds = {typing.get_origin(h) or h for h in (typing.get_args(hint) if union else (hint,))}
        if isinstance(f.default, tuple) or tuple in kinds:
            out.add(f.name)
    return out


def script_class(name: str) -> bool:
    """Whether a task string names a class of a script's `__main__` or one defined inside a function: what
    config.yaml records for a task object of such a class (`recorded_class`), which only that script can rebuild."""
    module, sep, attr = str(name).strip().partition(":")
    return bool(sep) and (module == "__main__" or "<locals>" in attr)


def recorded_class(task: Any) -> str:
    """`module:Qualname` of the user's class behind a task object (a TaskAdapter's object's class)."""
    cls = type(task.obj if isinstance(task, TaskAdapter) else task)
    return f"{cls.__module__}:{cls.__qualname__}"


def external_task(name: str, options: dict[str, Any]) -> Task:
    """The task an import path, a data file or a hub dataset name stands for (see external_kind)."""
    kind = external_kind(name)
    if kind == "file":
        raise unread_file_error(split_options(str(name).strip())[0])
    if kind in ("data", "hub"):
        check_recorded(name, options)
        return _data_task(name, kind, options)
    if kind == "import" or script_class(name):
        try:
            found = import_object(str(name).strip(), "task")
        except ValueError:
            if not script_class(name):
                raise
            where = "defined inside a function" if "<locals>" in name else "its __main__"
            raise ValueError(f"task {name!r} is a class of the script that trained the run ({where}), which "
                             "config.yaml cannot rebuild: continue the run from that script, passing the task object "
                             "again (esft.train_es(config, task=...), docs/custom-tasks.md)") from None
        check_recorded(name, options)
        return instantiate(found, name, options)
    raise ValueError(f"task {name!r} is neither an import path (module:Class) nor a data file nor a dataset name")


class TaskAdapter(Task):
    """Any object with load / prompt / score behind the Task interface (defaults for what it lacks)."""

    def __init__(self, obj: Any):
        super().__init__(name=task_name(obj),
                         splits=tuple(getattr(obj, "splits", ("train", "test"))))
        self.obj = obj

    def _load(self, split: str) -> list[Example]:
        rows = self.obj.load(split)
        if isinstance(rows, (dict, str, bytes)):  # list() would make its keys or characters the examples
            raise TypeError(f"{type(self.obj).__name__}.load({split!r}) returned {type(rows).__name__}, not a list "
                            "of examples")
        return list(rows)

    def prompt(self, example: Example) -> Messages:
        out = self.obj.prompt(example)
        return [{"role": "user", "content": out}] if isinstance(out, str) else out

    def score(self, completion: str, example: Example) -> float:
        value = self.obj.score(completion, example)
        if isinstance(value, (str, bytes)):  # float("1.0") passed, and a "n/a" failed only mid-run: no text at all
            raise TypeError(f"{type(self.obj).__name__}.score returned text {value!r}, not a number")
        return float(value)

    @property
    def checks_format(self) -> bool:
        """The object brings its own format check (`is_well_formed`), or has none."""
        return checks_format(self.obj)

    def is_well_formed(self, completion: str, example: Example) -> bool:
        return self.checks_format and bool(self.obj.is_well_formed(completion, example))

    def details(self, completion: str, example: Example) -> dict[str, Any]:
        details = getattr(self.obj, "details", None)
        return dict(details(completion, example)) if callable(details) else {}

    # the gold labels, where the object brings them (constant-answer baseline, balanced subsets)
    def gold_key(self, example: Example) -> Any:
        own = getattr(self.obj, "gold_key", None)
        return own(example) if callable(own) else super().gold_key(example)

    def label_set(self) -> tuple[str, ...] | None:
        own = getattr(self.obj, "label_set", None)
        return own() if callable(own) else super().label_set()

    def balance_key(self, example: Example) -> Any:
        own = getattr(self.obj, "balance_key", None)
        return own(example) if callable(own) else super().balance_key(example)

    def answer_labels(self) -> tuple[str, ...] | None:
        """The object's own; else its label set when it has no `balance_key` of its own (Task.answer_labels)."""
        own = getattr(self.obj, "answer_labels", None)
        if callable(own):
            return own()
        return None if callable(getattr(self.obj, "balance_key", None)) else self.label_set()


def add_task_flags(parser: Any) -> None:
    """The data-task flags of `esft eval` / `esft train es|grpo` (argparse); they become task options."""
    helps = {"prompt_field": "data task: column of the prompt (text, or chat messages)",
             "answer_field": "data task: column of the gold answer",
             "system_prompt": "data task: system message before each prompt",
             "reward": "data task: exact, boxed, math, mcq, regex:PATTERN, or module:function with TRL's reward "
                       "signature (completions, **kwargs) -> list[float] (None where it does not apply); several "
                       "functions joined by '+' add up as in TRL"}
    for key in DATA_TASK_FLAGS:
        parser.add_argument("--" + key.replace("_", "-"), dest=key, default=None, metavar=key.split("_")[0].upper(),
                            help=helps[key] + " (docs/custom-tasks.md)")


def apply_task_flags(config: Any, args: Any, tasks: list[str]) -> Any:
    """`config` with the data-task flags given in `args` added to its task_options; an error when none of `tasks`
    is a data task (the flags would be ignored)."""
    flags = {k: getattr(args, k) for k in DATA_TASK_FLAGS if getattr(args, k, None) is not None}
    if not flags:
        return config
    if not any(external_kind(t) in ("data", "hub", "file") for t in tasks):  # a "file": its build says what is wrong
        names = ", ".join("--" + k.replace("_", "-") for k in flags)
        raise ValueError(f"{names}: only for a task read from a data file or dataset (--task data.jsonl), "
                         f"not for {', '.join(tasks)}")
    return dataclasses.replace(config, task_options={**config.task_options, **flags})


def task_spec(task: Any) -> tuple[str, dict[str, Any]] | None:
    """(task string, task options) that rebuild `task` exactly through get_task, or None when it has none: a data
    task gives its source and options; an object whose class is importable (not defined in __main__ or inside a
    function) gives `module:Class` and its constructor values that differ from the defaults (`task_record`), when
    every one of them is a plain YAML value."""
    record = task_record(task)
    if script_class(record[0]) or unrecorded_options(record[1]):
        return None
    return record


def task_record(task: Any) -> tuple[str, dict[str, Any]]:
    """What a run's config.yaml records for a task object: its task string and options. Where they cannot rebuild
    it, the string names its class all the same (`recorded_class`) and each constructor value YAML cannot hold (a
    function, an array), or whose value is unknown (an argument of a constructor that is not a dataclass's), is
    `<not recorded: TYPE>`: get_task refuses such options (`check_recorded`), so a resume from config.yaml says
    to continue from the script instead of building the task with other values."""
    if isinstance(task, TaskAdapter):  # rebuilt from the user's class, which get_task wraps again
        task = task.obj
    if isinstance(task, DatasetTask):
        defaults = DatasetTask(source=task.source, reward="exact")
        opts = {f.name: recordable(getattr(task, f.name)) for f in dataclasses.fields(task)
                if f.init and f.name not in ("source", "name", "splits")
                and not same_value(getattr(task, f.name), getattr(defaults, f.name))}
        if not isinstance(task.reward, str):  # functions passed themselves: their import paths, where they name them
            paths = [_import_path(fn) for fn in reward_parts(task.reward)]
            opts["reward"] = "+".join(paths) if all(paths) else opts["reward"]  # type: ignore[arg-type]
        return task.source, absolute_task_options(opts)
    cls = type(task)
    path = recorded_class(task)
    if cls.__module__ != "builtins" and not script_class(path):
        try:
            found = import_object(path, "task")
        except ValueError:
            found = None
        if found is not cls:  # e.g. a class made by a factory function under another name
            return path, {"class": "<not recorded: not importable by this name>"}
    return path, constructor_values(task)


def _import_path(obj: Any) -> str | None:
    """`module:qualname` that imports `obj` itself, or None (a lambda, a function of __main__ or inside one)."""
    path = f"{getattr(obj, '__module__', None)}:{getattr(obj, '__qualname__', '')}"
    if script_class(path) or not _IMPORT_PATH.fullmatch(path):
        return None
    try:
        return path if import_object(path, "reward") is obj else None
    except ValueError:
        return None


__all__ = ["DATA_TASK_FLAGS", "ENTRY_POINT_GROUP", "TaskAdapter", "absolute_data_task", "absolute_file",
           "absolute_task_options", "add_task_flags", "apply_task_flags", "as_task", "entry_point_names",
           "entry_point_task", "external_kind", "external_task", "instantiate", "parse_options", "recorded_class",
           "script_class", "split_options", "task_record", "task_spec"]
