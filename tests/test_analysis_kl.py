"""KL(pi_after || pi_before): estimators, token alignment on generated ids, stages, seed aggregation, heatmap.

Run: `pytest -q tests/test_analysis_kl.py` (about 10 s: tiny random Llamas with the SmolLM2 tokenizer).
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.colors import SymLogNorm
import pytest
import torch

from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from conftest import make_tiny_model
from esft.analysis import kl as K
from esft.analysis import kl_report as KR
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


def test_seed_summary_std_is_the_sample_std_and_zero_for_one_seed():
    two = K.seed_summary([0.1, None, 0.3])
    assert two["n"] == 2 and two["std"] == pytest.approx(np.std([0.1, 0.3], ddof=1))
    one = K.seed_summary([0.2, float("nan")])
    assert (one["n"], one["median"], one["mean"], one["std"]) == (1, 0.2, 0.2, 0.0)
    assert K.seed_summary([None, float("nan")]) == {"n": 0, "median": None, "min": None, "max": None,
                                                     "mean": None, "std": None}


def tiny_gpt2(seed):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=64, n_positions=64, n_embd=16, n_layer=1, n_head=2)
    return GPT2LMHeadModel(cfg).eval().requires_grad_(False)


def test_left_padded_scoring_keeps_absolute_positions():
    """A model with learned absolute positions (GPT-2): each row is scored at the positions it has alone, so
    left padding must not shift them (a rotary model would not notice a uniform shift)."""
    a, b = tiny_gpt2(0), tiny_gpt2(1)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
    comps = [[20, 21, 22, 24, 25], [23], []]
    # positions in chunks of 2: the 5-token completion is read in three slices
    seqs = K.score_pair(a, b, prompts, comps, batch_size=3, pad_id=0, position_chunk=2)
    assert len(seqs) == 3
    for p, c, s in zip(prompts, comps, seqs):
        k1, k3, ex = direct(a, b, p, c) if c else (0.0, 0.0, 0.0)
        assert s.tokens == len(c)
        assert (s.k1, s.k3, s.exact) == pytest.approx((k1, k3, ex), abs=1e-6)
    # completions of one token each: scored, not taken for empty ones
    ones = K.score_pair(a, b, prompts, [[30], [31], [32]], batch_size=3, pad_id=0)
    for p, c, s in zip(prompts, [[30], [31], [32]], ones):
        assert s.tokens == 1 and s.exact > 0 and s.k3 == pytest.approx(direct(a, b, p, c)[1], abs=1e-6)


class IgnoresLogitsToKeep(torch.nn.Module):
    """A model whose forward accepts `logits_to_keep` and drops it: it returns logits for every position (or,
    with `cut`, for some other number of positions)."""

    def __init__(self, model, cut: int | None = None):
        super().__init__()
        self.model, self.cut = model, cut

    def forward(self, logits_to_keep=None, **kwargs):
        out = self.model(**kwargs)
        if self.cut is not None:
            out.logits = out.logits[:, -self.cut:]
        return out


def test_a_model_that_ignores_logits_to_keep_is_scored_on_the_same_aligned_tokens():
    """Full-sequence logits are cut to the last positions the scorer indexes, not read from the row's start."""
    a, b = tiny_gpt2(0), tiny_gpt2(1)
    prompts, comps = [[5, 6, 7, 8, 9, 10], [11, 12]], [[20, 21], [23, 24, 25]]
    kept = K.score_pair(a, b, prompts, comps, batch_size=2, pad_id=0)
    full = K.score_pair(IgnoresLogitsToKeep(a), IgnoresLogitsToKeep(b), prompts, comps, batch_size=2, pad_id=0)
    for p, c, x, y in zip(prompts, comps, kept, full):
        assert (y.tokens, y.k1, y.k3, y.exact) == pytest.approx((x.tokens, x.k1, x.k3, x.exact), abs=1e-9)
        assert (y.k1, y.k3, y.exact) == pytest.approx(direct(a, b, p, c), abs=1e-6)


