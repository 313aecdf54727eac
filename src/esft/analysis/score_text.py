"""How the report prints a held-out score: a percentage for an accuracy, three decimals for a mean reward on
another scale (a `module:function` reward may return any number; esft.tasks.labels.score_name), where a percentage
such as "250.0%" would mean nothing."""

from __future__ import annotations

from typing import Callable, Iterable

from esft.experiments.records import REWARD_DIGITS
from esft.tables import NA, pct
from esft.tasks.labels import MEAN_REWARD, score_name


def reward_text(x: float | None) -> str:
    """A held-out mean reward as the report prints it: three decimals, no percent sign."""
    return NA if x is None else f"{x:.{REWARD_DIGITS}f}"


def score_text(values: Iterable[float | None], name: str | None = None) -> Callable[[float | None], str]:
    """How one task's scores are printed: `reward_text` for a MEAN_REWARD, else `pct`. The name is `name` where
    the caller knows it (from the per-example scores), else chosen from all the values a table holds of the
    task: `pct` while every one lies in [0, 1]."""
    return reward_text if (name or score_name(values)) == MEAN_REWARD else pct
