"""Suggestions for a misspelt name (an option, a spec key, a task): what a user most likely meant."""

from __future__ import annotations

import difflib
import typing


def close_names(name: str, choices: typing.Iterable[str], n: int = 3) -> list[str]:
    """Up to `n` names of `choices` a misspelt `name` may have meant: difflib's close matches (ratio >= 0.6), else
    the names it begins (an abbreviation of 3+ characters: `temp` for temperature, whose ratio is 0.53)."""
    choices = list(choices)
    close = difflib.get_close_matches(name, choices, n=n)
    if close or len(name) < 3:
        return close
    return [c for c in choices if c.lower().startswith(name.lower())][:n]


def did_you_mean(name: typing.Any, choices: typing.Iterable[str]) -> str:
    """" (did you mean X?)" for a misspelt `name` among `choices` (`close_names`), "" when none is close."""
    close = close_names(str(name), choices)
    return f" (did you mean {', '.join(close)}?)" if close else ""

