"""Experiment specs, stage plans and tables, without training (a few seconds).

    pytest -q tests/test_experiments.py tests/test_experiments_run.py      # all experiment tests (< 60 s)

Spec errors must name the offending line before any compute; the plan shares one ES run across budgets; tables
built from hand-made stage records must match the expected Markdown and CSV exactly.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import load_spec_text
from esft.experiments import SpecError, load_spec, shipped_specs
from esft.experiments.plan import build_plan
from esft.experiments.compute_tables import table18
from esft.experiments.records import load_experiment
from esft.experiments.study_tables import table1, table2, tables5_8, write_all_tables

GOOD = """\
name: t
kind: sequential
tasks: [countdown, boolq]
seeds: [42, 52]
algorithms:
  es:
    preset: cpu
    iterations: [2, 4]
  grpo:
    max_steps: 2
evaluation:
  limit: 3
"""


@pytest.mark.parametrize("old,new,line,words", [
    ("    preset: cpu\n", "    preset: cpu\n    populaton_size: 4\n", 8, ["populaton_size", "population_size"]),
    ("tasks: [countdown, boolq]", "tasks:\n  - countdown\n  - mathh", 5, ["unknown task 'mathh'", "math"]),
    ("  grpo:\n", "  ppo:\n", 9, ["unknown algorithm 'ppo'"]),
    ("kind: sequential", "kind: sequentail", 2, ["unknown kind", "sequential"]),
    ("  limit: 3\n", "  limit: 3\n  limt: 4\n", 13, ["unknown key 'limt'", "limit"]),
    ("name: t\n", "name: t\nbogus: 1\n", 2, ["unknown key 'bogus'"]),
    ("    max_steps: 2\n", "    max_steps: [1, 2]\n", 10, ["max_steps must be one number"]),
    ("    max_steps: 2\n", "    max_steps: 2\n    num_generations: 3\n", 9, ["not a multiple"]),
    ("    max_steps: 2\n", "    max_steps: 2\n    seed: 3\n", 11, ["set by the experiment"]),
    ("    preset: cpu\n", "    preset: cpu\n    max_passage_chars: 300\n", 8, ["task option", "task_options"]),
    ("    preset: cpu\n", "    preset: gpu\n", 7, ["unknown preset 'gpu'"]),
    ("    preset: cpu\n", "    preset: cpu-countdwn\n", 7, ["unknown preset 'cpu-countdwn' for es (did you mean cpu-countdown?)"]),
    ("    preset: cpu\n", "    preset: cpu\n    sigma: abc\n", 8, ["sigma"]),
    ("  grpo:\n", "  es:\n", 9, ["duplicate key 'es'", "first on line 6"]),
    ("tasks: [countdown, boolq]", "tasks: [countdown, boolq", 4, ["YAML syntax error"]),
    ("evaluation:\n", "task_options:\n  boolq: {max_chars: 3}\nevaluation:\n", 12, ["task_options.boolq"]),
    ("  limit: 3\n", "  limit: 3\n  balanced: yes please\n", 13, ["evaluation.balanced must be true or false"]),
    ("    preset: cpu\n", "    preset: cpu\n    fitness_rule: dart\n    fitness_options: {replay_fraction: 2}\n", 6,
     ["algorithms.es", "replay_fraction", "[0, 1]"]),
    ("    preset: cpu\n", "    preset: cpu\n    fitness_rule: dart\n    format_bonus: 0.5\n", 6, ["format_bonus"]),
    ("    preset: cpu\n", "    preset: cpu\n    noise: lowrank\n    executor: ray\n", 6, ["lowrank", "local"]),
    # checks against the built task (esft train runs them before the model loads; a stage used to fail at its start)
    ("    preset: cpu\n", "    preset: cpu\n    fitness_rule: balanced\n", 6,
     ["algorithms.es (es) on countdown", "fitness_rule = 'balanced'", "labels"]),
    ("    max_steps: 2\n", "    max_steps: 2\n    class_balanced: true\n    scale_rewards: batch\n", 9,
     ["algorithms.grpo (grpo) on countdown", "class_balanced", "labels"]),
    ("    max_steps: 2\n", "    max_steps: 2\n    eval_every: 1\n    eval_balanced: true\n    eval_limit: 100000\n", 9,
     ["on boolq", "eval_limit = 100000", "rarest label"]),
    # a list of budgets shares one run, snapshotted at each budget: a checkpoint limit would delete the snapshots
    ("    preset: cpu\n", "    preset: cpu\n    save_total_limit: 1\n", 6, ["save_total_limit", "budgets"]),
    # evaluated tasks are built and their test split checked before compute: these failed after each stage's training
    ("  limit: 3\n", "  limit: 3\n  holdout: [/nonexistent/held.jsonl]\n", 13,
     ["evaluation of /nonexistent/held.jsonl", "does not exist"]),
    ("  limit: 3\n", "  limit: 100000\n  balanced: true\n", 12, ["evaluation of boolq (balanced)", "limit 100000",
                                                                 "rarest label"]),
    ("tasks: [countdown, boolq]", "tasks: [countdown, /nonexistent/train.jsonl]", 6,
     ["algorithms.es (es) on /nonexistent/train.jsonl", "does not exist"]),
    ("name: t\n", "name: t\noutput_dir: [runs, x]\n", 2, ["output_dir must be a folder path"]),
    ("name: t\n", "name: [a, b]\n", 1, ["name must be a name"]),
    # a task listed twice would train the sequence on it twice and share its stage folders
    ("tasks: [countdown, boolq]", "tasks: [countdown, boolq, Countdown]", 3, ["task 'Countdown' appears twice"]),
])
def test_spec_errors_name_the_line(tmp_path, old, new, line, words):
    assert old in GOOD
    with pytest.raises(SpecError) as info:
        load_spec_text(tmp_path, GOOD.replace(old, new, 1))
    message = str(info.value)
    assert f"spec.yaml:{line}:" in message, message
    assert "command line" not in message, message  # a spec's values are not flags
    for word in words:
        assert word in message, message


def test_valid_spec_and_shipped_specs_parse(tmp_path):
    spec = load_spec_text(tmp_path, GOOD)
    assert [m.label for m in spec.methods] == ["es", "grpo"]
    assert spec.method("es").budgets == [2, 4]
    assert spec.evaluation.all_tasks == ["countdown", "boolq", "mmlu", "ifeval"]
    names = set(shipped_specs())
    assert {"paper-single", "paper-sequential", "cpu-mini-single", "cpu-mini-sequential", "cpu-compare"} <= names
    for name in names - {"cpu-compare", "cpu-study"}:
        shipped = load_spec(name)  # by name, as on the command line
        assert set(shipped.tasks) == {"countdown", "math", "chemistry", "boolq"}
        assert {m.components[0].algorithm for m in shipped.methods} == {"es", "grpo"}
        assert shipped.evaluation.holdout == ["mmlu", "ifeval"]
    study = load_spec("cpu-study")  # issue 17: two Countdown variants, evaluated balanced over the operator
    assert [t.split(":")[0] for t in study.tasks] == ["countdown", "countdown"] and study.evaluation.balanced
    assert study.method("es").budgets == [15, 30] and study.evaluation.holdout == ["mmlu", "ifeval"]
    assert len(study.seeds) >= 2 and not study.evaluation.for_task("ifeval").balanced
    # a number is a folder name (the runner joins it into a path: it used to be passed on as an int)
    assert load_spec_text(tmp_path, GOOD.replace("name: t\n", "name: 7\noutput_dir: 2024\n")).output_dir == "2024"
    compare = load_spec("cpu-compare")  # issue 8: the ES variants and GRPO on one task, with pass@k
    assert [m.label for m in compare.methods] == ["es", "dart-es", "lowrank-es", "grpo"]
    assert compare.evaluation.passk.k == [1, 4] and compare.evaluation.passk.tasks == ["boolq"]
    variants = {m.label: compare.config(m.components[0], "boolq", 42) for m in compare.methods}
    assert variants["dart-es"].fitness_rule == "dart" and variants["lowrank-es"].noise == "lowrank"
    assert variants["es"].noise == "table" and variants["lowrank-es"].generation_options == {}
    # option values are plain containers: the trainer saves its config with yaml.safe_dump
    assert type(variants["lowrank-es"].generation_options) is dict
    import yaml
    yaml.safe_dump(variants["lowrank-es"].to_dict())


@pytest.mark.parametrize("new,line,words", [
    ("  es@2:\n    algorithm: es\n    iterations: 2\n  grpo:\n", 9,
     ["algorithms.es@2", "seed-42/sequential/es@2/1-countdown", "algorithms.es's"]),
    ("  grpo->es: {grpo: {max_steps: 1}, es: {iterations: 1}}\n"
     "  grpo-to-es: {algorithm: grpo->es, es: {iterations: 1}}\n  grpo:\n", 10,
     ["algorithms.grpo-to-es", "grpo-to-es/1-countdown", "algorithms.grpo->es's"]),
    ("  my es: {algorithm: grpo, max_steps: 1}\n  my-es: {algorithm: grpo, max_steps: 2}\n  grpo:\n", 10,
     ["algorithms.my-es", "algorithms.my es's"]),
])
def test_labels_that_share_a_folder_are_refused_before_compute(tmp_path, capsys, new, line, words):
    """Two labels whose stages land in one folder: the later stage used to be skipped as done, reporting the
    other label's training as its own."""
    from esft.cli import main

    spec = load_spec_text(tmp_path, GOOD.replace("  grpo:\n", new, 1))
    with pytest.raises(SpecError) as info:
        build_plan(spec)
    message = str(info.value)
    assert f"spec.yaml:{line}:" in message and "rename one of the two labels" in message, message
    for word in words:
        assert word in message, message
    assert main(["experiment", "run", str(tmp_path / "spec.yaml"), "--output-dir", str(tmp_path / "out"),
                 "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("esft: error: ") and err.count("\n") == 1 and "rename one" in err, err
    assert not (tmp_path / "out").exists()


def test_the_closing_line_says_its_time_is_this_calls(tmp_path, capsys, monkeypatch):
    """A re-run that resumed the last stage printed "3 of 3 stages done in 109 s", the time of that call alone,
    after earlier calls had trained the other stages for minutes."""
    import esft.experiments.runner as runner
    from esft.cli import main

    load_spec_text(tmp_path, GOOD)
    done = runner.ExperimentResult(tmp_path / "out", {"base": "done", "a": "done", "b": "done"}, wall_s=109.4)
    monkeypatch.setattr(runner, "run_experiment", lambda spec, out: done)
    assert main(["experiment", "run", str(tmp_path / "spec.yaml"), "--output-dir", str(tmp_path / "out")]) == 0
    assert "3 of 3 stages done; this call took 109 s; tables in" in capsys.readouterr().out


def test_task_slug_is_file_safe_readable_and_one_to_one():
    from esft.experiments.plan import task_slug

    assert task_slug("countdown") == "countdown"
    assert task_slug("countdown:numbers=2,ops=+*") == "countdown.numbers=2.ops=plustimes"
    assert task_slug("countdown:numbers=2,ops=+-") == "countdown.numbers=2.ops=plus-"
    odd = [task_slug("x:a=b c"), task_slug("x:a=b|c")]
    assert odd[0] != odd[1] and all(set(s) <= set("abcdefghijklmnopqrstuvwxyz0123456789_.=-x") for s in odd)
    # names whose readable forms would coincide get hashes: never one folder for two tasks
    pairs = [("a.b:c=1", "a:b.c=1"), ("x:a=1,b=2", "x:a=1.b=2"), ("t:w=plus", "t:w=+")]
    for one, other in pairs:
        assert task_slug(one) != task_slug(other), (one, other)


def test_balanced_evaluation_reaches_the_stage_settings(tmp_path):
    from esft.experiments.stage_eval import task_settings

    # (a limit of 4: a balanced subset of MMLU's 4 answer letters needs at least one question of each)
    spec = load_spec_text(tmp_path, GOOD.replace("  limit: 3\n", "  limit: 4\n  balanced: true\n"
                                        "  per_task: {boolq: {balanced: false}}\n"))
    assert spec.evaluation.for_task("countdown").balanced and not spec.evaluation.for_task("boolq").balanced
    assert task_settings(spec, "countdown", "m")["balanced"] is True
    # unset: the settings are those of results evaluated before the option existed, so they stay current
    assert "balanced" not in task_settings(spec, "boolq", "m")
    assert "balanced" not in task_settings(load_spec_text(tmp_path, GOOD), "countdown", "m")


def test_option_blocks_reach_trainer_configs(tmp_path):
    spec = load_spec_text(tmp_path, GOOD.replace("    max_steps: 2\n", "    max_steps: 2\n    per_task:\n"
                                        "      boolq: {learning_rate: 0.5}\n"))
    grpo = spec.method("grpo").components[0]
    cfg = spec.config(grpo, "boolq", 52, output_dir="x")
    assert (cfg.learning_rate, cfg.max_steps, cfg.seed, cfg.task) == (0.5, 2, 52, "boolq")
    assert spec.config(grpo, "countdown", 42).learning_rate == 3e-6
    es = spec.method("es").components[0]
    cfg = spec.config(es, "countdown", 42, 4)
    # the cpu preset's BoolQ passage cut is a task option: it never leaks into another task's constructor
    assert (cfg.iterations, cfg.population_size, cfg.max_passage_chars) == (4, 8, None)


def test_plan_shares_es_runs_across_budgets(tmp_path):
    stages = {s.key: s for s in build_plan(load_spec_text(tmp_path, GOOD))}
    a, b = stages["seed-42/sequential/es@2/1-countdown"], stages["seed-42/sequential/es@4/1-countdown"]
    # stage 1 of both budget tracks is one run: trained to 2, snapshotted, continued to 4
    assert a.steps[0].run_dir == b.steps[0].run_dir == "seed-42/sequential/es/1-countdown/run"
    assert a.steps[0].snapshot and not b.steps[0].snapshot
    assert a.model_dir().endswith("checkpoints/iter_000002") and b.model_dir().endswith("checkpoints/final")
    assert a.key in b.after
    # later stages start from their own track's previous stage, in their own run
    c = stages["seed-42/sequential/es@4/2-boolq"]
    assert c.parent == b.key and c.steps[0].run_dir == "seed-42/sequential/es@4/2-boolq/run"
    assert stages["seed-52/sequential/grpo/2-boolq"].parent == "seed-52/sequential/grpo/1-countdown"
    assert list(stages)[0] == "base" and stages["base"].eval_tasks == ["countdown", "boolq", "mmlu", "ifeval"]

    single = load_spec_text(tmp_path, GOOD.replace("kind: sequential", "kind: single-task")
                   + "  after_single_task: trained+holdout\n")
    stages = {s.key: s for s in build_plan(single)}
    a, b = stages["seed-42/single-task/boolq/es@2"], stages["seed-42/single-task/boolq/es@4"]
    assert a.steps[0].run_dir == b.steps[0].run_dir and a.parent is None and b.after == [a.key]
    assert a.eval_tasks == ["boolq", "mmlu", "ifeval"]


def test_chain_components_and_folder_names(tmp_path):
    spec = load_spec_text(tmp_path, GOOD.replace(
        "evaluation:", "  grpo->es:\n    grpo: {max_steps: 1}\n    es: {iterations: 1}\nevaluation:"))
    chain = spec.method("grpo->es")
    assert [c.algorithm for c in chain.components] == ["grpo", "es"]
    stage = {s.key: s for s in build_plan(spec)}["seed-42/sequential/grpo-to-es/2-boolq"]
    assert [(st.algorithm, st.budget) for st in stage.steps] == [("grpo", 1), ("es", 1)]
    assert stage.steps[1].run_dir.endswith("run-2-es")
    # the es component inherits the `es` block (cpu preset) under its own budget
    assert spec.config(chain.components[1], "boolq", 42).population_size == 8



def test_es_steps_of_a_chain_get_distinct_noise_streams(tmp_path):
    spec = load_spec_text(tmp_path, GOOD.replace("tasks: [countdown, boolq]", "tasks: [countdown, math, boolq]").replace(
        "evaluation:", "  grpo->es:\n    grpo: {max_steps: 1}\n    es: {iterations: 1}\nevaluation:"))
    stages = build_plan(spec)
    for seed in (42, 52):
        for track in ("es@2", "es@4", "grpo-to-es"):
            chain = [s for s in stages if s.key.startswith(f"seed-{seed}/sequential/{track}/")]
            es = [st for s in chain for st in s.steps if st.algorithm == "es"]
            # stage k's ES run draws stream k-1: stage 1 keeps the single-run seeds, no two stages share noise
            assert [st.noise_stream for st in es] == [0, 1, 2]
            assert [spec.config(st.component, "boolq", seed, noise_stream=st.noise_stream).noise_stream
                    for st in es] == [0, 1, 2]
    assert all(st.noise_stream == 0 for s in stages for st in s.steps if st.algorithm == "grpo")
    single = build_plan(load_spec_text(tmp_path, GOOD.replace("kind: sequential", "kind: single-task")))
    assert all(st.noise_stream == 0 for s in single for st in s.steps)
    # a stage trained before streams existed has no noise_stream in its fingerprint: stream 0 stages still match,
    # a later stage (trained on the shared noise) is refused before any compute
    from esft.experiments.runner import STATUS, _fingerprint, _step_configs, check_existing
    from esft.experiments.stage_eval import write_json

    root, smap = tmp_path / "out", {s.key: s for s in stages}
    for key in ("seed-42/sequential/es@2/1-countdown", "seed-42/sequential/es@4/2-math"):
        old = _fingerprint(spec, smap[key], _step_configs(spec, smap[key], root, smap), smap)
        for entry in old:
            entry["config"].pop("noise_stream", None)
        (root / key).mkdir(parents=True)
        write_json(root / key / STATUS, {"status": "done", "fingerprint": old})
        if key.endswith("1-countdown"):
            check_existing(spec, stages, root)
    with pytest.raises(SpecError, match=r"es@4/2-math was trained with other options \(noise_stream: None -> 1\)"):
        check_existing(spec, stages, root)
    # the stream is the experiment's to set, not an option of a block
    with pytest.raises(SpecError, match="set by the experiment"):
        load_spec_text(tmp_path, GOOD.replace("    preset: cpu\n", "    preset: cpu\n    noise_stream: 1\n", 1))


# ---- tables from hand-made stage records ----------------------------------------------------------------------------

def _rec(evals: dict[str, float], **extra) -> dict:
    out = {"eval": {t: {"n": 10, "accuracy": a / 100, "ci95": [(a - 5) / 100, (a + 5) / 100]}
                    for t, a in evals.items()}}
    if "ifeval" in evals:
        out["eval"]["ifeval"].update(prompt_strict=evals["ifeval"] / 100, prompt_loose=0.9)
    out.update(extra)
    return out


def _stage(key, kind="train", seed=None, track=None, display="Base", task=None, index=0):
    return {"key": key, "kind": kind, "seed": seed, "track": track, "display": display, "task": task,
            "index": index}


def _write(root: Path, spec: dict, stages: list[dict], results: dict[str, dict]) -> None:
    root.mkdir(parents=True)
    (root / "plan.json").write_text(json.dumps({"spec": spec, "stages": stages}))
    for key, rec in results.items():
        (root / key).mkdir(parents=True, exist_ok=True)
        (root / key / "result.json").write_text(json.dumps(rec))
        (root / key / "status.json").write_text(json.dumps({"status": "done"}))


def _sequential_fixture(root: Path) -> None:
    spec = {"name": "hand", "kind": "sequential", "model": "m", "tasks": ["countdown", "boolq"], "seeds": [42, 52],
            "evaluation": {"holdout": ["mmlu", "ifeval"], "limit": 10, "max_new_tokens": 8, "per_task": {}},
            "ifeval_metric": "prompt_strict"}
    stages = [_stage("base", kind="base")]
    results = {"base": _rec({"countdown": 20, "boolq": 80, "mmlu": 50, "ifeval": 60})}
    values = {  # (track, seed, index) -> accuracies
        ("es", 42, 1): {"countdown": 70, "boolq": 81, "mmlu": 48, "ifeval": 61},
        ("es", 52, 1): {"countdown": 72, "boolq": 79, "mmlu": 46, "ifeval": 63},
        ("es", 42, 2): {"countdown": 60, "boolq": 88, "mmlu": 45, "ifeval": 62},
        ("es", 52, 2): {"countdown": 64, "boolq": 90, "mmlu": 43, "ifeval": 60},
        ("grpo", 42, 1): {"countdown": 65, "boolq": 80, "mmlu": 51, "ifeval": 60},
        ("grpo", 52, 1): {"countdown": 67, "boolq": 82, "mmlu": 50, "ifeval": 59},
        ("grpo", 42, 2): {"countdown": 66, "boolq": 85, "mmlu": 52, "ifeval": 58},
        # seed 52's last GRPO stage failed: no record
    }
    step = {"es": {"num_params": 1000, "accounting": {"generations": 400, "prompt_tokens": 3000,
                                                      "tokens_generated": 1000, "train_forward_tokens": 0,
                                                      "train_seconds": 10.0},
                   "formula": {"coefficient": 800, "text": "2(2)(10)(20)PL"}},
            "grpo": {"num_params": 1000, "accounting": {"generations": 100, "prompt_tokens": 800,
                                                        "tokens_generated": 200, "train_forward_tokens": 500,
                                                        "train_seconds": 20.0},
                     "formula": {"coefficient": 400, "text": "8(5)(5)(2)PL"}}}
    for seed in (42, 52):
        for track, display in (("es", "ES (iter=2)"), ("grpo", "GRPO")):
            for k, task in enumerate(["countdown", "boolq"], start=1):
                key = f"seed-{seed}/sequential/{track}/{k}-{task}"
                stages.append(_stage(key, seed=seed, track=track, display=display, task=task, index=k))
                if (track, seed, k) in values:
                    results[key] = _rec(values[(track, seed, k)], steps=[step[track]])
    _write(root, spec, stages, results)


TABLE2 = """\
### Table 2: Holdout benchmark accuracy (%) throughout sequential training.

| Stage | ES (iter=2) (MMLU) | GRPO (MMLU) | ES (iter=2) (IFEval) | GRPO (IFEval) |
| --- | --- | --- | --- | --- |
| Base model | 50.0 [45.0, 55.0] | 50.0 [45.0, 55.0] | 60.0 [55.0, 65.0] | 60.0 [55.0, 65.0] |
| After Task 1 (Countdown) | 47.00 ± 1.41 | 50.50 ± 0.71 | 62.00 ± 1.41 | 59.50 ± 0.71 |
| After Task 2 (BoolQ) | 44.00 ± 1.41 | 52.00 (n=1) | 61.00 ± 1.41 | 58.00 (n=1) |
| Δ (base → final) | −6.00 ± 1.41 | +2.00 (n=1) | +1.00 ± 1.41 | −2.00 (n=1) |

Per seed (42 / 52):

| Stage | ES (iter=2) (MMLU) | GRPO (MMLU) | ES (iter=2) (IFEval) | GRPO (IFEval) |
| --- | --- | --- | --- | --- |
| Base model | 50.0 [45.0, 55.0] | 50.0 [45.0, 55.0] | 60.0 [55.0, 65.0] | 60.0 [55.0, 65.0] |
| After Task 1 (Countdown) | 48.0 [43.0, 53.0] / 46.0 [41.0, 51.0] | 51.0 [46.0, 56.0] / 50.0 [45.0, 55.0] | 61.0 [56.0, 66.0] / 63.0 [58.0, 68.0] | 60.0 [55.0, 65.0] / 59.0 [54.0, 64.0] |
| After Task 2 (BoolQ) | 45.0 [40.0, 50.0] / 43.0 [38.0, 48.0] | 52.0 [47.0, 57.0] / — | 62.0 [57.0, 67.0] / 60.0 [55.0, 65.0] | 58.0 [53.0, 63.0] / — |
| Δ (base → final) | −5.0 / −7.0 | +2.0 / — | +2.0 / +0.0 | −2.0 / — |

Mean ± sample std (ddof=1) over 2 seeds (42, 52); the base model is evaluated once (greedy decoding does not depend on the seed).
Greedy evaluation on the test split: MMLU n=10, 8 new tokens; IFEval n=10, 8 new tokens.
[a, b]: the 95% Wilson interval of that seed's evaluation.
IFEval: prompt-strict accuracy.
"""

TABLE5_ES = """\
| Stage | Countdown | BoolQ |
| --- | --- | --- |
| Base | 20.0 [15.0, 25.0] | 80.0 [75.0, 85.0] |
| After Countdown | **71.00 ± 1.41** | 80.00 ± 1.41 |
| After BoolQ | 62.00 ± 2.83 | **89.00 ± 1.41** |
"""

TABLE2_CSV_HEAD = ("Stage,ES (iter=2) (MMLU),ES (iter=2) (MMLU) std,ES (iter=2) (MMLU) seed 42,"
                   "ES (iter=2) (MMLU) seed 52,GRPO (MMLU),GRPO (MMLU) std,GRPO (MMLU) seed 42,GRPO (MMLU) seed 52,")


def test_tables_from_hand_made_stage_records(tmp_path):
    root = tmp_path / "exp"
    _sequential_fixture(root)
    exp = load_experiment(root)
    t2 = table2(exp)
    assert t2.markdown() == TABLE2
    csv_text = t2.csv().splitlines()
    assert csv_text[0].startswith(TABLE2_CSV_HEAD)
    # the base model, evaluated once: its value in every seed's column, no std across copies of it
    assert csv_text[1].startswith("Base model,50,,50,50,50,,50,50,")
    assert csv_text[2].startswith("After Task 1 (Countdown),47,1.4142,48,46,50.5,0.7071,51,50,")
    assert csv_text[3].startswith("After Task 2 (BoolQ),44,1.4142,45,43,52,,52,,")
    es, grpo = tables5_8(exp)
    assert TABLE5_ES in es.markdown()
    assert "with ES (iter=2). Bold indicates the task just trained" in es.markdown()
    assert "| After BoolQ | 66.00 (n=1) | **85.00 (n=1)** |" in grpo.markdown()
    # no single-task stages: Table 1 is stage 1 of the sequence, the first task's row, each seed's interval below
    t1 = table1(exp).markdown()
    assert "| Countdown | 20.0 [15.0, 25.0] | 71.00 ± 1.41 | 66.00 ± 1.41 |" in t1  # the base: once, not ± 0
    assert "| Countdown | 20.0 [15.0, 25.0] | 70.0 [65.0, 75.0] / 72.0 [67.0, 77.0] | " in t1
    assert "BoolQ |" not in t1 and "Stage 1 of the sequential runs" in t1
    main, detail = table18(exp)
    md = main.markdown()
    # measured: ES 2*P*(3000 + 1000) = 8e6; GRPO 2*P*(800 + 200) + 6*P*500 = 5e6 (P = 1000)
    assert "| ES (iter=2) | 2(2)(10)(20)PL = 800 PL | 2.00× | 400 | 3,000 | 1,000 | 0 | 8.000e+06 | 1.60× |" in md
    assert "| GRPO | 8(5)(5)(2)PL = 400 PL | 1.00× | 100 | 800 | 200 | 500 | 5.000e+06 | 1.00× |" in md
    assert "| ES (iter=2) | Countdown | 400 |" in detail.markdown()
    path = write_all_tables(root)
    written = path.read_text()
    assert TABLE2 in written and "8 of 9 stages done." in written
    assert (root / "tables" / "table2_holdout.csv").read_text() == t2.csv()
    assert (root / "tables" / "results.csv").read_text().count("\n") == 1 + 4 + 7 * 4


def test_results_csv_keeps_seed_zero(tmp_path):
    """results.csv printed seed 0 as an empty cell, the base stage's mark, so seed 0's rows lost their seed."""
    from esft.experiments.study_tables import results_csv

    root = tmp_path / "exp"
    spec = {"name": "s", "kind": "single-task", "model": "m", "tasks": ["countdown"], "seeds": [0, 1],
            "evaluation": {"holdout": [], "limit": 10, "max_new_tokens": 8, "per_task": {}}}
    stages = [_stage("base", kind="base")] + [
        _stage(f"seed-{seed}/single-task/countdown/es", seed=seed, track="es", display="ES", task="countdown",
               index=1) for seed in (0, 1)]
    results = {"base": _rec({"countdown": 20}), "seed-0/single-task/countdown/es": _rec({"countdown": 30}),
               "seed-1/single-task/countdown/es": _rec({"countdown": 40})}
    _write(root, spec, stages, results)
    rows = [line.split(",")[:2] for line in results_csv(load_experiment(root)).splitlines()[1:]]
    assert rows == [["base", ""], ["seed-0/single-task/countdown/es", "0"], ["seed-1/single-task/countdown/es", "1"]]


def test_table1_layout(tmp_path):
    root = tmp_path / "exp"
    spec = {"name": "s", "kind": "single-task", "model": "m", "tasks": ["countdown", "math"], "seeds": [42],
            "evaluation": {"holdout": [], "limit": None, "max_new_tokens": 8, "per_task": {}}}
    stages = [_stage("base", kind="base")]
    results = {"base": _rec({"countdown": 20.5, "math": 61.8})}
    for task, accs in (("countdown", (75.1, 78.6, 74.5)), ("math", (72.4, 74.0, 68.8))):
        for (track, display), acc in zip((("es@100", "ES (iter=100)"), ("es@300", "ES (iter=300)"),
                                          ("grpo", "GRPO")), accs):
            key = f"seed-42/single-task/{task}/{track}"
            stages.append(_stage(key, seed=42, track=track, display=display, task=task, index=1))
            results[key] = _rec({task: acc})
    _write(root, spec, stages, results)
    t1 = table1(load_experiment(root))
    assert t1.markdown().startswith(
        "### Table 1: Accuracy (%) for single task training (m).\n\n"
        "| Task | Base | ES (iter=100) | ES (iter=300) | GRPO |\n"
        "| --- | --- | --- | --- | --- |\n"
        "| Countdown | 20.5 [15.5, 25.5] | 75.1 [70.1, 80.1] | 78.6 [73.6, 83.6] | 74.5 [69.5, 79.5] |\n"
        "| Math | 61.8 [56.8, 66.8] | 72.4 [67.4, 77.4] | 74.0 [69.0, 79.0] | 68.8 [63.8, 73.8] |\n")
    assert t1.csv().splitlines() == [
        "Task,Base,Base std,Base seed 42,ES (iter=100),ES (iter=100) std,ES (iter=100) seed 42,ES (iter=300),"
        "ES (iter=300) std,ES (iter=300) seed 42,GRPO,GRPO std,GRPO seed 42",
        "Countdown,20.5,,20.5,75.1,,75.1,78.6,,78.6,74.5,,74.5",
        "Math,61.8,,61.8,72.4,,72.4,74,,74,68.8,,68.8"]


def test_cli_dry_run_and_errors(tmp_path, capsys):
    from esft.cli import main

    assert main(["experiment", "run", "cpu-mini-sequential", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "seed-42/sequential/grpo/4-boolq" in out and "is valid" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("  grpo:\n", "  grpo:\n    lerning_rate: 1\n"))
    assert main(["experiment", "run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml:10:" in err and "learning_rate" in err
    assert not (tmp_path / "runs").exists()
    assert main(["experiment", "list"]) == 0
    assert "cpu-mini-single" in capsys.readouterr().out


def test_status_says_stopped_for_a_stage_no_runner_is_working_on(tmp_path, capsys):
    """A stage killed (kill -9: no chance to record the stop) keeps status.json "running"; `esft experiment
    status` printed "running" for it although nothing ran. Only a runner holding the folder's lock makes a stage
    running; one whose stop was recorded ("stopped") reads as stopped whoever holds the folder."""
    from esft.cli import main
    from esft.experiments.invocation import experiment_lock as _lock

    root = tmp_path / "exp"
    (root / "base").mkdir(parents=True)
    (root / "plan.json").write_text(json.dumps({"stages": [{"key": "base"}, {"key": "s/es"}]}))
    (root / "base" / "status.json").write_text(json.dumps({"status": "running", "pid": 1}))
    assert main(["experiment", "status", str(root)]) == 0
    out = capsys.readouterr().out
    assert "stopped" in out and "resumes it" in out and "running" not in out and "pending" in out
    assert not (root / ".lock").exists()  # the probe creates nothing
    with _lock(root):
        assert main(["experiment", "status", str(root)]) == 0
        out = capsys.readouterr().out
        assert "running" in out and "stopped" not in out
        (root / "base" / "status.json").write_text(json.dumps({"status": "stopped"}))
        assert main(["experiment", "status", str(root)]) == 0
        assert re.search(r"^base +stopped +interrupted or killed: `esft experiment run` resumes it$",
                         capsys.readouterr().out, flags=re.M)


def test_carry_optimizer_state_loads_moments_not_learning_rates(tmp_path):
    import torch

    from esft.experiments.runner import _carry_optimizer_callback
    from types import SimpleNamespace

    model = torch.nn.Linear(3, 2)
    old = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    old.step()
    torch.save(old.state_dict(), tmp_path / "optimizer.pt")
    new = torch.optim.AdamW(model.parameters(), lr=0.5)
    callback = _carry_optimizer_callback(tmp_path)
    callback.on_train_begin(None, SimpleNamespace(global_step=3), None, optimizer=new)
    assert not new.state  # a resumed stage keeps its own checkpointed state
    callback.on_train_begin(None, SimpleNamespace(global_step=0), None, optimizer=new)
    for p in model.parameters():
        assert torch.equal(new.state[p]["exp_avg"], old.state[p]["exp_avg"])
    assert new.param_groups[0]["lr"] == 0.5  # the new stage's schedule, not the old stage's last lr


def test_turning_on_carry_optimizer_state_after_a_partial_run_is_refused(tmp_path):
    """sequential.carry_optimizer_state is no trainer field, so it was not in a stage's fingerprint: switching it
    on after some stages had trained went unnoticed and the experiment mixed stages trained each way."""
    import dataclasses

    from esft.experiments.runner import STATUS, _step_configs, check_existing
    from esft.experiments.stage_eval import write_json

    text = GOOD.replace("  grpo:\n", "  grpo->es: {grpo: {max_steps: 1}, es: {iterations: 1}}\n  grpo:\n", 1)
    spec = load_spec_text(tmp_path, text)
    stages = build_plan(spec)
    root, smap = tmp_path / "out", {s.key: s for s in stages}
    keys = ["seed-42/sequential/grpo/1-countdown", "seed-42/sequential/grpo/2-boolq",
            "seed-42/sequential/grpo-to-es/1-countdown", "seed-42/sequential/grpo-to-es/2-boolq"]
    for key in keys:
        (root / key).mkdir(parents=True)
        configs = _step_configs(spec, smap[key], root, smap)  # as a run without carried state records them
        write_json(root / key / STATUS, {"status": "done", "fingerprint": [
            {"algorithm": st.algorithm, "config": json.loads(json.dumps(dataclasses.asdict(c), default=str))}
            for st, c in zip(smap[key].steps, configs)]})
    carried = load_spec_text(tmp_path, text + "sequential: {carry_optimizer_state: true}\n")
    with pytest.raises(SpecError, match=r"grpo/2-boolq was trained with other options "
                                        r"\(carry_optimizer_state: None -> True\)"):
        check_existing(carried, stages, root)
    # stage 1 starts from the base model, and a chain's GRPO step after ES weights has no AdamW state to carry
    # (ES with Adam leaves an optimizer.pt of its own): neither changes, so neither is refused
    import shutil
    shutil.rmtree(root / keys[1])
    check_existing(carried, build_plan(carried), root)


def test_fingerprints_recorded_before_newer_fields_still_match(tmp_path):
    """A stage recorded by an earlier esft (no eval_balanced, rollout_dtype, report_to, noise_stream or run_name;
    GRPO with gradient_checkpointing) resumes: fields that cannot change a stage's result are compared on neither
    side."""
    import dataclasses
    import json

    from esft.experiments.runner import STATUS, _step_configs, check_existing
    from esft.experiments.stage_eval import write_json

    spec = load_spec_text(tmp_path, GOOD)
    stages = build_plan(spec)
    root, smap = tmp_path / "out", {s.key: s for s in stages}
    newer = {"eval_balanced", "rollout_dtype", "report_to", "noise_stream", "run_name"}
    for key in ("seed-42/sequential/es@2/1-countdown", "seed-42/sequential/grpo/1-countdown"):
        configs = _step_configs(spec, smap[key], root, smap)
        old = [{"algorithm": st.algorithm,
                "config": {k: v for k, v in json.loads(json.dumps(dataclasses.asdict(c), default=str)).items()
                           if k not in newer}} for st, c in zip(smap[key].steps, configs)]
        if "grpo" in key:
            old[0]["config"]["gradient_checkpointing"] = True
        (root / key).mkdir(parents=True)
        write_json(root / key / STATUS, {"status": "done", "fingerprint": old})
    check_existing(spec, stages, root)  # no SpecError
    # a field that does change the result still counts
    status = json.loads((root / "seed-42/sequential/grpo/1-countdown" / STATUS).read_text())
    status["fingerprint"][0]["config"]["learning_rate"] = 1.0
    write_json(root / "seed-42/sequential/grpo/1-countdown" / STATUS, status)
    with pytest.raises(SpecError, match=r"grpo/1-countdown was trained with other options \(learning_rate: 1.0 ->"):
        check_existing(spec, stages, root)


def test_a_folder_given_as_the_spec_is_named_and_its_spec_pointed_to(tmp_path, capsys):
    """`esft experiment run DIR` read a folder as YAML ("[Errno 21] Is a directory"); an experiment's output folder
    keeps its spec as spec.yaml, which the message names."""
    from esft.cli import main

    assert main(["experiment", "run", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path} is a folder, not a spec file (YAML)" in err and "spec.yaml" not in err, err
    (tmp_path / "spec.yaml").write_text("kind: single-task\n")
    assert main(["experiment", "run", str(tmp_path), "--dry-run"]) == 2
    assert f"its spec is {tmp_path / 'spec.yaml'}" in capsys.readouterr().err


def test_each_step_of_a_chain_starts_from_the_weights_the_step_before_left(tmp_path):
    """grpo->es: the ES step trains from GRPO's final checkpoint, and the next sequential stage from the chain's
    last step (ES), not its first; the stage's result (what is evaluated) is the last step's checkpoint."""
    from esft.experiments.runner import _step_configs

    spec = load_spec_text(tmp_path, GOOD.replace(
        "evaluation:", "  grpo->es:\n    grpo: {max_steps: 1}\n    es: {iterations: 1}\nevaluation:"))
    stages = build_plan(spec)
    smap, root = {s.key: s for s in stages}, tmp_path / "out"
    first, second = smap["seed-42/sequential/grpo-to-es/1-countdown"], smap["seed-42/sequential/grpo-to-es/2-boolq"]
    grpo, es = _step_configs(spec, first, root, smap)
    assert grpo.model == spec.model
    assert es.model == str((root / "seed-42/sequential/grpo-to-es/1-countdown/run-1-grpo/checkpoints/final").resolve())
    assert first.model_dir() == "seed-42/sequential/grpo-to-es/1-countdown/run-2-es/checkpoints/final"
    grpo2, es2 = _step_configs(spec, second, root, smap)
    assert second.parent == first.key and grpo2.model == str((root / first.model_dir()).resolve())
    assert es2.model == str((root / "seed-42/sequential/grpo-to-es/2-boolq/run-1-grpo/checkpoints/final").resolve())
    assert [c.task for c in (grpo, es, grpo2, es2)] == ["countdown", "countdown", "boolq", "boolq"]


@pytest.mark.parametrize("after,expected", [
    ("all", ["countdown", "boolq", "mmlu", "ifeval"]), ("trained", ["boolq"]),
    ("trained+holdout", ["boolq", "mmlu", "ifeval"])])
def test_after_single_task_picks_the_tasks_each_stage_evaluates(tmp_path, after, expected):
    spec = load_spec_text(tmp_path, GOOD.replace("kind: sequential", "kind: single-task")
                 + f"  after_single_task: {after}\n")
    stages = {s.key: s for s in build_plan(spec)}
    for key in ("seed-42/single-task/boolq/es@2", "seed-52/single-task/boolq/es@4", "seed-42/single-task/boolq/grpo"):
        assert stages[key].eval_tasks == expected, key
    assert stages["seed-42/single-task/countdown/grpo"].eval_tasks[0] == "countdown"
    assert stages["base"].eval_tasks == ["countdown", "boolq", "mmlu", "ifeval"]  # the base model: always all


def test_each_budget_of_a_shared_run_waits_for_the_budget_just_below(tmp_path):
    """Budget tracks share stage 1's run: the run continues to 6 only after the snapshot at 4 is taken, else a
    failed stage at 4 would be trained past and its snapshot could never be made."""
    spec = load_spec_text(tmp_path, GOOD.replace("iterations: [2, 4]", "iterations: [2, 4, 6]"))
    stages = {s.key: s for s in build_plan(spec)}
    first = "seed-42/sequential/es@{}/1-countdown"
    assert stages[first.format(2)].after == []
    assert stages[first.format(4)].after == [first.format(2)]
    assert stages[first.format(6)].after == [first.format(4)]
    assert [stages[first.format(b)].steps[0].snapshot for b in (2, 4, 6)] == [True, True, False]
    # later stages wait for their own track's previous stage only
    assert stages["seed-42/sequential/es@6/2-boolq"].after == [first.format(6)]


def test_only_a_grpo_step_after_grpo_weights_carries_the_optimizer_state(tmp_path):
    """sequential.carry_optimizer_state: the stage's first step must be GRPO and the parent's last step must have
    left GRPO weights (with their optimizer.pt); a chain's other step does not count."""
    from esft.experiments.runner import _carries_optimizer

    spec = load_spec_text(tmp_path, GOOD.replace(
        "evaluation:", "  grpo->es:\n    grpo: {max_steps: 1}\n    es: {iterations: 1}\n"
                       "  es->grpo:\n    grpo: {max_steps: 1}\n    es: {iterations: 1}\nevaluation:")
        + "sequential: {carry_optimizer_state: true}\n")
    smap = {s.key: s for s in build_plan(spec)}
    carries = {label: _carries_optimizer(spec, smap[f"seed-42/sequential/{label}/2-boolq"], smap)
               for label in ("grpo", "es@4", "grpo-to-es", "es-to-grpo")}
    assert carries == {"grpo": True, "es@4": False, "grpo-to-es": False, "es-to-grpo": False}
    assert not _carries_optimizer(spec, smap["seed-42/sequential/grpo/1-countdown"], smap)  # from the base model


def test_ifeval_cells_take_the_chosen_metric_and_only_its_own_interval():
    from esft.experiments.records import accuracy, interval

    rec = {"eval": {"ifeval": {"accuracy": 0.6, "prompt_strict": 0.6, "prompt_loose": 0.9, "ci95": [0.5, 0.7]},
                    "boolq": {"accuracy": 0.25, "prompt_loose": 0.99, "ci95": [0.2, 0.3]}}}
    assert accuracy(rec, "ifeval", "prompt_loose") == 90.0 and accuracy(rec, "ifeval", "prompt_strict") == 60.0
    assert accuracy(rec, "boolq", "prompt_loose") == 25.0  # the IFEval metric is IFEval's alone
    # the recorded interval is of `accuracy`: it belongs to no other IFEval level
    assert interval(rec, "ifeval", "prompt_loose") is None and interval(rec, "ifeval", "prompt_strict") == (50.0, 70.0)
    assert interval(rec, "boolq", "prompt_loose") == (20.0, 30.0)
    assert accuracy(None, "boolq") is None and accuracy({"eval": {}}, "boolq") is None
    # a summary with `accuracy` alone (IFEval's prompt-strict level): strict reads it, a missing loose level is
    # no figure rather than the strict one under a loose column
    bare = {"eval": {"ifeval": {"accuracy": 0.6}}}
    assert accuracy(bare, "ifeval", "prompt_strict") == 60.0 and accuracy(bare, "ifeval", "prompt_loose") is None


def test_stage_settings_are_greedy_on_the_test_split_and_same_model_needs_the_folder(tmp_path):
    from esft.experiments.stage_eval import same_model, task_settings

    settings = task_settings(load_spec_text(tmp_path, GOOD), "countdown", "m")
    assert settings["split"] == "test" and settings["temperature"] == 0.0 and settings["model"] == "m"
    # a model recorded inside the folder before it moved is the same place in the moved folder, and only then
    assert same_model("/old/exp/es/checkpoints/final", "/new/exp/es/checkpoints/final", Path("/new/exp"))
    assert not same_model("/old/exp/es/checkpoints/final", "/new/exp/es/checkpoints/final", None)
    assert not same_model("/old/exp/grpo/checkpoints/final", "/new/exp/es/checkpoints/final", Path("/new/exp"))


@pytest.mark.parametrize("name", ["es", "grpo"])
def test_a_stage_run_ends_with_its_learning_curve(tmp_path, monkeypatch, name):
    """Every training stage of an experiment leaves `<run>/curve.png`, as the README says of every run (a GRPO
    stage called esft.grpo.train_grpo, which draws none)."""
    import esft.api
    import esft.grpo.run
    from esft.experiments.algorithms import get_algorithm
    from esft.rundir import TrainResult

    out = tmp_path / "run"

    def trained(config, **kwargs):  # the run's metrics, without the minutes of training
        out.mkdir()
        records = [{"kind": "train", "step": s, "reward": {"mean": 0.1 * s, "min": 0.0, "max": 0.3}}
                   for s in (1, 2)]
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return TrainResult(out, 2, None, None)

    monkeypatch.setattr(esft.grpo.run, "train_grpo", trained)
    monkeypatch.setattr(esft.api, "es_trainer", lambda config, **kw: type("T", (), {"train": trained})())
    algorithm = get_algorithm(name)
    get_algorithm(name).train(algorithm.config_cls(output_dir=str(out)))
    assert (out / "curve.png").stat().st_size > 1000


def test_each_stage_run_is_named_after_its_folder_unless_the_spec_names_it(tmp_path):
    """Every stage's training folder is called `run`: the trackers' run name is the experiment's folder and the
    stage's, unless the option block gives run_name."""
    from esft.experiments.runner import _step_configs

    spec = load_spec_text(tmp_path, GOOD.replace("    max_steps: 2\n", "    max_steps: 2\n    run_name: mine\n"))
    stages = build_plan(spec)
    root, smap = tmp_path / "out", {s.key: s for s in stages}
    es = _step_configs(spec, smap["seed-42/sequential/es@2/1-countdown"], root, smap)
    grpo = _step_configs(spec, smap["seed-52/sequential/grpo/2-boolq"], root, smap)
    assert [c.run_name for c in es] == ["out/seed-42/sequential/es/1-countdown"]
    assert [c.run_name for c in grpo] == ["mine"]


@pytest.mark.parametrize("command", ["tables", "status"])
def test_a_folder_that_is_not_an_experiment_is_named_for_what_it_is(tmp_path, capsys, command):
    """`esft experiment tables|status` said "not an experiment folder (no plan.json)" of a folder that does not
    exist and of a folder of training runs alike; the first is named as missing, the second pointed to
    `esft report`."""
    from esft.cli import main

    run = tmp_path / "runs" / "es"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("algorithm: es\n")
    (run / "metrics.jsonl").write_text("")
    (tmp_path / "other").mkdir()
    expected = {
        tmp_path / "missing": f"{tmp_path / 'missing'} does not exist (an experiment folder is `esft experiment "
                              "run`'s --output-dir)",
        tmp_path / "runs": f"{tmp_path / 'runs'} is not an experiment folder (no plan.json): it holds training "
                           f"runs, which `esft report {tmp_path / 'runs'}` reports on",
        run: f"{run} is not an experiment folder (no plan.json): it is a training run's folder, which "
             f"`esft report {run}` reports on",
        tmp_path / "other": f"{tmp_path / 'other'} is not an experiment folder (no plan.json",
    }
    for folder, words in expected.items():
        assert main(["experiment", command, str(folder)]) == 2
        assert words in capsys.readouterr().err
