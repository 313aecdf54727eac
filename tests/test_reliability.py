"""Reliability probes through the `esft` command line with tiny settings (issue #22): bad values, empty, corrupt
or garbage configs, torn and corrupted logs, a deleted checkpoint file, concurrent writers, an interrupted
evaluation, a crash between the two log appends and a non-finite fitness. Each probe asserts its outcome: a clear
`esft: error: ...` (exit 2 for bad input, 1 at run time) before any model loads, or a correct recovery (the
resumed run ends with the weights of an uninterrupted one).

Real runs use a random-init Llama with the SmolLM2 tokenizer saved as a model folder, and a generated Countdown
variant (no download); a run of 3 iterations takes about a second after loading.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from esft.cli import main

TASK = "countdown:numbers=2,max_number=20,ops=+"


# ---- fixtures -------------------------------------------------------------------------------------------------

@pytest.fixture()
def no_model_load(monkeypatch):
    """Any model load fails the test: validation must refuse before it."""
    import esft.models

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(esft.models, "load_model", refuse)


@pytest.fixture()
def varied_fitness(monkeypatch):
    """Member fitness that differs across members (the random tiny model scores 0 everywhere, which would make
    every update zero and the weight comparisons below trivial); deterministic, so runs are comparable."""
    from esft.es.fitness import MeanReward

    def fitness(self, result, batch):
        n = np.asarray(result.scores).shape[0]
        return np.arange(n, dtype=np.float64) * (1.0 + len(batch)) % 5.0

    monkeypatch.setattr(MeanReward, "__call__", fitness)


def es_args(model: Path, out: Path, *extra: str, iterations: int = 3) -> list[str]:
    return ["train", "es", "--model", str(model), "--task", TASK, "--population-size", "4", "--batch-size", "2",
            "--max-new-tokens", "2", "--iterations", str(iterations), "--eval-every", "0",
            "--checkpoint-every", "1", "--generation-batch-size", "2", "--device", "cpu", "--dtype", "float32",
            "--samples-per-iteration", "0", "--output-dir", str(out), *extra]


def final_weights(run: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(run / "checkpoints" / "final" / "model.safetensors"))


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert np.array_equal(wa[name], wb[name]), name


def error_of(capsys) -> str:
    err = capsys.readouterr().err
    assert "esft: error:" in err, err
    assert "Traceback" not in err, err
    return err


def run_with_varied_fitness(args: list[str]) -> None:
    """`esft` with `args`, each member's fitness a fixed function of its index and the batch size (every update
    real), for the module-scoped reference runs (a function-scoped monkeypatch cannot serve them)."""
    from esft.es.fitness import MeanReward

    mp = pytest.MonkeyPatch()
    mp.setattr(MeanReward, "__call__",
               lambda self, result, batch: np.arange(np.asarray(result.scores).shape[0], dtype=np.float64)
               * (1.0 + len(batch)) % 5.0)
    try:
        assert main(args) == 0
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def reference(tiny_dir, tmp_path_factory) -> Path:
    """An uninterrupted 3-iteration run (varied fitness) the recovered runs must end equal to."""
    out = tmp_path_factory.mktemp("reference") / "run"
    run_with_varied_fitness(es_args(tiny_dir, out))
    norms = [json.loads(x)["update_norm"] for x in (out / "seeds.jsonl").read_text().splitlines()]
    assert len(norms) == 3 and min(norms) > 0  # real updates: the weight comparisons below are not trivial
    return out


# ---- bad values: refused before any model loads ----------------------------------------------------------------

@pytest.mark.parametrize("flag, value, key", [
    ("--alpha", "nan", "alpha"), ("--alpha", "inf", "alpha"), ("--sigma", "0", "sigma"),
    ("--sigma", "-0.5", "sigma"), ("--batch-size", "0", "batch_size"), ("--batch-size", "-3", "batch_size"),
    ("--population-size", "0", "population_size"), ("--max-new-tokens", "0", "max_new_tokens"),
    # past the model's context: a KV cache of tens of GB, allocated once the model had loaded
    ("--max-new-tokens", "100000000", "max_new_tokens"),
    ("--task", "nosuchtask", "task"), ("--task", "countdown:bogus=1", "task"), ("--model", "no-such-model", "model"),
    ("--noise", "gaussian", "noise"), ("--report-to", "tensorbord", "report_to"),
    # more members than distinct 32-bit seeds: the run loaded the model, then drew seeds forever
    ("--population-size", str(2**32 + 1), "population_size"),
])
def test_bad_es_flag_is_refused_before_the_model_loads(tmp_path, capsys, no_model_load, flag, value, key):
    args = ["train", "es", "--preset", "cpu", "--output-dir", str(tmp_path / "run"), flag, value]
    assert main(args) == 2
    err = error_of(capsys)
    assert f"{key} = " in err and "expected" in err and f"--{key.replace('_', '-')}" in err


@pytest.mark.parametrize("extra, key", [
    (["--fitness-rule", "balanced", "--task", "math"], "fitness_rule"),          # no labels to balance over
    (["--eval-balanced", "--eval-limit", "100000"], "eval_limit"),               # more than the rarest label has
    (["--rollout-dtype", "bfloat16", "--noise", "lowrank"], "rollout_dtype"),    # bf16 lanes are member-by-member
    (["--antithetic", "--population-size", "5"], "population_size"),             # mirrored pairs need an even N
    # the executor layout and the fitness rule's options were refused only once the trainer built them, after the
    # model had loaded (or silently accepted: DART-ES options out of range)
    (["--noise", "lowrank", "--executor", "ray"], "noise"),                      # one batched pass: local only
    (["--worker-backend", "vllm"], "worker_backend"),                            # vLLM engines are Ray actors
    (["--fitness-rule", "dart", "--format-bonus", "0.5"], "format_bonus"),       # DART has its own format_coef
    (["--fitness-rule", "dart", "--fitness-options", "{nope: 1}"], "fitness_options"),
    (["--fitness-rule", "dart", "--fitness-options", "{replay_fraction: 2}"], "fitness_options"),
    (["--fitness-rule", "dart", "--fitness-options", "{ema_decay: 5}"], "fitness_options"),
    (["--fitness-options", "{replay_fraction: 0.5}"], "fitness_options"),        # the mean rule takes none
])
def test_cross_field_es_errors_come_before_the_model_loads(tmp_path, capsys, no_model_load, extra, key):
    assert main(["train", "es", "--preset", "cpu", "--output-dir", str(tmp_path / "run"), *extra]) == 2
    err = error_of(capsys)
    assert f"{key} = " in err and "expected" in err


@pytest.mark.parametrize("value, words", [
    # the engine's own error is the reason after "expected", not what is accepted ("expected unknown option")
    ('{"nosuch": 1}', ["expected valid engine options (unknown option 'nosuch'", "packed_linear"]),
    ('{"lean": 3}', ["expected valid engine options (generation_options.lean = 3", "true or false"]),
    ('{"temperature": 0.7}', ["['temperature'] have their own ESConfig fields"]),  # rollouts are greedy
    ('{"min_new_tokens": -1}', ["min_new_tokens as an integer >= 0"]),
    ("[1, 2]", ["'fast', 'exact' or a mapping"]),
])
def test_bad_es_generation_options_are_refused_before_the_model_loads(tmp_path, capsys, no_model_load, value, words):
    assert main(["train", "es", "--preset", "cpu", "--output-dir", str(tmp_path / "run"),
                 "--generation-options", value]) == 2
    err = error_of(capsys)
    assert "generation_options = " in err and all(w in err for w in words), err


@pytest.mark.parametrize("command", [["train", "es", "--preset", "cpu"], ["train", "grpo", "--preset", "cpu"],
                                     ["eval", "--tasks", "boolq", "--limit", "2"]])
@pytest.mark.parametrize("device, words", [("nonsense", ["a torch device"]), ("cuda:99", ["a torch device", "cuda"])])
def test_a_device_this_torch_cannot_use_is_refused_before_the_model_loads(tmp_path, capsys, no_model_load, command,
                                                                          device, words):
    import torch

    if device.startswith("cuda") and torch.cuda.device_count() > 99:
        pytest.skip("this machine has a cuda:99")
    out = [] if command[0] == "eval" else ["--output-dir", str(tmp_path / "run")]
    assert main([*command, *out, "--device", device]) == 2
    err = error_of(capsys)
    assert f"device = '{device}'" in err and all(w in err for w in words), err


def test_es_generation_options_accept_the_named_paths_and_the_forced_length():
    from esft.config import FAST_CPU_GENERATION
    from esft.es.build import generation_config
    from esft.es.es_config import ESConfig

    assert ESConfig(generation_options="fast").generation_options == dict(FAST_CPU_GENERATION)
    assert ESConfig(generation_options="exact").generation_options == {}
    gen = generation_config(ESConfig(max_new_tokens=9, generation_options='{"min_new_tokens": 9, "lean": false}'))
    assert (gen.min_new_tokens, gen.lean, gen.max_new_tokens, gen.temperature) == (9, False, 9, 0.0)


def test_bad_grpo_batch_is_an_error_not_a_zero_division(tmp_path, capsys, no_model_load):
    assert main(["train", "grpo", "--preset", "cpu", "--per-device-train-batch-size", "0",
                 "--output-dir", str(tmp_path / "g")]) == 2
    assert "per_device_train_batch_size = 0" in error_of(capsys)
    assert main(["train", "grpo", "--preset", "cpu", "--top-p", "1.5", "--output-dir", str(tmp_path / "g")]) == 2
    assert "top_p" in error_of(capsys)


@pytest.mark.parametrize("text, line, words", [
    ("sigma: 0.01\npopulation_size: 2.7\n", 2, ["population_size = 2.7", "an integer"]),
    ("alpha: .nan\n", 1, ["alpha = nan", "finite"]),
    ("antithetic: maybe\n", 1, ["antithetic", "true or false"]),
    ("sigma: [1, 2\n", 2, ["not valid YAML"]),
    ("- just\n- a list\n", None, ["mapping"]),
    ("sigmaa: 0.1\n", None, ["unknown option", "did you mean sigma"]),
    ("sigma: 0.01\npreset: gpu\n", 2, ["preset = 'gpu'", "cpu-countdown"]),
    ("task: boolq\ntask_options: {max_chars: 3}\n", 2, ["task_options", "max_chars"]),
    # PyYAML keeps the last of a repeated key silently: the run would use a sigma its author did not read
    ("sigma: 0.001\npopulation_size: 4\nsigma: 0.002\n", 3, ["duplicate key 'sigma' (first on line 1)"]),
    ("task_options:\n  reward: exact\n  reward: math\n", 3, ["duplicate key 'reward' (first on line 2)"]),
])
def test_bad_yaml_config_names_file_and_line(tmp_path, capsys, no_model_load, text, line, words):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(text)
    assert main(["train", "es", "--config", str(cfg), "--output-dir", str(tmp_path / "run")]) == 2
    err = error_of(capsys)
    assert str(cfg) + (f":{line}" if line else "") in err, err
    for word in words:
        assert word in err, err


def test_debug_keeps_the_traceback(tmp_path, no_model_load):
    from esft.config import ConfigError

    with pytest.raises(ConfigError):
        main(["train", "es", "--sigma", "0", "--output-dir", str(tmp_path / "r"), "--debug"])


def test_output_paths_are_checked_before_work(tmp_path, capsys, no_model_load, monkeypatch):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    assert main(["train", "es", "--preset", "cpu", "--output-dir", str(a_file)]) == 2
    assert "is a file" in error_of(capsys)
    assert main(["train", "grpo", "--preset", "cpu", "--output-dir", str(a_file / "run")]) == 2
    assert "is a file" in error_of(capsys)
    import esft.evaluation

    monkeypatch.setattr(esft.evaluation, "run_eval", lambda *a, **k: pytest.fail("evaluated before the path check"))
    assert main(["eval", "--tasks", TASK, "--limit", "1", "--output-dir", str(a_file)]) == 2
    assert "is a file" in error_of(capsys)


def test_unwritable_output_dir_is_refused(tmp_path, capsys, no_model_load, monkeypatch):
    import esft.rundir

    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    if os.geteuid() == 0:  # root may write anywhere: the permission bits are read, as for any other user
        monkeypatch.setattr(esft.rundir.os, "access", lambda path, mode: Path(path) != locked)
    try:
        assert main(["train", "es", "--preset", "cpu", "--output-dir", str(locked / "run")]) == 2
        assert "not writable" in error_of(capsys)
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize("algorithm", ["es", "grpo"])
def test_a_misspelt_preset_is_one_line_naming_the_presets(tmp_path, capsys, no_model_load, algorithm):
    assert main(["train", algorithm, "--preset", "cpu-countdwn", "--output-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown preset 'cpu-countdwn'" in err and "cpu" in err


def test_report_of_a_missing_folder_fails(tmp_path, capsys):
    assert main(["report", str(tmp_path / "typo")]) == 2
    assert "not a folder" in error_of(capsys)
    assert not (tmp_path / "typo").exists()
    (tmp_path / "empty").mkdir()  # a folder holding no run is an error too, not an empty report
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "no run directory" in error_of(capsys)
    assert main(["analyze", "drift", "--run", str(tmp_path / "typo"), "--output-dir", str(tmp_path / "d")]) == 2
    err = error_of(capsys)
    assert f"run = '{tmp_path / 'typo'}' is not accepted; expected an existing run folder or drift JSONL file" in err


def test_eval_bad_values_and_unknown_task(capsys, no_model_load):
    assert main(["eval", "--tasks", "boolq", "--batch-size", "0"]) == 2
    assert "batch_size = 0" in error_of(capsys)
    assert main(["eval", "--tasks", "boolq,nosuch"]) == 2
    assert "nosuch" in error_of(capsys)


@pytest.mark.parametrize("command", [["train", "es", "--fitness-options"], ["train", "es", "--task-options"],
                                     ["train", "grpo", "--trl-args"], ["eval", "--limit", "1", "--task-options"],
                                     ["eval", "--limit", "1", "--generation-options"]])
def test_malformed_mapping_flag_is_one_line_not_a_yaml_traceback(tmp_path, capsys, no_model_load, command):
    out = [] if command[0] == "eval" else ["--output-dir", str(tmp_path / "run")]
    assert main([*command, "{bad", *out]) == 2
    err = error_of(capsys).strip()
    assert err.count("\n") == 0 and "'{bad'" in err, err


@pytest.mark.parametrize("command", [["train", "es", "--fitness-options"], ["train", "es", "--task-options"],
                                     ["train", "grpo", "--trl-args"], ["eval", "--limit", "1", "--task-options"],
                                     ["eval", "--limit", "1", "--generation-options"],
                                     ["train", "es", "--generation-options"]])
def test_a_value_that_is_no_mapping_is_located_at_its_flag(tmp_path, capsys, no_model_load, command):
    out = [] if command[0] == "eval" else ["--output-dir", str(tmp_path / "run")]
    assert main([*command, "7", *out]) == 2
    key = command[-1].removeprefix("--").replace("-", "_")
    assert f"command line ({command[-1]}): {key} = '7' is not accepted; expected " in error_of(capsys)


def test_a_report_generation_options_that_is_no_mapping_is_located(tmp_path, capsys, no_model_load):
    assert main(["report", str(tmp_path), "--generation-options", "7"]) == 2
    assert "command line (--generation-options): generation_options = '7' is not accepted" in error_of(capsys)
    config = tmp_path / "report.yaml"
    config.write_text("generation_options: {nope: 1}\n")
    assert main(["report", str(tmp_path), "--config", str(config)]) == 2
    assert f"{config}:1: generation_options = " in error_of(capsys)


@pytest.mark.parametrize("field", ["task_options", "generation_options"])
def test_an_eval_config_file_value_that_is_no_mapping_is_located_at_its_line(tmp_path, capsys, no_model_load, field):
    config = tmp_path / "eval.yaml"
    config.write_text(f"tasks: [boolq]\nlimit: 1\n{field}: 7\n")
    assert main(["eval", "--config", str(config)]) == 2
    assert f"{config}:3: {field} = 7 is not accepted; expected " in error_of(capsys)


@pytest.mark.parametrize("extra, key", [
    (["train", "es", "--include", "["], "include"), (["train", "es", "--exclude", "norm,("], "exclude"),
    (["train", "grpo", "--optim", "adamw_bogus"], "optim"),
    (["train", "grpo", "--lr-scheduler-type", "linaer"], "lr_scheduler_type"),
    (["train", "grpo", "--loss-type", "grpoo"], "loss_type"),  # TRL refused it only at the first loss
])
def test_names_refused_only_after_loading_are_checked_first(tmp_path, capsys, no_model_load, extra, key):
    assert main([*extra, "--preset", "cpu", "--output-dir", str(tmp_path / "run")]) == 2
    err = error_of(capsys)
    assert f"{key} = " in err and "expected" in err and f"--{key.replace('_', '-')}" in err, err
    assert not (tmp_path / "run").exists()


def test_eval_unknown_split_is_refused_before_the_model_loads(capsys, no_model_load):
    assert main(["eval", "--tasks", "boolq", "--limit", "1", "--split", "tset"]) == 2
    err = error_of(capsys)
    assert "split = 'tset'" in err and "train, test" in err and "--split" in err, err


@pytest.mark.parametrize("argv, key", [
    (["eval", "--tasks", "boolq", "--limit", "1", "--max-new-tokens", "8193"], "max_new_tokens"),
    (["train", "grpo", "--preset", "cpu", "--max-completion-length", "100000000"], "max_completion_length"),
    (["train", "grpo", "--preset", "cpu", "--eval-every", "5", "--eval-max-new-tokens", "9000"], "eval_max_new_tokens"),
])
def test_completions_past_the_models_context_are_refused_before_it_loads(tmp_path, capsys, no_model_load, argv,
                                                                         key):
    assert main([*argv, "--output-dir", str(tmp_path / "out")]) == 2
    err = error_of(capsys)
    assert f"{key} = " in err and "expected an integer from 1 to 8192, the context length of model smollm2-135m" in err
    assert not (tmp_path / "out").exists()


def test_output_dir_that_is_a_file_is_refused_by_experiment_and_report(tmp_path, capsys):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for dry in (["--dry-run"], []):
        assert main(["experiment", "run", "cpu-mini-single", "--output-dir", str(a_file), *dry]) == 2
        assert "is a file" in error_of(capsys)
    (tmp_path / "runs").mkdir()
    assert main(["report", str(tmp_path / "runs"), "--output-dir", str(a_file)]) == 2
    assert "is a file" in error_of(capsys)
    assert a_file.read_text() == "x"


def test_grpo_resume_of_a_folder_without_a_run_starts_nothing(tmp_path, capsys, no_model_load):
    assert main(["train", "grpo", "--preset", "cpu", "--resume", "--output-dir", str(tmp_path / "typo")]) == 2
    assert "cannot resume" in error_of(capsys)
    assert not (tmp_path / "typo").exists()

# ---- experiment specs: --dry-run rejects each bad value at its line ---------------------------------------------

SPEC = """name: probe
kind: sequential
tasks: [countdown]
algorithms:
  es:
    preset: cpu
    iterations: 2
    population_size: 8
  grpo:
    preset: cpu
    max_steps: 2
