"""ES ask/tell, fitness shaping and the random-walk law (esft.es.strategy with esft.es.noise).

Run: . .venv/bin/activate && pytest -q tests/test_es_strategy.py   (a few seconds, CPU)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from es_tiny import one_thread  # noqa: F401  (autouse fixture)
from es_tiny import bit_equal, state, tiny_llama
from esft.es.noise import MasterWeights
from esft.es.strategy import ES, Member, centered_rank, member_seeds, zscore


def test_zscore_matches_paper_formula():
    f = np.array([0.1, 0.5, 0.5, 0.9, 0.3])
    z = zscore(f)
    np.testing.assert_allclose(z, (f - f.mean()) / (f.std() + 1e-8))
    assert abs(z.mean()) < 1e-12
    assert (z**2).sum() == pytest.approx(len(f), rel=1e-6)  # sum z^2 = N: the random-walk law's engine


@pytest.mark.parametrize("shape", [zscore, centered_rank])
def test_all_equal_fitness_gives_exact_zeros(shape):
    # n = 6 and 30 include values whose float mean is one ulp off the value (std ~1e-16, not 0): the guard's case
    for n in (6, 8, 30):
        for value in (0.0, 0.1, 0.3, 1 / 3, 0.7, 7.1):
            out = shape(np.full(n, value))
            assert np.all(out == 0.0) and np.all(np.isfinite(out)), (n, value)
    assert shape(np.array([])).shape == (0,)  # no member, no weights (np.ptp of nothing would raise)


def test_centered_rank():
    out = centered_rank(np.array([3.0, -1.0, 10.0, 5.0]))
    np.testing.assert_allclose(out, [-1 / 6, -0.5, 0.5, 1 / 6])
    ties = centered_rank(np.array([1.0, 1.0, 2.0]))
    assert ties[0] == ties[1] and ties[2] == 0.5
    assert centered_rank(np.array([4.0])).tolist() == [0.0]


def test_ask_is_deterministic_and_distinct():
    es = ES(population_size=6, sigma=0.1, alpha=0.1, seed=42)
    a, b = es.ask(3), ES(population_size=6, sigma=0.1, alpha=0.1, seed=42).ask(3)
    assert a == b and len({m.seed for m in a}) == 6 and all(m.sign == 1 for m in a)
    assert es.ask(4) != a and ES(population_size=6, sigma=0.1, alpha=0.1, seed=43).ask(3) != a
    anti = ES(population_size=6, sigma=0.1, alpha=0.1, seed=42, antithetic=True).ask(0)
    assert [m.sign for m in anti] == [1, -1] * 3 and len({m.seed for m in anti}) == 3
    assert member_seeds(1, 2, 5) == member_seeds(1, 2, 5)
    with pytest.raises(ValueError):
        ES(population_size=5, sigma=0.1, alpha=0.1, antithetic=True)
    assert ES(population_size=1, sigma=0.1, alpha=0.1).ask(0)[0].sign == 1  # one member is a population
    with pytest.raises(ValueError, match="population_size"):
        ES(population_size=0, sigma=0.1, alpha=0.1)
    with pytest.raises(ValueError, match="stream"):  # refused when built, not at the first ask
        ES(population_size=2, sigma=0.1, alpha=0.1, stream=-1)


def test_member_seeds_redraw_past_a_collision():
    """70000 32-bit draws of SeedSequence([0, 0]) repeat 5 values: the member seeds are the first 70000 distinct
    values of the same stream, drawn in order."""
    import threading

    count, found = 70_000, []
    stream = np.random.SeedSequence([0, 0]).generate_state(count + 100, dtype=np.uint32).tolist()
    assert len(set(stream[:count])) < count  # the case: a plain draw of `count` has duplicates
    worker = threading.Thread(target=lambda: found.append(member_seeds(0, 0, count)), daemon=True)
    worker.start()
    worker.join(timeout=30)  # a re-draw that never grows would loop for ever
    assert found, "member_seeds did not return"
    assert found[0] == list(dict.fromkeys(stream))[:count]


def test_stream_0_seeds_are_the_original_derivation():
    # literal values of SeedSequence([run seed, t]) as drawn before noise streams existed: logged runs, the
    # committed demo results, resume and replay depend on stream 0 drawing exactly these
    assert member_seeds(42, 0, 4, stream=0) == [3444837047, 2669555309, 2046530742, 3581440988]
    assert member_seeds(42, 7, 3) == [1955881634, 2438590094, 3353151197]
    assert member_seeds(5, 2, 2, stream=0) == [3226123765, 968613748]
    assert member_seeds(2**40 + 3, 1, 2, stream=0) == [197316668, 1250035191]
    anti = ES(population_size=4, sigma=0.1, alpha=0.1, seed=42, antithetic=True, stream=0).ask(3)
    assert anti == [Member(2541583436, 1), Member(2541583436, -1), Member(4223867394, 1), Member(4223867394, -1)]
    assert ES(population_size=4, sigma=0.1, alpha=0.1, seed=42).stream == 0
    # the run seed defaults to 0 (stream 0): the members of SeedSequence([0, t])
    assert ES(population_size=3, sigma=0.1, alpha=0.1).ask(2) == [Member(s, 1) for s in member_seeds(0, 2, 3)]


def test_noise_streams_are_independent():
    """Stages of a sequential chain share the run seed and restart at iteration 0; their streams must not
    draw the same perturbations (the cumulative random-walk law assumes independent noise)."""
    for seed in (0, 42, 2**40 + 3):
        for t in range(4):
            draws = [member_seeds(seed, t, 16, stream=k) for k in range(5)]
            assert all(len(set(d)) == 16 for d in draws)
            assert len(set().union(*draws)) == 5 * 16  # no seed shared between streams
    a = ES(population_size=6, sigma=0.1, alpha=0.1, seed=42, stream=2)
    assert a.ask(1) == [Member(s, 1) for s in member_seeds(42, 1, 6, stream=2)]
    anti = ES(population_size=6, sigma=0.1, alpha=0.1, seed=42, antithetic=True, stream=2).ask(1)
    assert [m.seed for m in anti[::2]] == member_seeds(42, 1, 3, stream=2)
    with pytest.raises(ValueError, match="stream"):
        member_seeds(42, 0, 2, stream=-1)


def test_tell_sgd_scale_and_folding():
    es = ES(population_size=4, sigma=0.1, alpha=0.2, seed=0, antithetic=True)
    members = [Member(10, 1), Member(10, -1), Member(20, 1), Member(20, -1)]
    f = np.array([1.0, 0.0, 0.5, 0.5])
    upd = es.tell(members, f)
    z = zscore(f)
    assert upd.kind == "sgd" and upd.scale == pytest.approx(0.2 / 4)
    assert upd.seeds == (10, 20)
    assert upd.coefficients == pytest.approx((z[0] - z[1], z[2] - z[3]))
    with pytest.raises(ValueError):
        es.tell(members, [1.0, float("nan"), 0, 0])
    # Adam gets the gradient estimate -(1 / (N sigma)) sum z eps (torch minimises), with torch's default moments
    adam = ES(population_size=4, sigma=0.1, alpha=0.2, seed=0, antithetic=True, optimizer="adam")
    grad = adam.tell(members, f)
    assert grad.kind == "gradient" and grad.scale == pytest.approx(-1 / (4 * 0.1))
    assert grad.coefficients == upd.coefficients
    opt = adam.make_optimizer([torch.zeros(3)])
    assert opt.defaults["lr"] == 0.2 and opt.defaults["betas"] == (0.9, 0.999) and opt.defaults["eps"] == 1e-8


def test_all_equal_fitness_makes_no_update_and_no_nan():
    model = tiny_llama()
    before = state(model)
    w = MasterWeights(model)
    for opt in ("sgd", "adam"):
        # 0.1 x 6: numpy's mean is one ulp off 0.1, so only the all-equal guard gives exact zeros
        es = ES(population_size=6, sigma=0.01, alpha=0.01, seed=1, optimizer=opt)
        optimizer = es.make_optimizer(list(w.master.values()))
        upd = es.tell(es.ask(0), [0.1] * 6)
        assert upd.is_zero
        assert w.apply(upd, optimizer) == 0.0
    after = state(model)
    assert bit_equal(after, before)
    assert all(torch.isfinite(v).all() for v in after.values())


@pytest.mark.parametrize("optimizer, alpha, antithetic", [("adam", 0.01, True), ("sgd", 0.05, False)])
def test_es_maximises_fitness(optimizer, alpha, antithetic):
    """Fitness = <theta, target> is maximised by the paper's SGD rule and by Adam fed the ES estimate (torch
    minimises, so the estimate handed to Adam is minus the fitness gradient)."""
    lin = torch.nn.Linear(50, 40, bias=False).requires_grad_(False)
    target = torch.randn(40, 50)
    w = MasterWeights(lin)
    es = ES(population_size=16, sigma=0.05, alpha=alpha, seed=3, optimizer=optimizer, antithetic=antithetic)
    opt = es.make_optimizer(list(w.master.values()))
    fit0 = float((lin.weight * target).sum())
    for t in range(5):
        members = es.ask(t)
        fitness = []
        for seed, sign in members:
            w.perturb(seed, sign, es.sigma)
            fitness.append(float((lin.weight * target).sum()))
            w.restore()
        upd = es.tell(members, fitness)
        if optimizer == "adam":
            assert upd.kind == "gradient" and upd.scale < 0
        w.apply(upd, opt)
    assert float((lin.weight * target).sum()) > fit0 + 1.0
    assert torch.equal(lin.weight, w.master["weight"])


class _Wide(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(400, 400)
        self.b = torch.nn.Linear(400, 400)
        self.c = torch.nn.Parameter(torch.zeros(100_000))


def test_random_walk_law():
    """z-scored fitness: ||theta_T - theta_0||^2 = alpha^2 T d / N whatever the rewards (the random-walk law of the ES vs GRPO study)."""
    torch.manual_seed(0)
    model = _Wide()
    w = MasterWeights(model)
    d = w.num_params
    assert d > 400_000
    base = {n: m.clone() for n, m in w.iter_masters()}
    N, alpha, T = 8, 0.01, 12
    es = ES(population_size=N, sigma=0.01, alpha=alpha, seed=7)
    rng = np.random.default_rng(0)
    for t in range(T):
        fitness = rng.binomial(16, 0.3, size=N) / 16  # arbitrary rewards, ties included
        if np.ptp(fitness) == 0:
            fitness[0] += 1 / 16
        w.apply(es.tell(es.ask(t), fitness))
    sq = sum(float((m.double() - base[n].double()).pow(2).sum()) for n, m in w.iter_masters())
    predicted = alpha**2 * T * d / N
    print(f"random walk: measured/predicted = {sq / predicted:.5f}")
    assert sq == pytest.approx(predicted, rel=0.03)


def test_es_refuses_an_unknown_optimizer_and_a_fitness_count_that_is_not_the_members():
    with pytest.raises(ValueError, match="optimizer"):
        ES(population_size=2, sigma=0.1, alpha=0.1, optimizer="sgd-momentum")
    es = ES(population_size=4, sigma=0.1, alpha=0.1, seed=0)
    with pytest.raises(ValueError, match="4 members but 3 fitness values"):  # zip would drop a member silently
        es.tell(es.ask(0), [0.1, 0.2, 0.3])
    # the paper's SGD rule has no optimizer state; Adam is the only stateful one
    assert es.make_optimizer([torch.zeros(3)]) is None
    assert isinstance(ES(population_size=4, sigma=0.1, alpha=0.1, optimizer="adam").make_optimizer([torch.zeros(3)]),
                      torch.optim.Adam)


def test_rank_correlation_is_spearman_on_hand_made_orders():
    """rho = 1 - 6 sum d^2 / (n (n^2 - 1)) without ties: one swapped neighbour pair of 4 gives 1 - 12 / 60."""
    from esft.es.strategy import rank_correlation

    assert rank_correlation([1.0, 2.0, 3.0, 4.0], [10.0, 30.0, 20.0, 40.0]) == pytest.approx(0.8)
    assert rank_correlation([0.1, 0.5, 0.9], [-5.0, 0.0, 7.0]) == pytest.approx(1.0)  # ranks only, not values
    for a, b in (([1.0, 2.0, 3.0], [1.0, 2.0]), ([1.0, 2.0], [5.0])):  # a length-1 vector would broadcast
        with pytest.raises(ValueError, match="members"):
            rank_correlation(a, b)
    import warnings

    with warnings.catch_warnings():  # a constant vector has no order: NaN, returned without a 0/0 division
        warnings.simplefilter("error")
        assert np.isnan(rank_correlation([2.0, 2.0, 2.0], [1.0, 3.0, 2.0]))