def test_logits_of_neither_the_kept_nor_all_positions_are_refused():
    a, b = tiny_gpt2(0), tiny_gpt2(1)
    with pytest.raises(ValueError, match=r"returned logits of shape \(2, 3, 64\) for a batch of \(2, 8\) ids: "
                                         r"expected the last 4 positions \(logits_to_keep=4\) or all 8"):
        K.score_pair(IgnoresLogitsToKeep(a, cut=3), b, [[5, 6, 7, 8, 9], [11]], [[20, 21, 22], [23]],
                     batch_size=2, pad_id=0)
    """Nothing predicts the first token of a completion with an empty prompt; an empty prompt with an empty
    completion is simply nothing to score."""
    a, b = tiny_gpt2(0), tiny_gpt2(1)
    with pytest.raises(ValueError, match="row 1: a completion needs at least one prompt token"):
        K.score_pair(a, b, [[5, 6], [], [7]], [[20], [21, 22], [23]], batch_size=3, pad_id=0)
    assert K.score_pair(a, b, [[5, 6], []], [[20], []], batch_size=2, pad_id=0)[1].tokens == 0


def test_default_generation_of_kl_stages_is_greedy(monkeypatch, tokenizer):
    """Without a generation config, pi_after's completions are greedy, as the paper's evaluation."""
    seen = []

    def fake_completions(model, tok, examples, task, gen_config, progress=False):
        seen.append(gen_config)
        return [[1, 2]] * len(examples), [[3]] * len(examples)

    monkeypatch.setattr(K, "generate_completions", fake_completions)
    model = tiny_gpt2(0)
    res = K.kl_stages("base", [("1:boolq", "s1")], ["boolq"], limit=1, loader=lambda spec: (model, tokenizer),
                      task_options={"boolq": {"max_passage_chars": 80}})
    assert seen and all(c.temperature == 0.0 for c in seen) and res["generation"]["temperature"] == 0.0


def test_one_seed_aggregates_and_a_missing_cell_reads_nan():
    table = {"stages": ["1:a", "2:b"], "tasks": ["a"], "incremental": {"a": {"1:a": {"k3_token_mean": 0.5}}},
             "cumulative": {"a": {}}}
    agg = K.aggregate_seeds([table])
    assert agg["seeds"] == 1 and agg["incremental"]["a"]["1:a"]["std"] == 0.0
    m = K.matrix(table)
    assert m[0, 0] == 0.5 and math.isnan(m[0, 1])


def test_summarize_pools_tokens_for_the_token_mean_and_averages_sequences_for_the_seq_mean():
    """Hand-computed: 3 sequences of 2, 0 and 4 tokens whose k1 sums are 1, 0 and 2."""
    seqs = [K.SequenceKL(2, 1.0, 0.5, 0.25), K.SequenceKL(0, 0.0, 0.0, 0.0), K.SequenceKL(4, 2.0, 1.0, 0.5)]
    s = K.summarize(seqs)
    assert (s["n"], s["tokens"]) == (3, 6)
    assert (s["k1_token_mean"], s["k3_token_mean"], s["exact_token_mean"]) == pytest.approx((0.5, 0.25, 0.125))
    assert (s["k1_seq_mean"], s["k3_seq_mean"], s["exact_seq_mean"]) == pytest.approx((1.0, 0.5, 0.25))
    # only empty completions: no token to average over (not a KL of 0); the per-sequence sum is 0
    empty = K.summarize([K.SequenceKL(0, 0.0, 0.0, 0.0)] * 2)
    assert empty["k3_token_mean"] is None and empty["k3_seq_mean"] == 0.0
    assert K.summarize([])["k1_token_mean"] is None and K.summarize([])["k1_seq_mean"] is None


def test_estimators_keep_float64_for_nearly_equal_models():
    """k3 ~ r^2/2 and the exact KL of close distributions are differences of nearly equal numbers: float32
    inputs are promoted before subtracting (a float32 r = 1e-7 at log p ~ -1.2 is pure rounding)."""
    la = torch.tensor([math.log(0.3)], dtype=torch.float64)
    r = 1e-7
    est = K.kl_estimates(la, la + r)
    assert float(est["k1"][0]) == pytest.approx(-r, rel=1e-6)
    assert float(est["k3"][0]) == pytest.approx(r * r / 2, rel=1e-3)
    # exact KL of float32 logits: softmax(a) vs softmax(a + eps * noise); KL ~ eps^2/2 Var_p(noise)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 50, generator=g).float()
    b = (a.double() + 1e-3 * torch.randn(4, 50, generator=g, dtype=torch.float64)).float()
    pa = np.exp(a.double().numpy()) / np.exp(a.double().numpy()).sum(-1, keepdims=True)
    pb = np.exp(b.double().numpy()) / np.exp(b.double().numpy()).sum(-1, keepdims=True)
    want = (pa * (np.log(pa) - np.log(pb))).sum(-1)
    assert np.allclose(K.exact_kl(a, b).numpy(), want, rtol=1e-6, atol=0)
    # direction: KL(p || q) with p = softmax(after) = (1/2, 1/2), q = softmax(before) = (0.9, 0.1) is ln(5/3)
    got = K.exact_kl(torch.tensor([[0.0, 0.0]]), torch.log(torch.tensor([[0.9, 0.1]], dtype=torch.float64)))
    assert float(got[0]) == pytest.approx(math.log(5 / 3), rel=1e-12)