evaluation:
  limit: 2
"""


@pytest.mark.parametrize("old, new, line, key", [
    ("population_size: 8", "population_size: 0", 8, "population_size = 0"),
    ("population_size: 8", "population_size: 2.7", 8, "population_size = 2.7"),
    ("population_size: 8", "population_size: 8\n    sigma: -0.5", 9, "sigma = -0.5"),
    ("population_size: 8", "population_size: 8\n    alpha: .nan", 9, "alpha = nan"),
    ("population_size: 8", "population_size: 8\n    max_new_tokens: 0", 9, "max_new_tokens = 0"),
    ("max_steps: 2", "max_steps: 2\n    max_completion_length: 0", 12, "max_completion_length = 0"),
    ("max_steps: 2", "max_steps: 2\n    learning_rate: -1", 12, "learning_rate = -1"),
])
def test_experiment_dry_run_rejects_bad_values_at_their_line(tmp_path, capsys, old, new, line, key):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace(old, new, 1))
    assert main(["experiment", "run", str(spec), "--dry-run"]) == 2
    err = error_of(capsys)
    assert f"spec.yaml:{line}:" in err and key in err, err
    spec.write_text(SPEC)
    assert main(["experiment", "run", str(spec), "--dry-run"]) == 0


# ---- run directories ------------------------------------------------------------------------------------------

def test_concurrent_writer_is_refused(tiny_dir, tmp_path, capsys):
    import subprocess
    import sys

    out = tmp_path / "run"
    holder = ("import sys, time; from esft.rundir import RunLock; lock = RunLock(sys.argv[1]).acquire(); "
              "print('locked', flush=True); time.sleep(60)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    other = subprocess.Popen([sys.executable, "-c", holder, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    try:  # another process (a trainer at work) holds the folder
        assert other.stdout.readline().strip() == "locked"
        assert main(es_args(tiny_dir, out)) == 1
        assert "another esft process" in error_of(capsys)
        assert not (out / "seeds.jsonl").exists()
    finally:
        other.kill()
        other.wait()
    assert main(es_args(tiny_dir, out)) == 0  # the lock goes with its holder, even one killed


def test_a_run_refused_before_it_starts_leaves_no_folder_behind(tmp_path, capsys, monkeypatch):
    """The CLI's early busy-folder probe creates nothing: a run refused after it (here: a tracker package that is
    not installed) leaves no output folder holding only a lock file."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trackio" else real(name, *a))
    out = tmp_path / "new"
    assert main(["train", "es", "--report-to", "trackio", "--iterations", "1", "--output-dir", str(out)]) == 2
    assert "needs the" in error_of(capsys) and not out.exists()


