"""Contracts of the GRPO baseline that the mutation audit (mutgrpo) found untested: a run without held-out
evaluation never reads the test split, a train record times the scoring of the step's completions and counts
the completions trained on, an interrupt after the last step names the final checkpoint, a `final` checkpoint
ends a run whatever its generation round, TensorBoard's purge step and one-row tables, and an explicit device
wins over the default one.

Run: pytest -q tests/test_grpo_mutmutgrpo.py   (~10 s on 2 CPU cores; tiny random-init model, no download)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

pytest.importorskip("trl")

from conftest import make_tiny_model  # noqa: E402
from esft.grpo.run import train_grpo  # noqa: E402
from esft.rundir import read_jsonl  # noqa: E402
from grpo_tiny import ParityTask, tiny_config  # noqa: E402


@dataclass
class TrainOnlyTask(ParityTask):
    """A task with a train split only (a custom task a user brings for training): reading "test" fails."""

    splits: tuple[str, ...] = ("train",)
    loaded: list[str] = field(default_factory=list)

    def load(self, split: str = "test", limit: int | None = None):
        self.loaded.append(split)
        return super().load(split, limit)


def test_a_run_without_evaluation_reads_no_test_split_and_times_the_scoring(tmp_path, tokenizer):
    """eval_every 0 turns the held-out evaluation off whatever eval_limit says (default 200): the test split is
    never loaded. The step's record splits its time into generate / score / train, each measured."""
    task = TrainOnlyTask()
    out = tmp_path / "run"
    result = train_grpo(tiny_config(out, max_steps=1, eval_every=0, eval_limit=200, save_steps=0),
                        model=make_tiny_model(hidden=32, layers=2), tokenizer=tokenizer, task=task, progress=False)
    assert result.steps == 1 and result.last_eval is None
    assert "test" not in task.loaded and "train" in task.loaded
    (rec,) = [r for r in read_jsonl(out / "metrics.jsonl")]
    assert rec["kind"] == "train"
    # every completion holds at least its eos token, so each is trained on (a count of rows, not of columns:
    # max_completion_length 6 < 8 completions)
    assert rec["trained_completions"] == rec["completions"] == 8
    times = rec["time"]
    assert times["score"] > 0 and times["generate"] > 0
    assert times["total"] == pytest.approx(sum(v for k, v in times.items() if k != "total"), rel=1e-9)


def test_an_interrupt_after_the_last_step_saves_and_names_the_final_checkpoint(tmp_path):
    """Ctrl-C between the last step's record and its checkpoint: the checkpoint saved then is `final` (as
    _save_checkpoint names it at max_steps), and the path the interrupt message prints is that folder."""
    from types import SimpleNamespace

    from transformers import TrainerState

    from esft.grpo.interrupt import StepBoundary, rng_states
    from esft.grpo.trl_trainer import EsftGRPOTrainer

    saves = []
    for step, name in ((4, "final"), (3, "iter_000003")):
        trainer = SimpleNamespace(state=TrainerState(global_step=step, max_steps=4), run_dir=tmp_path, model=None,
                                  _save_checkpoint=lambda model, trial, step=step: saves.append(step),
                                  inside_round=lambda step: False)  # num_iterations 1: every step ends a round
        boundary = StepBoundary()
        boundary.finished, boundary.saved, boundary.rng = step, 2, rng_states()
        assert EsftGRPOTrainer.save_finished_step(trainer, boundary) == tmp_path / "checkpoints" / name
    assert saves == [4, 3]


def _checkpoint(run_dir, name, step):
    """A checkpoint folder resume_checkpoint accepts with model_only (readable weights, the trainer state)."""
    import json

    import torch
    from safetensors.torch import save_file

    folder = run_dir / "checkpoints" / name
    folder.mkdir(parents=True)
    save_file({"w": torch.zeros(1)}, str(folder / "model.safetensors"))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


