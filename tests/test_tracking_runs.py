"""`--report-to tensorboard` across a GRPO run's life: a crash and its resume leave one value per step in the event
files, and the event writer is closed whatever ends the training (an error, Ctrl-C).

Run: pytest -q tests/test_tracking_runs.py   (~30 s on 2 CPU cores; tiny random-init model, no download)
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
pytest.importorskip("tensorboard")

from transformers import TrainerCallback  # noqa: E402

from conftest import make_tiny_model  # noqa: E402
from esft.grpo import train_grpo  # noqa: E402
from esft.rundir import read_jsonl  # noqa: E402
from grpo_tiny import ParityTask, tiny_config  # noqa: E402


class CrashAfterLog(TrainerCallback):
    """Fails once the step's log has reached the trackers (as a process killed before the step's checkpoint)."""

    def __init__(self, step, error=None):
        self.step, self.error = step, error or RuntimeError("simulated crash")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.global_step == self.step and logs and "loss" in logs:
            raise self.error


def scalars(folder, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_a_resume_after_a_crash_logs_each_step_once(tmp_path, tokenizer):
    """A crash (OOM kill, power loss) after step 3 was logged but before it was saved: the resume redoes step 3
    from checkpoint 2, and the event files held step 3 twice (two points at one step, the first from weights the
    run no longer has), where metrics.jsonl keeps only the redone one."""
    out = tmp_path / "run"
    options = dict(max_steps=4, save_steps=2, eval_every=0, max_completion_length=3, report_to="tensorboard")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train_grpo(tiny_config(out, **options), model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(),
                   callbacks=[CrashAfterLog(3)], progress=False)
    assert [s for s, _ in scalars(out / "tensorboard", "train/loss")] == [1, 2, 3]
    train_grpo(tiny_config(out, resume=True, **options), model=make_tiny_model(), tokenizer=tokenizer,
               task=ParityTask(), progress=False)
    logged = scalars(out / "tensorboard", "train/loss")
    train = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "train"]
    assert [s for s, _ in logged] == [r["step"] for r in train] == [1, 2, 3, 4]
    assert [v for _, v in logged] == pytest.approx([r["loss"] for r in train])


@pytest.mark.parametrize("error", [RuntimeError("simulated crash"), KeyboardInterrupt()])
def test_the_event_writer_is_closed_when_an_error_or_ctrl_c_stops_the_run(tmp_path, tokenizer, monkeypatch, error):
    """transformers closes its TensorBoard writer at the end of training only: a run stopped by an error or
    Ctrl-C left it open (its queued events unwritten until the process ended, its file and thread held by a
    notebook or a script that goes on), where ES closes its tracker whatever ends the run."""
    import torch.utils.tensorboard as tb

    writers = []

    class Writer(tb.SummaryWriter):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.closed = False
            writers.append(self)

        def close(self):
            self.closed = True
            super().close()

    monkeypatch.setattr(tb, "SummaryWriter", Writer)
    out = tmp_path / "run"
    config = tiny_config(out, max_steps=3, save_steps=0, eval_every=0, max_completion_length=3,
                         report_to="tensorboard")
    with pytest.raises((RuntimeError, KeyboardInterrupt)) as caught:  # RunInterrupted is a KeyboardInterrupt
        train_grpo(config, model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(),
                   callbacks=[CrashAfterLog(1, error)], progress=False)
    # Ctrl-C in a callback after step 1's train record: step 1 is finished and saved (esft.grpo.interrupt)
    assert "simulated crash" in str(caught.value) or "interrupted with 1 of 3 steps finished: saved" in str(
        caught.value)
    assert len(writers) == 1 and writers[0].closed
    assert [s for s, _ in scalars(out / "tensorboard", "train/loss")] == [1]


def test_grpo_writes_sample_tables_to_tensorboard_under_es_names(tmp_path, tokenizer):
    """ES shows each iteration's completions (`samples`) and each evaluation's (`eval_samples`) in TensorBoard's
    text tab; a GRPO run showed none, so one TensorBoard could not set the two methods' answers side by side."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    train_grpo(tiny_config(out, max_steps=2, eval_every=1, eval_limit=3, samples_per_iteration=2,
                           report_to="tensorboard"),
               model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(), progress=False)
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    train = acc.Tensors("samples/text_summary")
    evals = acc.Tensors("eval_samples/text_summary")
    assert [e.step for e in train] == [1, 2] and [e.step for e in evals] == [0, 1, 2]
    first = read_jsonl(out / "samples" / "iter_000000.jsonl")
    text = train[0].tensor_proto.string_val[0].decode()
    assert text.count("\n") == 1 + len(first) == 3  # header, rule, one line per sample
    # the rows' own fields, in their order (esft.sample_rows: ES's rows have the same ones)
    assert text.startswith("| " + " | ".join(first[0]) + " |\n")
    assert f"| {first[0]['iteration']} | {first[0]['index']} | {first[0]['score']}" in text
    assert text.splitlines()[2].endswith(f" | {first[0]['reward']} |")
    assert evals[0].tensor_proto.string_val[0].decode().count("\n") == 3  # 2 of the 3 evaluated, as ES cuts


