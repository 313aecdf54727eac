"""The experiment runner's cheap parts (esft.experiments.runner), the spec defaults (esft.experiments.spec) and the
line-keeping YAML loader (esft.experiments.yamlines): stage configs, fingerprints, statuses and error lines,
inspected without training (a few seconds).

Run: pytest tests/test_runner_audit.py -q
"""

from __future__ import annotations

import json

import pytest

from conftest import load_spec_text
from esft.experiments import SpecError
from esft.experiments.plan import build_plan
from esft.experiments.yamlines import load, plain

SPEC = """\
kind: sequential
tasks: [countdown, boolq]
algorithms:
  es:
    preset: cpu
    iterations: 2
  grpo:
    max_steps: 2
evaluation:
  limit: 3
  holdout: [mmlu]
"""


# ---- spec defaults and parsing ----------------------------------------------------------------------------------

def test_spec_defaults_name_seeds_and_sequential_settings(tmp_path):
    """Without `name` the spec is named after its file; seeds default to [42]; optimizer moments are not carried;
    a single budget stays the option of the block (no budget list)."""
    spec = load_spec_text(tmp_path, SPEC)
    assert (spec.name, spec.seeds, spec.carry_optimizer_state) == ("spec", [42], False)
    es = spec.method("es")
    assert es.budgets == [] and es.components[0].options["iterations"] == 2
    assert spec.config(es.components[0], "countdown", 42).iterations == 2
    assert spec.evaluation.all_tasks == ["countdown", "boolq", "mmlu"]


def test_spec_refuses_repeated_seeds_and_a_sequential_block_on_single_task(tmp_path):
    with pytest.raises(SpecError, match=r"spec.yaml:\d+: seeds repeat: \[1, 1\]"):
        load_spec_text(tmp_path, SPEC + "seeds: [1, 1]\n")
    with pytest.raises(SpecError, match="only applies to kind: sequential"):
        load_spec_text(tmp_path, SPEC.replace("kind: sequential", "kind: single-task")
                       + "sequential: {carry_optimizer_state: true}\n")


def test_budget_reaches_the_config_and_passk_samples_only_training_tasks(tmp_path):
    """An explicit budget overrides the block's; pass@k samples the training tasks by default, not the holdouts."""
    spec = load_spec_text(tmp_path, SPEC + "  passk: {samples: 2}\n")
    assert spec.config(spec.method("es").components[0], "countdown", 42, 7).iterations == 7
    assert spec.evaluation.passk.tasks == ["countdown", "boolq"]


def test_a_null_per_task_limit_means_every_example(tmp_path):
    spec = load_spec_text(tmp_path, SPEC + "  per_task: {boolq: {limit: null}}\n")
    assert spec.evaluation.for_task("boolq").limit is None and spec.evaluation.for_task("countdown").limit == 3


def test_a_per_task_budget_beside_a_budget_list_is_refused_at_its_line(tmp_path):
    text = SPEC.replace("    iterations: 2\n", "    iterations: [2, 4]\n    per_task:\n      boolq:\n"
                                                  "        iterations: 3\n")
    with pytest.raises(SpecError, match=r"spec.yaml:9: algorithms.es.per_task.boolq: a per-task iterations"):
        load_spec_text(tmp_path, text)


def test_two_budgets_and_a_checkpoint_limit_are_refused(tmp_path):
    """Two budgets already share one run whose smaller budget is a numbered checkpoint a limit would delete."""
    with pytest.raises(SpecError, match="save_total_limit would delete"):
        load_spec_text(tmp_path, SPEC.replace("    iterations: 2\n", "    iterations: [2, 4]\n"
                                                                      "    save_total_limit: 1\n"))


def test_a_shipped_spec_is_found_by_its_file_name_too():
    from esft.experiments.spec import resolve_spec_path, shipped_specs

    assert resolve_spec_path("cpu-mini-single.yaml") == shipped_specs()["cpu-mini-single"]


def test_a_chain_component_keeps_the_base_block_options_its_sub_block_leaves(tmp_path):
    spec = load_spec_text(tmp_path, SPEC.replace("evaluation:", "  grpo->es:\n    es: {iterations: 1}\nevaluation:"))
    grpo, es = spec.method("grpo->es").components
    assert grpo.options == {"max_steps": 2} and (es.preset, es.options) == ("cpu", {"iterations": 1})


# ---- yamlines -----------------------------------------------------------------------------------------------------

