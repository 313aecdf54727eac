"""The pass@k figure (esft.passk_figure): written by `esft eval` when it samples and by an experiment beside its
methods table; its lines, error bars, axis and baseline read from the matplotlib objects. And pass@k on scores that are
not 0/1 (partial credit, a custom reward): n/a with its reason in the JSON, the printed line, the methods table and
the figure. Stub generation and hand-made records, no model (a few seconds).

Run: PYTHONPATH=src pytest -q tests/test_passk_figure.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from esft import evaluation, passk_figure
from esft.evaluation import run_eval
from esft.eval_config import EvalConfig
from esft.experiments.method_figures import method_figure
from esft.experiments.records import Experiment
from esft.experiments.study_tables import method_tables, write_all_tables
from esft.generation import Generation
from esft.passk import summarize_samples
from test_passk import CoinTask
from test_study_tables_audit import spec, stage, summary

#: Q = 2 questions, n = 4 samples: question 1 solved once, question 2 always
HAND_SCORES = np.array([[1, 0, 0, 0], [1, 1, 1, 1]], dtype=float)


def hand_summary() -> dict:
    return summarize_samples(HAND_SCORES, None, [1, 2, 4])


def curves_of(ax) -> dict:
    """{legend label: data line} of the error-bar curves, in drawing order."""
    return {c.get_label(): c.lines[0] for c in ax.containers}


def named_lines(ax) -> list:
    """The lines with a legend entry of their own (the baseline), not the curves' parts."""
    return [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]


def bars_of(ax, label: str) -> dict[float, tuple[float, float]]:
    """{x: (low, high)} of the error bars of the curve labelled `label`."""
    container = [c for c in ax.containers if c.get_label() == label][0]
    segments = container.lines[2][0].get_segments()
    return {float(seg[0][0]): (float(seg[0][1]), float(seg[1][1])) for seg in segments}


def test_hand_computed_pass_at_k_and_its_interval():
    """pass@k per question (Chen et al.): q1 (c=1 of 4) 1/4 at k=1, 1 - C(3,2)/C(4,2) = 1/2 at k=2, 1 at k=4; q2 1.
    Bootstrap over Q=2 questions: a resample's mean is q1's (p 1/4), the average (1/2) or q2's (1/4), so the 2.5%
    and 97.5% quantiles are q1's and q2's values. At k=4 both questions are 1: Wilson(2 of 2) =
    [(1 + z^2/4 - z sqrt(z^2/16)) / (1 + z^2/2), 1] = [0.34237, 1]."""
    out = hand_summary()
    assert out["pass@k"]["1"] == {"value": pytest.approx(0.625), "ci95": [pytest.approx(0.25), pytest.approx(1.0)]}
    assert out["pass@k"]["2"] == {"value": pytest.approx(0.75), "ci95": [pytest.approx(0.5), pytest.approx(1.0)]}
    assert out["pass@k"]["4"]["value"] == 1.0
    assert out["pass@k"]["4"]["ci95"] == [pytest.approx(0.34237, abs=1e-5), 1.0]


def test_figure_draws_each_k_with_its_interval_on_a_log2_axis():
    fig = passk_figure.passk_figure([passk_figure.curve_from_summary("GRPO", hand_summary())], "pass@k on t",
                                    passk_figure.Baseline(0.5, (0.2, 0.8), "yes"))
    ax = fig.axes[0]
    line = curves_of(ax)["GRPO"]
    assert list(line.get_xdata()) == [1, 2, 4]
    assert list(line.get_ydata()) == pytest.approx([62.5, 75.0, 100.0])  # in %
    assert line.get_color() == "tab:red"  # GRPO's colour in every esft figure
    bars = bars_of(ax, "GRPO")
    assert list(bars) == [1.0, 2.0, 4.0]  # one curve: on k itself
    assert bars[1.0] == pytest.approx((25.0, 100.0))
    assert bars[2.0] == pytest.approx((50.0, 100.0))
    assert bars[4.0] == pytest.approx((34.237, 100.0), abs=1e-3)
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4"]
    assert ax.get_ylim() == (0.0, 100.0) and ax.get_ylabel() == "pass@k (%)"
    constant = named_lines(ax)[0]
    assert constant.get_linestyle() == ":" and list(constant.get_ydata()) == [50.0, 50.0]
    assert constant.get_label() == 'constant answer "yes" (95% CI)'
    assert fig._suptitle.get_text() == "pass@k on t"


