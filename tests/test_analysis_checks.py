"""`esft analyze`: out-of-range values and missing checkpoints are refused when the config is built, before the
base model loads (it once loaded first for kl, landscape and sparsity, and accepted --eps -1 or --targets 1.5)."""

from __future__ import annotations

import math

import pytest

from esft.cli import main


@pytest.fixture
def no_model_load(monkeypatch):
    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the analysis options were checked")

    monkeypatch.setattr("esft.models.load_model", load_model)


@pytest.mark.parametrize("argv, words", [
    (["weights", "--tuned", "{missing}"],
     "tuned = '{missing}' is not accepted; expected an existing checkpoint folder"),
    (["weights", "--tuned", "{here}", "--eps", "-1"], "eps = -1.0 is not accepted; expected a finite number >= 0"),
    (["kl", "--stages", "{here},{missing}"], "stages = '{missing}'"),
    (["kl", "--stages", "{here}", "--limit", "0"], "limit = 0 is not accepted; expected an integer >= 1"),
    (["kl", "--stages", "{here}", "--temperature", "-1"], "temperature = -1.0"),
    (["kl", "--aggregate", "{missing}"], "expected an existing kl.json file"),
    (["landscape", "--es", "{here}", "--grpo", "{missing}"], "grpo = '{missing}'"),
    (["landscape", "--es", "{here}", "--magnitude-points", "-1"], "magnitude_points = -1"),
    (["sparsity", "--tuned", "{missing}"], "tuned = '{missing}'"),
    (["sparsity", "--tuned", "{here}", "--targets", "0.5,1.5"], "expected a list of target sparsities in [0, 1]"),
    (["sparsity", "--tuned", "{here}", "--taus=-1e-5"], "expected a list of thresholds >= 0"),
    (["drift", "--run", "{missing}"], "expected an existing run folder or drift JSONL file"),
    (["drift", "--run", "{here}", "--population", "0"], "population = 0"),
    (["drift", "--run", "{here}", "--alpha", "0"], "alpha = 0.0 is not accepted; expected a finite number > 0"),
    (["kl", "--stages", "{here}", "--threads", "0"], "threads = 0"),
    # task names were built only after the base model loaded
    (["kl", "--stages", "{here}", "--tasks", "boolq,bolq"], "tasks = 'bolq' is not accepted; expected a known task"),
    (["landscape", "--es", "{here}", "--holdout-tasks", "none"], "holdout_tasks = 'none' is not accepted"),
    (["sparsity", "--tuned", "{here}", "--tasks", "countdown:numbers=x"], "tasks = 'countdown:numbers=x'"),
    # devices were handed to torch once the base model had loaded: a traceback for a CUDA this torch cannot see
    (["kl", "--stages", "{here}", "--device", "cuda:99"], "device = 'cuda:99' is not accepted; expected a torch"),
    (["landscape", "--es", "{here}", "--device", "bogus"], "device = 'bogus' is not accepted; expected a torch"),
    (["weights", "--tuned", "{here}", "--stable-rank-device", "bogus"], "stable_rank_device = 'bogus'"),
    # zip(labels, stages) analysed two stages of three without a word; a label past the checkpoints was dropped
    (["kl", "--stages", "{here},{here},{here}", "--stage-labels", "a,b"], "expected one name per --stages folder"),
    (["weights", "--tuned", "{here}", "--labels", "es,grpo"], "expected at most one name per --tuned folder"),
    # results are keyed by name: a repeated stage label kept only the last of its stages
    (["kl", "--stages", "{here},{here}", "--stage-labels", "a,a"], "expected distinct names"),
    # an empty sweep evaluated the base model and wrote a table without rows
    (["sparsity", "--tuned", "{here}", "--targets", "", "--taus", ""], "targets = [] is not accepted"),
])
def test_bad_analysis_options_fail_before_the_model_loads(tmp_path, capsys, no_model_load, argv, words):
    paths = {"here": str(tmp_path), "missing": str(tmp_path / "missing")}
    argv = [a.format(**paths) for a in argv]
    assert main(["analyze", *argv, "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert words.format(**paths) in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", [["weights", "--tuned", "{here}"], ["drift", "--run", "{here}"],
                                  ["kl", "--stages", "{here}"], ["landscape", "--es", "{here}"],
                                  ["sparsity", "--tuned", "{here}"]])
def test_an_output_dir_that_is_a_file_is_refused_before_the_analysis_runs(tmp_path, capsys, no_model_load, argv):
    """The analyses ran (minutes) and then ended in "[Errno 17] File exists" when --output-dir named a file."""
    taken = tmp_path / "taken"
    taken.write_text("x")
    (tmp_path / "seeds.jsonl").write_text("")  # a run folder for drift, which reads it only later
    assert main(["analyze", *[a.format(here=tmp_path) for a in argv], "--output-dir", str(taken)]) == 2
    assert f"output_dir {taken} is a file, not a folder" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["weights", "--tuned", "{file}"], ["kl", "--stages", "{file}"],
                                  ["landscape", "--es", "{file}"], ["sparsity", "--tuned", "{file}"]])