def test_seed_summary_mean_and_median_differ_on_a_skewed_sample():
    s = K.seed_summary([0.1, 0.9, 0.2])
    assert (s["median"], s["min"], s["max"]) == (0.2, 0.1, 0.9)
    assert s["mean"] == pytest.approx(0.4) and s["std"] == pytest.approx(np.std([0.1, 0.9, 0.2], ddof=1))


def test_aggregate_seeds_reads_each_kind_from_its_own_table():
    tables = [{"stages": ["1:a", "2:b"], "tasks": ["a"],
               "incremental": {"a": {"1:a": {"k3_token_mean": v}, "2:b": {"k3_token_mean": 10 * v}}},
               "cumulative": {"a": {"1:a": {"k3_token_mean": v}, "2:b": {"k3_token_mean": 100 * v}}}}
              for v in (1.0, 2.0)]
    agg = K.aggregate_seeds(tables)
    assert agg["incremental"]["a"]["2:b"]["mean"] == pytest.approx(15.0)
    assert agg["cumulative"]["a"]["2:b"]["mean"] == pytest.approx(150.0)
    assert agg["cumulative"]["a"]["1:a"]["median"] == pytest.approx(1.5)


def test_scores_do_not_depend_on_the_pad_id():
    """Padding is masked out and positions come from the mask: the pad token's id cannot change any score."""
    a, b = tiny_gpt2(0), tiny_gpt2(1)
    prompts, comps = [[5, 6, 7, 8, 9, 10], [11, 12]], [[20, 21], [23, 24, 25, 26]]
    s0 = K.score_pair(a, b, prompts, comps, batch_size=2, pad_id=0)
    s1 = K.score_pair(a, b, prompts, comps, batch_size=2, pad_id=63)
    for x, y in zip(s0, s1):
        assert (x.tokens, x.k1, x.k3, x.exact) == pytest.approx((y.tokens, y.k1, y.k3, y.exact), abs=1e-9)


def test_kl_rows_print_median_min_max_over_seeds_next_to_the_studys_cell():
    from esft import paper

    tables = [{"stages": ["1:countdown", "2:math"], "tasks": ["countdown", "a"],
               "incremental": {t: {"1:countdown": {"k3_token_mean": v}, "2:math": {"k3_token_mean": 2 * v}}
                               for t in ("countdown", "a")},
               "cumulative": {t: {"1:countdown": {"k3_token_mean": v}, "2:math": {"k3_token_mean": 3 * v}}
                              for t in ("countdown", "a")}} for v in (0.1, 0.3, 0.2)]
    group = KR.KLGroup("grpo", "grpo", ("countdown", "math"), tables, K.aggregate_seeds(tables))
    head, rows = KR.kl_rows(group, "cumulative")
    assert head == ["eval task", "after 1:countdown", "after 2:math"]
    # the study's cell is looked up by the task trained at that stage (the label after the colon)
    ref1 = paper.kl_reference("grpo", "cumulative", "countdown", "countdown")
    ref2 = paper.kl_reference("grpo", "cumulative", "countdown", "math")
    assert ref1 and ref2 and ref1 != ref2
    # beside the study's mean +- std over seeds (Table 14), ours too
    assert rows[0] == ["countdown", f"0.2 [0.1, 0.3]; mean 0.2 +- 0.1 (paper {ref1[0]})",
                       f"0.6 [0.3, 0.9]; mean 0.6 +- 0.3 (paper {ref2[0]})"]
    assert rows[1] == ["a", "0.2 [0.1, 0.3]", "0.6 [0.3, 0.9]"]  # a task the study does not have: no cell
    one = KR.KLGroup("es", "es", ("a",), tables[:1], K.aggregate_seeds(tables[:1]))
    assert KR.kl_rows(one, "incremental")[1][1] == ["a", "0.1", "0.2"]  # one seed: the value alone


