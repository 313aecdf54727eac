"""Dataclass configs <-> command line flags and YAML files.

Every run is described by one dataclass (CleanRL style: a docstring under each field; esft.config_flags turns it
into argparse flags, their help text the field docstrings). This module merges, in increasing priority:
dataclass defaults < `--preset NAME` < `--config run.yaml` < explicit flags. Unknown YAML keys fail loudly.

It is also the first half of esft's one validation layer (the second, names of tasks and models, is
esft.validation): every value is checked against its field's type (an integer field takes no 2.7, a boolean no
"maybe") and against the range rules its config declares (`Rule`: sigma > 0, alpha finite, sizes >= 1, ...), so a
bad value fails as a `ConfigError` naming the key, the value, where it came from (`run.yaml:4`, `--sigma`,
`preset 'cpu'`) and what would be accepted, before any model loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import numbers
import types
import typing
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

import yaml

from esft.config_flags import converter, unwrap_optional
from esft.config_rules import Rule, plain_value
from esft.names import close_names, did_you_mean
from esft.yaml_keys import repeated_key

T = TypeVar("T", bound="ConfigHooks")


#: esft's fast CPU rollout configuration (esft.generation.GenerationConfig fields; docs/performance.md measures
#: each): the shared system-prompt prefix prefilled once, the rest in 4 length buckets, decode matmuls through
#: oneDNN with packed (and q|k|v, gate|up stacked) weights, the compiled decode kernels (rotary + KV-append +
#: attention, RMSNorm / residual / SwiGLU), and, when greedy, the bf16-screened lm_head. Logits match
#: `model.generate`'s to ~1e-6 relative rather than bit for bit (greedy outputs are compared in tests and by
#: `esft bench --check-outputs`); each option falls back to the exact path (with a warning) where it cannot run.
#: `esft bench` and the ES `cpu` preset use it.
FAST_CPU_GENERATION: dict[str, object] = {"share_prefix": True, "prefill_buckets": 4, "packed_linear": True,
                                          "fused_attention": True, "screened_lm_head": True}


def passage_cut(task: Any, max_passage_chars: int | None) -> dict[str, Any]:
    """{"max_passage_chars": n} when a passage cut is set and `task` is BoolQ without one in its name, else {}:
    a preset's cut must not reach a task without passages when only the task is overridden. The one rule for
    trainer configs, evaluation, validation and curves."""
    base, _, options = str(task).partition(":")
    if max_passage_chars is None or base.strip().lower() != "boolq" or "max_passage_chars" in options.lower():
        return {}
    return {"max_passage_chars": max_passage_chars}


class ConfigHooks:
    """What the config machinery (`coerce`, `build_config`, experiment specs) asks of a config dataclass, each with
    its default; every config class built from flags, files or specs inherits it, and overrides what it says better."""

    #: the command that trains with this config (`esft train es`): a key of another command's config is named so
    command: typing.ClassVar[str] = ""
    #: names whose `unknown_option_hint` outranks naming another command's option of that name (GRPO: TRL's names)
    hinted_names: typing.ClassVar[frozenset[str]] = frozenset()

    @staticmethod
    def unknown_option_hint(name: str, close: list[str]) -> str:
        """The text after "unknown option 'name'" in an error, given the config's field names `close` to `name`
        (esft.names.close_names): by default those names as a suggestion."""
        return f" (did you mean {', '.join(close)}?)" if close else ""


class RunConfig(ConfigHooks):
    """Shared behaviour of the trainers' config dataclasses (ESConfig, GRPOConfig)."""

    task: str
    task_options: dict[str, Any]
    max_passage_chars: int | None
    eval_every: int
    save_total_limit: int
    output_dir: str
    run_name: str | None
    #: what each field accepts beyond its type (`check_fields`); each config module sets its own
    rules: typing.ClassVar[Mapping[str, "Rule"]] = {}
    generation_fields: typing.ClassVar[tuple[str, ...]] = ()  # those that bound a completion (generation_limits)

    def tracking_name(self) -> str:
        """The run's name in trackers (TensorBoard, wandb, trackio): run_name, else its folder's name (of the folder
        `.` or `runs/..` stands for: their own name is '' or '..'; a link keeps its own name)."""
        import os.path

        return self.run_name or Path(os.path.abspath(self.output_dir)).name

    def task_checks(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(config key, task name, constructor options) of the task the run builds (esft.validation.check_names)."""
        return [("task", self.task, self.task_kwargs())]

    def check_task_fit(self, task: Any, name: str | None = None) -> None:
        """Cross-checks of the config against its built task, before any model loads (none by default); `name`:
        the task as the user named it (`task_checks`)."""

    def generation_limits(self) -> dict[str, int]:
        """{config key: the most tokens a completion may generate} of the `generation_fields` set, checked against
        the model's context length before it loads (esft.validation.check_names)."""
        return {f: getattr(self, f) for f in self.generation_fields if getattr(self, f)}

    def task_kwargs(self) -> dict[str, Any]:
        """Keyword options of the task's constructor: task_options, plus the passage cut (`passage_cut`)."""
        return {**passage_cut(self.task, self.max_passage_chars), **self.task_options}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def replace(self, **changes: Any):
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def stored_value(self, name: str, value: Any) -> Any:
        """`value` for field `name` as this config stores it (YAML text parsed, "fast" generation options spelt out,
        a data file's path made absolute), so that a flag a resume repeats unchanged compares equal to what
        config.yaml recorded; `value` itself where the config refuses it (the caller then names the change)."""
        try:
            return getattr(self.replace(**{name: value}), name)
        except (ValueError, TypeError):
            return value


class MappingError(ValueError):
    """parse_mapping's refusal; `detail` is the reason alone, for a ConfigError that names the field and value."""

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail


def parse_mapping(name: str, value: Any) -> dict[str, Any]:
    """A mapping field's value: a dict, or its YAML / JSON text from a command line (`{replay_fraction: 0.2}`);
    anything else, malformed YAML included, fails as MappingError (a ValueError) naming the field."""
    text = None
    if isinstance(value, str):
        text = value
        try:
            value = yaml.safe_load(value) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at column {mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or "not valid YAML"
            raise MappingError(f"{name} {value!r} is not a YAML / JSON mapping such as {{key: value}}{at}: {problem}",
                               f"the text is not a YAML / JSON mapping{at}: {problem}") from None
        if isinstance(value, dict):
            glued = [k for k, v in value.items() if v is None and isinstance(k, str) and ":" in k]
            if glued:  # YAML reads `{replay_fraction:0.2}` as the key 'replay_fraction:0.2' with no value
                key, _, rest = glued[0].partition(":")
                fix = f"YAML needs a space after the colon ({{{key}: {rest}}})"
                raise MappingError(f"{name} {text!r} has the key {glued[0]!r} without a value: {fix}",
                                   f"the key {glued[0]!r} has no value: {fix}")
    if not isinstance(value, dict):
        reads = f"reads as {type(value).__name__} {value!r}"
        given = f"{name} {value!r}" if text is None else f"{name} {text!r} {reads}"
        raise MappingError(f"{given}: it must be a mapping such as {{key: value}}",
                           "" if text is None else f"the text {reads}")
    return value


def mapping_field(name: str, value: Any) -> dict[str, Any]:
    """`parse_mapping` for config field `name`: its refusal is a ConfigError, which build_config locates (the
    file's line or the flag the value came from)."""
    try:
        return parse_mapping(name, value)
    except MappingError as exc:
        detail = f" ({exc.detail})" if exc.detail else ""
        raise ConfigError(name, value, f"a mapping such as {{key: value}}{detail}") from None


# ---- validation: types and ranges ---------------------------------------------------------------------------------

class ConfigError(ValueError):
    """A config value that is not accepted: the key, the value, where it came from (when known) and what is
    accepted. esft's CLI prints it as `esft: error: ...` and exits 2."""

    def __init__(self, key: str, value: Any, accepted: str, where: str | None = None):
        self.key, self.value, self.accepted, self.where = key, value, accepted, where
        at = f"{where}: " if where else ""
        super().__init__(f"{at}{key} = {value!r} is not accepted; expected {accepted}")

    def located(self, where: str | None) -> "ConfigError":
        """The same error with its origin (a file and line, a flag, a preset) when it had none."""
        return self if self.where or not where else ConfigError(self.key, self.value, self.accepted, where)


def type_ok(value: Any, hint: Any) -> bool:
    """`value` has the field type `hint`: ints pass for floats (never the reverse: no silent truncation), bools
    are not numbers, None only for optionals."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is Any:
        return True
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (list, tuple) or hint in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    return True


def type_words(hint: Any) -> str:
    """`hint` in an error message's words ("an integer", "a number or null", ...)."""
    inner, optional = unwrap_optional(hint)
    origin = typing.get_origin(inner)
    words = {bool: "true or false", int: "an integer", float: "a number", str: "text"}.get(inner)
    if words is None:
        words = ("a list" if origin in (list, tuple) or inner in (list, tuple) else
                 "a mapping" if origin is dict or inner is dict else str(inner))
    return f"{words} or null" if optional else words


def check_value(cls: type[RunConfig], name: str, value: Any) -> None:
    """One field's value against its type and the class's `rules` (an option block of an experiment spec)."""
    hint = typing.get_type_hints(cls)[name]
    if not type_ok(value, hint):
        raise ConfigError(name, value, type_words(hint))
    rule = cls.rules.get(name)
    if rule is not None and value is not None and not rule.ok(value):
        raise ConfigError(name, value, rule.accepted)


def check_fields(config: Any, rules: Mapping[str, Rule] | None = None) -> None:
    """Every field of the dataclass `config` against its type, then against its `Rule` (None passes the rule of
    an optional field). Raises ConfigError for the first bad value."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value = plain_value(getattr(config, f.name))  # a numpy scalar, a path: as the type check and YAML read them
        object.__setattr__(config, f.name, value)
        if not type_ok(value, hints[f.name]):
            raise ConfigError(f.name, value, type_words(hints[f.name]))
        rule = (rules or {}).get(f.name)
        if rule is not None and value is not None and not rule.ok(value):
            raise ConfigError(f.name, value, rule.accepted)


def load_yaml_lines(path: str | Path) -> tuple[dict[str, Any], dict[str, int]]:
    """(top-level mapping, line of each top-level key) of a YAML config file; unreadable, malformed or
    non-mapping files fail as ValueError naming the file (and the line YAML stopped at)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        text = path.read_text()
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{path}{line}: not valid YAML: {exc.problem or exc.context}") from None
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read it as YAML ({exc})") from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of option: value at the top level, got {type(data).__name__}")
    twice = repeated_key(node)  # esft.yaml_keys
    if twice is not None:
        key, first, line = twice
        raise ValueError(f"{path}:{line}: duplicate key {key!r} (first on line {first}); YAML would keep only the "
                         "last value: remove one")
    lines = {}
    if isinstance(node, yaml.MappingNode):
        lines = {str(k.value): k.start_mark.line + 1 for k, _ in node.value}
    return data, lines


def coerce(cls: type[ConfigHooks], values: Mapping[str, Any], source: str,
           where: Callable[[str], str] | None = None) -> dict[str, Any]:
    """Check keys against the dataclass and convert strings where YAML left them as strings. `where(key)` names
    a key's origin in errors (default: `source`)."""
    if not issubclass(cls, ConfigHooks):  # its hooks run only on a bad key: refuse such a class on every use instead
        raise TypeError(f"{cls.__name__} is built from options, so it must inherit esft.config.ConfigHooks")
    names = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    out = {}
    for key, value in values.items():
        name = str(key).replace("-", "_")  # a YAML key may be a number or a bool (`1: 2`, `yes: 3`)
        at = where(str(key)) if where else source
        if name not in names:
            raise ValueError(f"{at}: unknown option {key!r}{unknown_option_words(cls, name, names)}")
        if isinstance(value, str) and hints[name] is not str:
            try:
                value = converter(hints[name])(value)
            except (ValueError, TypeError, argparse.ArgumentTypeError):
                raise ConfigError(name, value, type_words(hints[name]), at) from None
        out[name] = value
    return out


def unknown_option_words(cls: type[ConfigHooks], name: str, names: typing.Iterable[str]) -> str:
    """The words after "unknown option 'name'" for config class `cls` with options `names`: the class's hint for one
    of its `hinted_names`; the command whose option it is, where another trainer's config has it
    (`other_command_words`: no near names then, which would mislead, as GRPO's num_iterations for ES's iterations);
    else the class's own `unknown_option_hint`."""
    own = cls.unknown_option_hint(name, []) if name in cls.hinted_names else ""
    return own or other_command_words(cls, name) or cls.unknown_option_hint(name, close_names(name, names))


def other_command_words(cls: type[ConfigHooks], name: str) -> str:
    """' (an option of `esft train grpo`, not of `esft train es`)' where `name` is a field of another config class
    with a command (a GRPO file given to ES), else ''. Only a class that declares a command speaks for it (a user's
    ESConfig subclass adds fields `esft train es` lacks); only imported classes are seen (`esft train` imports both)."""
    stack, found = list(ConfigHooks.__subclasses__()), set()
    while stack:
        other = stack.pop()
        stack.extend(other.__subclasses__())
        declares = "command" in vars(other) and dataclasses.is_dataclass(other)  # fields() raises on a plain class
        if declares and other.command not in ("", cls.command) and name in {f.name for f in dataclasses.fields(other)}:
            found.add(f"`{other.command}`")
    return f" (an option of {' and '.join(sorted(found))}, not of `{cls.command}`)" if found and cls.command else ""


def build_config(cls: type[T], presets: Mapping[str, Mapping[str, Any]] | None = None,
                 preset: str | None = None, config_file: str | None = None,
                 overrides: Mapping[str, Any] | None = None, check: Callable[[T], None] | None = None,
                 overrides_source: str = "command line", flag_names: Mapping[str, str] | None = None) -> T:
    """defaults < preset < YAML file (its own `preset:` key applies when no preset is given) < explicit overrides;
    then the type / range checks (the config's own `__post_init__`, `check_fields`) and `check` (e.g.
    esft.validation.check_names). A rejected value's error names where it was set (an alias as typed: flag_names)."""
    origin: dict[str, str] = {}
    file_values: dict[str, Any] = {}
    if config_file:
        data, lines = load_yaml_lines(config_file)
        # a run's saved config.yaml reads as the options it ran with: `_run` is esft's record of it, not an option
        data.pop("_run", None)
        file_preset = data.pop("preset", None)
        if file_preset and not preset:
            if not presets or file_preset not in presets:
                raise ConfigError("preset", file_preset, f"one of {', '.join(presets or {}) or 'no presets'}",
                                  f"{config_file}:{lines.get('preset', '?')}")
            preset = file_preset
        file_values = coerce(cls, data, str(config_file), lambda k: f"{config_file}:{lines.get(k, '?')}")
        origin.update({k.replace("-", "_"): f"{config_file}:{lines.get(k, '?')}" for k in data})
    values: dict[str, Any] = {}
    if preset:
        if not presets or preset not in presets:
            raise ValueError(f"unknown preset {preset!r}{did_you_mean(preset, presets or ())}; available: "
                             f"{', '.join(presets or ())}")
        values.update(coerce(cls, presets[preset], f"preset {preset!r}"))
        origin = {**{k: f"preset {preset!r}" for k in presets[preset]}, **origin}
    values.update(file_values)

    def named(key: str) -> str:  # flags are named as typed (an alias by its own name); other sources by the key
        flag = f"--{key.replace('_', '-')}" if overrides_source == "command line" else key
        return f"{overrides_source} ({(flag_names or {}).get(key, flag)})"

    flags = coerce(cls, overrides or {}, overrides_source, named)
    values.update(flags)
    origin.update({k: named(k) for k in flags})
    try:
        config = cls(**values)
        check_fields(config)
        if check is not None:
            check(config)
    except ConfigError as exc:
        raise exc.located(origin.get(exc.key)) from None
    return config


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def save_yaml(config: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(config), sort_keys=False))


def locked_changes(old: Any, new: Any, free: typing.Iterable[str]) -> dict[str, tuple[Any, Any]]:
    """option -> (the run's value, this config's) for every option of the run's config `old` that `new` changes,
    `free` (the options a resume may change) aside: what `resume_refusal` names."""
    return {k: (getattr(old, k), getattr(new, k)) for k in old.to_dict()
            if k not in free and getattr(old, k) != getattr(new, k)}


def resume_refusal(run_dir: Any, diffs: Mapping[str, tuple[Any, Any]], note: str = "") -> ValueError:
    """The refusal of a resume whose config differs from the run's in options a resume may not change (`diffs`:
    option -> (the run's value, this config's)), in the words `resume_config` uses for a flag."""
    was = ", ".join(f"{k}={old!r}" for k, (old, _) in diffs.items())
    now = ", ".join(f"{k}={new!r}" for k, (_, new) in diffs.items())
    return ValueError(f"cannot change {sorted(diffs)} when resuming {run_dir} (the run has {was}; this config has "
                      f"{now}){note}: drop the change, or start a new run in another --output-dir")