def test_methods_take_their_algorithm_colours_and_seeds_share_one():
    s = hand_summary()
    curves = [passk_figure.curve_from_summary(label, s, method, style) for label, method, style in
              (("Base", "Base", "-"), ("ES (iter=2)", "ES (iter=2)", "-"), ("ES (iter=4)", "ES (iter=4)", "-"),
               ("GRPO->ES (seed 1)", "GRPO->ES", "-"), ("GRPO->ES (seed 2)", "GRPO->ES", "--"))]
    ax = passk_figure.passk_figure(curves, "t").axes[0]
    colour = {label: ln.get_color() for label, ln in curves_of(ax).items()}
    assert colour["Base"] == "black" and colour["ES (iter=2)"] == "tab:blue"
    assert colour["ES (iter=4)"] not in ("tab:blue", "black", "tab:purple")  # a second ES budget: its own colour
    assert colour["GRPO->ES (seed 1)"] == colour["GRPO->ES (seed 2)"] == "tab:purple"
    styles = {label: ln.get_linestyle() for label, ln in curves_of(ax).items()}
    assert styles["GRPO->ES (seed 1)"] == "-" and styles["GRPO->ES (seed 2)"] == "--"
    # equal curves spread around each k, in order, the middle one on k: all five stay visible
    xs = [list(ln.get_xdata()) for ln in curves_of(ax).values()]
    assert [x[1] for x in xs] == pytest.approx([2 * 2 ** (0.045 * (i - 2)) for i in range(5)])
    assert xs[2] == [1, 2, 4] and len({x[0] for x in xs}) == 5


# ---- esft eval ----------------------------------------------------------------------------------------------------

class FixedTask(CoinTask):
    """Question i's sample s scores SCORES[i][s] (a 0/1 matrix, or a reward)."""

    name = "fixed"

    def __init__(self, scores, answers=("yes", "no")):
        self.scores = np.asarray(scores, dtype=float)
        self.rows = [{"id": i, "answer": answers[i % len(answers)]} for i in range(len(self.scores))]

    def score(self, text, ex):
        return float(text)

    def aggregate(self, records):
        return {**super().aggregate(records), "constant_baseline": 0.5, "constant_baseline_ci95": [0.1, 0.9],
                "constant_answer": "yes"}

    def label_set(self):
        return None


def fixed_generate(task):
    calls = []

    def generate(model, tokenizer, prompts, cfg, progress=False):
        s = len(calls)  # one call per sample index
        calls.append(cfg.seed)
        return [Generation(text=str(float(task.scores[int(p[0]["content"])][s])), completion_ids=[1],
                           prompt_tokens=2, finished=True) for p in prompts]

    return generate


def run_fixed(monkeypatch, tmp_path, scores, k=(1, 2, 4)):
    task = FixedTask(scores)
    figures = []
    real_save = passk_figure.save_figure

    def keep(fig, path):
        figures.append((fig, Path(path)))
        return real_save(fig, path)

    monkeypatch.setattr(evaluation, "get_task", lambda name, **kw: task)
    monkeypatch.setattr(evaluation, "generate", fixed_generate(task))
    monkeypatch.setattr(passk_figure, "save_figure", keep)
    config = EvalConfig(model="tiny-model", tasks=["fixed"], samples=len(scores[0]), temperature=0.7, k=list(k),
                        output_dir=str(tmp_path))
    return run_eval(config, model=object(), tokenizer=None, progress=False)["fixed"], figures


def test_esft_eval_writes_the_figure_of_what_its_summary_holds(monkeypatch, tmp_path):
    res, figures = run_fixed(monkeypatch, tmp_path, HAND_SCORES)
    assert [path for _, path in figures] == [tmp_path / "fixed.passk.png"] and figures[0][1].stat().st_size > 0
    ax = figures[0][0].axes[0]
    line = curves_of(ax)["tiny-model"]
    assert list(line.get_ydata()) == pytest.approx([100 * res["pass@k"][k]["value"] for k in ("1", "2", "4")])
    assert bars_of(ax, "tiny-model")[2.0] == pytest.approx((50.0, 100.0))
    assert [ln.get_label() for ln in named_lines(ax)] == ['constant answer "yes" (95% CI)']
    assert "pass@k on fixed | model tiny-model" == figures[0][0]._suptitle.get_text()
    assert ax.get_title() == "4 samples per question at temperature 0.7, top_p 1; 2 questions"