def test_loader_keeps_the_lines_of_mappings_keys_values_and_items():
    doc = load("a: 1\nb:\n  c: 2\nd:\n  - x\n  - y\n")
    assert (doc.line, doc.key_lines, doc.value_lines) == (1, {"a": 1, "b": 2, "d": 4}, {"a": 1, "b": 3, "d": 5})
    assert (doc["b"].line, doc["d"].line, doc["d"].item_lines) == (3, 5, [5, 6])
    assert doc["d"].line_of(5) == 5 and doc.line_of("missing") == 1
    assert type(plain(doc)["d"]) is list and type(plain({"k": [{"z": 1}]})["k"][0]) is dict


def test_a_syntax_error_names_the_line_of_the_problem():
    """Where PyYAML names both, the problem's line, not the line of the construct it was reading."""
    with pytest.raises(SpecError, match=r"^x.yaml:3: YAML syntax error: expected ',' or ']'"):
        load("a: [1,\n  2\nb: 3\n", "x.yaml")
    with pytest.raises(SpecError, match=r"^x.yaml:2: YAML syntax error: mapping values are not allowed"):
        load("a: 1\n  b: 2\n", "x.yaml")


# ---- runner: stage configs, fingerprints, statuses ---------------------------------------------------------------

def test_stage_configs_resume_in_their_run_dir_from_the_parent_stage(tmp_path):
    from esft.experiments.runner import _step_configs

    spec = load_spec_text(tmp_path, SPEC)
    smap, root = {s.key: s for s in build_plan(spec)}, tmp_path / "out"
    first, second = smap["seed-42/sequential/es/1-countdown"], smap["seed-42/sequential/es/2-boolq"]
    (cfg,) = _step_configs(spec, second, root, smap)
    assert cfg.resume is True and cfg.output_dir == str((root / second.steps[0].run_dir).resolve())
    assert cfg.model == str((root / first.model_dir()).resolve()) and cfg.noise_stream == 1
    (grpo,) = _step_configs(spec, smap["seed-42/sequential/grpo/2-boolq"], root, smap)
    assert not hasattr(grpo, "noise_stream")


def test_comparable_drops_what_cannot_change_a_result_but_keeps_the_budget():
    from esft.experiments.fingerprint import comparable

    def one(algorithm, **config):
        return comparable([{"algorithm": algorithm, "config": config}])[0]["config"]

    assert one("es", iterations=4, eval_every=2, output_dir="x") == {"iterations": 4}
    assert one("grpo", max_steps=4, save_steps=1) == {"max_steps": 4}
    assert one("es", noise_stream=0, rollout_dtype="float32", sigma=0.1) == {"sigma": 0.1}
    assert one("es", noise_stream=1, rollout_dtype="bfloat16") == {"noise_stream": 1, "rollout_dtype": "bfloat16"}
    assert one("grpo", rollout_dtype="auto") == {}


def _finished_first_stage(tmp_path):
    """(spec, stages, output folder, a function that records the first ES stage as done with a fingerprint whose
    sigma is `sigma`, or unchanged when None)."""
    from esft.experiments.runner import STATUS, _fingerprint, _step_configs
    from esft.experiments.stage_eval import write_json

    spec = load_spec_text(tmp_path, SPEC)
    stages = build_plan(spec)
    smap, root, key = {s.key: s for s in stages}, tmp_path / "out", "seed-42/sequential/es/1-countdown"
    (root / key).mkdir(parents=True)

    def finish(sigma=None):
        old = _fingerprint(spec, smap[key], _step_configs(spec, smap[key], root, smap), smap)
        if sigma is not None:
            old[0]["config"]["sigma"] = sigma
        write_json(root / key / STATUS, {"status": "done", "fingerprint": old})

    return spec, stages, root, finish


def test_check_existing_names_the_changed_field_and_passes_an_unchanged_stage(tmp_path):
    from esft.experiments.runner import check_existing

    spec, stages, root, finish = _finished_first_stage(tmp_path)
    finish()
    check_existing(spec, stages, root)
    finish(sigma=0.5)
    with pytest.raises(SpecError, match=r"1-countdown was trained with other options \(sigma: 0.5 -> 0.003\);"):
        check_existing(spec, stages, root)


def test_dry_run_refuses_a_folder_whose_stage_was_trained_with_other_options(tmp_path, capsys):
    """`esft experiment run SPEC --output-dir D --dry-run` printed the plan for a folder whose finished stage the
    real run then refused (population_size changed); the dry run refuses it the same way."""
    from esft.cli import main

    spec, _, root, finish = _finished_first_stage(tmp_path)
    finish()
    argv = ["experiment", "run", str(spec.path), "--output-dir", str(root), "--dry-run"]
    assert main(argv) == 0
    finish(sigma=0.5)
    capsys.readouterr()
    assert main(argv) == 2
    assert "1-countdown was trained with other options (sigma: 0.5 -> 0.003)" in capsys.readouterr().err