def test_progress_line_of_a_task_with_no_generated_token(monkeypatch, tokenizer, capsys):
    """Empty completions (max_new_tokens=0) have no per-token mean (None): the progress line says n/a."""
    monkeypatch.setattr(K, "generate_completions",
                        lambda m, tok, ex, task, cfg, progress=False: ([[1, 2]] * len(ex), [[]] * len(ex)))
    model = tiny_gpt2(0)
    res = K.kl_stages("base", [("1:boolq", "s1")], ["boolq"], limit=1, loader=lambda spec: (model, tokenizer),
                      task_options={"boolq": {"max_passage_chars": 80}}, progress=True)
    assert res["incremental"]["boolq"]["1:boolq"]["k3_token_mean"] is None
    assert "k3/token n/a" in capsys.readouterr().out


@pytest.fixture()
def heatmap_figure(monkeypatch, tmp_path):
    """plot_heatmap's figure as it is about to be saved (the PNG's bytes say little about its colour scale)."""
    import esft.analysis.plots as plots

    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, path: figures.append(fig) or path)

    def draw(panels):
        K.plot_heatmap(panels, tmp_path / "h.png")
        (fig,) = figures[-1:]
        plots.pyplot().close(fig)
        return fig

    return draw


def test_heatmap_panels_share_one_colour_scale_from_zero_to_the_largest_kl(heatmap_figure):
    """Figure 2: one viridis scale for every panel, from 0 (no change) to the largest cell of any panel, so the
    methods' colours compare; each finite cell's value written on it, white on a dark cell and black on a light one,
    and n/a on a cell not measured."""
    es = np.array([[0.3, np.nan], [0.05, 0.4]])
    grpo = np.array([[0.01, 0.02], [0.03, 0.1]])
    fig = heatmap_figure({"ES": (es, ["a", "b"], ["1:a", "2:b"]), "GRPO": (grpo, ["a", "b"], ["1:a", "2:b"])})
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["ES", "GRPO"]
    for ax, m in zip(panels, (es, grpo)):
        (im,) = ax.get_images()
        assert im.cmap.name == "viridis"
        assert (im.norm.vmin, im.norm.vmax) == (0.0, 0.4)
        np.testing.assert_array_equal(np.ma.filled(im.get_array(), np.nan), m)
    assert len(fig.axes) == 3  # and a colour bar
    written = [[(t.get_text(), t.get_color()) for t in ax.texts] for ax in panels]
    assert written == [[("0.3", "k"), ("n/a", "grey"), ("0.05", "w"), ("0.4", "k")],
                       [("0.01", "w"), ("0.02", "w"), ("0.03", "w"), ("0.1", "w")]]


def test_heatmap_scale_of_negative_equal_and_missing_values(heatmap_figure):
    """A negative estimate (k1, or rounding) extends the scale below 0; panels of one value (two equal models:
    all 0) and panels of no finite value still get a scale of positive width."""
    def norm(m):
        (im,) = heatmap_figure({"ES": (np.array(m), ["a"], ["1:a", "2:a"])}).axes[0].get_images()
        return im.norm.vmin, im.norm.vmax

    assert norm([[-0.1, 0.2]]) == (-0.1, 0.2)
    assert norm([[0.5, 0.5]]) == (0.0, 0.5)
    lo, hi = norm([[0.0, 0.0]])
    assert lo == 0.0 and 0.0 < hi < 1e-9
    assert norm([[np.nan, np.nan]]) == (0.0, 1.0)


def test_heatmap_of_kls_decades_apart_is_on_a_log_scale_that_tells_them_apart(heatmap_figure):
    """ES's KLs are often decades below GRPO's: on one linear scale every ES cell was the same dark colour. Over
    LOG_SCALE_SPAN the scale is symmetric-log, 0 at the bottom, and the colour bar says so."""
    es = np.array([[1e-4, 1e-3]])
    grpo = np.array([[0.0, 0.5]])
    fig = heatmap_figure({"ES": (es, ["a"], ["1:a", "2:a"]), "GRPO": (grpo, ["a"], ["1:a", "2:a"])})
    (im,) = fig.axes[0].get_images()
    norm = im.norm
    assert isinstance(norm, SymLogNorm) and (norm.vmin, norm.vmax) == (0.0, 0.5)
    levels = [float(norm(v)) for v in (0.0, 1e-4, 1e-3, 0.5)]
    assert levels[0] == 0.0 and levels[-1] == 1.0
    assert all(b - a > 0.15 for a, b in zip(levels, levels[1:])), levels  # each decade a visibly other colour
    assert fig.axes[-1].get_ylabel() == "KL per token (nats, log scale)"
    assert [t.get_text() for t in fig.axes[0].texts] == ["0.0001", "0.001"]  # the values, as before


