"""The chance curve of pass@k: for a task whose answer is one of L labels (BoolQ's yes/no, A-D), a uniform random
guess scores pass@k = 1 - (1 - 1/L)^k, which climbs with k where the constant answer stays flat. It is recorded in
the sampled summary (`chance_pass@k`) and drawn on the pass@k figure, for `esft eval` and for an experiment; not for
open answers nor for a Countdown variant, whose labels are operators. Stub generation, no model (a few seconds).

Run: PYTHONPATH=src pytest -q tests/test_passk_chance.py
"""

from __future__ import annotations

import json

import pytest

from esft import evaluation
from esft.experiments.method_figures import method_figure
from esft.passk import chance_pass_at_k, summarize_samples
from esft.tasks import get_task
from esft.tasks.custom import TaskAdapter
from test_passk_figure import (HAND_SCORES, REWARD_SCORES, FixedTask, experiment, hand_summary, named_lines,
                               run_fixed)

CHANCE_LABEL = "random guess of 2 labels (yes/no): 1-(1-1/2)^k"


class YesNoTask(FixedTask):
    """FixedTask answered yes or no: its labels are its answers."""

    def label_set(self):
        return ("yes", "no")

    def answer_labels(self):
        return ("yes", "no")


def test_chance_is_one_minus_the_chance_that_every_guess_misses():
    assert chance_pass_at_k(["yes", "no"], [4, 1, 2]) == {
        "labels": ["yes", "no"], "pass@k": {"1": 0.5, "2": 0.75, "4": 0.9375}}
    four = chance_pass_at_k("ABCD", [1, 2, 8])["pass@k"]
    assert four == {"1": 0.25, "2": pytest.approx(1 - 0.75 ** 2), "8": pytest.approx(1 - 0.75 ** 8)}
    with pytest.raises(ValueError):
        chance_pass_at_k([], [1])


def test_only_labels_that_are_answers_have_a_chance_curve():
    assert get_task("boolq").answer_labels() == ("yes", "no")
    assert get_task("mmlu").answer_labels() == ("A", "B", "C", "D")
    variant = get_task("countdown:numbers=2,max_number=20,ops=+*")
    assert variant.label_set() == ("+", "*") and variant.answer_labels() is None  # operators are no answers
    assert get_task("math").answer_labels() is None
    metrics = summarize_samples(HAND_SCORES, None, [1, 2, 4])
    assert evaluation.chance_entry(get_task("boolq"), metrics)["pass@k"] == {"1": 0.5, "2": 0.75, "4": 0.9375}
    assert evaluation.chance_entry(variant, metrics) is None


class Labelled:
    splits = ("test",)

    def load(self, split):
        return []

    def prompt(self, ex):
        return "q"

    def score(self, completion, ex):
        return 0.0

    def label_set(self):
        return ("A", "B", "C")


class ByOperator(Labelled):
    def balance_key(self, ex):
        return ex["op"]


def test_a_task_object_has_answer_labels_unless_it_balances_over_something_else():
    assert TaskAdapter(Labelled()).answer_labels() == ("A", "B", "C")
    assert TaskAdapter(ByOperator()).answer_labels() is None


def test_esft_eval_records_and_draws_the_chance_curve(monkeypatch, tmp_path):
    monkeypatch.setattr("test_passk_figure.FixedTask", YesNoTask)
    res, figures = run_fixed(monkeypatch, tmp_path, HAND_SCORES)
    saved = json.loads((tmp_path / "summary.json").read_text())["results"]["fixed"]
    assert saved["chance_pass@k"] == {"labels": ["yes", "no"], "pass@k": {"1": 0.5, "2": 0.75, "4": 0.9375}}
    # the model's own numbers are those of the summary without the chance curve
    assert saved["pass@k"] == json.loads(json.dumps(hand_summary()["pass@k"]))
    ax = figures[0][0].axes[0]
    lines = {ln.get_label(): ln for ln in named_lines(ax)}
    assert list(lines) == ['constant answer "yes" (95% CI)', CHANCE_LABEL]
    chance = lines[CHANCE_LABEL]
    assert chance.get_linestyle() == "--" and list(chance.get_xdata()) == [1, 2, 4]
    assert list(chance.get_ydata()) == pytest.approx([50.0, 75.0, 93.75])
    assert CHANCE_LABEL in [t.get_text() for t in ax.get_legend().get_texts()]


def test_no_chance_curve_without_answer_labels_or_without_pass_at_k(monkeypatch, tmp_path):
    res, figures = run_fixed(monkeypatch, tmp_path / "open", HAND_SCORES)  # FixedTask: no label set
    assert "chance_pass@k" not in res
    assert [ln.get_label() for ln in named_lines(figures[0][0].axes[0])] == ['constant answer "yes" (95% CI)']
    monkeypatch.setattr("test_passk_figure.FixedTask", YesNoTask)
    reward, _ = run_fixed(monkeypatch, tmp_path / "reward", REWARD_SCORES, k=(1, 4))
    assert reward["pass@k"] is None and "chance_pass@k" not in reward


def test_experiment_figure_draws_the_chance_curve_its_summaries_recorded():
    s = {**hand_summary(), "chance_pass@k": chance_pass_at_k(["yes", "no"], [1, 2, 4])}
    ax = method_figure(experiment({"Base": [s], "GRPO": [s]}), "boolq").axes[0]
    lines = {ln.get_label(): ln for ln in named_lines(ax)}
    assert list(lines) == ["constant answer (95% CI)", CHANCE_LABEL]
    assert list(lines[CHANCE_LABEL].get_ydata()) == pytest.approx([50.0, 75.0, 93.75])
    older = method_figure(experiment({"Base": [hand_summary()], "GRPO": [hand_summary()]}), "boolq").axes[0]
    assert [ln.get_label() for ln in named_lines(older)] == ["constant answer (95% CI)"]
