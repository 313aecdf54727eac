"""pass@k, maj@k, bootstrap CIs (esft.passk) and the sampled `esft eval` path with a stub generator.

Run: . .venv/bin/activate && pytest -q tests/test_passk.py   (~2 s, no model)
"""

from __future__ import annotations

import itertools
import json
import math
import re

import numpy as np
import pytest

from esft import evaluation
from esft.evaluation import pass_at_k, run_eval
from esft.eval_config import EvalConfig
from esft.generation import Generation
from esft.tasks.labels import wilson_interval
from esft.passk import (answer_key, bootstrap_ci, maj_at_k, majority_score, not_right_or_wrong, parse_ks,
                        pass_at_k_per_question, summarize_samples)


def comb_pass_at_k(n, c, k):
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def subsets_pass_at_k(n, c, k):
    """Literal definition: the fraction of k-subsets of the n samples holding at least one correct one."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 10, 17])
def test_pass_at_k_matches_combinatorics(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            expected = comb_pass_at_k(n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
            if n <= 10:
                assert pass_at_k(n, c, k) == pytest.approx(subsets_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_edge_cases_and_large_n():
    assert pass_at_k(10, 0, 1) == 0.0 and pass_at_k(10, 0, 10) == 0.0  # nothing correct
    assert pass_at_k(10, 10, 1) == 1.0 and pass_at_k(10, 10, 10) == 1.0  # everything correct
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 = c / n
    assert pass_at_k(10, 1, 10) == 1.0  # k = n: any correct sample is in the only subset
    # n in the thousands: the binomials overflow float64, the product form does not
    big = pass_at_k(5000, 7, 64)
    assert big == pytest.approx(comb_pass_at_k(5000, 7, 64), rel=1e-9) and 0 < big < 1
    for bad in [(4, 1, 5), (4, 1, 0), (4, 5, 1), (4, -1, 1), (0, 0, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)
    assert pass_at_k_per_question(np.array([0, 2, 4]), 4, 2).tolist() == pytest.approx(
        [0.0, comb_pass_at_k(4, 2, 2), 1.0])


def test_majority_vote_rules():
    assert majority_score(["a", "a", "b"], [1, 1, 0]) == 1.0
    assert majority_score(["a", "b", "b"], [1, 0, 0]) == 0.0
    assert majority_score(["a", "b"], [1, 0]) == 0.5  # tie: expected score of a random tie-break
    assert majority_score([None, None, "b"], [0, 0, 1]) == 1.0  # no answer, no vote
    assert majority_score([None, None], [0, 0]) == 0.0


def test_maj_at_k_exact_and_subset_average():
    keys = ["a", "a", "b", "b", "b", None]
    scores = [1, 1, 0, 0, 0, 0]
    assert maj_at_k(keys, scores, 6) == 0.0  # b wins 3-2
    assert maj_at_k(keys, scores, 1) == pytest.approx(2 / 6)
    subsets = list(itertools.combinations(range(6), 3))
    exact = np.mean([majority_score([keys[i] for i in s], [scores[i] for i in s]) for s in subsets])
    est = maj_at_k(keys, scores, 3, np.random.default_rng(1), draws=4000)
    assert est == pytest.approx(exact, abs=0.03)
    with pytest.raises(ValueError):
        maj_at_k(keys, scores, 7)


def test_bootstrap_ci_and_summary():
    # every question alike: the Wilson interval over the questions, not a point
    assert bootstrap_ci([1, 1, 1]) == pytest.approx((0.4385, 1.0), abs=1e-4)
    assert bootstrap_ci([0] * 3) == pytest.approx((0.0, 0.5615), abs=1e-4)
    assert bootstrap_ci([0.5] * 10) == wilson_interval(5, 10)
    assert bootstrap_ci([2.0] * 4) == (2.0, 2.0)  # a custom score outside [0, 1]: no binomial model, no crash
    lo, hi = bootstrap_ci([0, 1] * 50, seed=3)
    assert lo < 0.5 < hi and hi - lo == pytest.approx(2 * 1.96 * 0.05, abs=0.03)
    scores = np.array([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=float)
    keys = [["4", "5", "5", "6"], [None] * 4, ["x"] * 4]
    out = summarize_samples(scores, keys, [1, 2, 4], seed=0)
    assert out["questions"] == 3 and out["samples"] == 4
    assert out["mean@n"]["value"] == pytest.approx((0.25 + 0 + 1) / 3)
    assert out["pass@k"]["1"]["value"] == pytest.approx(out["mean@n"]["value"])
    assert out["pass@k"]["2"]["value"] == pytest.approx((comb_pass_at_k(4, 1, 2) + 0 + 1) / 3)
    assert out["pass@k"]["4"]["value"] == pytest.approx(2 / 3)
    assert out["maj@k"]["4"]["value"] == pytest.approx(1 / 3)  # "5" wins question 0 (wrong)
    for metric in ("pass@k", "maj@k"):
        for m in out[metric].values():
            assert 0 <= m["ci95"][0] <= m["value"] <= m["ci95"][1] <= 1
    assert "maj@k" not in summarize_samples(scores, None, [1])
    assert parse_ks([], 8) == [1, 8] and parse_ks([8, 1, 1], 8) == [1, 8]
    with pytest.raises(ValueError):
        parse_ks([16], 8)


def test_answer_key():
    assert answer_key({"extracted": "1 + 2"}) == answer_key({"extracted": "1+2"}) != answer_key({"extracted": "2+1"})
    assert answer_key({"extracted": "  "}) is None  # a blank answer casts no vote
    assert answer_key({"extracted": "\\frac12", "normalized": "1/2"}) == "1/2"
    assert answer_key({"extracted": None}) is None and answer_key({"strict": [True]}) is None


# ---- the sampled evaluation path ----------------------------------------------------------------------------------

class CoinTask:
    """Questions with a 'yes' answer; a stub generator answers yes with a per-question probability."""

    name = "coin"

    def __init__(self, probs):
        self.rows = [{"id": i, "p": p} for i, p in enumerate(probs)]

    def load(self, split="test", limit=None):
        return self.rows if limit is None else self.rows[:limit]

    def prompt(self, ex):
        return [{"role": "user", "content": str(ex["id"])}]

    def score(self, text, ex):
        return float(text == "yes")

    def is_well_formed(self, text, ex):
        return True

    def details(self, text, ex):
        return {"extracted": text}

    def aggregate(self, records):
        n = len(records)
        return {"n": n, "accuracy": sum(r["score"] for r in records) / n, "ci95": [0.0, 1.0], "format_rate": 1.0}


def stub_generate(model, tokenizer, prompts, cfg, progress=False):
    rng = np.random.default_rng(cfg.seed)
    out = []
    for p in prompts:
        q = int(p[0]["content"])
        text = "yes" if rng.random() < tokenizer[q] else "no"
        out.append(Generation(text=text, completion_ids=[1, 2], prompt_tokens=3, finished=True))
    return out


def test_sampled_eval_path(monkeypatch, tmp_path):
    probs = [0.0, 0.3, 1.0, 0.6]
    task = CoinTask(probs)
    monkeypatch.setattr(evaluation, "get_task", lambda name, **kw: task)
    monkeypatch.setattr(evaluation, "generate", stub_generate)
    config = EvalConfig(tasks=["coin"], samples=8, temperature=0.7, k=[1, 4], output_dir=str(tmp_path))
    res = run_eval(config, model=object(), tokenizer=probs, progress=False)["coin"]
    assert res["n"] == 4 and res["completions"] == 32 and res["samples"] == 8
    assert set(res["pass@k"]) == {"1", "4"} and set(res["maj@k"]) == {"1", "4"}
    assert len(set(res["sample_seeds"])) == 8  # one independent stream per sample index
    rows = [json.loads(x) for x in (tmp_path / "coin.jsonl").read_text().splitlines()]
    assert len(rows) == 32 and {r["sample"] for r in rows} == set(range(8))
    per_q = np.array([[r["score"] for r in rows if r["index"] == i] for i in range(4)])
    assert per_q[0].sum() == 0 and per_q[2].sum() == 8
    expected = np.mean([pass_at_k(8, int(c), 4) for c in per_q.sum(axis=1)])
    assert res["pass@k"]["4"]["value"] == pytest.approx(expected)
    assert res["accuracy"] == pytest.approx(per_q.mean())
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["results"]["coin"]["pass@k"]["4"]["value"] == pytest.approx(expected)
    line = evaluation.format_row("coin", res)
    assert "pass@4" in line and "maj@4" in line and "mean@8" in line


def test_sampled_eval_shows_how_many_of_its_passes_are_done(monkeypatch, capsys):
    """n samples are n generate passes whose bars all read "prompts 4/4": nothing said how many of the n were
    done (8 x 15 s of identical bars on a small CPU run). A bar over the passes counts them; none without
    progress."""
    probs = [0.0, 0.3, 1.0, 0.6]
    monkeypatch.setattr(evaluation, "generate", stub_generate)
    cfg = evaluation.GenerationConfig(temperature=0.7)
    evaluation.evaluate_task_sampled(object(), probs, CoinTask(probs), CoinTask(probs).rows, cfg, 8, [1, 8])
    assert re.search(r"samples: +0%\S* *\| *0/8 \[", capsys.readouterr().err)
    evaluation.evaluate_task_sampled(object(), probs, CoinTask(probs), CoinTask(probs).rows, cfg, 8, [1, 8],
                                     progress=False)
    assert "samples" not in capsys.readouterr().err


def test_ctrl_c_clears_the_samples_bar_before_anything_else_is_printed(monkeypatch, capsys):
    """Ctrl-C in a sampled evaluation: the bar over the passes is cleared before the caller's message (it printed
    its cleared line after it)."""
    import sys

    probs = [0.0, 0.3]
    calls = []

    def interrupted_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return stub_generate(*args, **kwargs)

    monkeypatch.setattr(evaluation, "generate", interrupted_second)
    cfg = evaluation.GenerationConfig(temperature=0.7)
    with pytest.raises(KeyboardInterrupt):
        try:
            evaluation.evaluate_task_sampled(object(), probs, CoinTask(probs), CoinTask(probs).rows, cfg, 4, [1, 4])
        finally:
            print("interrupted", file=sys.stderr)
    err = capsys.readouterr().err
    assert err.startswith("\rsamples:") and err.endswith(" \rinterrupted\n"), repr(err)


def test_greedy_default_path_unchanged(monkeypatch):
    calls = []
    task = CoinTask([1.0, 0.0])

    def greedy_generate(model, tokenizer, prompts, cfg, progress=False):
        calls.append(cfg)
        return stub_generate(model, tokenizer, prompts, cfg)

    monkeypatch.setattr(evaluation, "get_task", lambda name, **kw: task)
    monkeypatch.setattr(evaluation, "generate", greedy_generate)
    res = run_eval(EvalConfig(tasks=["coin"]), model=object(), tokenizer=[1.0, 0.0], progress=False)["coin"]
    assert len(calls) == 1 and calls[0].temperature == 0.0 and calls[0].seed == 0
    assert "pass@k" not in res and res["n"] == 2 and res["accuracy"] == 0.5


def test_eval_config_validation_and_cli(capsys):
    from esft.cli import build_parser, main

    with pytest.raises(ValueError, match=r"^samples = 4 is not accepted; expected 1 with greedy decoding, or "
                                         r"temperature > 0"):
        EvalConfig(samples=4)
    with pytest.raises(ValueError, match=r"^k = \[8\] is not accepted; expected values in \[1, samples=4\]"):
        EvalConfig(samples=4, temperature=0.6, k=[8])
    args = build_parser().parse_args(["eval", "--samples", "8", "--temperature", "0.6", "--k", "1,8"])
    assert args.samples == 8 and args.k == [1, 8]
    # the recorded config names the k values the results hold: sorted, once each
    assert EvalConfig(samples=4, temperature=0.6, k=[4, 1, 1]).k == [1, 4]
    assert main(["eval", "--tasks", "boolq", "--samples", "8", "--k", "1,8"]) == 2
    assert "command line (--samples): samples = 8 is not accepted" in capsys.readouterr().err  # its flag named
    assert main(["eval", "--tasks", "boolq", "--samples", "2", "--temperature", "0.5", "--k", "1,3"]) == 2
    assert "command line (--k): k = [1, 3] is not accepted" in capsys.readouterr().err


def test_a_k_that_is_no_whole_number_is_refused_not_truncated():
    """`k: [2.5]` in an `esft eval --config` file passed the checks and was truncated to k = 2: the summary
    reported pass@2 and recorded k [2] as what was asked; True counted as k = 1. Refused before any model loads."""
    for bad in ([2.5], [1, True], [float("nan")], [float("inf")]):
        with pytest.raises(ValueError, match=r"are not whole numbers"):
            parse_ks(bad, 4)
    assert parse_ks([4.0, 2], 4) == [2, 4] and parse_ks([np.int64(1), np.int64(4)], 4) == [1, 4]
    with pytest.raises(ValueError, match=r"^k = \[2\.5\] is not accepted; expected values in \[1, samples=4\] "
                                         r"\(whole numbers\)"):
        EvalConfig(samples=4, temperature=0.6, k=[2.5])


def test_pass_at_k_refuses_fractional_counts():
    """A correct count of 2.5 (e.g. summed partial-credit scores) is not a count: it used to be truncated to 2."""
    from esft.passk import pass_at_k, pass_at_k_per_question

    with pytest.raises(ValueError, match="whole numbers"):
        pass_at_k(8, 2.5, 2)
    with pytest.raises(ValueError, match="whole numbers"):
        pass_at_k_per_question(np.array([1.0, 2.5]), 8, 2)
    assert pass_at_k(8.0, 2.0, 2) == pass_at_k(8, 2, 2)
    assert pass_at_k_per_question(np.array([2, 0], dtype=np.int64), 8, 2).tolist() == [pass_at_k(8, 2, 2), 0.0]


def test_maj_at_k_draws_k_distinct_samples():
    """Each k-subset holds k different samples (without replacement): with one right 'a' among three wrong 'b's,
    every 3-subset has at least two 'b's, so maj@3 is exactly 0; drawing with replacement would let 'a' win."""
    keys, scores = ["a", "b", "b", "b"], [1.0, 0.0, 0.0, 0.0]
    assert maj_at_k(keys, scores, 3, np.random.default_rng(0), draws=500) == 0.0
    assert maj_at_k(["a", "a", "a", "b"], [1.0, 1.0, 1.0, 0.0], 3, np.random.default_rng(0), draws=500) == 1.0
    for bad in (0, 5):
        with pytest.raises(ValueError, match="1 <= k <= n"):
            maj_at_k(keys, scores, bad)


def test_bootstrap_ci_is_the_central_percentile_interval_of_the_level():
    """For many continuous per-question values the percentile bootstrap of the mean is close to mean +- z SE,
    z = 1.96 at 95% and 1.645 at 90% (the tails are (1 - level) / 2 each, not a narrower or wider cut)."""
    v = np.linspace(0.0, 1.0, 400)
    se = v.std() / np.sqrt(v.size)
    for level, z in ((0.95, 1.959964), (0.9, 1.644854)):
        lo, hi = bootstrap_ci(v, level=level, seed=1)
        assert hi - lo == pytest.approx(2 * z * se, rel=0.04)
        assert (lo + hi) / 2 == pytest.approx(0.5, abs=0.2 * se)
    assert bootstrap_ci([]) == (0.0, 1.0)  # no question: nothing is known


def test_summary_of_one_sample_per_question_and_k_range():
    scores = np.array([[1.0], [0.0], [1.0], [1.0]])
    out = summarize_samples(scores, [["x"], [None], ["y"], ["z"]], [1], resamples=200)
    assert out["samples"] == 1 and out["pass@k"]["1"]["value"] == 0.75 and out["maj@k"]["1"]["value"] == 0.75
    assert parse_ks(None, 1) == [1]
    for bad in ([0, 1], [2]):
        with pytest.raises(ValueError, match="not in"):
            parse_ks(bad, 1)


def test_answer_key_of_blank_and_non_string_answers():
    """A blank answer is no answer (no vote); a non-string answer (a custom task's) votes as itself, or as its
    text when it is not hashable."""
    assert answer_key({"extracted": "  \n"}) is None
    assert answer_key({"extracted": 42}) == 42
    assert answer_key({"extracted": ["a", "b"]}) == "['a', 'b']"


def long_answer(tail: str, size: int) -> str:
    """An answer of `size` characters that ends in `tail` (so answers differ only past the display cut)."""
    return "(" * (size - len(tail) - 1) + "1" + tail


def test_long_answers_that_differ_past_the_display_cut_vote_apart(monkeypatch):
    """Countdown and MATH cut `extracted` to 200 characters + "..." for the records; maj@k used to vote on that
    cut text, so two long wrong answers differing only after character 200 (MATH: past the 1000 characters it
    normalises) counted as one answer with two votes and beat a single right one. Each now votes apart: three
    answers, one vote each, a three-way tie scores 1/3."""
    from esft.tasks import get_task

    countdown = get_task("countdown")
    ex = {"nums": [44, 19, 35], "target": 98}
    texts = [f"\\boxed{{{long_answer(t, 250)}}}" for t in ("+1)", "+2)")] + ["\\boxed{44 + 19 + 35}"]
    records = [countdown.details(t, ex) for t in texts]
    assert records[0]["extracted"] == records[1]["extracted"]  # the display text still cannot tell them apart
    assert all(len(r["extracted"]) <= 203 for r in records)
    scores = [countdown.score(t, ex) for t in texts]
    assert scores == [0.0, 0.0, 1.0]
    assert majority_score([answer_key(r) for r in records], scores) == pytest.approx(1 / 3)

    math_task = get_task("math")
    mex = {"problem": "...", "answer": "2"}
    texts = [f"\\boxed{{{'x' * 1100}{t}}}" for t in "ab"] + ["\\boxed{2}"]
    records = [math_task.details(t, mex) for t in texts]
    assert "normalized" not in records[0] and records[0]["extracted"] == records[1]["extracted"]
    scores = [math_task.score(t, mex) for t in texts]
    assert majority_score([answer_key(r) for r in records], scores) == pytest.approx(1 / 3)

    # through the sampled evaluation path: the same three completions as samples 0, 1, 2 of one question
    texts = iter([f"\\boxed{{{long_answer(t, 250)}}}" for t in ("+1)", "+2)")] + ["\\boxed{44 + 19 + 35}"])

    def fixed_generate(model, tokenizer, prompts, cfg, progress=False):
        return [Generation(text=next(texts), completion_ids=[1], prompt_tokens=1, finished=True) for _ in prompts]

    monkeypatch.setattr(evaluation, "generate", fixed_generate)
    cfg = evaluation.GenerationConfig(temperature=1.0)
    res = evaluation.evaluate_task_sampled(None, None, countdown, [ex], cfg, 3, [3], progress=False)
    assert res["maj@k"]["3"]["value"] == pytest.approx(1 / 3)


def test_long_answers_equal_past_the_cut_still_vote_together():
    """The digest is of the whole answer with whitespace removed, as short answers compare; a short answer keeps
    no digest in its record; a key compares whitespace-free answers on either side of the cut."""
    from esft.tasks import get_task

    task = get_task("countdown")
    ex = {"nums": [44, 19, 35], "target": 98}
    a, b = (task.details(f"\\boxed{{{'(' * 249}1{t}}}", ex) for t in ("+1)", " + 1 )"))
    assert answer_key(a) == answer_key(b) is not None
    short = task.details("\\boxed{44 + 19 + 35}", ex)
    assert "extracted_digest" not in short  # records of normal-length answers are unchanged
    spaced = task.details("\\boxed{44" + " " * 200 + "+ 19 + 35}", ex)  # the same answer, cut for display
    assert "extracted_digest" in spaced
    assert answer_key(short) == answer_key(spaced) == answer_key(task.details("\\boxed{44+19+35}", ex))
    assert answer_key(short) != answer_key(task.details("\\boxed{44 + 35 + 19}", ex))
    assert answer_key(task.details("\\boxed{" + " " * 300 + "}", ex)) is None  # a blank answer casts no vote


# ---- audit: behaviours pinned against mutants (each test below failed on one) -----------------------------------

def test_maj_at_1_counts_a_sample_without_an_answer_as_no_vote():
    """maj@1 is the average over the 1-subsets of the majority score, and a lone sample without an answer key
    casts no vote (scores 0) even when the task scored it right, as it does with k = n."""
    keys, scores = [None, "a", "b"], [1.0, 1.0, 0.0]
    brute = np.mean([majority_score([keys[i]], [scores[i]]) for i in range(3)])
    assert brute == pytest.approx(1 / 3)
    assert maj_at_k(keys, scores, 1) == pytest.approx(brute, abs=1e-12)
    assert maj_at_k([None], [1.0], 1) == 0.0 == majority_score([None], [1.0])


def test_bootstrap_ci_of_constant_values_outside_the_wilson_case_is_the_point():
    """The Wilson fallback is for the 95% level and values in [0, 1]; any other level or value is the point."""
    assert bootstrap_ci([1.0] * 3, level=0.9) == (1.0, 1.0)
    assert bootstrap_ci([0.25] * 5, level=0.5) == (0.25, 0.25)
    assert bootstrap_ci([-0.5] * 3) == (-0.5, -0.5)  # below 0: no binomial model either


def test_bootstrap_ci_resamples_every_question():
    """Two questions, 0 and 1: resampled means are 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4, so the central 95%
    reaches both ends (a resampler that never picked the last question would give (0, 0))."""
    assert bootstrap_ci([0.0, 1.0]) == (0.0, 1.0)
    assert bootstrap_ci([1.0, 0.0]) == (0.0, 1.0)


def test_summary_of_partial_scores_has_no_pass_at_k_and_mean_at_n_is_the_mean_score():
    """No threshold makes a partial score right or wrong (0.5 counted as correct, 0.49 not, was the report's
    choice): pass@k is n/a with its reason, mean@n the mean of the raw scores; 0/1 scores keep c / n."""
    scores = np.array([[0.5, 0.49, 0.0, 0.0], [0.7, 0.7, 0.2, 0.2]])
    out = summarize_samples(scores, None, [1, 2], resamples=50)
    assert out["mean@n"]["value"] == pytest.approx(scores.mean())
    assert out["pass@k"] is None and "include 0.5 " in out["pass@k_note"]
    binary = summarize_samples((scores >= 0.5).astype(float), None, [1, 2], resamples=50)
    assert binary["mean@n"]["value"] == pytest.approx((1 / 4 + 2 / 4) / 2)
    assert binary["pass@k"]["2"]["value"] == pytest.approx((comb_pass_at_k(4, 1, 2) + comb_pass_at_k(4, 2, 2)) / 2)


def test_summary_intervals_are_the_bootstrap_of_the_per_question_values_with_its_seed_and_resamples():
    scores = np.array([[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [0, 1, 0, 0]], dtype=float)
    correct = [2, 0, 4, 1, 1]
    per_q = [comb_pass_at_k(4, c, 2) for c in correct]
    for seed, resamples in ((7, 300), (11, 40)):
        out = summarize_samples(scores, None, [2], seed=seed, resamples=resamples)
        # approx: the binomial form and esft's product form differ in the last bit
        assert out["pass@k"]["2"]["ci95"] == pytest.approx(bootstrap_ci(per_q, resamples=resamples, seed=seed),
                                                           abs=1e-12)
        assert out["mean@n"]["ci95"] == list(bootstrap_ci([c / 4 for c in correct], resamples=resamples, seed=seed))


def test_summary_of_no_questions_reports_zero_and_the_uninformative_interval():
    out = summarize_samples(np.zeros((0, 4)), None, [1, 4])
    assert out["questions"] == 0 and out["samples"] == 4
    assert out["mean@n"] == {"value": 0.0, "ci95": [0.0, 1.0]}
    assert out["pass@k"]["4"] == {"value": 0.0, "ci95": [0.0, 1.0]}


def test_answer_key_of_a_blank_normalised_answer_is_no_vote():
    assert answer_key({"extracted": "x", "normalized": " \n"}) is None
    assert answer_key({"extracted": "x", "normalized": " 1 / 2 "}) == "1/2"


def test_maj_at_n_is_exact_and_draws_nothing():
    """With k = n there is one subset: maj@n is the majority score itself, to the last bit (an average of 64
    equal Monte Carlo draws of 1/3 is 0.33333333333333320), and the shared generator is left untouched, so the
    estimates of the other questions do not depend on it."""
    keys, scores = ["a", "b", "c"], [1.0, 0.0, 0.0]
    rng = np.random.default_rng(5)
    assert maj_at_k(keys, scores, 3, rng) == 1 / 3 == majority_score(keys, scores)
    assert rng.random() == np.random.default_rng(5).random()


def test_bootstrap_ci_resamples_as_many_questions_as_there_are():
    """Five questions, one solved: a resample's mean is B/5 with B ~ Binomial(5, 1/5), P(B <= 2) = 0.942 and
    P(B <= 3) = 0.993, so the 97.5% point is 3/5 (resamples of four questions would put it at 2/4 or 3/4)."""
    assert bootstrap_ci([0.0, 0.0, 0.0, 0.0, 1.0]) == (0.0, 0.6)


def test_summary_maj_at_k_estimate_follows_the_seed():
    """maj@k with k < n is a seeded Monte Carlo estimate: the seed of the summary seeds it too, so another seed
    gives another (equally valid) estimate and the same seed the same one."""
    scores = np.array([[1.0, 0.0, 0.0, 1.0, 0.0, 1.0]] * 3)
    keys = [["a", "b", "c", "a", "b", "a"]] * 3
    values = {seed: summarize_samples(scores, keys, [3], seed=seed, resamples=10, maj_draws=5)["maj@k"]["3"]["value"]
              for seed in range(6)}
    assert len(set(values.values())) > 1
    again = summarize_samples(scores, keys, [3], seed=2, resamples=10, maj_draws=5)["maj@k"]["3"]["value"]
    assert again == values[2]


def test_bootstrap_ci_of_one_question_scored_outside_zero_one_is_that_score():
    """One question, a custom score of 2.0: no spread and no binomial model, so the interval is the score itself
    (not an index past the only value)."""
    assert bootstrap_ci([2.0]) == (2.0, 2.0)
    assert bootstrap_ci([0.5], level=0.9) == (0.5, 0.5)


def test_the_reason_pass_at_k_is_not_counted_names_a_score_outside_0_1_first():
    """A reward on another scale is the telling case: the note names a score outside [0, 1] when one exists, even
    after partial credits; only partial credits alone are named as such."""
    assert not_right_or_wrong(np.array([[0.0, 1.0], [1.0, 0.0]])) is None
    mixed = not_right_or_wrong(np.array([[0.5, 1.0], [2.0, 0.0]]))
    assert "include 2 " in mixed and "0.5" not in mixed
    assert "include -1 " in not_right_or_wrong(np.array([0.25, -1.0, 0.75]))
    assert "include 0.25 " in not_right_or_wrong(np.array([0.0, 0.25, 0.75, 1.0]))


def test_summary_refuses_questions_without_samples_and_scores_that_are_not_a_matrix():
    """[questions, samples] with at least one sample: zero samples per question is no measurement (not a pass@k
    over n = 0), and a flat list of scores has no question axis."""
    for bad in (np.zeros((3, 0)), np.zeros(4), np.zeros((2, 2, 2))):
        with pytest.raises(ValueError, match=r"\[questions, samples\] matrix"):
            summarize_samples(bad, None, None)


def test_summary_maj_at_k_defaults_to_64_draws_per_question():
    """The draw count is part of what a recorded maj@k (k < n) is: the default must stay 64, the count recorded
    results used, or results sampled earlier would no longer be reproduced."""
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 2, size=(6, 5)).astype(float)
    keys = [[str(int(s)) if j % 2 else f"a{j}" for j, s in enumerate(row)] for row in scores]
    default = summarize_samples(scores, keys, [3], resamples=10)["maj@k"]["3"]
    assert default == summarize_samples(scores, keys, [3], resamples=10, maj_draws=64)["maj@k"]["3"]
    assert default != summarize_samples(scores, keys, [3], resamples=10, maj_draws=65)["maj@k"]["3"]


def test_math_answers_the_scorer_reads_as_one_vote_as_one():
    """"0.5" and "\\frac12" are one answer to MATH's scorer, so they are one answer with two votes in maj@k, and
    beat the single votes of "3" and "4" (they used to vote apart: a four-way tie, scoring 1/2)."""
    from esft.tasks import get_task

    task = get_task("math")
    ex = {"problem": "...", "answer": "\\dfrac{1}{2}"}
    texts = ["\\boxed{0.5}", "\\boxed{\\frac12}", "\\boxed{3}", "\\boxed{4}"]
    keys = [answer_key(task.details(t, ex)) for t in texts]
    assert keys[0] == keys[1] != keys[2] != keys[3]
    assert majority_score(keys, [task.score(t, ex) for t in texts]) == 1.0
    assert answer_key(task.details("\\boxed{ }", ex)) is None  # a blank answer casts no vote