def test_heat_norm_keeps_a_negative_estimate_below_zero_on_the_log_scale():
    norm = K.heat_norm(np.array([-0.002, 0.0, 0.002, 2.0, np.nan]))
    assert isinstance(norm, SymLogNorm) and (norm.vmin, norm.vmax) == (-0.002, 2.0)
    assert float(norm(-0.002)) == 0.0 and 0.0 < float(norm(0.0)) < float(norm(0.002)) < float(norm(2.0)) == 1.0
    assert not isinstance(K.heat_norm(np.array([0.0, 0.01, 0.5])), SymLogNorm)  # 50x: linear


def test_one_near_zero_cell_among_similar_kls_keeps_the_scale_linear():
    """A single tiny cell (a stage that barely moved a task) spans decades with the rest, but a log scale would
    squeeze the similar cells into the top of the colour map (0.935, 0.976, 1.0): the scale stays linear."""
    values = np.array([2e-8, 0.01, 0.02, 0.03])
    norm = K.heat_norm(values)
    assert not isinstance(norm, SymLogNorm)
    assert np.allclose([float(norm(v)) for v in values[1:]], [1 / 3, 2 / 3, 1.0])


def test_kl_rows_of_two_seeds_give_their_range():
    tables = [{"stages": ["1:a"], "tasks": ["a"], "incremental": {"a": {"1:a": {"k3_token_mean": v}}},
               "cumulative": {"a": {"1:a": {"k3_token_mean": v}}}} for v in (0.1, 0.3)]
    group = KR.KLGroup("es", "es", ("a",), tables, K.aggregate_seeds(tables))
    assert KR.kl_rows(group, "incremental")[1] == [["a", "0.2 [0.1, 0.3]"]]


def test_kl_and_landscape_show_the_generation_bar_of_their_long_evaluations(monkeypatch, tokenizer):
    """A KL stage or a landscape point generates `limit` completions of up to 256 tokens (minutes on a CPU) before
    its one progress line: the generation ran with progress=False, so `esft analyze kl|landscape|sparsity` and the
    report's evaluating analyses sat silent that long."""
    import esft.evaluation as E
    import esft.generation as G
    from esft.analysis import landscape as L

    asked = []

    def fake_generate(model, tok, prompts, cfg, prompt_ids=None, progress=False):
        asked.append(progress)
        return [G.Generation(text="", completion_ids=[3], finished=True, prompt_tokens=2) for _ in prompts]

    monkeypatch.setattr(G, "generate", fake_generate)
    model = make_tiny_model(hidden=32, layers=1)
    K.kl_stages("base", [("1:boolq", "s1")], ["boolq"], limit=1, loader=lambda spec: (model, tokenizer),
                progress=True)
    assert asked == [True]
    monkeypatch.setattr(E, "generate", fake_generate)
    from esft.tasks import get_task

    task = get_task("boolq")
    L.accuracy(model, tokenizer, {"boolq": (task, task.load("test", limit=1))}, GenerationConfig(), progress=True)
    assert asked == [True, True]


def test_a_batch_of_empty_completions_scores_zero_kl_without_running_the_models():
    """Every completion of a batch empty (each stopped at once): nothing was generated, so nothing diverged, and
    neither model is run on the batch."""

    class NotRun:
        def __call__(self, *a, **k):
            raise AssertionError("a model was run on a batch with no completion token")

    seqs = K.score_pair(NotRun(), NotRun(), [[5, 6], [7]], [[], []], batch_size=2, pad_id=0)
    assert [(s.tokens, s.k1, s.k3, s.exact) for s in seqs] == [(0, 0.0, 0.0, 0.0)] * 2


def test_paper_cells_count_the_studys_cells_of_a_group():
    """The study's KL cells exist for es and grpo chains over its tasks only (paper.kl_reference)."""
    agg = {"tasks": ["countdown", "a"], "stages": ["1:countdown", "2:math"]}
    assert KR.paper_cells(KR.KLGroup("grpo", "grpo", ("countdown", "math"), [{}], agg)) == 4  # 2 kinds x 2 stages
    assert KR.paper_cells(KR.KLGroup("grpo->es", "grpo->es", ("countdown", "math"), [{}], agg)) == 0
    assert KR.paper_cells(KR.KLGroup("es", "es", ("a",), [{}], {"tasks": ["a"], "stages": ["1:a"]})) == 0