def test_the_final_checkpoint_is_resumed_from_though_its_step_ends_no_generation_round(tmp_path):
    """max_steps 5 with num_iterations 2: the run's last round is cut short at step 5, whose `final` checkpoint is
    the finished run (nothing to redo); only a run extended past it goes back to step 4, the round's start."""
    from esft.grpo.checkpoints import resume_checkpoint

    at_4 = _checkpoint(tmp_path, "iter_000004", 4)
    final = _checkpoint(tmp_path, "final", 5)
    assert resume_checkpoint(tmp_path, num_iterations=2, max_steps=5, model_only=True) == (5, final)
    with pytest.warns(UserWarning, match="inside a generation round"):
        assert resume_checkpoint(tmp_path, num_iterations=2, max_steps=6, model_only=True) == (4, at_4)


def test_a_fresh_sampler_draws_epoch_0s_order():
    """Epoch e's order is the one seeded by (seed, e): a sampler not yet told its epoch is at epoch 0."""
    from esft.grpo.trl_trainer import EpochSeededRepeatSampler

    def sampler():
        return EpochSeededRepeatSampler(list(range(12)), mini_repeat_count=2, batch_size=4, shuffle=True, seed=5)

    told = sampler()
    told.set_epoch(0)
    assert list(sampler()) == list(told)


def _board_trainer():
    """A trainer stand-in holding one transformers TensorBoard callback (as TRL adds for report_to)."""
    from types import SimpleNamespace

    from transformers import TrainerState
    from transformers.integrations import TensorBoardCallback

    board = TensorBoardCallback()
    trainer = SimpleNamespace(callback_handler=SimpleNamespace(callbacks=[board]),
                              state=TrainerState(global_step=7))
    return trainer, board


def test_a_resumed_runs_tensorboard_hides_only_the_steps_after_its_checkpoint(tmp_path, monkeypatch):
    """A resume from step 4 redoes steps 5.. : TensorBoard purges the earlier files' events from step 5 on and keeps
    step 4's, which the resumed run does not log again."""
    import torch.utils.tensorboard

    from esft.grpo.callbacks import point_tensorboard

    opened = []
    monkeypatch.setattr(torch.utils.tensorboard, "SummaryWriter", lambda **kw: opened.append(kw) or kw)
    for resume_step in (4, None):
        trainer, board = _board_trainer()
        point_tensorboard(trainer, tmp_path / "tb", resume_step=resume_step)
    assert opened == [{"log_dir": str(tmp_path / "tb"), "purge_step": 5},
                      {"log_dir": str(tmp_path / "tb"), "purge_step": None}]


def test_one_sample_per_step_still_reaches_the_tensorboard_table():
    """samples_per_iteration 1 keeps a one-row `samples` table; 0 keeps none."""
    from esft.grpo.callbacks import tracker_table

    trainer, board = _board_trainer()
    texts = []
    board.tb_writer = type("Writer", (), {"add_text": lambda self, *a: texts.append(a), "flush": lambda self: None})()
    assert tracker_table(trainer, 0) is None
    table = tracker_table(trainer, 1)
    table("samples", [{"completion": "a"}, {"completion": "b"}])
    assert texts == [("samples", "| completion |\n|---|\n| a |", 7)]


def test_an_explicit_device_is_the_one_the_model_loads_on(tmp_path, monkeypatch):
    """`device: cpu` on a machine whose default device is another (a CUDA box) loads the model on the CPU; only
    a config without a device takes the default."""
    import esft.models

    class Loaded(Exception):
        pass

    devices = []

    def load_model(name, dtype, device):
        devices.append(device)
        raise Loaded

    monkeypatch.setattr(esft.models, "default_device", lambda: "cuda")
    monkeypatch.setattr(esft.models, "load_model", load_model)
    for device in ("cpu", None):
        with pytest.raises(Loaded):
            train_grpo(tiny_config(tmp_path / f"run-{device}", device=device), task=ParityTask(), progress=False)
    assert devices == ["cpu", "cuda"]
