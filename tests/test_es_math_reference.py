"""The ES core's formulas against independent numpy implementations written here from the rules' statements
(basic ES and its fitness shaping, table noise, Adam on the ES gradient, EGGROLL low-rank noise, pass@k), not
from esft's code. The noise draws themselves (`gaussian`, `lowrank_factors`, the table) are esft's definitions
and are taken as given; what is checked is every formula built on them. DART-ES: tests/test_es_dart_reference.py.

Run: . .venv/bin/activate && pytest -q tests/test_es_math_reference.py   (a few seconds, CPU)
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from es_tiny import one_thread  # noqa: F401  (autouse fixture)
from esft.analysis.drift import fit_drift, predicted_sq_drift
from esft.es.lowrank import LowRankWeights, PopulationPerturbation, lowrank_factors
from esft.es.noise import MasterWeights, gaussian
from esft.es.strategy import ES, centered_rank, raw, zscore
from esft.passk import maj_at_k, pass_at_k


class TwinTensors(torch.nn.Module):
    """Two same-shaped matrices (they must get different noise) and a vector."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = torch.nn.Parameter(torch.randn(6, 5, generator=g).to(dtype))
        self.b = torch.nn.Parameter(torch.randn(6, 5, generator=g).to(dtype))
        self.c = torch.nn.Parameter(torch.randn(7, generator=g).to(dtype))


def masters_np(w: MasterWeights) -> dict[str, np.ndarray]:
    return {n: m.double().numpy().copy() for n, m in w.iter_masters()}


# ---- fitness shaping ----------

def ref_zscore(f):
    f = np.asarray(f, np.float64)
    if f.max() == f.min():
        return np.zeros_like(f)
    return (f - f.mean()) / (np.sqrt(((f - f.mean()) ** 2).mean()) + 1e-8)


def ref_centered_rank(f):
    """Average 0-based rank among ties, mapped linearly to [-0.5, 0.5], by counting (no sorting)."""
    f = list(map(float, f))
    n = len(f)
    if n <= 1:
        return np.zeros(n)
    ranks = [sum(g < x for g in f) + (sum(g == x for g in f) - 1) / 2 for x in f]
    return np.array(ranks) / (n - 1) - 0.5


@pytest.mark.parametrize("values", [[0.1, 0.5, 0.5, 0.2, 0.9], [1, 1, 0, 0], [3.0], [0.3] * 6, [0.1 + 0.2, 0.3],
                                    [1e-9, 2e-9, 3e-9], [5, -1, 5, 5, 2, -1, 0]])
def test_each_shaping_matches_its_formula(values):
    f = np.array(values, dtype=np.float64)
    for got, want in ((zscore(f), ref_zscore(f)), (centered_rank(f), ref_centered_rank(f)), (raw(f), f)):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # equal fitness values get equal weights under every shaping
    for shaped in (zscore(f), centered_rank(f)):
        for i, j in itertools.combinations(range(f.size), 2):
            if f[i] == f[j]:
                assert shaped[i] == shaped[j]
    if np.ptp(f) == 0:  # no spread: exactly zero weights, so no update
        assert not zscore(f).any() and not centered_rank(f).any()


@pytest.mark.parametrize("shaping", ["zscore", "centered_rank"])
@pytest.mark.parametrize("antithetic", [False, True])
def test_zero_spread_gives_a_zero_update(shaping, antithetic):
    es = ES(population_size=4, sigma=0.1, alpha=0.5, seed=3, antithetic=antithetic, fitness_shaping=shaping)
    w = MasterWeights(TwinTensors())
    before = masters_np(w)
    update = es.tell(es.ask(0), [0.25] * 4)
    assert update.is_zero and w.apply(update) == 0.0
    assert all(np.array_equal(before[n], m) for n, m in masters_np(w).items())


def test_zero_spread_skips_the_adam_step():
    """Documented choice (esft.es.strategy): no spread, no optimizer step; Adam's step count does not advance."""
    es = ES(population_size=4, sigma=0.1, alpha=0.01, seed=3, optimizer="adam")
    w = MasterWeights(TwinTensors())
    opt = es.make_optimizer(list(w.master.values()))
    w.apply(es.tell(es.ask(0), [0.1, 0.4, 0.2, 0.3]), opt)
    before = masters_np(w)
    assert w.apply(es.tell(es.ask(1), [0.5] * 4), opt) == 0.0
    assert all(np.array_equal(before[n], m) for n, m in masters_np(w).items())
    assert {float(st["step"]) for st in opt.state.values()} == {1.0}


# ---- basic ES: perturbation, update, restore ----------

