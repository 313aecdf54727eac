"""Fitness rules (esft.es.fitness): the paper's mean with a format bonus, the default per-example rewards behind
`train_reward`, and the balanced rule without a closed label set.

Run: PYTHONPATH=src pytest -q tests/test_es_fitness_audit.py   (< 1 s)
"""

from __future__ import annotations

import numpy as np
import pytest

from esft.es.executor import PopulationResult
from esft.es.fitness import ClassBalancedMean, MeanReward, as_fitness_rule


def _result(scores, well_formed):
    return PopulationResult(scores=np.asarray(scores, dtype=np.float64),
                            well_formed=np.asarray(well_formed, dtype=bool), texts=[])


def test_mean_reward_adds_the_format_bonus_of_well_formed_answers_only():
    res = _result([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], [[True, True, False], [False, False, False]])
    batch = [{}] * 3
    assert MeanReward()(res, batch).tolist() == pytest.approx([1 / 3, 1 / 3])
    assert MeanReward(0.3)(res, batch).tolist() == pytest.approx([(1.3 + 0.3) / 3, 1 / 3])
    np.testing.assert_allclose(MeanReward(0.3).rewards(res), [[1.3, 0.3, 0.0], [0.0, 0.0, 1.0]])


def test_a_plain_functions_rewards_are_the_task_scores():
    # `train_reward` of an evaluation is the mean of these: the scores, whatever the rule computes as fitness
    rule = as_fitness_rule(lambda result, batch: np.zeros(len(result.scores)))
    res = _result([[1.0, 0.5]], [[False, True]])
    assert rule.rewards(res).tolist() == [[1.0, 0.5]]


def test_balanced_rule_without_a_label_set_balances_over_every_label_seen():
    rule = ClassBalancedMean(lambda ex: ex["y"])  # labels=None: every label in the batch is a class
    batch = [{"y": "a"}, {"y": "a"}, {"y": "a"}, {"y": "b"}]
    res = _result([[1, 1, 1, 0], [0, 0, 0, 1]], [[True] * 4] * 2)
    assert rule(res, batch).tolist() == pytest.approx([0.5, 0.5])  # the plain mean would be 0.75 and 0.25