def test_rerun_into_a_used_folder_is_a_clean_error(tiny_dir, reference, tmp_path, capsys):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(reference, out)
    assert main(es_args(tiny_dir, out)) == 2
    assert "already holds a run" in error_of(capsys)


@pytest.mark.parametrize("algorithm", ["es", "grpo"])
def test_a_used_folder_is_refused_before_the_model_loads(tiny_dir, reference, tmp_path, capsys, no_model_load,
                                                        algorithm):
    """A new run into a folder holding one was refused only by the trainer's folder set-up, after the model had
    loaded (seconds here, minutes for a large model)."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(reference, out)
    args = (es_args(tiny_dir, out) if algorithm == "es" else
            ["train", "grpo", "--model", str(tiny_dir), "--task", TASK, "--max-steps", "1", "--output-dir", str(out)])
    assert main(args) == 2
    err = error_of(capsys)
    assert "already holds" in err and "model was loaded" not in err


@pytest.mark.parametrize("content", ["", "\n", b"\x00\xff\xfe garbage \x81", "sigma: [1,\n"])
def test_resume_refuses_an_empty_or_unreadable_config(tiny_dir, reference, tmp_path, capsys, content):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(reference, out)
    cfg = out / "config.yaml"
    cfg.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = cfg.read_bytes()
    assert main(["train", "es", "--resume", str(out)]) == 2
    error_of(capsys)
    assert cfg.read_bytes() == before  # not overwritten with defaults
    cfg.unlink()
    assert main(["train", "es", "--resume", str(out)]) == 2
    assert "no config.yaml" in error_of(capsys)


def test_resume_refuses_fewer_iterations_and_another_folder(reference, tmp_path, capsys, no_model_load):
    """A resume that would end before the logged iterations, or that names another --output-dir, is refused
    before any model loads, and the run's files stay as they were."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(reference, out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert main(["train", "es", "--resume", str(out), "--iterations", "2"]) == 2
    assert "3 iterations logged" in error_of(capsys)
    other = tmp_path / "other"
    assert main(["train", "es", "--resume", str(out), "--output-dir", str(other)]) == 2
    assert "in place" in error_of(capsys) and not other.exists()
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("log", ["metrics.jsonl", "seeds.jsonl"])
def test_corrupt_middle_line_is_reported_not_truncated(tiny_dir, reference, tmp_path, capsys, monkeypatch, log):
    """Both logs are refused before the model loads (a damaged metrics.jsonl was found only after it had)."""
    import shutil

    import esft.models

    def no_load(*args, **kwargs):
        raise AssertionError("the model loaded before the damaged log was found")

    monkeypatch.setattr(esft.models, "load_model", no_load)

    out = tmp_path / "run"
    shutil.copytree(reference, out)
    path = out / log
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = '{"iteration": 1, "broken\n'
    path.write_text("".join(lines))
    before = path.read_bytes()
    assert main(["train", "es", "--resume", str(out)]) == 1
    err = error_of(capsys)
    assert f"{log}:2:" in err, err
    assert path.read_bytes() == before  # nothing after the bad line was dropped