def test_a_file_given_for_a_checkpoint_folder_is_named_as_a_file(tmp_path, capsys, no_model_load, argv):
    """A file given as a checkpoint was reported as "checkpoint folder ... does not exist"."""
    file = tmp_path / "model.safetensors"
    file.write_text("x")
    assert main(["analyze", *[a.format(file=file) for a in argv], "--output-dir", str(tmp_path / "out")]) == 2
    assert f"= '{file}' is not accepted; expected a checkpoint folder; {file} is a file" in capsys.readouterr().err


@pytest.mark.parametrize("name, text, words", [
    ("notes.txt", "not json", "notes.txt is not JSON"),
    ("drift.jsonl", '{"step": 1}', "(stages, tasks, incremental and cumulative KL); {path} holds other JSON"),
    ("list.json", "[1, 2]", "{path} holds other JSON"),
    ("kl_aggregate.json", '{"seeds": 2, "stages": [], "tasks": [], "incremental": {}, "cumulative": {}}',
     "{path} is already an aggregate over seeds"),
    ("folder", None, "{path} is a folder"),
])
def test_kl_aggregate_refuses_a_file_that_is_not_a_seed_kl_json(tmp_path, capsys, no_model_load, name, text, words):
    """A file that is not JSON ended in the decoder's "Expecting value: line 1 column 1" without the file's name;
    JSON without stages in a KeyError traceback (exit 1); an aggregate was averaged again into empty cells."""
    path = tmp_path / name
    path.mkdir() if text is None else path.write_text(text)
    assert main(["analyze", "kl", "--aggregate", str(path), "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"aggregate = '{path}' is not accepted; expected a kl.json file written by `esft analyze kl --stages`" \
        in err and words.format(path=path) in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_a_report_refuses_a_device_its_evaluations_cannot_use_before_any_analysis_runs(tmp_path, monkeypatch):
    """`esft report --device cuda` on a torch without CUDA ran weights and drift, then failed KL, landscape and
    sparsity each with "Torch not compiled with CUDA enabled" (exit 1). A drift-only report replays on the runs'
    own device type, so there only the name is checked."""
    import torch

    from esft.analysis.report_builder import ReportConfig
    from esft.config import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="device = 'cuda' is not accepted; .* sees no CUDA device"):
        ReportConfig(dir=str(tmp_path), device="cuda")
    with pytest.raises(ConfigError, match="device = 'cuda' is not accepted"):
        ReportConfig(dir=str(tmp_path), device="cuda", analyses=["weights", "sparsity"])
    assert ReportConfig(dir=str(tmp_path), device="cuda", analyses=["drift"]).device == "cuda"
    with pytest.raises(ConfigError, match="device = 'tpu' is not accepted"):
        ReportConfig(dir=str(tmp_path), device="tpu", analyses=["drift"])


def test_a_report_refuses_an_unknown_analysis_when_built(tmp_path):
    """A misspelt --analyses was refused only after the runs were read, in other words than the other options'
    (no flag named). An empty list stays accepted: a report of the runs' tables only."""
    from esft.analysis.report_builder import ReportConfig
    from esft.config import ConfigError

    with pytest.raises(ConfigError, match=r"analyses = \['weights', 'bogus'\] is not accepted; expected a list of"):
        ReportConfig(dir=str(tmp_path), analyses=["weights", "bogus"])
    assert ReportConfig(dir=str(tmp_path), analyses=[]).analyses == []


def test_a_report_refuses_an_unknown_holdout_task_before_any_analysis_runs(tmp_path):
    """`esft report --holdout-tasks none` ran weights, drift, KL and most of the landscape before Figure 5 failed on
    the name."""
    from esft.analysis.report_builder import ReportConfig
    from esft.config import ConfigError

    with pytest.raises(ConfigError, match="holdout_tasks = 'none' is not accepted; expected a known task name"):
        ReportConfig(dir=str(tmp_path), holdout_tasks=["none"])
    assert ReportConfig(dir=str(tmp_path), holdout_tasks=[]).holdout_tasks == []
    # a data file needs the field options its runs recorded, which the report applies later: not refused here
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(f'{{"q": "{i}?", "a": "{i}"}}\n' for i in range(10)))
    assert ReportConfig(dir=str(tmp_path), holdout_tasks=[str(data)]).holdout_tasks == [str(data)]


