"""A new training run refused or failed before it trains a step (its step-0 evaluation aside) leaves the user's
--output-dir as it found it (esft.run_undo.locked_run_folder): a folder it made is gone, a folder that was there
keeps exactly its own files, so the same command with the option fixed starts cleanly. Real `esft train` runs at
tiny settings (a random-init Llama with the SmolLM2 tokenizer saved as a model folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esft.cli import main
from esft.run_undo import locked_run_folder

TASK = "countdown:numbers=2,max_number=20,ops=+"

#: a reward that passes the set-up's probes (the gold answers, an empty completion) and refuses any other text,
#: such as the tiny model's blank lines in its first evaluation
PICKY_REWARD = '''
def picky(completions, answer, **kwargs):
    texts = [c[0]["content"] for c in completions]
    if any(t and t != str(a) for t, a in zip(texts, answer)):
        raise ValueError("picky wants the gold answer")
    return [1.0 for _ in texts]
'''


def contents(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in folder.rglob("*")}


def user_folder(path: Path) -> dict[str, bytes | None]:
    """A folder the user made before the run: their notes, their own config.yaml and an empty samples/."""
    (path / "samples").mkdir(parents=True)
    (path / "notes.txt").write_text("mine\n")
    (path / "config.yaml").write_text("# my options\nsigma: 0.001\n")
    return contents(path)


def es_data_args(model: Path, data: Path, out: Path, reward: str) -> list[str]:
    return ["train", "es", "--model", str(model), "--task", str(data), "--prompt-field", "question",
            "--reward", reward, "--population-size", "2", "--batch-size", "2", "--max-new-tokens", "2",
            "--iterations", "1", "--eval-limit", "1", "--generation-batch-size", "2", "--device", "cpu",
            "--dtype", "float32", "--output-dir", str(out)]


def test_es_run_failing_before_it_logs_leaves_no_files_and_reruns(tiny_dir, tmp_path, monkeypatch, capsys):
    from conftest import importable_module

    importable_module(tmp_path, monkeypatch, "picky_rewards", PICKY_REWARD)
    data = tmp_path / "one.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+{i}?", "answer": str(2 * i)}) + "\n" for i in range(6)))
    new = tmp_path / "runs" / "es"  # neither folder exists yet
    assert main(es_data_args(tiny_dir, data, new, "picky_rewards:picky")) == 2
    assert "picky wants the gold answer" in capsys.readouterr().err  # it failed in its first evaluation
    assert not (tmp_path / "runs").exists()

    mine = tmp_path / "mine"
    before = user_folder(mine)
    assert main(es_data_args(tiny_dir, data, mine, "picky_rewards:picky")) == 2
    assert contents(mine) == before  # no config.yaml of the failed run, no .lock, the user's config.yaml back

    assert main(es_data_args(tiny_dir, data, new, "exact")) == 0  # the fixed command is not refused
    assert (new / "seeds.jsonl").is_file() and (new / "checkpoints" / "final").is_dir()


def grpo_args(model: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "grpo", "--model", str(model), "--task", TASK, "--max-steps", "1", "--prompts-per-step", "2",
            "--num-generations", "2", "--per-device-train-batch-size", "2", "--max-completion-length", "2",
            "--device", "cpu", "--output-dir", str(out), *extra]


def test_grpo_run_refused_by_trl_leaves_no_files(tiny_dir, tmp_path, capsys):
    refused = ("--trl-args", '{"auto_find_batch_size": true}')  # TRL's own check, run once the folder is locked
    new = tmp_path / "runs" / "grpo"
    assert main(grpo_args(tiny_dir, new, *refused)) == 2
    assert "auto_find_batch_size" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()

    mine = tmp_path / "mine"
    before = user_folder(mine)
    assert main(grpo_args(tiny_dir, mine, *refused)) == 2
    assert contents(mine) == before


TWO_REWARD = """
def two(completions, **kwargs):
    return [2.0 for _ in completions]
