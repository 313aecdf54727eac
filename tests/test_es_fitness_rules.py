"""Fitness rules other than the balanced one (esft.es.fitness): a plain function given as the rule."""

from __future__ import annotations

import numpy as np

from esft.es.executor import PopulationResult
from esft.es.fitness import FitnessRule, as_fitness_rule


def test_a_plain_function_becomes_a_stateless_rule_called_with_result_then_batch():
    calls = []

    def fitness(result, batch):
        calls.append((result, batch))
        return result.scores @ np.array([ex["weight"] for ex in batch])

    rule = as_fitness_rule(fitness)
    assert isinstance(rule, FitnessRule) and as_fitness_rule(rule) is rule
    scores = np.array([[1.0, 0.0], [1.0, 1.0]])
    result = PopulationResult(scores=scores, well_formed=np.ones_like(scores, dtype=bool), texts=[])
    batch = [{"weight": 1.0}, {"weight": 3.0}]
    assert rule(result, batch).tolist() == [1.0, 4.0]
    assert len(calls) == 1 and calls[0][0] is result and calls[0][1] is batch
    assert not rule.stateful and rule.state_dict() is None
    assert rule.sample_batch(1, 2, 8, 8) == list(range(8))


def test_uniform_batches_are_the_original_draws_without_replacement():
    """Literal batches of SeedSequence([run seed, t, 0xBA7C]): a resumed `mean`/`balanced` run re-draws the batches
    of the iterations it has not run yet, and logged runs and the committed results used exactly these."""
    from esft.es.fitness import sample_batch

    assert sample_batch(42, 0, 200, 8) == [14, 168, 72, 81, 54, 151, 1, 51]
    assert sample_batch(5, 3, 24, 6) == [6, 18, 1, 7, 4, 11]
    assert sample_batch(2**40 + 3, 1, 10, 4) == [0, 8, 5, 9]
    for t in range(20):  # without replacement: B distinct problems, even for B close to n
        batch = sample_batch(7, t, 12, 11)
        assert len(set(batch)) == 11 and all(0 <= i < 12 for i in batch)