def test_good_analysis_options_pass_the_checks(tmp_path):
    from esft.analysis.commands import DriftConfig, KLConfig, SparsityConfig, WeightsConfig

    assert WeightsConfig(tuned=[str(tmp_path)], eps=0.0).eps == 0.0
    assert KLConfig(stages=[str(tmp_path)], temperature=1.0, limit=1).limit == 1
    assert SparsityConfig(tuned=str(tmp_path), targets=[0.0, 1.0], taus=[0.0]).targets == [0.0, 1.0]
    assert DriftConfig(run=str(tmp_path), alpha=1e-3, population=2).population == 2


@pytest.mark.parametrize("argv", [["weights", "--base", "smollm2-135m", "--tuned", "{run}"],
                                  ["kl", "--base", "smollm2-135m", "--stages", "{run}"],
                                  ["weights", "--base", "{run}", "--tuned", "{run}/checkpoints/final"]])
def test_a_run_directory_given_for_a_checkpoint_names_its_final_checkpoint(tmp_path, capsys, argv):
    """`--tuned runs/es` (the run, not its checkpoint) said only "no *.safetensors weights in runs/es"; it is
    refused, as `esft eval --model` refuses it, with the checkpoint folder to give instead; so is such a --base."""
    run = tmp_path / "run"
    (run / "checkpoints" / "final").mkdir(parents=True)
    (run / "config.yaml").write_text("task: boolq\n")
    assert main(["analyze", *[a.format(run=run) for a in argv], "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{run} is a run directory: its model is a checkpoint folder, e.g. {run / 'checkpoints' / 'final'}" in err


def test_an_infinite_threshold_is_refused(tmp_path):
    """tau = inf would revert every coordinate (the base model, not a threshold of the update): only finite
    thresholds >= 0 are accepted."""
    from esft.analysis.commands import SparsityConfig
    from esft.config import ConfigError

    with pytest.raises(ConfigError, match="expected a list of thresholds >= 0"):
        SparsityConfig(tuned=str(tmp_path), taus=[0.0, math.inf])


def test_a_model_folder_with_a_checkpoints_subfolder_is_still_a_checkpoint(tmp_path):
    """Only a folder with checkpoints/ and no config.json is a run directory: a model folder (config.json) that
    also holds a checkpoints/ folder is accepted as the checkpoint it is."""
    from esft.analysis.commands import WeightsConfig

    model = tmp_path / "model"
    (model / "checkpoints").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    assert WeightsConfig(tuned=[str(model)]).tuned == [str(model)]


@pytest.mark.parametrize("argv, words", [
    (["--limit", "0"], "limit = 0 is not accepted; expected an integer >= 1"),
    (["--max-new-tokens", "0"], "max_new_tokens = 0 is not accepted"),
    (["--batch-size", "0"], "batch_size = 0 is not accepted"),
    (["--kl-batch-size", "0"], "kl_batch_size = 0 is not accepted"),
    (["--eps", "-1"], "eps = -1.0 is not accepted; expected a finite number >= 0"),
    (["--sparsity-targets", "0.5,1.5"], "expected a list of target sparsities in [0, 1]"),
    (["--threads", "0"], "threads = 0 is not accepted"),
    (["--dtype", "float8"], "dtype = 'float8' is not accepted"),
    (["--device", "tpu"], "device = 'tpu' is not accepted"),
    (["--exclude", "seed-(42"], "exclude = 'seed-(42' is not accepted; expected regular expressions"),
])
def test_bad_report_options_fail_before_any_run_is_read(tmp_path, capsys, monkeypatch, argv, words):
    """`esft report` read these only in the analyses after weights and drift (minutes in), or, for --exclude, died
    with a re.error traceback; its options are now checked when its config is built, as `esft analyze`'s are."""
    import esft.analysis.report_builder as rb

    def discover(self):
        raise AssertionError("runs were read before the report options were checked")

    monkeypatch.setattr(rb.Report, "discover", discover)
    assert main(["report", str(tmp_path), "--output-dir", str(tmp_path / "report"), *argv]) == 2
    assert words in capsys.readouterr().err


def test_a_checkpoint_of_the_other_algorithm_is_refused_as_that_side_of_the_landscape(tmp_path, capsys, no_model_load):
    """`--es RUNS/grpo/checkpoints/final` (or a swapped pair) ran for minutes and labelled the GRPO update "ES" in
    every table and figure; the run folder says which algorithm a checkpoint comes from, so it is refused first."""
    runs = {}
    for algo in ("es", "grpo"):
        runs[algo] = tmp_path / algo / "checkpoints" / "final"
        runs[algo].mkdir(parents=True)
        (tmp_path / algo / "config.yaml").write_text(f"algorithm: {algo}\nmodel: smollm2-135m\n")
    out = ["--limit", "1", "--output-dir", str(tmp_path / "out")]
    assert main(["analyze", "landscape", "--es", str(runs["grpo"]), "--grpo", str(runs["es"]), *out]) == 2
    err = capsys.readouterr().err
    # both swapped: said at once, not one flag per try
    assert (f"(--es): es = '{runs['grpo']}' is not accepted; expected an ES checkpoint; --es and --grpo are swapped "
            f"({tmp_path / 'grpo'} is a GRPO run, {tmp_path / 'es'} an ES run): give each as the other") in err
    assert main(["analyze", "landscape", "--es", str(runs["grpo"]), *out]) == 2
    assert (f"(--es): es = '{runs['grpo']}' is not accepted; expected an ES checkpoint; {tmp_path / 'grpo'} is a "
            f"GRPO run: give its checkpoint as --grpo") in capsys.readouterr().err
    # two ES runs: --es is taken, so --grpo is told to name a GRPO run's checkpoint, not to move to --es
    assert main(["analyze", "landscape", "--es", str(runs["es"]), "--grpo", str(runs["es"]), *out]) == 2
    assert (f"expected a GRPO checkpoint; {tmp_path / 'es'} is an ES run: give a GRPO run's checkpoint as --grpo"
            in capsys.readouterr().err)
    assert main(["analyze", "landscape", "--grpo", str(runs["es"]), *out]) == 2
    assert (f"expected a GRPO checkpoint; {tmp_path / 'es'} is an ES run: give its checkpoint as --es"
            in capsys.readouterr().err)
    from esft.analysis.commands import LandscapeConfig

    # the right sides, and a checkpoint outside a run folder, pass
    assert LandscapeConfig(es=str(runs["es"]), grpo=str(runs["grpo"])).es == str(runs["es"])
    (tmp_path / "model").mkdir()
    assert LandscapeConfig(grpo=str(tmp_path / "model")).grpo == str(tmp_path / "model")
