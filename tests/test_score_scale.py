"""A reward on another scale than [0, 1] (`--reward module:function` may return any number) is presented as a
held-out mean reward, without the constant-answer baseline (the share of the most frequent gold answer, which
says nothing on that scale): in the training progress lines, the run figure, the model card and `esft eval`'s
summary line. Scores in [0, 1] keep "accuracy" and the baseline (esft.tasks.labels.score_name)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import make_tiny_model
from esft.cli import main
from esft.es.curve import run_figure
from esft.evaluation import format_row
from esft.export import model_card
from esft.tasks.base import Task
from esft.tasks.labels import ACCURACY, MEAN_REWARD, score_name

REWARD = '''
def scaled(completions, **kwargs):
    """2.5 for every completion: a reward on another scale than [0, 1]."""
    return [2.5 for _ in completions]
'''


def test_score_name_is_accuracy_only_while_every_value_lies_in_zero_one():
    assert score_name([0.0, 0.25, 1.0, None]) == ACCURACY
    assert score_name([]) == ACCURACY
    assert score_name([0.5, 2.5]) == MEAN_REWARD
    assert score_name([-1.0, 0.5]) == MEAN_REWARD
    assert score_name([1.0000001]) == MEAN_REWARD


def test_the_task_summary_has_a_constant_answer_baseline_only_for_scores_in_zero_one():
    """Task.aggregate is the summary of every evaluation path (greedy and sampled): the baseline is a share of
    examples, so it stands beside an accuracy and not beside a mean reward of 2.5 over the same examples."""
    examples = [{"answer": "yes"}, {"answer": "yes"}, {"answer": "no"}, {"answer": "yes"}]

    def summary(scores):
        return Task(name="t").aggregate([{"index": i, "score": s, "example": ex}
                                         for i, (s, ex) in enumerate(zip(scores, examples))])

    unit = summary([1.0, 0.0, 0.5, 1.0])
    assert unit["constant_answer"] == "yes" and unit["constant_baseline"] == pytest.approx(0.75)
    assert "constant_baseline_ci95" in unit
    scaled = summary([1.0, 0.0, 2.5, 1.0])
    assert scaled["accuracy"] == pytest.approx(1.125)
    assert not {"constant_baseline", "constant_baseline_ci95", "constant_answer"} & set(scaled)


def test_the_card_calls_a_score_outside_zero_one_a_mean_reward(tmp_path):
    config = {"model": "smollm2-135m", "task": "q.jsonl", "population_size": 2}
    unit = model_card(tmp_path / "run", config, [{"step": 0, "n": 4, "accuracy": 0.25, "ci95": [0.05, 0.7]}])
    assert "| step | n | accuracy | 95% CI |" in unit
    scaled = model_card(tmp_path / "run", config, [{"step": 0, "n": 4, "accuracy": 0.5, "ci95": [0.4, 0.6]},
                                                   {"step": 2, "n": 4, "accuracy": 2.5, "ci95": [2.5, 2.5]}])
    assert "| step | n | mean reward | 95% CI |" in scaled and "accuracy" not in scaled
    # a mean in [0, 1] whose normal-approximation interval leaves it: scores of -1 and 2.5, say
    spread = model_card(tmp_path / "run", config, [{"step": 0, "n": 4, "accuracy": 0.75, "ci95": [-0.9, 2.4]}])
    assert "| step | n | mean reward | 95% CI |" in spread


def test_esft_eval_prints_a_mean_reward_without_the_constant_answer():
    summary = {"n": 4, "accuracy": 2.5, "ci95": [1.9, 3.1], "constant_baseline": 0.25,
               "constant_baseline_ci95": [0.05, 0.7], "constant_answer": "5"}
    line = format_row("q.jsonl", summary)
    assert "mean reward 2.500  95% CI [1.900, 3.100]" in line and "acc " not in line and "const" not in line
    assert "acc 0.250" in format_row("q.jsonl", dict(summary, accuracy=0.25, ci95=[0.05, 0.7]))
    assert "mean reward 0.750" in format_row("q.jsonl", dict(summary, accuracy=0.75, ci95=[-0.9, 2.4]))


def test_the_figure_reads_the_interval_too_and_keeps_accuracy_and_baseline_on_zero_one(tmp_path):
    """A mean of 0.75 whose interval leaves [0, 1] is a mean reward (no constant band); the same records with a
    Wilson interval are an accuracy beside the constant answer."""
    def run_of(ci: list[float]) -> Path:
        run = tmp_path / f"run{ci[0]}"
        run.mkdir()
        records = [{"kind": "eval", "step": s, "test_n": 4, "test_accuracy": 0.75, "test_ci95": ci,
                    "test_format_rate": None, "test_constant_baseline": 0.5,
                    "test_constant_baseline_ci95": [0.15, 0.85], "test_constant_answer": "1"} for s in (0, 2)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return run

    assert _legend(run_of([-0.9, 2.4])) == ["held-out mean reward (n=4)"]
    assert _legend(run_of([0.3, 0.95])) == ['constant answer "1" (95% CI)', "held-out accuracy (n=4)"]


def _legend(run: Path) -> list[str]:
    held_out = run_figure(run).axes[1]
    return [text.get_text() for text in held_out.get_legend().get_texts()]


def test_a_tiny_es_run_with_a_reward_of_2_5_says_mean_reward_everywhere(tmp_path, tokenizer, capsys, monkeypatch):
    """Train (progress lines), figure, export (card) and `esft eval` of one tiny run whose reward is 2.5."""
    (tmp_path / "scaled_reward.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    folder = tmp_path / "tiny"
    make_tiny_model(hidden=32, layers=2).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say {i}.", "answer": str(i % 2)}) + "\n" for i in range(20)))
    run = tmp_path / "run"
    common = ["--model", str(folder), "--task", str(data), "--reward", "scaled_reward:scaled", "--device", "cpu",
              "--dtype", "float32", "--max-new-tokens", "3"]
    assert main(["train", "es", *common, "--iterations", "1", "--population-size", "2", "--batch-size", "2",
                 "--eval-limit", "3", "--eval-every", "1", "--format-bonus", "0", "--output-dir", str(run)]) == 0
    out = capsys.readouterr()
    printed = out.out + out.err
    assert "step 0: held-out mean reward 2.500" in printed and "step 1: held-out mean reward 2.500" in printed
    assert "held-out accuracy" not in printed

    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"eval"' in line]
    # the task has gold answers, so a constant answer exists, but a share of examples is no companion for a mean
    # reward: the record itself leaves it out, and every reader below shows none
    assert evals and all(e["test_constant_baseline"] is None for e in evals)
    assert all(e["test_constant_baseline_ci95"] is None and e["test_constant_answer"] is None for e in evals)
    assert _legend(run) == ["held-out mean reward (n=3)"]

    assert main(["export", str(run), "--to", str(tmp_path / "exported")]) == 0
    card = (tmp_path / "exported" / "README.md").read_text()
    assert "| step | n | mean reward | 95% CI |" in card and "| 1 | 3 | 2.500 | [2.500, 2.500] |" in card
    capsys.readouterr()

    assert main(["eval", *common, "--answer-field", "answer", "--limit", "3"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "mean reward 2.500" in line and "const" not in line and " acc " not in line


def test_a_grpo_run_with_a_reward_of_2_5_prints_and_draws_a_mean_reward(tmp_path, tokenizer, capsys):
    pytest.importorskip("trl")
    from esft.grpo import train_grpo
    from grpo_tiny import ParityTask, tiny_config

    class ScaledParity(ParityTask):
        def score(self, completion, example):
            return 2.5

    run = tmp_path / "run"
    train_grpo(tiny_config(run, max_steps=1, eval_every=1), model=make_tiny_model(hidden=32, layers=2),
               tokenizer=tokenizer, task=ScaledParity(), progress=True)
    printed = capsys.readouterr().out
    assert "step 0: held-out mean reward 2.500" in printed and "held-out accuracy" not in printed
    assert _legend(run) == ["held-out format rate", "held-out mean reward (n=3)"]


def test_a_grpo_runs_printed_accuracy_stands_beside_its_constant_answer_baseline(tmp_path, tokenizer, capsys):
    """GRPO printed `held-out accuracy 0.333 [0.061, 0.792]` without what always giving the most frequent gold
    answer scores on the same examples, which its metrics.jsonl record holds."""
    pytest.importorskip("trl")
    from esft.grpo import train_grpo
    from grpo_tiny import ParityTask, tiny_config

    run = tmp_path / "run"
    train_grpo(tiny_config(run, max_steps=1, eval_every=1), model=make_tiny_model(hidden=32, layers=2),
               tokenizer=tokenizer, task=ParityTask(), progress=True)
    printed = capsys.readouterr().out
    ev = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert ev["kind"] == "eval" and ev["test_constant_answer"] == "even"
    lo, hi = ev["test_constant_baseline_ci95"]
    assert f"constant answer 'even' {ev['test_constant_baseline']:.3f} [{lo:.3f}, {hi:.3f}]" in printed