def test_greedy_eval_writes_no_figure(monkeypatch, tmp_path):
    task = FixedTask([[1.0], [0.0]])
    monkeypatch.setattr(evaluation, "get_task", lambda name, **kw: task)
    monkeypatch.setattr(evaluation, "generate", fixed_generate(task))
    run_eval(EvalConfig(tasks=["fixed"], output_dir=str(tmp_path)), model=object(), tokenizer=None, progress=False)
    assert not list(tmp_path.glob("*.png"))


# ---- scores that are not 0/1 ------------------------------------------------------------------------------------

REWARD_SCORES = np.array([[0.1, 2.1, 0.1, 0.1], [0.6, 0.6, 2.1, 2.1]])


def test_a_reward_has_no_pass_at_k_and_its_mean_is_the_mean_score():
    """0.6 >= 0.5 once counted as correct: a reward scale has no right or wrong, so no pass@k; mean@n is the mean
    score (as the greedy accuracy of a reward is), not a share of scores over a threshold."""
    out = summarize_samples(REWARD_SCORES, None, [1, 4], resamples=50)
    assert out["pass@k"] is None
    assert out["pass@k_note"].startswith("pass@k needs right/wrong scores (0 or 1); these include 2.1 ")
    assert out["mean@n"]["value"] == pytest.approx(REWARD_SCORES.mean())
    partial = summarize_samples(np.array([[1.0, 0.5], [0.0, 0.0]]), None, [1])  # partial credit within [0, 1]
    assert partial["pass@k"] is None and "include 0.5 " in partial["pass@k_note"]
    binary = summarize_samples(np.array([[1.0, 0.0], [0.0, 0.0]]), None, [1])
    assert "pass@k_note" not in binary and binary["pass@k"]["1"]["value"] == 0.25


def test_greedy_esft_eval_of_a_reward_drops_the_baseline_a_task_aggregate_adds(monkeypatch, tmp_path):
    """The greedy path (one completion per question) gives a reward the same summary as the sampled one, even from
    a task whose own `aggregate` adds a constant-answer baseline (FixedTask does)."""
    task = FixedTask([[2.1], [0.6]])
    monkeypatch.setattr(evaluation, "get_task", lambda name, **kw: task)
    monkeypatch.setattr(evaluation, "generate", fixed_generate(task))
    res = run_eval(EvalConfig(model="tiny-model", tasks=["fixed"], output_dir=str(tmp_path)), model=object(),
                   tokenizer=None, progress=False)["fixed"]
    saved = json.loads((tmp_path / "summary.json").read_text())["results"]["fixed"]
    assert res["accuracy"] == pytest.approx(1.35) and saved["accuracy"] == pytest.approx(1.35)
    assert not {"constant_baseline", "constant_baseline_ci95", "constant_answer"} & (set(saved) | set(res))
    unit = FixedTask([[1.0], [0.0]])  # right/wrong: the task's own baseline stays
    monkeypatch.setattr(evaluation, "get_task", lambda name, **kw: unit)
    monkeypatch.setattr(evaluation, "generate", fixed_generate(unit))
    kept = run_eval(EvalConfig(model="tiny-model", tasks=["fixed"], output_dir=str(tmp_path / "u")), model=object(),
                    tokenizer=None, progress=False)["fixed"]
    assert kept["constant_baseline"] == 0.5 and kept["constant_answer"] == "yes"


def test_esft_eval_of_a_reward_reports_pass_at_k_n_a_everywhere(monkeypatch, tmp_path):
    res, figures = run_fixed(monkeypatch, tmp_path, REWARD_SCORES, k=(1, 4))
    saved = json.loads((tmp_path / "summary.json").read_text())["results"]["fixed"]
    assert saved["pass@k"] is None and saved["pass@k_note"] == res["pass@k_note"] and "2.1" in res["pass@k_note"]
    assert saved["accuracy"] == pytest.approx(REWARD_SCORES.mean())
    assert "constant_baseline" not in saved  # a mean reward is no accuracy beside a constant answer
    line = evaluation.format_row("fixed", res)
    assert "pass@k n/a (scores not 0/1)" in line and "pass@1" not in line and "const" not in line
    ax = figures[0][0].axes[0]
    assert ax.get_lines() == [] and not ax.collections  # no curve, no baseline
    texts = [t.get_text().replace("\n", " ") for t in ax.texts]
    assert texts == [f"tiny-model: {res['pass@k_note']}"]


# ---- experiments ------------------------------------------------------------------------------------------------