def ref_sgd_step(theta, members, fitness, alpha, shaping, noise):
    """theta + (alpha / N) * sum_n shaped_n * sign_n * eps(seed_n), in float64, member by member."""
    z = {"zscore": ref_zscore, "centered_rank": ref_centered_rank, "raw": np.asarray}[shaping](fitness)
    out = {n: t.copy() for n, t in theta.items()}
    for (seed, sign), zn in zip(members, z):
        for name in out:
            out[name] += alpha / len(members) * zn * sign * noise(seed, name)
    return out


@pytest.mark.parametrize("shaping", ["zscore", "centered_rank", "raw"])
@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("mode", ["per-tensor", "table"])
def test_sgd_update_and_perturbation_match_the_formula(shaping, antithetic, mode):
    model = TwinTensors()
    w = MasterWeights(model, noise=mode)
    es = ES(population_size=6, sigma=0.05, alpha=0.3, seed=11, antithetic=antithetic, fitness_shaping=shaping)
    members = es.ask(4)
    assert len(members) == 6 and len({s for s, _ in members}) == (3 if antithetic else 6)

    def noise(seed, name):
        return w.noise(seed, name).double().numpy()

    theta0 = masters_np(w)
    for seed, sign in members:  # member = theta + sign * sigma * eps, and the restore gives theta back bit for bit
        w.perturb(seed, sign, es.sigma)
        for name, p in model.named_parameters():
            np.testing.assert_allclose(p.detach().double().numpy(), theta0[name] + sign * es.sigma * noise(seed, name),
                                       rtol=0, atol=1e-6)
        w.restore()
        assert all(np.array_equal(p.detach().double().numpy(), theta0[n]) for n, p in model.named_parameters())
    fitness = np.array([0.2, 0.7, 0.7, 0.1, 0.4, 0.9])
    norm = w.apply(es.tell(members, fitness))
    want = ref_sgd_step(theta0, members, fitness, es.alpha, shaping, noise)
    got = masters_np(w)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6)
        assert w.master[name].dtype == torch.float32
    assert norm == pytest.approx(math.sqrt(sum(((want[n] - theta0[n]) ** 2).sum() for n in want)), rel=1e-5)


@pytest.mark.parametrize("mode", ["per-tensor", "table"])
def test_noise_is_distinct_per_tensor_and_member_and_standard_normal(mode):
    w = MasterWeights(TwinTensors(), noise=mode)
    draws = [w.noise(s, n).reshape(-1).double().numpy().copy() for s in (1, 2, 3) for n in ("a", "b")]
    for x, y in itertools.combinations(draws, 2):  # same shape, different (seed, tensor): never the same noise
        assert not np.allclose(x, y)
    # many windows / streams of one 6x5 tensor: mean 0, variance 1, no correlation between two of them
    big = np.stack([w.noise(s, "a").reshape(-1).double().numpy() for s in range(2000)])
    assert abs(big.mean()) < 0.02 and abs(big.var() - 1) < 0.03
    corr = np.corrcoef(big[:, 0], big[:, 1])[0, 1]
    assert abs(corr) < 0.08
    assert abs(float((big[:-1] * big[1:]).sum(axis=1).mean()) / big.shape[1]) < 0.02


def test_bf16_restore_is_bit_exact_after_updates():
    model = TwinTensors(torch.bfloat16)
    w = MasterWeights(model)
    es = ES(population_size=4, sigma=1e-3, alpha=1e-4, seed=5)
    for t in range(3):
        centre = {n: p.detach().clone() for n, p in model.named_parameters()}
        for seed, sign in es.ask(t):
            w.perturb(seed, sign, es.sigma)
            w.restore()
            assert all(torch.equal(p, centre[n]) for n, p in model.named_parameters())
        w.apply(es.tell(es.ask(t), [0.1, 0.4, 0.2, 0.3]))
        # the model holds the fp32 masters rounded once; the masters keep steps below bf16's resolution
        assert all(torch.equal(p, w.master[n].to(torch.bfloat16)) for n, p in model.named_parameters())


# ---- random-walk law ----------

def test_random_walk_prediction_and_fit():
    alpha, d, n = 2e-3, 12345, 30
    steps = np.arange(1, 11)
    np.testing.assert_allclose(predicted_sq_drift(alpha, steps, d, n), alpha ** 2 * steps * d / n, rtol=1e-15)
    fit = fit_drift(steps, alpha ** 2 * steps * d / n, alpha, n, d)
    assert fit["d_eff"] == pytest.approx(d) and fit["rho"] == pytest.approx(1.0) and fit["r2_theory"] == 1.0
    # z-scored coefficients of independent members have sum c^2 = N (up to the 1e-8 in the denominator)
    es = ES(population_size=n, sigma=1.0, alpha=alpha, seed=0)
    c = np.array(es.tell(es.ask(0), np.random.default_rng(0).random(n)).coefficients)
    assert float((c * c).sum()) == pytest.approx(n, rel=1e-6)