def test_torn_last_line_resumes_bit_identical(tiny_dir, reference, tmp_path, varied_fitness):
    out = tmp_path / "run"
    assert main(es_args(tiny_dir, out, iterations=2)) == 0
    with open(out / "seeds.jsonl", "a") as fh:
        fh.write('{"iteration": 2, "batch": [1')  # a crash mid-write
    assert main(es_args(tiny_dir, out, "--resume", str(out), iterations=3)) == 0
    assert [json.loads(x)["iteration"] for x in (out / "seeds.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert_same_weights(out, reference)
    assert (out / "curve.png").stat().st_size > 1000  # the run's learning curve, written by every training run


def test_damaged_final_checkpoint_falls_back_to_the_previous_one(tiny_dir, reference, tmp_path, capsys,
                                                                 varied_fitness):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(reference, out)
    (out / "checkpoints" / "final" / "model.safetensors").unlink()
    (out / "checkpoints" / "iter_000002" / "model.safetensors").write_bytes(b"truncated")
    assert main(["train", "es", "--resume", str(out)]) == 0
    err = capsys.readouterr().err
    assert "final" in err and "iter_000002" in err  # both damaged ones are reported
    assert_same_weights(out, reference)  # iter_000001 + the seed log's iterations 1 and 2


def test_damaged_checkpoint_at_the_resume_step_is_written_again(tiny_dir, reference, tmp_path, capsys,
                                                                 varied_fitness):
    import shutil

    from safetensors.numpy import load_file

    out = tmp_path / "run"
    shutil.copytree(reference, out)
    shutil.rmtree(out / "checkpoints" / "final")  # stopped after iteration 2 (step 2) was logged
    lines = (out / "seeds.jsonl").read_text().splitlines()[:2]
    (out / "seeds.jsonl").write_text("\n".join(lines) + "\n")
    damaged = out / "checkpoints" / "iter_000002" / "model.safetensors"
    damaged.write_bytes(b"truncated")
    assert main(["train", "es", "--resume", str(out)]) == 0
    assert "iter_000002" in capsys.readouterr().err
    assert load_file(str(damaged)) and damaged.stat().st_size > 1000  # step 2's checkpoint is due: rewritten
    assert_same_weights(out, reference)


def test_interrupted_evaluation_writes_its_checkpoint_on_resume(tiny_dir, tmp_path, monkeypatch, varied_fitness):
    from esft.es.trainer import ESTrainer

    out = tmp_path / "run"
    args = es_args(tiny_dir, out, "--eval-every", "2", "--eval-limit", "2", "--checkpoint-every", "2", iterations=4)
    evaluate = ESTrainer.evaluate

    def stop_at_step_two(self):
        if self.step == 2:
            raise KeyboardInterrupt
        return evaluate(self)

    monkeypatch.setattr(ESTrainer, "evaluate", stop_at_step_two)
    assert main(args) == 130
    assert not (out / "checkpoints" / "iter_000002").exists()
    monkeypatch.setattr(ESTrainer, "evaluate", evaluate)
    assert main(["train", "es", "--resume", str(out)]) == 0
    assert (out / "checkpoints" / "iter_000002").exists()
    evals = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()
             if json.loads(x)["kind"] == "eval"]
    assert evals == [0, 2, 4]
    reference = tmp_path / "reference"
    assert main(es_args(tiny_dir, reference, "--eval-every", "2", "--eval-limit", "2", "--checkpoint-every", "2",
                        iterations=4)) == 0
    assert_same_weights(out, reference)


def test_crash_between_log_appends_keeps_the_pair(tiny_dir, reference, tmp_path, monkeypatch, varied_fitness):
    from esft.es import es_rundir

    out = tmp_path / "run"
    append = es_rundir.append_jsonl

    def crash_before_second_seed_line(path, record, sync=True):
        if Path(path).name == "seeds.jsonl" and record.get("iteration") == 1:
            raise KeyboardInterrupt  # the process dies between the metrics and the seed-log append
        append(path, record, sync)

    monkeypatch.setattr(es_rundir, "append_jsonl", crash_before_second_seed_line)
    assert main(es_args(tiny_dir, out)) == 130
    monkeypatch.setattr(es_rundir, "append_jsonl", append)
    assert main(["train", "es", "--resume", str(out)]) == 0
    seeds = [json.loads(x)["iteration"] for x in (out / "seeds.jsonl").read_text().splitlines()]
    train = [json.loads(x)["iteration"] for x in (out / "metrics.jsonl").read_text().splitlines()
             if json.loads(x)["kind"] == "train"]
    assert seeds == train == [0, 1, 2]
    assert_same_weights(out, reference)


def test_non_finite_fitness_stops_before_anything_is_written(tiny_dir, tmp_path, capsys, monkeypatch):
    from esft.es.fitness import MeanReward

    out = tmp_path / "run"
    calls = {"n": 0}

    def fitness(self, result, batch):
        calls["n"] += 1
        n = np.asarray(result.scores).shape[0]
        return np.full(n, np.nan) if calls["n"] == 2 else np.arange(n, dtype=np.float64)

    monkeypatch.setattr(MeanReward, "__call__", fitness)
    assert main(es_args(tiny_dir, out)) == 1
    assert "non-finite fitness" in error_of(capsys)
    assert len((out / "seeds.jsonl").read_text().splitlines()) == 1  # the bad iteration is not logged
    assert (out / "checkpoints" / "iter_000001" / "model.safetensors").exists()  # the last good one
    assert not (out / "checkpoints" / "final").exists()
    weights = final_weights_of(out / "checkpoints" / "iter_000001")
    assert all(np.isfinite(w).all() for w in weights.values())


def final_weights_of(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(folder / "model.safetensors"))


def test_grpo_non_finite_loss_stops_before_the_step_is_saved(tmp_path, tokenizer, monkeypatch):
    pytest.importorskip("trl")
    from conftest import make_tiny_model
    from esft.grpo.run import list_checkpoints, train_grpo
    from esft.grpo.trl_trainer import EsftGRPOTrainer
    from esft.rundir import NonFiniteError
    from grpo_tiny import ParityTask, tiny_config

    compute_loss = EsftGRPOTrainer.compute_loss

    def nan_at_second_step(self, *args, **kwargs):
        loss = compute_loss(self, *args, **kwargs)
        return loss * float("nan") if self.state.global_step == 1 else loss

    monkeypatch.setattr(EsftGRPOTrainer, "compute_loss", nan_at_second_step)
    out = tmp_path / "grpo"
    config = tiny_config(out, max_steps=3, save_steps=1, eval_every=0)
    with pytest.raises(NonFiniteError, match="step 2"):
        train_grpo(config, model=make_tiny_model(), tokenizer=tokenizer, task=ParityTask(), progress=False)
    assert [s for s, _ in list_checkpoints(out)] == [1]  # the last good step; step 2's weights never written
    assert not (out / "checkpoints" / "final").exists()


def test_replay_verify_reports_a_missing_file_as_damage(reference, tmp_path, capsys):
    import shutil

    from esft.es.replay import main as replay_main

    out = tmp_path / "run"
    shutil.copytree(reference, out)
    assert replay_main(["verify", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["bit_identical"] is True
    (out / "checkpoints" / "final" / "model.safetensors").unlink()
    assert replay_main(["verify", str(out)]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["bit_identical"] is None and "lacks" in result["damaged"]


def test_checkpoint_folder_moves_survive_leftovers(tmp_path):
    """demote_final replaces a folder already holding its new name (a damaged copy); prune_checkpoints deletes
    past a leftover `.old_*` folder of a killed process and sweeps such folders."""
    from esft.rundir import demote_final, prune_checkpoints

    root = tmp_path / "checkpoints"
    for name in ("iter_000001", "iter_000002", "final", ".old_iter_000001", ".old_final"):
        (root / name).mkdir(parents=True)
        (root / name / "weights").write_text(name)
    moved = demote_final(root / "final", 2)
    assert moved == root / "iter_000002" and (moved / "weights").read_text() == "final"
    assert not (root / "final").exists()
    gone = prune_checkpoints([(1, root / "iter_000001"), (2, root / "iter_000002")], 1)
    assert gone == [root / "iter_000001"]
    assert sorted(p.name for p in root.iterdir()) == ["iter_000002"]


def test_a_new_es_run_leaves_a_grpo_run_in_its_folder_alone(tiny_dir, tmp_path, capsys):
    """A folder holding a GRPO run (metrics, TRL checkpoints, no seed log) is a used folder for ES too: a new ES
    run there refuses. It used to delete the GRPO run's metrics.jsonl and replace its config.yaml and final
    checkpoint."""
    out = tmp_path / "grpo-run"
    (out / "checkpoints" / "final").mkdir(parents=True)
    (out / "checkpoints" / "final" / "trainer_state.json").write_text('{"global_step": 4}')
    (out / "metrics.jsonl").write_text('{"kind":"eval","step":0}\n{"kind":"train","step":1,"reward":0.5}\n')
    (out / "config.yaml").write_text("task: parity\nmax_steps: 4\n_run: {algorithm: grpo}\n")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert main(es_args(tiny_dir, out)) == 2
    # the command that continues it is GRPO's (`esft train es --resume` would refuse a GRPO run)
    assert (f"already holds a GRPO run (continue it with `esft train grpo --resume --output-dir {out}`): choose a "
            "new output_dir for this ES run") in error_of(capsys)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"} == before


# ---- SIGKILL and a full disk: resume continues bit-identically ---------------------------------------------------

#: A child that runs `esft train es` (varied fitness, as the fixture above) and SIGKILLs itself at one moment
KILLED_RUN = """
import json, os, signal, sys
from pathlib import Path
import numpy as np
from esft.cli import main
from esft.es import es_rundir
from esft.es.fitness import MeanReward

MeanReward.__call__ = lambda self, result, batch: (np.arange(np.asarray(result.scores).shape[0], dtype=np.float64)
                                                   * (1.0 + len(batch)) % 5.0)
point = sys.argv[1]
append, rewrite, replace = es_rundir.append_jsonl, es_rundir.rewrite_jsonl, es_rundir.replace_dir

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def append_or_die(path, record, sync=True):
    if point == "torn-metrics-line" and record.get("kind") == "train" and record["step"] == 3:
        with open(path, "a") as fh:
            fh.write(json.dumps(record)[:40])
            fh.flush()
        die()
    append(path, record, sync)
    if point == "after-seed-line" and Path(path).name == "seeds.jsonl" and record["iteration"] == 2:
        die()

def rewrite_or_die(path, records):
    rewrite(path, records)
    if point == "mid-evaluation" and Path(path).name == "eval_000002.jsonl":
        die()

def replace_or_die(src, dst):
    if point == "mid-checkpoint" and dst.name == "iter_000002":
        die()
    replace(src, dst)

es_rundir.append_jsonl, es_rundir.rewrite_jsonl, es_rundir.replace_dir = append_or_die, rewrite_or_die, replace_or_die
sys.exit(main(sys.argv[2:]))
"""

VOLATILE = ("seconds", "peak_rss_mb", "time", "generated_tokens_per_s")


def run_records(run: Path) -> dict[str, object]:
    """What a resumed run must reproduce exactly: its log records (timings aside), seed log, samples, weights."""
    metrics = [{k: v for k, v in json.loads(line).items() if k not in VOLATILE}
               for line in (run / "metrics.jsonl").read_text().splitlines()]
    samples = {p.name: p.read_bytes() for p in sorted((run / "samples").iterdir())}
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    return {"metrics": metrics, "seeds": (run / "seeds.jsonl").read_bytes(), "samples": samples,
            "checkpoints": checkpoints, "weights": {k: v.tobytes() for k, v in final_weights(run).items()}}


def eval_args(model: Path, out: Path) -> list[str]:
    return [*es_args(model, out, "--eval-every", "2", "--eval-limit", "2", "--checkpoint-every", "2",
                     "--samples-per-iteration", "1", iterations=4)]


@pytest.fixture(scope="module")
def reference_with_evals(tiny_dir, tmp_path_factory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("reference-evals") / "run"
    run_with_varied_fitness(eval_args(tiny_dir, out))
    return run_records(out)


@pytest.mark.parametrize("point", ["torn-metrics-line", "after-seed-line", "mid-evaluation", "mid-checkpoint"])
def test_sigkill_then_resume_is_bit_identical(tiny_dir, reference_with_evals, tmp_path, varied_fitness, point):
    """A real SIGKILL (no handler runs) at one moment of iteration 3 or of step 2's evaluation / checkpoint, then
    `--resume`: the run's records, samples and weights equal an uninterrupted run's. After the seed-log line the
    iteration is committed: its samples file used to be written only after it, so the kill lost it for good."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    killed = subprocess.run([sys.executable, "-c", KILLED_RUN, point, *eval_args(tiny_dir, out)], env=env,
                            capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert main(["train", "es", "--resume", str(out)]) == 0
    assert run_records(out) == reference_with_evals


def test_a_full_disk_during_a_checkpoint_leaves_no_half_copy(tiny_dir, reference, tmp_path, capsys, monkeypatch,
                                                             varied_fitness):
    """ENOSPC while the model file of a checkpoint is written: one line naming the file and the resume command,
    no half-written `.tmp_*` folder left taking the space; the resume then ends as an uninterrupted run."""
    import errno

    from transformers import PreTrainedModel

    save = PreTrainedModel.save_pretrained

    def disk_full_at_step_two(self, folder, *args, **kwargs):
        if "iter_000002" in str(folder):
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / "model.safetensors").write_bytes(b"\0" * 4096)  # as much as fitted
            raise OSError(errno.ENOSPC, "No space left on device", str(Path(folder) / "model.safetensors"))
        return save(self, folder, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", disk_full_at_step_two)
    out = tmp_path / "run"
    assert main(es_args(tiny_dir, out)) == 1
    err = error_of(capsys).strip().splitlines()[-1]  # after the progress bar: the one line of the error
    assert err.startswith("esft: error:") and "No space left on device" in err and "iter_000002" in err, err
    assert f"--resume {out}" in err, err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["iter_000001"]
    monkeypatch.setattr(PreTrainedModel, "save_pretrained", save)
    assert main(["train", "es", "--resume", str(out)]) == 0
    assert_same_weights(out, reference)


def test_a_full_disk_while_appending_a_log_names_the_log(tiny_dir, reference, tmp_path, capsys, monkeypatch,
                                                         varied_fitness):
    """ENOSPC in the middle of a metrics.jsonl append (a write names no file by itself): the error names the log
    and the resume command; the torn line is dropped on resume."""
    import errno

    import esft.rundir

    class FullDisk:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, text):
            self.fh.write(text[: len(text) // 2])
            self.fh.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

    appends = {"train": 0}

    def open_on_a_full_disk(path, mode="r", *args, **kwargs):
        fh = open(path, mode, *args, **kwargs)
        if Path(path).name == "metrics.jsonl" and mode == "a":
            appends["train"] += 1
            if appends["train"] == 2:
                return FullDisk(fh)
        return fh

    monkeypatch.setattr(esft.rundir, "open", open_on_a_full_disk, raising=False)
    out = tmp_path / "run"
    assert main(es_args(tiny_dir, out)) == 1
    err = error_of(capsys).strip().splitlines()[-1]
    assert err.startswith("esft: error:") and "No space left on device" in err and f"{out}/metrics.jsonl" in err
    assert f"--resume {out}" in err, err
    monkeypatch.delattr(esft.rundir, "open")
    assert main(["train", "es", "--resume", str(out)]) == 0
    assert_same_weights(out, reference)


def test_eval_refuses_an_output_dir_holding_another_evaluation(tmp_path, capsys, no_model_load):
    """`esft eval --output-dir D` replaced D/summary.json of an earlier evaluation (another limit, model or task)
    without a word; the same evaluation again may still overwrite its own results."""
    import dataclasses

    from esft.evaluation import check_previous_results

    from esft.eval_config import EvalConfig

    out = tmp_path / "ev"
    out.mkdir()
    earlier = EvalConfig(tasks=["countdown"], limit=5, output_dir=str(out))
    summary = json.dumps({"config": dataclasses.asdict(earlier), "results": {"countdown": {"accuracy": 0.4}}},
                         default=str)
    (out / "summary.json").write_text(summary)
    assert main(["eval", "--tasks", "countdown", "--limit", "2", "--output-dir", str(out)]) == 2
    err = error_of(capsys)
    assert "summary.json holds the results of another evaluation (limit: 5 there, 2 now)" in err, err
    assert (out / "summary.json").read_text() == summary
    check_previous_results(EvalConfig(tasks=["countdown"], limit=5, output_dir=str(out)))  # the same one: passes
    (out / "summary.json").write_text("not json")  # not an evaluation's summary: nothing to protect
    check_previous_results(EvalConfig(tasks=["countdown"], limit=2, output_dir=str(out)))