def test_carried_optimizer_state_enters_the_fingerprint(tmp_path):
    from esft.experiments.runner import _fingerprint, _step_configs

    spec = load_spec_text(tmp_path, SPEC + "sequential: {carry_optimizer_state: true}\n")
    smap, root = {s.key: s for s in build_plan(spec)}, tmp_path / "out"
    stage = smap["seed-42/sequential/grpo/2-boolq"]
    (step,) = _fingerprint(spec, stage, _step_configs(spec, stage, root, smap), smap)
    assert step["config"]["carry_optimizer_state"] is True


def test_a_stage_whose_parent_left_no_weights_is_blocked_even_if_the_parent_ran(tmp_path):
    """Blocked depends on `trained`, not on the parent having a status: a parent that failed before its weights
    existed blocks its children, which are never started."""
    from esft.experiments.runner import STATUS, Hooks, _visit
    from esft.experiments.stage_eval import write_json

    def must_not_train(step, config):
        raise AssertionError("a blocked stage was started")

    spec = load_spec_text(tmp_path, SPEC)
    smap, root = {s.key: s for s in build_plan(spec)}, tmp_path / "out"
    parent, child = smap["seed-42/sequential/es/1-countdown"], smap["seed-42/sequential/es/2-boolq"]
    (root / parent.key).mkdir(parents=True)
    write_json(root / parent.key / STATUS, {"status": "failed", "trained": False})
    hooks = Hooks(train_kwargs=must_not_train, progress=False, collect_garbage=False)
    assert _visit(spec, child, root, smap, hooks, "[1/1]") == "blocked"
    status = json.loads((root / child.key / STATUS).read_text())
    assert status["status"] == "blocked" and parent.key in status["error"]


def test_results_count_blocked_stages_as_failed_and_output_dir_precedence(tmp_path):
    from esft.experiments.runner import ExperimentResult, output_dir_for

    result = ExperimentResult(tmp_path, {"a": "done", "b": "blocked"})
    assert result.failed == ["b"] and not result.ok
    spec = load_spec_text(tmp_path, SPEC + "output_dir: from-spec\n")
    assert str(output_dir_for(spec, "given")) == "given" and str(output_dir_for(spec)) == "from-spec"
    spec.output_dir = None
    assert output_dir_for(spec).as_posix() == "runs/experiments/spec"


def test_a_heartbeat_left_behind_is_logged_as_a_killed_invocation(tmp_path):
    from esft.experiments.invocation import HEARTBEAT, recover_killed_invocation
    from esft.experiments.stage_eval import write_json

    assert recover_killed_invocation(tmp_path) is None
    write_json(tmp_path / HEARTBEAT, {"started": "s", "last": "l", "wall_s": 12.5})
    record = recover_killed_invocation(tmp_path)
    assert record == {"started": "s", "finished": "l", "wall_s": 12.5, "interrupted": True, "killed": True,
                      "statuses": {}}
    assert json.loads((tmp_path / "invocations.jsonl").read_text()) == record
    assert not (tmp_path / HEARTBEAT).exists()


def test_a_done_stage_without_its_result_is_run_again(tmp_path, monkeypatch):
    """`done` alone does not skip a stage: without result.json the tables would have no record of it, so the stage
    is visited again (its trainer resumes; here the trainer hook records the call), even when its evaluations
    are current."""
    from esft.experiments import stage_eval
    from esft.experiments.runner import STATUS, Hooks, _visit
    from esft.experiments.stage_eval import write_json

    started = []

    def train_kwargs(step, config):
        started.append(step.run_dir)
        raise RuntimeError("stop before training")

    monkeypatch.setattr(stage_eval, "is_current", lambda *args: True)
    spec = load_spec_text(tmp_path, SPEC)
    smap, root = {s.key: s for s in build_plan(spec)}, tmp_path / "out"
    stage = smap["seed-42/sequential/es/1-countdown"]
    (root / stage.key).mkdir(parents=True)
    write_json(root / stage.key / STATUS, {"status": "done", "trained": True})
    hooks = Hooks(train_kwargs=train_kwargs, progress=False, collect_garbage=False)
    assert _visit(spec, stage, root, smap, hooks, "[1/1]") == "failed" and started == [stage.steps[0].run_dir]
    (root / stage.key / "result.json").write_text("{}")
    write_json(root / stage.key / STATUS, {"status": "done", "trained": True})
    assert _visit(spec, stage, root, smap, hooks, "[1/1]") == "done" and len(started) == 1
