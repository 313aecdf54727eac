"""The range rules a config field declares beyond its type (esft.config.check_fields): each a `Rule`, the words of
the error message beside the test, so `sigma = -1` fails as "expected a finite number > 0"."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class Rule:
    """What a field accepts beyond its type: `ok(value)` and the words for the error message."""

    accepted: str
    ok: Callable[[Any], bool]


def _finite(v: Any) -> bool:
    """math.isfinite, but False (not OverflowError) for an integer too large for a float: runs compute in floats,
    and a YAML file can hold such an integer."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def at_least(n: int) -> Rule:
    return Rule(f"an integer >= {n}", lambda v: v >= n)


def positive() -> Rule:
    return Rule("a finite number > 0", lambda v: _finite(v) and v > 0)


def non_negative() -> Rule:
    return Rule("a finite number >= 0", lambda v: _finite(v) and v >= 0)


def finite() -> Rule:
    return Rule("a finite number", _finite)


def in_range(low: float, high: float, low_open: bool = True) -> Rule:
    bracket = "(" if low_open else "["
    return Rule(f"a number in {bracket}{low}, {high}]",
                lambda v: _finite(v) and (v > low if low_open else v >= low) and v <= high)


def regexes() -> Rule:
    def compiles(pattern: Any) -> bool:
        if not isinstance(pattern, str):  # a YAML number or null: re.search raises TypeError on it
            return False
        try:
            re.compile(pattern)
        except re.error:
            return False
        return True

    return Rule("a list of valid regular expressions (text, Python re syntax)", lambda v: all(map(compiles, v)))


def one_of(*choices: Any) -> Rule:
    return Rule(f"one of {', '.join(repr(c) for c in choices)}", lambda v: v in choices)


def plain_value(value: Any) -> Any:
    """`value` as Python's own types, in lists, tuples and dicts too: a numpy scalar (a sweep's np.linspace value)
    by its `item()`, a path by its text. Configs built in Python hold what YAML can write and the checks read."""
    import os

    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        return value.item()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if type(value) in (list, tuple):
        return type(value)(plain_value(v) for v in value)
    if isinstance(value, dict):
        return {k: plain_value(v) for k, v in value.items()}
    return value
