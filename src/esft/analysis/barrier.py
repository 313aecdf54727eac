"""The barrier test of the landscape's interpolation path (esft.analysis.landscape, paper Figure 3) and what it
needs of the per-example scores: their name (esft.tasks.labels.score_name) and their spread.

An accuracy's standard error comes from its mean alone (binomial, sqrt(p (1 - p) / n)); it is 0 where the line's
value is 0 or 1, so there any drop counts as a barrier. A mean reward's does not: on another scale p (1 - p) is no
variance (it is negative for p = 3, and the clamp that keeps the root real would make every drop a barrier), so its
standard error is the sample standard deviation of the scores over sqrt(n)."""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

import numpy as np

from esft.tasks.labels import score_name

#: how a barrier's standard error was computed (its `se_of`): from the mean, or from the per-example scores
BINOMIAL, SAMPLE = "binomial", "sample"


def barrier(ts: Sequence[float], acc: Sequence[float], n: int | None = None,
            sd: Sequence[float | None] | None = None) -> dict[str, Any]:
    """Largest drop of the path below the straight line between its endpoint scores. A barrier is declared when
    the drop exceeds twice the standard error at that point (n examples): without `sd` the binomial one of the
    line's value (an accuracy), with `sd` (each point's sample standard deviation of the scores: a mean reward)
    sd / sqrt(n) at the point of the largest drop."""
    ts = np.asarray(ts, dtype=np.float64)
    acc = np.asarray(acc, dtype=np.float64)
    line = acc[0] + (acc[-1] - acc[0]) * (ts - ts[0]) / (ts[-1] - ts[0])
    drop = line - acc
    k = int(np.argmax(drop))
    if sd is None:
        # 0 at a line value of 0 or 1, where the binomial SE vanishes (the tables print its Wilson interval
        # beside it); the clamp only absorbs rounding just below 0
        se = math.sqrt(max(line[k] * (1 - line[k]), 0.0) / n) if n else None
    else:
        se = sd[k] / math.sqrt(n) if n and sd[k] is not None else None
    return {"max_drop": float(drop[k]), "at": float(ts[k]), "line_at": float(line[k]), "se": se,
            "se_of": BINOMIAL if sd is None else SAMPLE, "barrier": bool(se is not None and drop[k] > 2 * se),
            "min_accuracy": float(acc.min()), "linear": line.tolist()}


def sample_sd(scores: Sequence[float] | None) -> float | None:
    """Sample standard deviation (ddof 1) of one point's scores; None for fewer than two."""
    return statistics.stdev(scores) if scores is not None and len(scores) > 1 else None


def path_score_names(scores: Mapping[str, Sequence[Sequence[float] | None]],
                     means: Mapping[str, Sequence[float]]) -> dict[str, str]:
    """Per task, ACCURACY or MEAN_REWARD: from every point's per-example scores where all points have them (a
    reward scoring -1 or 2 whose means stay in [0, 1] is still a mean reward), else from the means."""
    out = {}
    for task, per_point in scores.items():
        known = per_point and all(s is not None for s in per_point)
        out[task] = score_name([v for s in per_point for v in s] if known else means[task])
    return out
