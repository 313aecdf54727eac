"""A resume on other train examples than the run started on (a data file edited in between) is refused before the
model loads: it continued silently, and the run no longer ended where an uninterrupted one would. Real `esft train`
runs at tiny settings (a random-init Llama with the SmolLM2 tokenizer saved as a model folder)."""

from __future__ import annotations

import json

import pytest
import yaml

from esft.cli import main
from esft.rundir import examples_digest


def write_rows(path, offset: int) -> None:
    path.write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(offset, offset + 12)))


def test_the_digest_is_of_the_examples_in_order_and_none_for_values_json_cannot_write():
    rows = [{"q": "a", "answer": "1"}, {"answer": "2", "q": "b"}]
    assert examples_digest(rows) == examples_digest([{"answer": "1", "q": "a"}, {"q": "b", "answer": "2"}])
    assert examples_digest(rows) != examples_digest(rows[::-1])
    assert len(examples_digest(rows)) == 64 and examples_digest([{"q": object()}]) is None


@pytest.mark.parametrize("algorithm", ["es", "grpo"])
def test_a_resume_on_edited_train_data_is_refused_before_the_model_loads(tiny_dir, tmp_path, capsys, monkeypatch,
                                                                         algorithm):
    from esft.tasks import get_task

    data, out = tmp_path / "sums.jsonl", tmp_path / "run"
    write_rows(data, 0)
    common = ["--model", str(tiny_dir), "--task", str(data), "--prompt-field", "question", "--reward", "exact",
              "--eval-every", "0", "--device", "cpu", "--output-dir", str(out)]
    if algorithm == "es":
        first = ["train", "es", "--population-size", "2", "--batch-size", "2", "--max-new-tokens", "2",
                 "--iterations", "1", "--generation-batch-size", "2", "--dtype", "float32", *common]
        resume = ["train", "es", "--resume", str(out), "--iterations", "2"]
    else:
        first = ["train", "grpo", "--max-steps", "1", "--prompts-per-step", "2", "--num-generations", "2",
                 "--per-device-train-batch-size", "2", "--max-completion-length", "2", "--lr-scheduler-type",
                 "constant", *common]  # a schedule without an end: the finished run can be extended
        resume = ["train", "grpo", "--resume", "--output-dir", str(out), "--max-steps", "2"]  # the other form
    assert main(first) == 0
    recorded = yaml.safe_load((out / "config.yaml").read_text())["_run"]["train_sha256"]
    task = get_task(str(data), prompt_field="question", reward="exact")
    assert recorded == examples_digest(task.load("train"))
    capsys.readouterr()

    write_rows(data, 100)  # the user edits the file between the run and its resume

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the train examples were compared")

    def files():
        return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    if algorithm == "grpo":  # a step logged after the last checkpoint, which preparing a resume cuts away
        with open(out / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps({"kind": "train", "step": 2, "reward": {"mean": 0.0, "min": 0.0, "max": 0.0}}) + "\n")
    before = files()
    monkeypatch.setattr("esft.models.load_model", refuse)
    assert main(resume) == 2
    assert files() == before  # refused before the folder was touched (GRPO's logs were cut to its checkpoint)
    err = capsys.readouterr().err
    assert f"cannot resume {out}: its train examples changed since it started (sha256 {recorded[:12]}..." in err
    assert "restore the data, or start a new run in another --output-dir" in err
    monkeypatch.undo()
    write_rows(data, 0)  # restored: the resume goes on
    assert main(resume) == 0


@pytest.mark.parametrize("algorithm", ["es", "grpo"])
def test_an_error_after_logged_steps_says_what_is_kept_and_how_to_continue(tiny_dir, tmp_path, capsys, monkeypatch,
                                                                           algorithm):
    """A reward that raised in a run's third step was reported like bad input (exit code 2) without the way back
    that Ctrl-C prints; the resume then goes on from what was kept."""
    from esft.es.trainer import ESTrainer
    from esft.grpo.trl_trainer import TaskReward

    data, out = tmp_path / "sums.jsonl", tmp_path / "run"
    write_rows(data, 0)
    common = ["--model", str(tiny_dir), "--task", str(data), "--prompt-field", "question", "--reward", "exact",
              "--eval-every", "0", "--device", "cpu", "--output-dir", str(out)]
    calls = []
    if algorithm == "es":
        args = ["train", "es", "--population-size", "2", "--batch-size", "2", "--max-new-tokens", "2",
                "--iterations", "3", "--generation-batch-size", "2", "--dtype", "float32", "--checkpoint-every", "1",
                *common]
        owner, name, resume = ESTrainer, "iteration", ["train", "es", "--resume", str(out)]
        hint = f"(after 2 iterations are logged in {out}, which are kept; once the cause is fixed, continue with " \
               f"`esft train es --resume {out}`)"
    else:
        args = ["train", "grpo", "--max-steps", "3", "--prompts-per-step", "2", "--num-generations", "2",
                "--per-device-train-batch-size", "2", "--max-completion-length", "2", "--save-steps", "1", *common]
        owner, name, resume = TaskReward, "__call__", ["train", "grpo", "--resume", "--output-dir", str(out)]
        hint = f"(at step 2; once the cause is fixed, continue from step 2 with `esft train grpo --resume " \
               f"--output-dir {out}`)"
    real = getattr(owner, name)

    def third_fails(self, *a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("reward 'my:reward' raised RuntimeError: the service is down")
        return real(self, *a, **k)

    monkeypatch.setattr(owner, name, third_fails)
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"esft: error: reward 'my:reward' raised RuntimeError: the service is down {hint}" in err
    monkeypatch.undo()
    assert main(resume) == 0 and (out / "checkpoints" / "final").is_dir()


def test_a_failed_experiment_stage_says_to_run_the_experiment_again():
    """Inside an experiment the trainer's `esft train es --resume RUN` would bypass it (the runner replaces the hint
    of an interrupt likewise); the cause is kept for the stage's traceback."""
    from esft.rundir import RunFailed

    cause = ValueError("reward raised")
    exc = RunFailed("reward raised (after 2 iterations are logged in r, which are kept; once the cause is fixed, "
                    "continue with `esft train es --resume r`)")
    exc.__cause__ = cause
    again = exc.resumed_by("running the same command again")
    assert str(again).endswith("once the cause is fixed, continue with running the same command again)")
    assert again.__cause__ is cause and isinstance(again, RunFailed)
