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


def score_text(values: Iterable[float | None]) -> Callable[[float | None], str]:
    """How one task's scores are printed, chosen from all of them (`values`, as a table holds them): `pct` while
    every value lies in [0, 1], else `reward_text`."""
    return reward_text if score_name(values) == MEAN_REWARD else pct