# ---- Adam on the ES gradient ----------

def ref_adam(theta, grads, lr, b1=0.9, b2=0.999, eps=1e-8):
    """Kingma & Ba with bias correction, minimising: theta -= lr * mhat / (sqrt(vhat) + eps)."""
    m = {k: np.zeros_like(v) for k, v in theta.items()}
    v2 = {k: np.zeros_like(v) for k, v in theta.items()}
    theta = {k: v.copy() for k, v in theta.items()}
    for t, g in enumerate(grads, start=1):
        for k in theta:
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v2[k] = b2 * v2[k] + (1 - b2) * g[k] ** 2
            theta[k] -= lr * (m[k] / (1 - b1 ** t)) / (np.sqrt(v2[k] / (1 - b2 ** t)) + eps)
    return theta


def test_adam_ascends_the_es_gradient_with_bias_correction_and_resumes():
    n, sigma, lr = 6, 0.1, 0.01
    es = ES(population_size=n, sigma=sigma, alpha=lr, seed=2, optimizer="adam")
    rng = np.random.default_rng(1)
    fitness = [rng.random(n) for _ in range(4)]
    w = MasterWeights(TwinTensors())
    theta0 = masters_np(w)
    grads = []
    for t, f in enumerate(fitness):  # gradient handed to a minimiser: minus the fitness-gradient estimate
        z = ref_zscore(f)
        grads.append({k: -sum(zi * w.noise(s, k).double().numpy() for (s, _), zi in zip(es.ask(t), z)) / (n * sigma)
                      for k in theta0})
    want = ref_adam(theta0, grads, lr)

    opt = es.make_optimizer(list(w.master.values()))
    for t in range(2):
        w.apply(es.tell(es.ask(t), fitness[t]), opt)
    saved = opt.state_dict()
    # resume: the masters and the optimizer state of step 2 in a fresh process-like setup
    w2 = MasterWeights(TwinTensors())
    w2.load_masters({k: m.clone() for k, m in w.iter_masters()})
    opt2 = es.make_optimizer(list(w2.master.values()))
    opt2.load_state_dict(saved)
    for t in range(2, 4):
        w2.apply(es.tell(es.ask(t), fitness[t]), opt2)
    got = masters_np(w2)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=2e-6)
    # the first step of bias-corrected Adam moves every coordinate by ~lr towards higher fitness
    first = ref_adam(theta0, grads[:1], lr)
    assert all(np.allclose(np.abs(first[k] - theta0[k]), lr, rtol=1e-3) for k in theta0)
    assert all(np.all(np.sign(first[k] - theta0[k]) == np.sign(-grads[0][k])) for k in theta0)


# ---- EGGROLL low-rank ----------

class TinyLinearNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(11, 6)
        self.lin = torch.nn.Linear(6, 4)  # its bias is a vector: frozen in low-rank mode
        self.norm = torch.nn.LayerNorm(4)

    def forward(self, ids):
        return self.norm(self.lin(self.emb(ids)))


def ref_lowrank_e(seed, name, shape, r):
    a, b = (t.double().numpy() for t in lowrank_factors(seed, name, shape, r))
    return a @ b.T / math.sqrt(r)


def ref_forward(model, deltas, ids):
    """The member's explicit weights W + delta in float64 numpy (LayerNorm with its unperturbed gain and bias)."""
    p = {k: v.detach().double().numpy() for k, v in model.named_parameters()}
    x = (p["emb.weight"] + deltas["emb.weight"])[ids]
    h = x @ (p["lin.weight"] + deltas["lin.weight"]).T + p["lin.bias"]
    mu, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
    return (h - mu) / np.sqrt(var + 1e-5) * p["norm.weight"] + p["norm.bias"]


