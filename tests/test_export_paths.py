"""`esft export` with the paths and run folders users give it: `.`, a symlink, a folder inside the run, damaged
checkpoint files, a model folder that is no run, and a training config holding a token."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from esft.cli import main


def run_folder(root, checkpoints=("iter_000001", "final"), config=None):
    """A run directory as the trainers leave it: config.yaml, held-out evaluations at steps 0-2 in metrics.jsonl and
    checkpoint folders (a one-tensor safetensors file, placeholder tokenizer config, es_state.json with the step)."""
    from safetensors.torch import save_file

    root.mkdir(parents=True)
    (root / "config.yaml").write_text(yaml.safe_dump(config or {"model": "m", "task": "boolq", "population_size": 2}))
    (root / "metrics.jsonl").write_text("".join(
        json.dumps({"kind": "eval", "step": s, "test_n": 4, "test_accuracy": 0.25 * s, "test_ci95": [0.0, 1.0]})
        + "\n" for s in range(3)))
    for name in checkpoints:
        folder = root / "checkpoints" / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"eos_token_id": 2}))
        (folder / "tokenizer_config.json").write_text("{}")
        (folder / "es_state.json").write_text(json.dumps({"step": 1 if name == "iter_000001" else 2}))
        save_file({"w": torch.zeros(1)}, str(folder / "model.safetensors"))
    return root


def test_the_card_publishes_no_token_of_the_training_config(tmp_path):
    """A GRPO run given `trl_args: {hub_token: ...}` (TRL's option, accepted and recorded in config.yaml) had the
    token written into the card, which is made to be uploaded; transformers itself writes such keys as <HUB_TOKEN>."""
    run = run_folder(tmp_path / "run", config={"model": "m", "task": "boolq", "num_generations": 2, "trl_args": {
        "hub_token": "hf_SECRET1", "model_init_kwargs": {"token": "hf_SECRET2"}, "hub_model_id": "me/m"}})
    assert main(["export", str(run), "--to", str(tmp_path / "out")]) == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert "hf_SECRET" not in card
    assert "hub_token: <HUB_TOKEN>" in card and "token: <TOKEN>" in card and "hub_model_id: me/m" in card


def test_an_export_to_a_symlinked_folder_writes_into_the_folder_it_names(tmp_path, capsys):
    """`--to LINK` (a symlink to a folder) replaced the symlink by a new folder, left `.old_LINK` beside it and
    failed with "Cannot call rmtree on a symbolic link" after the export was in place."""
    run = run_folder(tmp_path / "run")
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    for extra in ([], ["--overwrite"]):
        assert main(["export", str(run), "--to", str(tmp_path / "link"), *extra]) == 0, capsys.readouterr().err
        assert (tmp_path / "link").is_symlink() and (tmp_path / "real" / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real", "run"]


def test_an_export_to_the_empty_current_folder_fills_it(tmp_path, monkeypatch, capsys):
    """`mkdir m && cd m && esft export RUN --to .` failed with "PosixPath('.') has an empty name"; the folder the
    user made (and stands in) is kept and filled."""
    run = run_folder(tmp_path / "run")
    (here := tmp_path / "m").mkdir()
    inode = here.stat().st_ino
    monkeypatch.chdir(here)
    assert main(["export", str(run), "--to", "."]) == 0, capsys.readouterr().err
    assert here.stat().st_ino == inode and (here / "model.safetensors").is_file() and (here / "README.md").is_file()


def test_exporting_the_checkpoint_folder_one_stands_in_keeps_the_runs_card(tmp_path, monkeypatch):
    """`cd RUN/checkpoints/iter_000001 && esft export . --to ...` made the card of a model folder with no run: an
    empty title, no training config, no held-out results, no word that the weights are an earlier checkpoint."""
    run = run_folder(tmp_path / "run")
    monkeypatch.chdir(run / "checkpoints" / "iter_000001")
    assert main(["export", ".", "--to", str(tmp_path / "out")]) == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert "\n# run\n" in card and "population_size: 2" in card
    assert "checkpoint `iter_000001`, step 1, not the run's final checkpoint" in card
    assert "| 1 | 4 | 0.250 |" in card and "| 2 | 4 |" not in card
    monkeypatch.chdir(run)
    assert main(["export", ".", "--to", str(tmp_path / "out2")]) == 0
    assert "\n# run\n" in (tmp_path / "out2" / "README.md").read_text()


@pytest.mark.parametrize("text", ['{"eos_token_id": ', "[1]"])
def test_a_damaged_json_file_of_the_checkpoint_is_named(tmp_path, capsys, text):
    """A truncated config.json stopped the export with "esft: error: Expecting value: line 1 column 17 (char 16)",
    naming no file; one holding a JSON list ended in a traceback (AttributeError)."""
    run = run_folder(tmp_path / "run", checkpoints=("final",))
    (run / "checkpoints" / "final" / "config.json").write_text(text)
    assert main(["export", str(run), "--to", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"esft: error: {run / 'checkpoints' / 'final' / 'config.json'} is damaged") and \
        err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_export_refuses_a_target_inside_the_runs_checkpoints(tmp_path, capsys):
    """`--to RUN/checkpoints/final` on a run stopped before its final checkpoint made a folder that the next export
    took for the run's final checkpoint: its card then listed the evaluations of steps after its weights'."""
    run = run_folder(tmp_path / "run", checkpoints=("iter_000001",))
    for target in ("final", "iter_000009", "x/y"):
        assert main(["export", str(run), "--to", str(run / "checkpoints" / target)]) == 2
        assert "inside the run's checkpoints" in capsys.readouterr().err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000001"]
    assert main(["export", str(run), "--to", str(run / "exported")]) == 0  # elsewhere in the run: no checkpoint


def test_the_card_of_a_model_folder_claims_no_training(tmp_path):
    """A model folder with no run around it was tagged evolution-strategies, said "The run recorded no held-out
    evaluation" and ended with an empty training config (`{}`); a checkpoint folder copied out of its run still
    shows its trainer by its state file."""
    run = run_folder(tmp_path / "run", checkpoints=("final",))
    plain = tmp_path / "plain"
    plain.mkdir()
    for p in (run / "checkpoints" / "final").iterdir():
        if p.name != "es_state.json":
            (plain / p.name).write_bytes(p.read_bytes())
    assert main(["export", str(plain), "--to", str(tmp_path / "out")]) == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert "tags:\n- esft\n---" in card
    assert "The run recorded" not in card and "## Training config" not in card
    assert "no training config (`config.yaml`) beside it" in card
    (plain / "es_state.json").write_text(json.dumps({"step": 2}))
    assert main(["export", str(plain), "--to", str(tmp_path / "out"), "--overwrite"]) == 0
    assert "- evolution-strategies\n" in (tmp_path / "out" / "README.md").read_text()


def test_the_checkpoints_folder_given_for_the_run_names_the_run(tmp_path, capsys):
    """`esft export RUN/checkpoints` said "expected RUN/checkpoints/checkpoints/final or a model folder"."""
    run = run_folder(tmp_path / "run")
    assert main(["export", str(run / "checkpoints"), "--to", str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err
    assert f"{run / 'checkpoints'} is a run's checkpoints folder: export the run ({run})" in err
    assert "checkpoints/checkpoints" not in err and not (tmp_path / "out").exists()


def test_overwrite_of_the_folder_the_command_runs_in_is_refused(tmp_path, capsys, monkeypatch):
    """`esft export RUN --to . --overwrite` from inside an earlier export replaced the folder the shell stood in,
    which then stood in a deleted folder; the earlier export is kept."""
    run = run_folder(tmp_path / "run")
    assert main(["export", str(run), "--to", str(tmp_path / "out")]) == 0
    before = sorted(p.name for p in (tmp_path / "out").iterdir())
    monkeypatch.chdir(tmp_path / "out")
    capsys.readouterr()
    assert main(["export", str(run), "--to", ".", "--overwrite"]) != 0
    assert "is the folder this command runs in" in capsys.readouterr().err
    assert (tmp_path / "out").samefile(".") and sorted(p.name for p in (tmp_path / "out").iterdir()) == before


@pytest.mark.parametrize("inside, given", [("checkpoints", "."), ("checkpoints/final", "..")])
def test_the_checkpoints_folder_given_as_dot_names_the_run_above_it(tmp_path, capsys, monkeypatch, inside, given):
    """From inside RUN/checkpoints, `esft export .` said "export the run (.)", the checkpoints folder itself."""
    run = run_folder(tmp_path / "run")
    monkeypatch.chdir(run / inside)
    assert main(["export", given, "--to", str(tmp_path / "out")]) != 0
    assert f"{given} is a run's checkpoints folder: export the run ({run}) or" in capsys.readouterr().err


def test_a_target_below_a_file_names_that_file(tmp_path, capsys):
    """`--to afile/sub` said only "[Errno 17] File exists: 'afile'"."""
    run = run_folder(tmp_path / "run")
    (tmp_path / "afile").write_text("x")
    assert main(["export", str(run), "--to", str(tmp_path / "afile" / "sub")]) != 0
    assert f"{tmp_path / 'afile'} is a file, not a folder" in capsys.readouterr().err


def test_a_target_that_cannot_be_written_is_named_not_the_staging_folder(tmp_path, capsys, monkeypatch):
    """An unwritable parent of `--to` gave "Permission denied: 'PARENT/.out.abc123'", a folder the user never
    named; the error names `--to` and leaves nothing behind."""
    import tempfile

    run = run_folder(tmp_path / "run")

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / ".out.abc123"))

    monkeypatch.setattr(tempfile, "mkdtemp", refused)
    assert main(["export", str(run), "--to", str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err
    assert f"cannot write the export beside --to {tmp_path / 'out'} (Permission denied)" in err and ".out." not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_the_card_of_a_checkpoint_between_evaluations_says_its_step_was_not_evaluated(tmp_path):
    """An interrupted run's latest checkpoint (step 3, evaluations at 0-2) got a card whose last row read as the
    exported weights' accuracy."""
    run = run_folder(tmp_path / "run", checkpoints=("iter_000003",))
    (run / "checkpoints" / "iter_000003" / "es_state.json").write_text(json.dumps({"step": 3}))
    assert main(["export", str(run), "--to", str(tmp_path / "out")]) == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert "No held-out evaluation was made at step 3, the exported weights' step: the last row is step 2's." in card
    assert main(["export", str(run_folder(tmp_path / "run2")), "--to", str(tmp_path / "out2")]) == 0
    assert "No held-out evaluation" not in (tmp_path / "out2" / "README.md").read_text()
