"""Folders esft reads or writes that are not what the command takes: a run's damaged config.yaml (export, report),
a model folder that cannot load, an evaluation written into a run or model folder, a run written into an
experiment's folder or inside another run. Each is refused before any model loads, in one line (exit 2), and
leaves no folder behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from esft.cli import main


def model_folder(path: Path) -> Path:
    """A model folder as the checks see it (config.json, a one-tensor safetensors file, a tokenizer config):
    nothing here loads it."""
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    save_file({"w": torch.zeros(1)}, str(path / "model.safetensors"))
    (path / "tokenizer_config.json").write_text("{}")
    return path


def run_folder(path: Path, config_text: str) -> Path:
    """A finished run: config.yaml as given, one evaluation record and a final checkpoint."""
    model_folder(path / "checkpoints" / "final")
    (path / "config.yaml").write_text(config_text)
    (path / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "step": 0, "test_accuracy": 0.5, "test_n": 2,
                                                    "test_ci95": [0.1, 0.9]}) + "\n")
    return path


@pytest.fixture()
def no_model_loads(monkeypatch):
    import esft.models

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr(esft.models, "load_model", refuse)


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("esft: error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("text, words", [
    ("sigma: [\n", "config.yaml:2: not valid YAML"),
    ("- 1\n- 2\n", "config.yaml: expected a mapping of option: value at the top level, got list"),
    ("just text\n", "config.yaml: expected a mapping of option: value at the top level, got str"),
    ("model: m\ntask: [1, 2]\n", "config.yaml:2: task is [1, 2], expected text"),
    ("model: 5\ntask: boolq\n", "config.yaml:1: model is 5, expected text"),
    ("model: m\ntask: boolq\n_run: 3\n", "config.yaml:3: _run is 3, expected a mapping"),
])
def test_export_and_report_refuse_a_damaged_config_yaml_in_one_line(tmp_path, capsys, text, words):
    """A hand-edited or damaged config.yaml showed a traceback (a YAML parser error, 'list' object has no
    attribute 'items', a TypeError deep in the report) and left an empty report/ behind."""
    run = run_folder(tmp_path / "run", text)
    assert main(["export", str(run), "--to", str(tmp_path / "out")]) == 2
    assert words in error_line(capsys)
    assert not (tmp_path / "out").exists()
    assert main(["report", str(run)]) == 2
    assert words in error_line(capsys)
    assert not (run / "report").exists()


def test_a_recorded_config_keeps_what_runs_write(tmp_path):
    """Lists of task names, a seed as text, an empty file and null values are what runs (and older esft)
    recorded: read as they are."""
    from esft.saved_config import read_recorded_config

    path = tmp_path / "config.yaml"
    path.write_text("model: m\ntask: [boolq, mmlu]\nseed: '3'\ntask_options: {}\n_run: {algorithm: es}\nrun_name:\n")
    assert read_recorded_config(path)["task"] == ["boolq", "mmlu"]
    path.write_text("")
    assert read_recorded_config(path) == {}


@pytest.mark.parametrize("damage, words", [
    (lambda p: (p / "model.safetensors").unlink(), "has no weights file (model.safetensors"),
    (lambda p: (p / "config.json").write_text("{not json"), "config.json does not read as JSON"),
    (lambda p: (p / "config.json").write_text("[]"), "config.json holds a list, not a JSON object"),
])
def test_a_model_folder_that_cannot_load_is_refused_before_loading(tmp_path, capsys, no_model_loads, damage, words):
    """A model folder with config.json and no weights failed only at load time, exit 1, in transformers' words
    ("Error no file named model.safetensors, or pytorch_model.bin, found in directory ...")."""
    model = model_folder(tmp_path / "model")
    damage(model)
    assert main(["eval", "--model", str(model), "--task", "boolq", "--limit", "1", "--device", "cpu"]) == 2
    line = error_line(capsys)
    assert "model = " in line and words in line


def test_a_sharded_model_folder_passes_the_check(tmp_path):
    from esft.validation import check_model

    model = model_folder(tmp_path / "model")
    (model / "model.safetensors").rename(model / "model-00001-of-00001.safetensors")
    (model / "model.safetensors.index.json").write_text("{}")
    check_model("model", str(model))


def test_eval_refuses_an_output_dir_in_a_run_or_a_model_folder(tmp_path, capsys, no_model_loads):
    """`esft eval --output-dir RUN/checkpoints/final` wrote summary.json and the per-task files among a
    checkpoint's (and a run's) own files."""
    run = run_folder(tmp_path / "run", "model: m\ntask: boolq\n")
    model = model_folder(tmp_path / "model")
    cases = [(run, "is a run folder"), (run / "checkpoints" / "final", f"is inside the run folder {run}"),
             (run / "evals", f"is inside the run folder {run}"), (model, "is a model folder")]
    for out, words in cases:
        before = sorted(p.name for p in out.iterdir()) if out.exists() else None
        assert main(["eval", "--model", str(model), "--task", "boolq", "--limit", "1", "--device", "cpu",
                     "--output-dir", str(out)]) == 2
        assert f"--output-dir {out} {words}" in error_line(capsys)
        assert (sorted(p.name for p in out.iterdir()) if out.exists() else None) == before


TRAIN = {"es": ["train", "es", "--task", "countdown:numbers=2", "--iterations", "1", "--population-size", "2",
                "--batch-size", "2", "--max-new-tokens", "2", "--eval-every", "0", "--device", "cpu",
                "--dtype", "float32"],
         "grpo": ["train", "grpo", "--task", "countdown:numbers=2", "--max-steps", "1", "--prompts-per-step", "2",
                  "--num-generations", "2", "--per-device-train-batch-size", "2", "--max-completion-length", "2",
                  "--eval-every", "0", "--device", "cpu"]}


@pytest.mark.parametrize("algorithm", ["es", "grpo"])
def test_a_run_is_refused_in_an_experiment_folder_or_inside_another_run(tmp_path, capsys, no_model_loads, algorithm):
    """`esft train ... --output-dir EXP` wrote config.yaml and checkpoints/ beside an experiment's plan.json;
    `--output-dir RUN/checkpoints/sub` wrote a run inside another, which `esft report` then passed over."""
    model = model_folder(tmp_path / "model")
    experiment = tmp_path / "exp"
    experiment.mkdir()
    (experiment / "plan.json").write_text("{}")
    run = run_folder(tmp_path / "run", "model: m\ntask: boolq\n")
    cases = [(experiment, "is an experiment folder (it holds plan.json)"),
             (run / "checkpoints" / "sub", f"is inside the run folder {run}"), (run / "more", "inside the run")]
    for out, words in cases:
        assert main([*TRAIN[algorithm], "--model", str(model), "--output-dir", str(out)]) == 2
        assert words in error_line(capsys)
        assert sorted(p.name for p in experiment.iterdir()) == ["plan.json"]
        assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.yaml", "metrics.jsonl"]
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["final"]
