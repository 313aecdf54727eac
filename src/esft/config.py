"""Dataclass configs <-> command line flags and YAML files.

Every run is described by one dataclass (CleanRL style: a docstring under each field). This module turns such a
dataclass into argparse flags (help text = the field docstring) and merges, in increasing priority:
dataclass defaults < `--preset NAME` < `--config run.yaml` < explicit flags. Unknown YAML keys fail loudly.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import dataclasses
import inspect
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Mapping, TypeVar

import yaml

T = TypeVar("T")


#: esft's fast CPU rollout configuration (esft.generation.GenerationConfig fields; docs/performance.md measures
#: each): the shared system-prompt prefix prefilled once, the rest in 4 length buckets, decode matmuls through
#: oneDNN with packed (and q|k|v, gate|up stacked) weights, the compiled decode kernels (rotary + KV-append +
#: attention, RMSNorm / residual / SwiGLU), and, when greedy, the bf16-screened lm_head. Logits match
#: `model.generate`'s to ~1e-6 relative rather than bit for bit (greedy outputs are compared in tests and by
#: `esft bench --check-outputs`); each option falls back to the exact path (with a warning) where it cannot run.
#: `esft bench` and the ES `cpu` preset use it.
FAST_CPU_GENERATION: dict[str, object] = {"share_prefix": True, "prefill_buckets": 4, "packed_linear": True,
                                          "fused_attention": True, "screened_lm_head": True}


class RunConfig:
    """Shared behaviour of the trainers' config dataclasses (ESConfig, GRPOConfig)."""

    task_options: dict[str, Any]
    max_passage_chars: int | None

    def parse_mappings(self, *names: str) -> None:
        """Fields given on the command line as a YAML / JSON mapping string become dicts; anything else fails."""
        for name in names:
            value = getattr(self, name)
            if isinstance(value, str):
                value = yaml.safe_load(value) or {}
                setattr(self, name, value)
            if not isinstance(value, dict):
                raise ValueError(f"{name} must be a mapping, got {value!r}")

    def task_kwargs(self) -> dict[str, Any]:
        """Keyword options of the task's constructor (task_options, plus max_passage_chars when set and the task is
        BoolQ: a preset's passage cut must not reach a task without passages when only `task` is overridden)."""
        kw = dict(self.task_options)
        if self.max_passage_chars is not None and str(self.task).partition(":")[0].strip().lower() == "boolq":
            kw.setdefault("max_passage_chars", self.max_passage_chars)
        return kw

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def replace(self, **changes: Any):
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of a dataclass (read from its source)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _none_or(conv):
    def parse(text: str):
        return None if text.strip().lower() in ("none", "null", "") else conv(text)
    parse.__name__ = getattr(conv, "__name__", "value")
    return parse


def _list_of(conv):
    def parse(text: str):
        return [conv(x.strip()) for x in text.split(",") if x.strip()]
    parse.__name__ = "list"
    return parse


def converter(tp: Any):
    """A function str -> value for a field type (int, float, str, bool, list[X], X | None)."""
    inner, optional = _unwrap_optional(tp)
    if typing.get_origin(inner) in (list, tuple):
        (item,) = typing.get_args(inner)[:1] or (str,)
        conv = _list_of(item if item in (int, float, str) else str)
    elif inner is bool:
        conv = parse_bool
    elif inner in (int, float, str):
        conv = inner
    else:
        conv = str
    return _none_or(conv) if optional else conv


def parse_bool(text: str) -> bool:
    v = str(text).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """One `--field-name` flag per dataclass field; defaults are left unset so explicit flags can be told apart."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        flag = "--" + f.name.replace("_", "-")
        tp = hints[f.name]
        default = (f.default if f.default is not dataclasses.MISSING
                   else f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        # argparse %-formats help strings: a literal "%" in a docstring must be doubled
        help_text = f"{docs.get(f.name, '')} (default: {default!r})".replace("%", "%%")
        inner, _ = _unwrap_optional(tp)
        if inner is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=help_text)
        else:
            parser.add_argument(flag, dest=f.name, type=converter(tp), default=argparse.SUPPRESS,
                                metavar=f.name.upper(), help=help_text)


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"config file {path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of option: value at the top level")
    return data


def coerce(cls: type, values: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Check keys against the dataclass and convert strings where YAML left them as strings."""
    names = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    out = {}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name not in names:
            close = difflib.get_close_matches(name, list(names), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ValueError(f"{source}: unknown option {key!r}{hint}")
        if isinstance(value, str) and hints[name] is not str:
            value = converter(hints[name])(value)
        out[name] = value
    return out


def build_config(cls: type[T], presets: Mapping[str, Mapping[str, Any]] | None = None,
                 preset: str | None = None, config_file: str | None = None,
                 overrides: Mapping[str, Any] | None = None) -> T:
    """defaults < preset < YAML file < explicit overrides."""
    values: dict[str, Any] = {}
    if preset:
        if not presets or preset not in presets:
            raise ValueError(f"unknown preset {preset!r}; available: {', '.join(presets or {})}")
        values.update(coerce(cls, presets[preset], f"preset {preset!r}"))
    if config_file:
        data = load_yaml(config_file)
        file_preset = data.pop("preset", None)
        if file_preset and not preset:
            return build_config(cls, presets, file_preset, config_file=None,
                                overrides={**coerce(cls, data, str(config_file)), **(overrides or {})})
        values.update(coerce(cls, data, str(config_file)))
    values.update(coerce(cls, overrides or {}, "command line"))
    return cls(**values)


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def save_yaml(config: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