def test_the_studys_cumulative_kl_stands_only_beside_a_stage_of_its_sequence():
    """Tables 13-14 are KL from the base, cumulative over the study's sequence: its cell after BoolQ is the KL
    after four tasks, and stood beside a single-task BoolQ run's KL after one (as Tables 3, 4 and 20 did before
    paper.sequence_stage kept them to the stages of the study's sequence). The incremental cell, one step's, stays."""
    from esft import paper

    def group(stages):
        cells = {"boolq": {s: {"k3_token_mean": 0.3} for s in stages}}
        tables = [{"stages": stages, "tasks": ["boolq"], "incremental": cells, "cumulative": cells}]
        return KR.KLGroup("grpo", "grpo", tuple(s.split(":")[1] for s in stages), tables, K.aggregate_seeds(tables))

    one = group(["1:boolq"])
    assert KR.kl_rows(one, "cumulative")[1] == [["boolq", "0.3"]]
    step = paper.kl_reference("grpo", "incremental", "boolq", "boolq")[0]
    assert KR.kl_rows(one, "incremental")[1] == [["boolq", f"0.3 (paper {step})"]]
    assert KR.paper_cells(one) == 1
    # the study's own sequence: its cumulative cell after BoolQ, its fourth task, stands beside our fourth stage
    four = group(["1:countdown", "2:math", "3:chemistry", "4:boolq"])
    after4 = paper.kl_reference("grpo", "cumulative", "boolq", "boolq")[0]
    assert KR.kl_rows(four, "cumulative")[1][0][-1] == f"0.3 (paper {after4})"
    assert KR.kl_rows(group(["1:countdown", "2:boolq"]), "cumulative")[1][0][-1] == "0.3"


def test_seeds_whose_stage_labels_differ_are_aggregated_by_stage_position():
    # `esft analyze kl` names a stage by its run folder, which differs per seed (es-42, es-52): every seed must
    # still count in its cell, not the first one alone
    tables = [{"stages": [f"es-{seed}"], "tasks": ["a"], "incremental": {"a": {f"es-{seed}": {"k3_token_mean": v}}},
               "cumulative": {"a": {f"es-{seed}": {"k3_token_mean": v}}}} for seed, v in ((42, 0.1), (52, 0.3))]
    cell = K.aggregate_seeds(tables)["incremental"]["a"]["es-42"]
    assert (cell["n"], cell["min"], cell["max"]) == (2, 0.1, 0.3)
    other = {**tables[1], "stages": ["es-52", "more"]}
    with pytest.raises(ValueError, match="number of stages"):
        K.aggregate_seeds([tables[0], other])


def test_default_stage_labels_of_experiment_stages_differ(tmp_path):
    seq = tmp_path / "seed-42" / "sequential"
    paths = [seq / "es" / "1-countdown" / "run" / "checkpoints" / "iter_000100",
             seq / "es@100" / "2-math" / "run" / "checkpoints" / "final"]
    assert K.stage_labels(paths) == ["1-countdown", "2-math"]
    assert K.stage_labels([tmp_path / "es-42" / "checkpoints" / "final", tmp_path / "ck"]) == ["es-42", "ck"]
    one_run = [tmp_path / "es" / "checkpoints" / "iter_000100", tmp_path / "es" / "checkpoints" / "final"]
    assert K.stage_labels(one_run) == ["1:es", "2:es"]


def test_repeated_stage_labels_are_refused_before_a_model_loads():
    def loader(spec):
        raise AssertionError("loaded a model")

    with pytest.raises(ValueError, match="stage labels must differ"):
        K.kl_stages("base", [("run", "s1"), ("run", "s2")], ["boolq"], limit=1, loader=loader)


def test_seed_aggregation_takes_the_median_of_the_seeds_standard_errors():
    """Three seeds whose SEs over sequences are 0.01, 0.02 and 0.09: the cell's `se` is their median, 0.02 (their
    mean would be 0.04), beside the median [min, max] of the values."""
    tables = [{"stages": ["1:a"], "tasks": ["a"],
               **{k: {"a": {"1:a": {"k3_token_mean": v, "k3_token_mean_se": se}}}
                  for k in ("incremental", "cumulative")}}
              for v, se in ((0.1, 0.01), (0.3, 0.02), (0.2, 0.09))]
    cell = K.aggregate_seeds(tables)["incremental"]["a"]["1:a"]
    assert cell["se"] == pytest.approx(0.02)
    assert (cell["median"], cell["min"], cell["max"]) == pytest.approx((0.2, 0.1, 0.3))
