"""Dataclass configs -> command-line flags: one `--field-name` per field, its help text the docstring written under
the field, and the text -> value converters (`int`, `float`, `bool`, comma lists, `X | None`) that the flags, the
task options (esft.tasks.custom) and YAML values given as text share. esft.config merges the flags it parses with
presets and YAML files.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import types
import typing
import weakref
from typing import Any


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


def unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """(X, True) for a type `X | None`, else (the type, False)."""
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


def split_items(text: str) -> list[str]:
    """The items of a comma list, stripped, empty ones dropped. A comma inside (), [] or {}, or after a backslash,
    is part of its item: list flags take regular expressions (`--exclude 'layers\\.[0-9]{1,2}\\.'`)."""
    items, current, depth, escaped = [], "", 0, False
    opened = -1  # where the character class being read began (-1: none); it holds any bracket, up to its `]`
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif opened >= 0:  # a `]` right after `[` or `[^` is a character of the class
            opened = -1 if ch == "]" and current[opened + 1:] not in ("", "^") else opened
        elif ch == "[":
            opened = len(current)
        elif ch in "({":
            depth += 1
        elif ch in ")}":
            depth = max(depth - 1, 0)
        elif ch == "," and not depth:
            items, current = items + [current], ""
            continue
        current += ch
    return [x.strip() for x in items + [current] if x.strip()]


def _list_of(conv):
    def parse(text: str):
        return [conv(x) for x in split_items(text)]
    parse.__name__ = "list"
    return parse


def converter(tp: Any):
    """A function str -> value for a field type (int, float, str, bool, list[X], X | None)."""
    inner, optional = unwrap_optional(tp)
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


def default_text(default: Any) -> str:
    """A default as its flag takes it: a list as comma text (`decode-heavy,cpu-preset`; `empty`, not a word the
    flag would read as an item), anything else as Python writes it."""
    if isinstance(default, (list, tuple)):
        return ",".join(map(str, default)) if default else "empty"
    return repr(default)


#: fields whose flag, repeated with another value, is refused rather than overridden by the last one: `--task boolq
#: --task countdown` reads as "train on both" and would train on Countdown alone. Other flags keep argparse's
#: last-one-wins, which scripts rely on to override a base command line.
ONCE = frozenset({"task", "tasks"})


class StoreOnce(argparse.Action):
    """Store a flag's value, refusing the flag given again with another value (`ONCE`); the same value twice is
    accepted. A list field takes its items comma-separated instead."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the namespace this flag last stored into: another spelling of the same option (esft.cli_parser.Alias)
        # may have stored the value first, which that spelling's own check judges, not this one
        self._stored_into: weakref.ref | None = None

    def __call__(self, parser, namespace, values, option_string=None):
        again = self._stored_into is not None and self._stored_into() is namespace
        if again and getattr(namespace, self.dest) != values:
            parser.error(f"argument {option_string}: given twice ({getattr(namespace, self.dest)!r}, then "
                         f"{values!r}); give it once (several items of a list flag: comma-separated)")
        self._stored_into = weakref.ref(namespace)
        setattr(namespace, self.dest, values)


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
        help_text = f"{docs.get(f.name, '')} (default: {default_text(default)})".replace("%", "%%")
        inner, _ = unwrap_optional(tp)
        if inner is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=help_text)
        else:
            parser.add_argument(flag, dest=f.name, type=converter(tp), default=argparse.SUPPRESS,
                                metavar=f.name.upper(), help=help_text,
                                action=StoreOnce if f.name in ONCE else "store")


__all__ = ["ONCE", "StoreOnce", "add_dataclass_arguments", "converter", "default_text", "field_docs", "parse_bool",
           "split_items", "unwrap_optional"]
