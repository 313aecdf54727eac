"""The hybrid budget split (esft.experiments.hybrid): any positive step cost, however small, buys steps.
Run: `pytest tests/test_hybrid_mutmutcli.py -q`."""

from __future__ import annotations

from esft.experiments.hybrid import split_budget


def test_a_step_cost_of_one_or_less_is_a_cost_not_a_refusal():
    # floor(10 * 0.5 / 1) = 5 and floor(10 * 0.5 / 0.5) = 10
    assert split_budget(10, [1, 0.5], [0.5, 0.5]) == [5, 10]
    assert split_budget(3, [0.25], [1.0]) == [12]