def offline_wandb(monkeypatch, seen):
    """wandb offline and silent, with a fresh process state; `seen(run, failed)` is called as each run the
    trainer opened is finished (esft.tracking.finish_wandb). Returns the wandb module."""
    wandb = pytest.importorskip("wandb")
    import esft.tracking as tracking

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.teardown()  # wandb keeps the settings of its first run in a process
    finish = tracking.finish_wandb
    monkeypatch.setattr(tracking, "finish_wandb", lambda run, failed: (seen(run, failed), finish(run, failed)))
    return wandb


@pytest.mark.parametrize("error", [None, RuntimeError("simulated crash"), KeyboardInterrupt()])
def test_grpo_marks_its_wandb_run_failed_when_an_error_or_ctrl_c_stops_it(tmp_path, tokenizer, monkeypatch, error):
    """The folder's wandb run ends with the training, as a success only when the training ended normally."""
    ends = []
    wandb = offline_wandb(monkeypatch, lambda run, failed: ends.append(failed))
    config = tiny_config(tmp_path / "run", max_steps=2, save_steps=0, eval_every=0, max_completion_length=3,
                         report_to="wandb")
    crash = [] if error is None else [CrashAfterLog(1, error)]
    try:
        train_grpo(config, model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(), callbacks=crash,
                   progress=False)
    except (RuntimeError, KeyboardInterrupt) as exc:  # RunInterrupted is a KeyboardInterrupt
        assert error is not None and ("simulated crash" in str(exc)
                                      or "interrupted with 1 of 2 steps finished: saved" in str(exc))
    assert ends == [error is not None] and wandb.run is None


def test_the_last_steps_evaluation_redone_on_resume_reaches_the_trackers(tmp_path, tokenizer, monkeypatch):
    """Ctrl-C during the last step's held-out evaluation: `final` is saved and the resume, with no step left to
    train, evaluates it (esft.grpo.run). That evaluation went to metrics.jsonl only: TensorBoard's held-out curve
    stopped one evaluation short, where an ES run's resume logs the redone evaluation at its step."""
    from esft.rundir import RunInterrupted
    from test_grpo import evaluation_cut_at

    cut = evaluation_cut_at(2, monkeypatch)
    out = tmp_path / "run"
    options = dict(max_steps=2, save_steps=0, eval_every=1, eval_limit=2, max_completion_length=3,
                   samples_per_iteration=2, report_to="tensorboard")
    with pytest.raises(RunInterrupted, match="saved .*final"):
        train_grpo(tiny_config(out, **options), model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(),
                   progress=False)
    assert cut and [s for s, _ in scalars(out / "tensorboard", "eval/test_accuracy")] == [0, 1]
    train_grpo(tiny_config(out, resume=True, **options), model=make_tiny_model(), tokenizer=tokenizer,
               task=ParityTask(), progress=False)
    evals = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "eval"]
    logged = scalars(out / "tensorboard", "eval/test_accuracy")
    assert [s for s, _ in logged] == [r["step"] for r in evals] == [0, 1, 2]
    assert [v for _, v in logged] == pytest.approx([r["test_accuracy"] for r in evals])


def test_grpo_wandb_run_holds_esfts_config_as_an_es_run_does(tmp_path, tokenizer, monkeypatch):
    """An ES run's wandb config is its esft config (task, precision, eval settings); a GRPO run's held only what
    transformers adds (TRL's arguments, the model's config), so wandb could not group or filter GRPO runs by task
    or set them beside ES runs of the same task."""
    configs = []
    offline_wandb(monkeypatch, lambda run, failed: configs.append(dict(run.config)))
    config = tiny_config(tmp_path / "run", max_steps=1, save_steps=0, eval_every=0, max_completion_length=3,
                         report_to="wandb")
    train_grpo(config, model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(), progress=False)
    (logged,) = configs
    assert logged["task"] == "parity" and logged["precision"] == "fp32" and logged["format_bonus"] == 0.1
    assert logged["prompts_per_step"] == 2 and logged["num_generations"] == 4  # and TRL's own arguments beside


@pytest.mark.parametrize("strategy", ["no", "epoch"])
def test_trl_args_logging_strategy_is_refused(strategy):
    """trl_args: {logging_strategy: no} was accepted and ran: TRL then logs no step, so metrics.jsonl got no train
    record, the held-out evaluations after step 0 (made when a step is logged) never ran, and the trackers got
    nothing but step 0's evaluation, with nothing said. esft logs every step itself."""
    from esft.config import ConfigError

    with pytest.raises(ConfigError, match=r"no logging_strategy there \(esft logs every step"):
        tiny_config("out", trl_args={"logging_strategy": strategy})
