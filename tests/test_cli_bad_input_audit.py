"""Bad input met by a new user at the command line: refused as one `esft: error:` line naming the value and what is
accepted, with exit code 2, before any model loads."""

from __future__ import annotations

import pytest

from esft.cli import main


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr("esft.models.load_model", refuse)


@pytest.mark.parametrize("seed", ["4294967296", "-1"])
def test_a_grpo_seed_numpy_cannot_take_is_refused_before_the_model_loads(tmp_path, capsys, no_model_load, seed):
    """--seed 4294967296 loaded the model, then ended in "Seed must be between 0 and 2**32 - 1" from inside TRL's
    set_seed, naming neither the option nor the value."""
    assert main(["train", "grpo", "--preset", "cpu", "--seed", seed, "--output-dir", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err
    assert f"command line (--seed): seed = {seed} is not accepted; expected an integer from 0 to 2^32 - 1" in err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "g").exists()


def test_the_largest_seed_numpy_takes_is_accepted_for_grpo():
    from esft.grpo.grpo_config import GRPOConfig

    assert GRPOConfig(seed=2**32 - 1).seed == 2**32 - 1


def test_a_runs_saved_config_yaml_is_accepted_by_config_as_the_options_it_ran_with(tmp_path, capsys, no_model_load):
    """`esft train es --config runs/es/config.yaml --output-dir runs/es-again` (README: `--config run.yaml`) was
    refused as "unknown option '_run'": the block esft itself writes beside the options, which the user never
    typed. The run's options are read; a flag still overrides them and is still checked."""
    from esft.config import build_config
    from esft.es.es_config import ESConfig, save_yaml

    saved = ESConfig(sigma=0.004, population_size=6, output_dir=str(tmp_path / "es"))
    path = tmp_path / "config.yaml"
    save_yaml(saved, path, extra={"algorithm": "es", "torch": "2.x", "train_examples": 200})
    again = build_config(ESConfig, config_file=str(path), overrides={"output_dir": str(tmp_path / "again")})
    assert again == saved.replace(output_dir=str(tmp_path / "again"))
    assert main(["train", "es", "--config", str(path), "--iterations", "-1"]) == 2
    err = capsys.readouterr().err
    assert "iterations = -1 is not accepted" in err and "_run" not in err, err


@pytest.mark.parametrize("text", ["notes, not a drift log\n", '{"step": 1}\n'])
def test_analyze_drift_names_a_file_that_holds_no_drift_records(tmp_path, capsys, no_model_load, text):
    """A --run file that is no drift log was answered "alpha and population are needed", and with those given,
    "no drift records": the first message sent the user after the wrong thing."""
    path = tmp_path / "notes.jsonl"
    path.write_text(text)
    assert main(["analyze", "drift", "--run", str(path), "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"no drift records in {path}: --run takes an ES run folder or a drift JSONL file" in err, err
    assert not (tmp_path / "out").exists()


def test_analyze_drift_reads_back_the_series_it_wrote(tmp_path):
    from esft.analysis import drift as D

    D.DriftSeries(steps=[1, 2], total=[1e-6, 2e-6], num_params=10).write(tmp_path / "series.jsonl")
    assert D.read_series(tmp_path / "series.jsonl").steps == [1, 2]