"""


def test_es_run_refused_after_its_step_0_evaluation_leaves_no_files_and_reruns(tiny_dir, tmp_path, monkeypatch,
                                                                              capsys):
    """DART-ES refuses a reward outside [0, 1] at its first iteration, after the step-0 evaluation was logged: the
    folder was kept, so the fixed command (`--fitness mean`) was refused as "already holds a run", and its resume
    as a change of fitness_rule; the user had to delete the folder."""
    from conftest import importable_module

    importable_module(tmp_path, monkeypatch, "two_rewards", TWO_REWARD)
    data = tmp_path / "one.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+{i}?", "answer": str(2 * i)}) + "\n" for i in range(6)))
    out = tmp_path / "runs" / "es"
    assert main([*es_data_args(tiny_dir, data, out, "two_rewards:two"), "--fitness", "dart"]) == 2
    assert "DART-ES" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    assert main(es_data_args(tiny_dir, data, out, "two_rewards:two")) == 0  # the fixed command runs
    assert (out / "checkpoints" / "final").is_dir()


def test_a_folder_that_holds_a_run_or_an_interrupted_one_is_kept(tmp_path):
    """A failure is undone only before a new run trains a step: a trained step's record, a run that was there
    before (a resume's), or Ctrl-C (whose message says how to resume from config.yaml), keeps every file."""
    logged = tmp_path / "logged"
    with pytest.raises(ValueError):
        with locked_run_folder(logged):
            (logged / "config.yaml").write_text("seed: 1\n")
            (logged / "metrics.jsonl").write_text('{"kind": "eval", "step": 0}\n{"kind": "train", "step": 1}\n')
            raise ValueError("late failure")
    assert {p.name for p in logged.iterdir()} == {".lock", "config.yaml", "metrics.jsonl"}

    evaluated = tmp_path / "evaluated"  # only the step-0 evaluation: undone, as if nothing was logged
    with pytest.raises(ValueError):
        with locked_run_folder(evaluated):
            (evaluated / "config.yaml").write_text("seed: 1\n")
            (evaluated / "metrics.jsonl").write_text('{"kind": "eval", "step": 0}\n')
            raise ValueError("refused at the first iteration")
    assert not evaluated.exists()

    (evaluated / "metrics.jsonl").parent.mkdir()  # the same, resumed: the run was there before, and is kept
    (evaluated / "metrics.jsonl").write_text('{"kind": "eval", "step": 0}\n')
    with pytest.raises(ValueError):
        with locked_run_folder(evaluated):
            (evaluated / "config.yaml").write_text("seed: 1\n")
            raise ValueError("refused on resume")
    assert {p.name for p in evaluated.iterdir()} == {".lock", "config.yaml", "metrics.jsonl"}

    ray = tmp_path / "ray"  # a Ray run's start events (no step: no update yet) beside it train nothing either
    events = [{"kind": "executor", "event": "start", "workers": []}, {"kind": "executor", "event": "checksum"},
              {"kind": "eval", "step": 0}]
    with pytest.raises(ValueError):
        with locked_run_folder(ray):
            (ray / "config.yaml").write_text("seed: 1\n")
            (ray / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in events))
            raise ValueError("refused at the first iteration")
    assert not ray.exists()

    stopped = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        with locked_run_folder(stopped):
            (stopped / "config.yaml").write_text("seed: 1\n")
            raise KeyboardInterrupt
    assert (stopped / "config.yaml").is_file()


def test_in_a_folder_that_was_there_a_failed_run_removes_only_the_files_a_run_writes(tmp_path):
    before = user_folder(tmp_path / "out")
    with pytest.raises(ValueError), locked_run_folder(tmp_path / "out"):
        (tmp_path / "out" / "config.yaml").write_text("seed: 1\n")  # the run's, over the user's
        (tmp_path / "out" / "samples" / "iter_000.jsonl").write_text("{}\n")
        (tmp_path / "out" / "tensorboard").mkdir()
        (tmp_path / "out" / "draft.md").write_text("written by an editor meanwhile\n")
        raise ValueError("refused")
    after = contents(tmp_path / "out")
    assert after == {**before, "draft.md": b"written by an editor meanwhile\n"}
    # a folder the run made is the run's alone: all of it goes
    with pytest.raises(ValueError), locked_run_folder(tmp_path / "new" / "run"):
        (tmp_path / "new" / "run" / "draft.md").write_text("x")
        raise ValueError("refused")
    assert not (tmp_path / "new").exists()


def test_a_failed_run_removes_its_trackers_and_trl_folders_and_only_a_lock_it_made(tmp_path):
    before = user_folder(tmp_path / "out")
    with pytest.raises(ValueError), locked_run_folder(tmp_path / "out"):
        (tmp_path / "out" / "wandb" / "run-1").mkdir(parents=True)
        (tmp_path / "out" / "wandb" / "esft-run-id").write_text("abc\n")
        (tmp_path / "out" / "trackio-run-name").write_text("out\n")
        (tmp_path / "out" / "checkpoint-2").mkdir()
        raise ValueError("refused")
    assert contents(tmp_path / "out") == before  # the .lock this run made is gone too
    (tmp_path / "out" / ".lock").write_text("")  # left by an earlier run: kept
    before = contents(tmp_path / "out")
    with pytest.raises(ValueError), locked_run_folder(tmp_path / "out"):
        raise ValueError("refused")
    assert contents(tmp_path / "out").keys() == before.keys()
