"""Members that tie in fitness tie bit for bit, whichever examples they got right (esft.es.fitness.row_means).

With a format bonus (or DART-ES weights) the per-example rewards are not integers, and a float sum in array order
gave members with the same counts at different examples values an ulp apart: centered ranks then weighted the tied
members +-0.29, and z-scores made a ~1e-8 update that was not a zero update (Adam took a full step on it).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from esft.es.dart import dart_fitness, difficulty_weights
from esft.es.fitness import ClassBalancedMean, MeanReward
from esft.es.strategy import ES

# 16 examples: 3 right and boxed, 4 boxed but wrong, 1 right unboxed, 8 neither; each member's at other examples
SCORES = np.array([1] * 3 + [0] * 4 + [1] + [0] * 8, dtype=np.float64)
BOXED = np.array([1] * 7 + [0] * 9, dtype=bool)


def tied_population(members: int = 8, seed: int = 0) -> SimpleNamespace:
    """Each member's rewards are SCORES / BOXED shuffled within the even and within the odd examples (two labels
    in the class-balanced test), so every member has the same counts per label."""
    rng = np.random.default_rng(seed)
    even, odd = np.arange(0, SCORES.size, 2), np.arange(1, SCORES.size, 2)
    perms = []
    for _ in range(members):
        p = np.arange(SCORES.size)
        p[even], p[odd] = rng.permutation(even), rng.permutation(odd)
        perms.append(p)
    return SimpleNamespace(scores=np.stack([SCORES[p] for p in perms]),
                           well_formed=np.stack([BOXED[p] for p in perms]))


@pytest.mark.parametrize("seed", range(5))
def test_members_with_equal_counts_get_bitwise_equal_fitness(seed):
    res = tied_population(seed=seed)
    batch = [{"label": "yes" if j % 2 else "no"} for j in range(SCORES.size)]
    for rule in (MeanReward(0.1), ClassBalancedMean(lambda ex: ex["label"], format_bonus=0.1)):
        f = rule(res, batch)
        assert np.ptp(f) == 0.0, (type(rule).__name__, f)
    f = MeanReward(0.1)(res, batch)
    assert f[0] == pytest.approx((4 + 0.1 * 7) / 16, rel=1e-15)


@pytest.mark.parametrize("seed", range(3))
def test_dart_members_that_solved_problems_of_equal_weights_tie(seed):
    """11 of 16 problems solved by every member, shuffled within four groups of equal EMA (equal weight)."""
    groups = np.arange(16) % 4
    weights = difficulty_weights(np.array([0.1, 0.37, 0.62, 0.05])[groups])
    solved = np.arange(16) < 11
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(8):
        p = np.arange(16)
        for g in range(4):
            idx = np.flatnonzero(groups == g)
            p[idx] = rng.permutation(idx)
        rows.append(solved[p])
    f = dart_fitness(np.stack(rows), np.ones((8, 16), dtype=bool), weights, 0.1)
    assert np.ptp(f) == 0.0, f
    assert f[0] == pytest.approx(float((weights * solved).sum()) / 16 + 0.1, rel=1e-15)


@pytest.mark.parametrize("shaping", ["zscore", "centered_rank"])
def test_a_tied_population_makes_a_zero_update(shaping):
    fitness = MeanReward(0.1)(tied_population(), [{}] * SCORES.size)
    es = ES(8, sigma=0.0015, alpha=0.00075, seed=0, fitness_shaping=shaping)
    assert es.tell(es.ask(0), fitness).is_zero


def test_row_means_is_the_weighted_mean_whatever_the_order():
    from esft.es.fitness import row_means

    v = np.array([[0.1, 0.2, 0.3, 1.1], [1.1, 0.3, 0.2, 0.1]])
    w = np.array([1.0, 2.0, 2.0, 1.0])
    out = row_means(v, w, 3)
    assert out[0] == out[1] == pytest.approx((0.1 + 0.4 + 0.6 + 1.1) / 3)
    np.testing.assert_allclose(row_means(v), v.mean(axis=1))
