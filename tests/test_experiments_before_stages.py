"""What `esft experiment run` checks before any stage runs, as `esft train` checks its flags before a model loads:
the devices a spec names against this machine, ES parameter selections against the model's parameter names,
evaluation options a run with eval_every 0 would ignore; and a stage that trained nothing before it failed, which
a re-run with a fixed spec must not refuse as "trained with other options".

Run: pytest tests/test_experiments_before_stages.py -q
"""

from __future__ import annotations

import json

import pytest

from conftest import load_spec_text
from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from esft.experiments import SpecError, run_experiment
from esft.experiments.plan import build_plan
from experiments_tiny import ES_BLOCK, TinyHooks, write_spec

# one task and no holdouts: each parse builds only Countdown
SPEC = """\
name: checks
kind: single-task
tasks: [countdown]
algorithms:
  es:
    preset: cpu
    iterations: 2
  grpo:
    preset: cpu
    max_steps: 2
evaluation:
  limit: 3
  holdout: []
"""
ES = "    iterations: 2\n"
GRPO = "    max_steps: 2\n"
EVAL = "  limit: 3\n"


def _spec(tmp_path, old: str, new: str):
    assert old in SPEC
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.replace(old, new, 1))
    return path


def _never_run(monkeypatch):
    """The runner, replaced: a spec refused before its stages never reaches it (without the check, the real
    runner would evaluate the base model first)."""
    from esft.experiments import runner

    def refused(*args, **kwargs):
        raise AssertionError("the experiment started")

    monkeypatch.setattr(runner, "run_experiment", refused)


# ---- devices: checked against this machine before any stage, as `esft train --device` ----------------------------

