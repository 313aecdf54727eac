"""The barrier test of the landscape's interpolation path (esft.analysis.landscape, paper Figure 3) and what it
needs of the per-example scores: their name (esft.tasks.labels.score_name) and their spread.

The study declares no test ("no catastrophic accuracy drop"); esft's is `paired_barrier`. Every point of the path
is evaluated on the same examples, so the drop at t is the mean over examples of d_i(t) = line_i(t) - s_i(t), with
line_i the straight line between example i's scores at the two ends: its standard error is the sample standard
deviation of the d_i over sqrt(n), which carries the noise of both endpoint scores and the correlation between the
points. The largest drop is a maximum over the interior points, so it is compared with the one-sided 2.5% normal
quantile Bonferroni-corrected over them (z* = 2.39 for the default 3 interior points; a bare "2 SE" at the largest of
several drops declares far more barriers than its nominal 2.3%).

`barrier` is the test of means alone, for a result without per-example scores: an accuracy's standard error is the
binomial one of the line's value, sqrt(p (1 - p) / n) (0 where the line stands at 0 or 1, so any drop there counts);
a mean reward's is the sample standard deviation of its scores over sqrt(n) (p (1 - p) is no variance on another
scale); a barrier when the drop exceeds twice it."""

from __future__ import annotations

import math
import statistics
from statistics import NormalDist
from typing import Any, Mapping, Sequence

import numpy as np

from esft.tasks.labels import MEAN_REWARD, score_name

#: how a barrier's standard error was computed (its `se_of`): from the mean, from one point's per-example scores,
#: or from each example's drop below its own straight line (`paired_barrier`)
BINOMIAL, SAMPLE, PAIRED = "binomial", "sample", "paired"
#: the family-wise one-sided level of `paired_barrier`'s test over a path's interior points
LEVEL = 0.025


def critical_z(interior: int) -> float:
    """The one-sided normal quantile of LEVEL, Bonferroni-corrected over `interior` points (at least one)."""
    return NormalDist().inv_cdf(1 - LEVEL / max(interior, 1))


def paired_barrier(ts: Sequence[float], scores: Sequence[Sequence[float]]) -> dict[str, Any]:
    """The paired barrier test (module docstring) from each point's per-example scores, `scores[j][i]` the score
    of example i at ts[j] (the same examples, in the same order, at every point). Keys as `barrier`'s, plus
    `z_crit`, the threshold the drop's z = drop / se is compared with; `se` None (no verdict) for fewer than two
    examples."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 2 or s.shape[0] != len(ts) or s.shape[0] < 2:
        raise ValueError(f"paired_barrier needs one row of per-example scores per point, got shape {s.shape} "
                         f"for {len(ts)} points")
    t = np.asarray(ts, dtype=np.float64)
    frac = ((t - t[0]) / (t[-1] - t[0]))[:, None]
    d = s[0] + (s[-1] - s[0]) * frac - s  # d[j, i]: example i's drop below its own line at ts[j]
    drop = d.mean(axis=1)
    k = int(np.argmax(drop))
    n = s.shape[1]
    se = float(d[k].std(ddof=1) / math.sqrt(n)) if n > 1 else None
    z_crit = critical_z(len(ts) - 2)
    # a drop every example shares (se 0) is a barrier however small; no drop, or rounding noise of a straight path
    # (scores on a line leave ~1e-17), is none
    tiny = 1e-9 * max(1.0, float(np.abs(s).max()))
    over = se is not None and drop[k] > tiny and (se == 0 or drop[k] / se > z_crit)
    means = s.mean(axis=1)
    line = means[0] + (means[-1] - means[0]) * frac[:, 0]
    return {"max_drop": float(drop[k]), "at": float(t[k]), "line_at": float(line[k]), "se": se,
            "se_of": PAIRED, "z_crit": z_crit, "barrier": bool(over), "min_accuracy": float(means.min()),
            "linear": line.tolist()}


def barrier(ts: Sequence[float], acc: Sequence[float], n: int | None = None,
            sd: Sequence[float | None] | None = None) -> dict[str, Any]:
    """Largest drop of the path below the straight line between its endpoint scores, from the means alone (for a
    result without per-example scores; `paired_barrier` where they are known). A barrier is declared when
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


def path_barrier(ts: Sequence[float], accs: Sequence[float], scores: Sequence[Sequence[float] | None], n: int,
                 name: str) -> dict[str, Any]:
    """A path's barrier test: the paired one where every point holds the scores of all n examples, else the test
    of the means (`name`: the task's score name; a mean reward's uses each point's sample standard deviation)."""
    if all(s is not None and len(s) == n for s in scores):
        return paired_barrier(ts, scores)
    return barrier(ts, accs, n, [sample_sd(s) for s in scores] if name == MEAN_REWARD else None)


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