def experiment(sampled_of: dict, seeds=(1,), passk=True) -> Experiment:
    """BoolQ, base and methods (display -> sampled summary per seed), greedy summaries with a constant answer."""
    ev = {"passk": {"samples": 4, "k": [1, 2, 4], "temperature": 0.7, "top_p": 1.0}} if passk else {}
    stages = [stage("base", kind="base")]
    results = {"base": {"eval": {"boolq": summary(0.5, constant=0.6, sampled=sampled_of["Base"][0])}}}
    for display, per_seed in sampled_of.items():
        if display == "Base":
            continue
        for seed, sampled in zip(seeds, per_seed):
            key = f"seed-{seed}/single-task/boolq/{display.lower()}"
            stages.append(stage(key, seed, display.lower(), display, "boolq", 1))
            results[key] = {"eval": {"boolq": summary(0.7, sampled=sampled)}}
    return Experiment(Path("."), spec(["boolq"], list(seeds), **ev), stages, results)


def test_experiment_figure_has_a_line_per_method_and_seed_and_the_constant_answer():
    s = hand_summary()
    exp = experiment({"Base": [s], "GRPO": [s, s], "GRPO->ES": [s, s]}, seeds=(1, 2))
    fig = method_figure(exp, "boolq")
    ax = fig.axes[0]
    curves = curves_of(ax)
    assert list(curves) == ["Base", "GRPO (seed 1)", "GRPO (seed 2)", "GRPO->ES (seed 1)", "GRPO->ES (seed 2)"]
    assert [ln.get_color() for ln in curves.values()] == ["black", "tab:red", "tab:red", "tab:purple", "tab:purple"]
    assert [ln.get_label() for ln in named_lines(ax)] == ["constant answer (95% CI)"]
    constant = named_lines(ax)[0]
    assert constant.get_linestyle() == ":" and list(constant.get_ydata()) == pytest.approx([60.0, 60.0])
    assert fig._suptitle.get_text() == "pass@k on BoolQ (m)"
    assert method_figure(experiment({"Base": [s], "GRPO": [s]}, passk=False), "boolq") is not None
    unsampled = experiment({"Base": [None], "GRPO": [None]})
    assert method_figure(unsampled, "boolq") is None
    sequential = experiment({"Base": [s], "GRPO": [s]})  # no methods table, so no figure beside it
    sequential.stages = [{**st, "key": st["key"].replace("single-task", "sequential")} for st in sequential.stages]
    assert method_figure(sequential, "boolq") is None


def test_experiment_writes_one_figure_per_task_beside_its_methods_table(tmp_path):
    s = hand_summary()
    exp = experiment({"Base": [s], "GRPO": [s]})
    (tmp_path / "plan.json").write_text(json.dumps({"spec": exp.spec, "stages": exp.stages}))
    for key, rec in exp.results.items():
        (tmp_path / key).mkdir(parents=True, exist_ok=True)
        (tmp_path / key / "result.json").write_text(json.dumps(rec))
    md = write_all_tables(tmp_path).read_text()
    assert (tmp_path / "tables/methods_boolq.md").exists() and (tmp_path / "tables/passk_boolq.png").stat().st_size
    assert "pass@k figures (95% bootstrap intervals): [passk_boolq.png](passk_boolq.png)" in md


def test_methods_table_and_figure_of_a_reward_read_n_a_with_the_reason():
    reward = summarize_samples(REWARD_SCORES, None, [1, 2, 4], resamples=50)
    exp = experiment({"Base": [reward], "GRPO": [reward]})
    md = method_tables(exp)[0].markdown()
    assert "| GRPO | 70.0 | [65.0, 75.0] | — | n/a | n/a | n/a | n/a | n/a | n/a |" in md
    assert f"pass@k n/a: {reward['pass@k_note']}." in md
    ax = method_figure(exp, "boolq").axes[0]
    assert ax.get_lines() == [] and [t.get_text().replace("\n", " ") for t in ax.texts] == [
        f"Base: {reward['pass@k_note']}"]


def test_the_legend_names_both_intervals_the_bars_can_be():
    """The legend said every bar was a bootstrap interval; at k=4 of HAND_SCORES both questions are solved, and
    that bar is the Wilson interval of 2 of 2 (esft.passk.bootstrap_ci), as it is for every point of a model
    that solves nothing."""
    curve = passk_figure.curve_from_summary("m", hand_summary())
    fig = passk_figure.passk_figure([curve], "t")
    title = fig.axes[0].get_legend().get_title().get_text()
    assert "bootstrap" in title and "Wilson where all score alike" in title
