"""esft.grpo.callbacks driven directly with transformers' TrainerState: the fields and values of a `kind: train`
record (counts, reward, TRL's metrics, timings, totals, drift), the refusal of a non-finite loss or gradient norm,
and when the held-out evaluation fires and what it records."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("transformers")

from transformers import TrainerControl, TrainerState  # noqa: E402

import esft.grpo.callbacks as callbacks  # noqa: E402
from conftest import make_tiny_model  # noqa: E402
from esft.grpo.callbacks import EvalCallback, RunLogCallback, check_finite_logs  # noqa: E402
from esft.grpo.drift_log import DriftCallback, snapshot  # noqa: E402
from esft.grpo.ledger import COUNTERS, StepLedger  # noqa: E402
from esft.rundir import NonFiniteError  # noqa: E402


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


class Clock:
    def __init__(self):
        self.now = 100.0

    def perf_counter(self):
        return self.now


def _step(cb, state, clock, seconds, logs):
    control = TrainerControl()
    cb.on_step_begin(None, state, control)
    clock.now += seconds
    cb.on_step_end(None, state, control)
    state.global_step += 1
    cb.on_log(None, state, control, logs=logs)


def test_train_records_of_two_steps(tmp_path, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(callbacks, "time", clock)
    model = torch.nn.Linear(2, 1)
    drift = DriftCallback(tmp_path / "drift.jsonl", snapshot(model))
    with torch.no_grad():
        model.weight.add_(torch.tensor([[3.0, 4.0]]))
    state = TrainerState(global_step=2, max_steps=4)  # resumed after step 2
    drift.on_step_end(None, TrainerState(global_step=3), TrainerControl(), model=model)
    led = StepLedger(prompts=1, completions=2, prompt_tokens=10, tokens_generated=6, finished=1,
                     trained_completions=2, trained_tokens=6, forward_tokens=20, signal_completions=2,
                     rewards=[1.1, 0.0], scores=[1.0, 0.0], well_formed=[True, False],
                     samples=[{"iteration": 2, "index": 0, "completion": "x"}],
                     time={"generate": 2.0, "score": 0.5})
    trainer = SimpleNamespace(ledger=led)
    (tmp_path / "samples").mkdir()  # as the run directory is prepared
    cb = RunLogCallback(tmp_path, trainer, drift, totals={"completions": 6, "prompts": 3}, progress=False)
    logs = {"loss": 0.125, "grad_norm": 0.5, "learning_rate": 1e-3, "kl": math.inf, "entropy": math.nan,
            "clip_ratio/low_mean": 0.05, "clip_ratio/region_mean": 0.2, "frac_reward_zero_std": 0.0, "reward": 0.55}
    _step(cb, state, clock, 4.0, logs)
    (rec,) = _lines(tmp_path / "metrics.jsonl")
    assert (rec["kind"], rec["iteration"], rec["step"]) == ("train", 2, 3)
    assert {k: rec[k] for k in COUNTERS} == led.counts()
    assert rec["reward"] == {"mean": 0.55, "std": 0.55, "min": 0.0, "max": 1.1}
    assert (rec["accuracy"], rec["format_rate"], rec["finished_rate"]) == (0.5, 0.5, 0.5)
    assert rec["generated_tokens_per_s"] == 6 / 2.0  # tokens over the generation time, not the step's
    assert (rec["loss"], rec["grad_norm"], rec["learning_rate"]) == (0.125, 0.5, 1e-3)
    assert (rec["clip_ratio"], rec["frac_reward_zero_std"]) == (0.2, 0.0)
    assert rec["kl"] is None and rec["entropy"] is None  # non-finite metrics are null, not NaN / Infinity
    assert rec["trl"] == {**logs, "kl": None, "entropy": None}
    assert rec["drift_total"] == pytest.approx(25.0, rel=1e-6)  # 3^2 + 4^2
    d = drift.last_seconds
    assert rec["time"] == pytest.approx({"generate": 2.0, "score": 0.5, "drift": d, "train": 4.0 - 2.5 - d,
                                         "total": 4.0})
    assert rec["totals"] == {**{k: led.counts()[k] for k in COUNTERS}, "completions": 8, "prompts": 4}
    assert _lines(tmp_path / "samples" / "iter_000002.jsonl") == led.samples
    assert trainer.ledger is not led and trainer.ledger.counts() == {k: 0 for k in COUNTERS}  # a fresh one

    # step 4: no drift record of it yet, generation longer than the measured step, a log without a reward
    trainer.ledger = StepLedger(completions=2, time={"generate": 5.0})
    _step(cb, state, clock, 1.0, {"loss": 0.25})
    last = _lines(tmp_path / "metrics.jsonl")[-1]
    assert (last["step"], last["iteration"], last["drift_total"]) == (4, 3, None)
    assert last["time"]["train"] == 0.0 and last["totals"]["completions"] == 10
    assert "reward" not in last and cb.last == last
    # the end-of-training summary is not a step
    cb.on_log(None, state, TrainerControl(), logs={"train_runtime": 9.0, "train_loss": 0.2})
    cb.on_log(None, state, TrainerControl(), logs={"total_flos": 0.0})
    assert len(_lines(tmp_path / "metrics.jsonl")) == 2


@pytest.mark.parametrize("logs", [{"loss": math.nan, "grad_norm": 1.0}, {"loss": 0.5, "grad_norm": math.inf}])
def test_a_non_finite_loss_or_gradient_norm_stops_before_the_record(tmp_path, logs):
    cb = RunLogCallback(tmp_path, SimpleNamespace(ledger=StepLedger()), progress=False)
    with pytest.raises(NonFiniteError, match="^step 5: non-finite"):
        cb.on_log(None, TrainerState(global_step=5), TrainerControl(), logs=logs)
    assert not (tmp_path / "metrics.jsonl").exists()
    check_finite_logs({"loss": 1, "grad_norm": None}, 5)  # ints and missing values are fine


def test_when_the_held_out_evaluation_is_due():
    cb = EvalCallback("unused", None, None, [{"id": 0}], every=2, max_new_tokens=1, evaluated={4}, progress=False)
    assert [s for s in range(8) if cb.due(s, 7)] == [0, 2, 6, 7]  # step 0, every 2, the final step; 4 was done
    assert not EvalCallback("unused", None, None, [{"id": 0}], every=0, max_new_tokens=1).due(0, 7)
    assert not EvalCallback("unused", None, None, [], every=2, max_new_tokens=1).due(2, 7)


def test_the_evaluation_fires_at_step_0_and_on_step_logs_only():
    cb = EvalCallback("unused", None, None, [{"id": 0}], every=2, max_new_tokens=1, progress=False, evaluated={0, 2})
    done = []
    cb.evaluate = lambda model, step: done.append(step)
    control = TrainerControl()
    cb.on_train_begin(None, TrainerState(global_step=2, max_steps=4), control)  # a resume: step 2 is evaluated
    cb.on_log(None, TrainerState(global_step=4, max_steps=4), control, logs={"train_runtime": 1.0})
    assert done == []
    # a resume whose step 2 evaluation an interrupt cut short: evaluated first
    cut = EvalCallback("unused", None, None, [{"id": 0}], every=2, max_new_tokens=1, progress=False, evaluated={0})
    cut.evaluate = lambda model, step: done.append(step)
    cut.on_train_begin(None, TrainerState(global_step=2, max_steps=4), control)
    assert done == [2]
    done.clear()
    cb = EvalCallback("unused", None, None, [{"id": 0}], every=2, max_new_tokens=1, progress=False)
    cb.evaluate = lambda model, step: done.append(step)
    cb.on_train_begin(None, TrainerState(global_step=0, max_steps=4), control)
    cb.on_log(None, TrainerState(global_step=2, max_steps=4), control, logs={"loss": 0.1})
    assert done == [0, 2]


@pytest.mark.parametrize("training", [True, False])
def test_an_evaluation_record_is_greedy_and_keeps_the_models_mode(tmp_path, tokenizer, training):
    from esft.generation import GenerationConfig, generate
    from grpo_tiny import ParityTask

    task = ParityTask(n=2)
    examples = task.load("test")
    model = make_tiny_model(hidden=32, layers=1)
    model.train(training)
    reported = []
    cb = EvalCallback(tmp_path, task, tokenizer, examples, every=2, max_new_tokens=3, progress=False,
                      report=reported.append)
    (tmp_path / "samples").mkdir()
    rec = cb.evaluate(model, 2)
    assert model.training is training
    assert rec["kind"] == "eval" and rec["step"] == 2 and rec["train_reward"] is None and rec["test_n"] == 2
    assert _lines(tmp_path / "metrics.jsonl") == [rec] and reported == [rec] and cb.last == rec
    assert not cb.due(2, 4)  # evaluated once
    model.eval()
    greedy = generate(model, tokenizer, [task.prompt(ex) for ex in examples],
                      GenerationConfig(max_new_tokens=3, temperature=0.0), progress=False)
    rows = _lines(tmp_path / "samples" / "eval_000002.jsonl")
    assert [r["completion"] for r in rows] == [g.text for g in greedy]
    assert rec["test_tokens_generated"] == sum(len(g.completion_ids) for g in greedy)
    assert rec["test_accuracy"] == sum(task.score(g.text, ex) for g, ex in zip(greedy, examples)) / 2
