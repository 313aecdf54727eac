"""ES ask/tell and fitness shaping (esft.es.strategy) on the inputs the core tests leave out: infinite fitness, an
unknown shaping name, Adam's moment settings, shaped values handed back to the caller, one-member populations.

Run: PYTHONPATH=src pytest -q tests/test_es_strategy_audit.py   (a few seconds, CPU)
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from esft.es.strategy import ES, FITNESS_SHAPING, Member, centered_rank, get_shaping, raw, zscore


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_tell_refuses_non_finite_fitness(bad):
    # an infinite reward would z-score to inf - inf = NaN coefficients and corrupt every master weight
    es = ES(population_size=4, sigma=0.1, alpha=0.1, seed=0)
    with pytest.raises(ValueError, match="non-finite fitness"):
        es.tell(es.ask(0), [0.1, bad, 0.2, 0.3])


def test_an_unknown_shaping_name_is_refused_with_the_choices():
    assert {name: get_shaping(name) for name in FITNESS_SHAPING} == {
        "zscore": zscore, "centered_rank": centered_rank, "raw": raw}
    msg = r"unknown fitness shaping 'rank'; choose one of \['centered_rank', 'raw', 'zscore'\]"
    with pytest.raises(ValueError, match=msg):
        get_shaping("rank")
    with pytest.raises(ValueError, match="unknown fitness shaping"):  # refused when built, not at the first tell
        ES(population_size=2, sigma=0.1, alpha=0.1, fitness_shaping="ranks")


def test_adam_gets_the_configured_moments_and_epsilon():
    es = ES(population_size=2, sigma=0.1, alpha=3e-4, optimizer="adam", adam_betas=(0.5, 0.99), adam_eps=1e-6)
    opt = es.make_optimizer([torch.zeros(3)])
    assert opt.defaults["lr"] == 3e-4 and opt.defaults["betas"] == (0.5, 0.99) and opt.defaults["eps"] == 1e-6


def test_raw_shaping_returns_a_copy_of_the_fitness():
    f = np.array([0.2, 0.9, 0.4])
    shaped = raw(f)
    shaped *= 10.0  # a caller scaling the weights in place must not rewrite the logged fitness
    assert f.tolist() == [0.2, 0.9, 0.4] and shaped.tolist() == [2.0, 9.0, 4.0]


@pytest.mark.parametrize("shaping", ["zscore", "centered_rank"])
def test_a_one_member_population_makes_a_zero_update(shaping):
    # one member has no spread to rank or standardise: no signal, so no step rather than a NaN one
    es = ES(population_size=1, sigma=0.1, alpha=0.1, seed=3, fitness_shaping=shaping)
    update = es.tell(es.ask(0), [0.7])
    assert update.coefficients == (0.0,) and update.is_zero


def test_higher_fitness_gets_a_positive_coefficient_under_every_shaping():
    """esft maximises: the best member's noise enters the step with a positive sign, the worst's negative."""
    members = [Member(1, 1), Member(2, 1), Member(3, 1)]
    for name in FITNESS_SHAPING:
        update = ES(population_size=3, sigma=0.1, alpha=0.3, fitness_shaping=name).tell(members, [0.5, 2.0, -1.0])
        c = dict(zip(update.seeds, update.coefficients))
        assert c[2] > 0 > c[3] and c[2] > c[1] > c[3] and update.scale == pytest.approx(0.1), name
    # antithetic: the pair folds to z(+) - z(-), positive when the + side did better
    pair = ES(population_size=2, sigma=0.1, alpha=0.3, antithetic=True).tell([Member(7, 1), Member(7, -1)], [1.0, 0.0])
    assert pair.seeds == (7,) and pair.coefficients[0] == pytest.approx(2.0, rel=1e-6)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("field, value", [("sigma", -0.1), ("sigma", 0.0), ("sigma", float("inf")),
                                          ("sigma", float("nan")), ("alpha", -0.1), ("alpha", 0.0),
                                          ("alpha", float("nan"))])
def test_es_refuses_a_sigma_or_alpha_that_is_not_a_finite_positive_number(field, value, optimizer):
    """ES(sigma=-0.1) was taken: a member (seed, +1) sits at theta - 0.1 eps, yet the SGD step adds
    +(alpha / N) z eps, so the run moved away from its best members (descent, where esft maximises). sigma 0 with
    Adam divided by zero in the first tell, after a whole population had been evaluated; an infinite sigma made
    every Adam step -0.0 (no update, silently). ESConfig refuses these values; ES, which scripts and benchmarks
    build directly, now refuses them as well, when it is built."""
    kwargs = dict(population_size=4, sigma=0.1, alpha=0.1, seed=0, optimizer=optimizer)
    kwargs[field] = value
    with pytest.raises(ValueError, match=re.escape(f"{field} must be a finite number > 0, got {value}")):
        ES(**kwargs)