@pytest.mark.parametrize("old,new,line,where", [
    (ES, ES + "    device: cuda\n", 8, "algorithms.es.device"),
    (GRPO, GRPO + "    device: cuda\n", 11, "algorithms.grpo.device"),
    (EVAL, EVAL + "  device: cuda\n", 13, "evaluation.device"),
    (ES, ES + "    per_task:\n      countdown: {device: cuda}\n", 9, "algorithms.es.per_task.countdown.device"),
    (GRPO, GRPO + "  grpo->es:\n    es: {iterations: 1, device: 'cuda:0'}\n", 12, "algorithms.grpo->es.es.device"),
])
def test_a_device_this_machine_lacks_is_refused_before_any_stage(tmp_path, capsys, monkeypatch, old, new, line,
                                                                 where):
    """`device: cuda` on a machine without CUDA evaluated the base model, then failed each stage with "Torch not
    compiled with CUDA enabled" (evaluation.device: the base stage failed and training started anyway). The run
    is refused at the line, with `esft train --device`'s words; the dry run still passes: a spec may be checked on
    another machine than the one that runs it (the shipped paper specs name cuda)."""
    import torch

    from esft.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _never_run(monkeypatch)
    path, out = _spec(tmp_path, old, new), tmp_path / "out"
    assert main(["experiment", "run", str(path), "--output-dir", str(out), "--dry-run"]) == 0
    capsys.readouterr()
    assert main(["experiment", "run", str(path), "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"esft: error: {path}:{line}: {where} = 'cuda") and len(err.splitlines()) == 1, err
    assert "sees no CUDA device, so use cpu here" in err
    assert not out.exists()


def test_devices_this_machine_has_pass(tmp_path):
    from esft.experiments.spec_checks import check_spec_devices

    spec = load_spec_text(tmp_path, SPEC.replace(ES, ES + "    device: cpu\n").replace(EVAL, EVAL + "  device: cpu\n"))
    check_spec_devices(spec)


# ---- ES parameter selections: from the model's skeleton, before any weights load ---------------------------------

@pytest.mark.parametrize("old,new,line,where", [
    (ES, ES + "    include: [nosuchparam]\n", 8, "algorithms.es.include"),
    (ES, ES + "    per_task:\n      countdown:\n        exclude: ['.']\n", 10,
     "algorithms.es.per_task.countdown.exclude"),
    (GRPO, GRPO + "  grpo->es:\n    es: {iterations: 1, include: [nosuchparam]}\n", 12,
     "algorithms.grpo->es.es.include"),
])
def test_a_parameter_selection_that_selects_nothing_is_refused_by_the_dry_run(tmp_path, capsys, monkeypatch, old,
                                                                              new, line, where):
    """`include: [nosuchparam]` passed --dry-run and failed only after the base model's evaluation ("no parameters
    selected"); `esft train es --include nosuchparam` is refused before the weights load. The spec is too, by the
    dry run as by the run (the check reads the model's config, no weights)."""
    from esft.cli import main

    _never_run(monkeypatch)
    path = _spec(tmp_path, old, new)
    for dry in (["--dry-run"], []):
        assert main(["experiment", "run", str(path), "--output-dir", str(tmp_path / "out"), *dry]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"esft: error: {path}:{line}: {where}: no parameters selected"), err
    assert main(["experiment", "run", str(_spec(tmp_path, ES, ES + "    include: ['layers\\.0\\.']\n")),
                 "--output-dir", str(tmp_path / "out"), "--dry-run"]) == 0


# ---- evaluation options a run with eval_every 0 never reads ------------------------------------------------------

@pytest.mark.parametrize("old,new,line,where", [
    (ES, ES + "    eval_every: 0\n    eval_limit: 10\n", 9, "algorithms.es.eval_limit = 10"),
    (ES, ES + "    eval_every: 0\n    eval-balanced: true\n", 9, "algorithms.es.eval-balanced = True"),
    (GRPO, GRPO + "    eval_max_new_tokens: 8\n", 11, "algorithms.grpo.eval_max_new_tokens = 8"),  # preset cpu: 0
    (ES, ES + "    per_task:\n      countdown: {eval_every: 0, eval_limit: 5}\n", 9,
     "algorithms.es.per_task.countdown.eval_limit = 5"),
    (GRPO, GRPO + "  grpo->es:\n    es: {iterations: 1, eval_every: 0, eval_limit: 5}\n", 12,
     "algorithms.grpo->es.es.eval_limit = 5"),
])
def test_an_evaluation_option_a_run_never_reads_is_refused_at_its_line(tmp_path, old, new, line, where):
    """`eval_every: 0, eval_limit: 10` passed the dry run while `esft train es --eval-every 0 --eval-limit 10` is
    refused ("--eval-limit would be ignored"): the same rule (esft.validation.unread_eval_option), at the line."""
    with pytest.raises(SpecError) as info:
        load_spec_text(tmp_path, SPEC.replace(old, new, 1))
    message = str(info.value)
    assert f"spec.yaml:{line}: {where} is not accepted" in message, message
    assert "eval_every is 0" in message and "command line" not in message, message


def test_evaluation_options_a_run_reads_or_that_ask_for_none_pass(tmp_path):
    for new, want in (("    eval_every: 0\n    eval_limit: 0\n    eval_balanced: false\n", (0, 0, False)),  # none
                      ("    eval_every: 5\n    eval_limit: 10\n", (5, 10))):
        spec = load_spec_text(tmp_path, SPEC.replace(ES, ES + new, 1))
        config = spec.config(spec.method("es").components[0], "countdown", 42)
        assert (config.eval_every, config.eval_limit, config.eval_balanced)[:len(want)] == want
    spec = load_spec_text(tmp_path, SPEC.replace(GRPO, GRPO + "    eval_every: 2\n    eval_limit: 4\n", 1))
    config = spec.config(spec.method("grpo").components[0], "countdown", 42)
    assert (config.eval_every, config.eval_limit) == (2, 4)


# ---- a stage that trained nothing is held to no options -----------------------------------------------------------

def _fail_before_training(tokenizer):
    tiny = TinyHooks(tokenizer)

    def train_kwargs(step, config):  # as a device, memory or data error before the first step would
        raise RuntimeError("failed before the first step")

    tiny.hooks.train_kwargs = train_kwargs
    return tiny


def test_a_stage_that_failed_before_training_runs_with_the_fixed_spec(tmp_path, tokenizer):
    """A stage that failed before it trained anything (status failed, no run folder) refused the fixed spec:
    "was trained with other options (device: 'cuda' -> 'cpu')". Nothing was trained: the stage runs with the new
    options. Once it has trained, a change is refused again, also when its status says failed but its run holds
    logged steps."""
    from esft.experiments.runner import check_existing

    key = "seed-42/single-task/countdown/es"
    path = write_spec(tmp_path / "a.yaml", "single-task", ["countdown"], {"es": {**ES_BLOCK, "iterations": 1}})
    first = run_experiment(load_spec_text(tmp_path, path.read_text()), tmp_path / "out",
                           _fail_before_training(tokenizer).hooks, write_tables=False)
    assert first.statuses[key] == "failed"
    status = json.loads((tmp_path / "out" / key / "status.json").read_text())
    assert status["fingerprint"] and not status.get("trained")
    fixed = load_spec_text(tmp_path, path.read_text().replace("sigma: 0.01", "sigma: 0.02"))
    tiny = TinyHooks(tokenizer)
    again = run_experiment(fixed, tmp_path / "out", tiny.hooks, write_tables=False)
    assert again.ok and tiny.trained == [("es", f"{key}/run")]
    # trained now: held to its options, whatever its status says
    status = json.loads((tmp_path / "out" / key / "status.json").read_text())
    status.update({"status": "failed", "trained": False})
    (tmp_path / "out" / key / "status.json").write_text(json.dumps(status))
    changed = load_spec_text(tmp_path, path.read_text().replace("sigma: 0.01", "sigma: 0.03"))
    with pytest.raises(SpecError, match=r"es was trained with other options \(sigma: 0.02 -> 0.03\)"):
        check_existing(changed, build_plan(changed, tmp_path / "out"), tmp_path / "out")


def test_a_run_folder_left_by_an_attempt_killed_before_its_first_step_takes_the_new_options(tmp_path, tokenizer):
    """An attempt killed (kill -9) before its first logged step leaves its config.yaml: the stage, which trained
    nothing, starts a fresh run with the spec's options now instead of failing on "cannot resume"."""
    import yaml

    from esft.es.es_config import save_yaml
    from esft.experiments.runner import _step_configs

    key = "seed-42/single-task/countdown/es"
    path = write_spec(tmp_path / "a.yaml", "single-task", ["countdown"], {"es": {**ES_BLOCK, "iterations": 1}})
    spec, root = load_spec_text(tmp_path, path.read_text()), tmp_path / "out"
    run_experiment(spec, root, _fail_before_training(tokenizer).hooks, write_tables=False)
    smap = {s.key: s for s in build_plan(spec, root)}
    (config,) = _step_configs(spec, smap[key], root, smap)
    (root / key / "run").mkdir()  # what the killed attempt left: its config.yaml, no logged step
    save_yaml(config.replace(resume=False, rollout_dtype="float32"), root / key / "run" / "config.yaml")
    fixed = load_spec_text(tmp_path, path.read_text().replace("sigma: 0.01", "sigma: 0.02"))
    result = run_experiment(fixed, root, TinyHooks(tokenizer).hooks, write_tables=False)
    assert result.ok, (root / key / "error.txt").read_text()
    assert yaml.safe_load((root / key / "run" / "config.yaml").read_text())["sigma"] == 0.02


def test_a_chain_is_held_only_to_the_steps_that_trained(tmp_path):
    """A chain whose first step trained and whose second failed before its first step: the second step's options
    may change, the first's may not."""
    import dataclasses

    from esft.experiments.runner import STATUS, _step_configs, check_existing
    from esft.experiments.stage_eval import write_json

    text = SPEC.replace("evaluation:\n", "  grpo->es: {grpo: {max_steps: 1}, es: {iterations: 1}}\nevaluation:\n", 1)
    spec = load_spec_text(tmp_path, text)
    root, key = tmp_path / "out", "seed-42/single-task/countdown/grpo-to-es"
    stage = {s.key: s for s in build_plan(spec)}[key]
    configs = _step_configs(spec, stage, root, {s.key: s for s in build_plan(spec)})
    (root / key).mkdir(parents=True)
    write_json(root / key / STATUS, {"status": "failed", "fingerprint": [
        {"algorithm": st.algorithm, "config": json.loads(json.dumps(dataclasses.asdict(c), default=str))}
        for st, c in zip(stage.steps, configs)]})
    grpo_run = root / stage.steps[0].run_dir
    grpo_run.mkdir(parents=True, exist_ok=True)
    (grpo_run / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1}) + "\n")
    es_changed = load_spec_text(tmp_path, text.replace("es: {iterations: 1}", "es: {iterations: 1, sigma: 0.5}"))
    check_existing(es_changed, build_plan(es_changed), root)
    grpo_changed = load_spec_text(tmp_path, text.replace("grpo: {max_steps: 1}",
                                                         "grpo: {max_steps: 1, learning_rate: 0.5}"))
    with pytest.raises(SpecError, match=r"grpo-to-es was trained with other options \(learning_rate: .* -> 0.5\)"):
        check_existing(grpo_changed, build_plan(grpo_changed), root)


# ---- the experiment's folder: its own, not a training run's -----------------------------------------------------
def test_an_experiment_in_or_inside_a_training_runs_folder_is_refused(tmp_path, capsys):
    """`esft experiment run SPEC --output-dir RUN` wrote plan.json, spec.yaml, tables/ and base/ among a training
    run's files (and --dry-run called the spec valid there)."""
    from esft.cli import main

    run = tmp_path / "run"
    (run / "checkpoints" / "final").mkdir(parents=True)
    (run / "config.yaml").write_text("model: tiny\n")
    (run / "metrics.jsonl").write_text("")
    spec = _spec(tmp_path, EVAL, EVAL)
    for out, where in ((run, "is"), (run / "checkpoints" / "final" / "exp", "lies inside")):
        for dry in (["--dry-run"], []):
            assert main(["experiment", "run", str(spec), "--output-dir", str(out), *dry]) == 2
            assert f"{out} {where} a training run's folder ({run.resolve()})" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.yaml", "metrics.jsonl"]
    assert not (run / "checkpoints" / "final" / "exp").exists()
