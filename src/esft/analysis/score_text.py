"""How the report prints a held-out score: a percentage for an accuracy, three decimals for a mean reward on
another scale (a `module:function` reward may return any number; esft.tasks.labels.score_name), where a percentage
such as "250.0%" would mean nothing."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from esft.experiments.records import REWARD_DIGITS
from esft.tables import NA, pct
from esft.tasks.labels import ACCURACY, MEAN_REWARD, score_name, wilson_interval


def reward_text(x: float | None) -> str:
    """A held-out mean reward as the report prints it: three decimals, no percent sign."""
    return NA if x is None else f"{x:.{REWARD_DIGITS}f}"


def score_text(values: Iterable[float | None], name: str | None = None) -> Callable[[float | None], str]:
    """How one task's scores are printed: `reward_text` for a MEAN_REWARD, else `pct`. The name is `name` where
    the caller knows it (from the per-example scores), else chosen from all the values a table holds of the
    task: `pct` while every one lies in [0, 1]."""
    return reward_text if (name or score_name(values)) == MEAN_REWARD else pct


def scores_line(res: Mapping[str, float], scores: Mapping[str, list[float]]) -> str:
    """`task=score ...` for a progress line, each score printed as the tables print it: a percentage for an
    accuracy, three decimals for a mean reward, named from the point's per-example `scores` where given (the
    tables name a task from all its points: a reward of 0 or 2 reads as an accuracy at a point that scored 0
    everywhere)."""
    return " ".join(f"{n}={score_text(scores.get(n) or [v])(v)}" for n, v in res.items())


def interval_text(name: str, n: int | None) -> Callable[[float | None], str]:
    """How one task's scores over `n` examples are printed with their uncertainty: an accuracy as `62.5% [30.6,
    86.3]`, its 95% Wilson interval in %; a mean reward (whose per-example spread a table does not hold) or a
    task of unknown n as `score_text` prints it."""
    plain = score_text((), name)
    if name != ACCURACY or not n:
        return plain

    def text(x: float | None) -> str:
        if x is None:
            return NA
        lo, hi = wilson_interval(x * n, int(n))
        return f"{pct(x)} [{100 * lo:.1f}, {100 * hi:.1f}]"

    return text


def interval_notes(res: Mapping[str, Any], names: Mapping[str, str]) -> list[str]:
    """The caption of `interval_text`'s brackets in a table of `res`: how many examples each interval is over."""
    n = res.get("n") or {}
    over = [f"{t} n = {n[t]}" for t, k in names.items() if k == ACCURACY and n.get(t)]
    return [f"[a, b]: the 95% Wilson interval of the accuracy over the evaluated examples ({', '.join(over)})."
            ] if over else []