@pytest.mark.parametrize("rank", [1, 3])
def test_lowrank_forward_update_and_rank(rank):
    model = TinyLinearNet()
    w = LowRankWeights(model, rank=rank)
    assert sorted(w.frozen) == ["lin.bias", "norm.bias", "norm.weight"] and w.num_params == 11 * 6 + 4 * 6
    es = ES(population_size=4, sigma=0.2, alpha=0.05, seed=9, antithetic=True)
    members = es.ask(0)
    shapes = {n: tuple(m.shape) for n, m in w.iter_masters()}
    ids = torch.tensor([[1, 4, 7], [10, 0, 3]])
    with torch.no_grad(), PopulationPerturbation(model, w, members, es.sigma) as pert:
        pert.set_rows(np.repeat(np.arange(len(members)), 2).tolist())
        out = model(ids.repeat(len(members), 1)).double().numpy().reshape(len(members), 2, 3, 4)
    for i, (seed, sign) in enumerate(members):  # implicit forward == explicit perturbed weights
        deltas = {n: sign * es.sigma * ref_lowrank_e(seed, n, s, rank) for n, s in shapes.items()}
        np.testing.assert_allclose(out[i], ref_forward(model, deltas, ids.numpy()), rtol=0, atol=1e-5)
        np.testing.assert_allclose(w.noise(seed, "lin.weight").double().numpy(),
                                   ref_lowrank_e(seed, "lin.weight", shapes["lin.weight"], rank), atol=1e-6)
    theta0 = masters_np(w)
    fitness = [0.3, 0.1, 0.8, 0.4]
    w.apply(es.tell(members, fitness))
    z = ref_zscore(fitness)
    for n, s in shapes.items():  # alpha / N * sum_n z_n sign_n E_n, as in full rank
        step = sum(zi * sg * ref_lowrank_e(sd, n, s, rank) for (sd, sg), zi in zip(members, z)) * es.alpha / 4
        np.testing.assert_allclose(masters_np(w)[n] - theta0[n], step, rtol=0, atol=1e-6)
        # two antithetic pairs fold into 2 seeds: rank min(2 r, m, n)
        assert np.linalg.matrix_rank(step) == min(2 * rank, *s)
    assert all(torch.equal(p, p0) for p, p0 in zip(model.lin.bias, TinyLinearNet().lin.bias))


# ---- pass@k ----------

def test_pass_at_k_equals_the_exact_combinatorial_estimator():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
                assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)
            with pytest.raises(ValueError):
                pass_at_k(n, c, n + 1)
        assert pass_at_k(n, 0, n) == 0.0 and pass_at_k(n, n, 1) == 1.0
    for n, c, k in ((500, 3, 10), (1000, 1, 1), (1000, 999, 2), (400, 40, 200)):
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


def test_maj_at_k_exact_cases_against_brute_force():
    keys = ["7", "7", "3", None, "3", "5"]
    scores = [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    # k = n: "7" and "3" tie with 2 votes, one of them right: expected score of a uniform tie-break
    assert maj_at_k(keys, scores, 6) == 0.5
    # k = 1: the mean over the samples of a single sample's score (no answer scores 0)
    assert maj_at_k(keys, scores, 1) == pytest.approx(2 / 6)


# ---- table noise: a run rebuilt from its logged (seeds, fitness) ----------

def test_table_run_is_rebuilt_from_logged_seeds_and_fitness(tmp_path):
    from es_tiny import ToyTask, stub_generate, tiny_llama
    from esft.api import train_es
    from esft.es import es_rundir
    from esft.es.build import make_strategy, make_weights
    from esft.es.es_config import ESConfig
    from esft.es.replay import drift, matches_checkpoint

    config = ESConfig(model="tiny", task="toy", population_size=4, sigma=0.05, alpha=0.02, batch_size=6,
                      iterations=3, max_new_tokens=2, seed=5, output_dir=str(tmp_path / "run"), eval_every=0,
                      noise="table", antithetic=True, fitness_shaping="centered_rank")
    res = train_es(config, model=tiny_llama(), tokenizer=None, task=ToyTask(), generate_fn=stub_generate,
                   progress=False)
    records = es_rundir.read_seed_log(res.output_dir)
    assert len(records) == 3
    model = tiny_llama()
    weights = make_weights(model, config)
    strategy = make_strategy(config)
    d = weights.num_params
    unit = 0.0
    for rec in records:  # the update from the logged members and fitness alone, then applied
        members = strategy.ask(rec["iteration"])
        assert [list(m) for m in members] == rec["members"]
        update = strategy.tell(members, rec["fitness"])
        assert update == es_rundir.update_from_record(rec)
        weights.apply(update)
        unit += update.scale ** 2 * sum(c * c for c in update.coefficients)
    assert matches_checkpoint(model, weights, res.final_checkpoint)
    # the replayed random-walk expectation: sum_t (alpha / N)^2 sum_k c_k^2 * d
    last = list(drift(tiny_llama(), res.output_dir, per_tensor=False))[-1]
    assert last["num_params"] == d and last["expected"] == pytest.approx(unit * d, rel=1e-12)
    with pytest.raises(ValueError, match="not in the seed log"):  # a step past the log is not the last one
        list(drift(tiny_llama(), res.output_dir, upto=4))
