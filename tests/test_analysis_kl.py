"""KL(pi_after || pi_before): estimators, token alignment on generated ids, stages, seed aggregation, heatmap.

Run: `pytest -q tests/test_analysis_kl.py` (about 10 s: tiny random Llamas with the SmolLM2 tokenizer).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from conftest import make_tiny_model
from esft.analysis import kl as K
from esft.generation import GenerationConfig
from esft.tasks import get_task


@pytest.fixture(scope="module")
def task():
    return get_task("boolq", max_passage_chars=80)


def test_estimators_against_numpy():
    rng = np.random.default_rng(0)
    la, lb = np.log(rng.random(50)), np.log(rng.random(50))
    est = K.kl_estimates(torch.from_numpy(la), torch.from_numpy(lb))
    r = lb - la
    assert np.allclose(est["k1"].numpy(), -r)
    assert np.allclose(est["k3"].numpy(), np.exp(r) - 1 - r)
    assert (est["k3"] >= 0).all()
    # exact KL of two categorical distributions vs scipy's entropy(p, q)
    import scipy.stats

    a, b = rng.normal(size=(3, 7)), rng.normal(size=(3, 7))
    pa = np.exp(a) / np.exp(a).sum(-1, keepdims=True)
    pb = np.exp(b) / np.exp(b).sum(-1, keepdims=True)
    want = [scipy.stats.entropy(pa[i], pb[i]) for i in range(3)]
    assert np.allclose(K.exact_kl(torch.from_numpy(a), torch.from_numpy(b)).numpy(), want)


def test_k1_and_k3_are_unbiased_for_sampled_tokens():
    """E_{y ~ p}[k1] = E[k3] = KL(p || q): Monte-Carlo check of the estimators' definition."""
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(6))
    q = rng.dirichlet(np.ones(6))
    y = rng.choice(6, size=200_000, p=p)
    est = K.kl_estimates(torch.from_numpy(np.log(p[y])), torch.from_numpy(np.log(q[y])))
    kl = float((p * np.log(p / q)).sum())
    assert float(est["k1"].mean()) == pytest.approx(kl, abs=0.02)
    assert float(est["k3"].mean()) == pytest.approx(kl, abs=0.02)


def direct(model_a, model_b, prompt, completion):
    """Unbatched, unpadded reference: log-softmax of each model's logits at the completion positions."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        la = torch.log_softmax(model_a(ids).logits[0].double(), -1)
        lb = torch.log_softmax(model_b(ids).logits[0].double(), -1)
    pos = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)
    tok = torch.tensor(completion)
    r = lb[pos, tok] - la[pos, tok]
    exact = (la[pos].exp() * (la[pos] - lb[pos])).sum()
    return float((-r).sum()), float((torch.expm1(r) - r).sum()), float(exact)


def test_token_aligned_scores_match_direct_computation(tokenizer, task):
    a, b = make_tiny_model(seed=0, hidden=32), make_tiny_model(seed=1, hidden=32)
    examples = task.load("test", 3)
    cfg = GenerationConfig(max_new_tokens=5, temperature=1.0, seed=4, batch_size=3)
    prompt_ids, comps = K.generate_completions(a, tokenizer, examples, task, cfg)
    assert len({len(p) for p in prompt_ids}) > 1  # different prompt lengths: left padding is exercised
    # the scorer sees exactly the generated ids, not a re-tokenisation of their text
    seqs = K.score_pair(a, b, prompt_ids, comps, batch_size=2, pad_id=tokenizer.pad_token_id)
    for p, c, s in zip(prompt_ids, comps, seqs):
        k1, k3, ex = direct(a, b, p, c)
        assert s.tokens == len(c)
        assert s.k1 == pytest.approx(k1, abs=1e-5)
        assert s.k3 == pytest.approx(k3, abs=1e-5)
        assert s.exact == pytest.approx(ex, abs=1e-5)
    same = K.score_pair(a, a, prompt_ids, comps, batch_size=2, pad_id=tokenizer.pad_token_id)
    assert all(s.k1 == 0.0 and s.k3 == 0.0 and s.exact == 0.0 for s in same)
    summ = K.summarize(seqs)
    assert summ["tokens"] == sum(len(c) for c in comps)
    assert summ["k3_token_mean"] == pytest.approx(sum(s.k3 for s in seqs) / summ["tokens"])
    assert summ["k3_seq_mean"] == pytest.approx(sum(s.k3 for s in seqs) / 3)


def test_stages_incremental_and_cumulative(tokenizer):
    models = {"base": make_tiny_model(seed=0, hidden=32), "s1": make_tiny_model(seed=1, hidden=32),
              "s2": make_tiny_model(seed=2, hidden=32)}
    loads = []

    def loader(spec):
        loads.append(spec)
        return models[spec], tokenizer

    cfg = GenerationConfig(max_new_tokens=3, batch_size=2)
    res = K.kl_stages("base", [("1:boolq", "s1"), ("2:boolq", "s2")], ["boolq"], limit=2, gen_config=cfg,
                      loader=loader, task_options={"boolq": {"max_passage_chars": 80}})
    assert loads == ["s1", "base", "s2", "s1", "base"]  # never more than two models at a time
    inc, cum = res["incremental"]["boolq"], res["cumulative"]["boolq"]
    assert inc["1:boolq"] == cum["1:boolq"]  # stage 1: its previous stage is the base
    assert inc["2:boolq"] != cum["2:boolq"]
    assert all(v["k3_token_mean"] > 0 for v in (inc["2:boolq"], cum["2:boolq"]))
    task = get_task("boolq", max_passage_chars=80)
    self_kl = K.kl_between(models["s1"], models["s1"], tokenizer, task, task.load("test", 2), cfg)
    assert self_kl["k1_token_mean"] == 0.0 and self_kl["exact_token_mean"] == 0.0


def test_seed_aggregation_and_heatmap(tmp_path):
    tables = []
    for v in (0.1, 0.3, 0.2):
        cell = {"k3_token_mean": v}
        tables.append({"stages": ["1:a"], "tasks": ["a"], "incremental": {"a": {"1:a": cell}},
                       "cumulative": {"a": {"1:a": cell}}})
    agg = K.aggregate_seeds(tables)
    c = agg["incremental"]["a"]["1:a"]
    assert (c["median"], c["min"], c["max"], c["n"]) == (0.2, 0.1, 0.3, 3)
    assert c["mean"] == pytest.approx(0.2) and c["std"] == pytest.approx(np.std([0.1, 0.3, 0.2], ddof=1))
    m = K.matrix(agg, stat="median")
    assert m.shape == (1, 1) and m[0, 0] == 0.2
    p = K.plot_heatmap({"ES": (m, ["a"], ["1:a"]), "GRPO": (m / 2, ["a"], ["1:a"])}, tmp_path / "h.png")
    assert p.stat().st_size > 5000
