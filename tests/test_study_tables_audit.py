"""The study's tables (esft.experiments.records, study_tables, compute_tables) on hand-made stage records: constant
baselines, method tables with pass@k over seeds, results.csv, tables.md and the compute accounting of Table 18,
each cell pinned against hand-computed text. No model, no training (< 1 s).

Run: PYTHONPATH=src pytest -q tests/test_study_tables_audit.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esft.experiments.compute_tables import compute_row, table18
from esft.experiments.records import Experiment, constant_baseline, eval_note, interval, load_experiment
from esft.experiments.study_tables import (all_tables, method_tables, results_csv, table1, table2, tables5_8,
                                          write_all_tables)


def summary(acc: float, constant: float | None = None, ci=None, **extra) -> dict:
    out = {"n": 10, "accuracy": acc, "ci95": ci or [acc - 0.05, acc + 0.05], **extra}
    if constant is not None:
        out.update(constant_baseline=constant, constant_baseline_ci95=[constant - 0.1, constant + 0.1])
    return out


def stage(key, seed=None, track=None, display="Base", task=None, index=0, kind="train"):
    return {"key": key, "kind": kind, "seed": seed, "track": track, "display": display, "task": task,
            "index": index}


def spec(tasks, seeds, kind="single-task", holdout=(), **evaluation):
    return {"name": "t", "kind": kind, "model": "m", "tasks": list(tasks), "seeds": list(seeds),
            "evaluation": {"holdout": list(holdout), "limit": 10, "max_new_tokens": 8, "per_task": {},
                           **evaluation}}


def step(params=1000, gens=10, prompt=60, generated=40, fwd=0, seconds=1.0, coef=100, text="F"):
    out = {"accounting": {"generations": gens, "prompt_tokens": prompt, "tokens_generated": generated,
                          "train_forward_tokens": fwd, "train_seconds": seconds},
           "formula": {"coefficient": coef, "text": text}}
    if params is not None:
        out["num_params"] = params
    return out


# ---- constant-answer baselines --------------------------------------------------------------------------------

def test_constant_baseline_is_the_base_models_else_the_first_stage_that_recorded_one():
    stages = [stage("base", kind="base"), stage("seed-1/single-task/boolq/es", 1, "es", "ES", "boolq", 1)]
    both = Experiment(Path("."), spec(["boolq"], [1]), stages,
                      {"seed-1/single-task/boolq/es": {"eval": {"boolq": summary(0.6, constant=0.7)}},
                       "base": {"eval": {"boolq": summary(0.5, constant=0.6)}}})
    assert constant_baseline(both, "boolq")["constant_baseline"] == 0.6  # the base model's, though stored last
    older_base = Experiment(Path("."), spec(["boolq"], [1]), stages,
                            {"base": {"eval": {"boolq": summary(0.5)}},
                             "seed-1/single-task/boolq/es": {"eval": {"boolq": summary(0.6, constant=0.7)}}})
    assert constant_baseline(older_base, "boolq")["constant_baseline"] == 0.7


def sequential_with_constants(holdout_constants: dict) -> Experiment:
    """Two sequential tracks over two tasks, one seed; holdout h has constant baseline holdout_constants[h]."""
    stages = [stage("base", kind="base")]
    results = {"base": {"eval": {h: summary(0.5, constant=c) for h, c in holdout_constants.items()}}}
    for track in ("es", "grpo"):
        for k, task in enumerate(["countdown", "boolq"], start=1):
            key = f"seed-1/sequential/{track}/{k}-{task}"
            stages.append(stage(key, 1, track, track.upper(), task, k))
            results[key] = {"eval": {h: summary(0.5) for h in holdout_constants}}
    return Experiment(Path("."), spec(["countdown", "boolq"], [1], "sequential", list(holdout_constants)),
                      stages, results)


def test_table2_constant_row_follows_the_holdout_major_columns():
    """Columns are holdout-major (ES (MMLU), GRPO (MMLU), ES (BoolQ), ...): each holdout's baseline is repeated
    once per track under its own columns; a holdout without a recorded baseline shows a dash."""
    md = table2(sequential_with_constants({"mmlu": 0.25, "boolq": 0.6})).markdown()
    assert "| Stage | ES (MMLU) | GRPO (MMLU) | ES (BoolQ) | GRPO (BoolQ) |" in md
    assert "| Constant answer | 25.0 [15.0, 35.0] | 25.0 [15.0, 35.0] | 60.0 [50.0, 70.0] | 60.0 [50.0, 70.0] |" in md
    assert "IFEval:" not in md  # the IFEval metric note belongs to tables that show IFEval
    md = table2(sequential_with_constants({"mmlu": 0.25, "ifeval": None})).markdown()
    assert "| Constant answer | 25.0 [15.0, 35.0] | 25.0 [15.0, 35.0] | — | — |" in md


def test_table1_shows_the_constant_column_when_any_task_recorded_one():
    stages = [stage("base", kind="base")]
    results = {"base": {"eval": {"boolq": summary(0.5, constant=0.6), "countdown": summary(0.1)}}}
    for task in ("countdown", "boolq"):
        key = f"seed-1/single-task/{task}/es"
        stages.append(stage(key, 1, "es", "ES", task, 1))
        results[key] = {"eval": {task: summary(0.7)}}
    md = table1(Experiment(Path("."), spec(["countdown", "boolq"], [1]), stages, results)).markdown()
    assert "| Task | Constant answer | Base | ES |" in md
    assert "| Countdown | — | 10.0 [5.0, 15.0] | 70.0 [65.0, 75.0] |" in md
    assert "| BoolQ | 60.0 [50.0, 70.0] | 50.0 [45.0, 55.0] | 70.0 [65.0, 75.0] |" in md
    assert "\nSeed 1.\n" in md


# ---- loading and notes ----------------------------------------------------------------------------------------

def write_experiment(root: Path, sp: dict, stages: list[dict], results: dict, statuses: dict | None = None) -> Path:
    root.mkdir(parents=True)
    (root / "plan.json").write_text(json.dumps({"spec": sp, "stages": stages}))
    for key, rec in results.items():
        (root / key).mkdir(parents=True, exist_ok=True)
        (root / key / "result.json").write_text(rec if isinstance(rec, str) else json.dumps(rec))
    for key, st in (statuses or {key: {"status": "done"} for key in results}).items():
        (root / key).mkdir(parents=True, exist_ok=True)
        (root / key / "status.json").write_text(json.dumps(st))
    return root


def test_an_unreadable_result_is_skipped_not_fatal(tmp_path):
    """A result.json that is not JSON (damaged, or copied in part between machines) costs that stage's cells,
    not every table of the experiment."""
    stages = [stage("base", kind="base"), stage("seed-1/single-task/boolq/es", 1, "es", "ES", "boolq", 1)]
    root = write_experiment(tmp_path / "e", spec(["boolq"], [1]), stages,
                            {"base": {"eval": {"boolq": summary(0.5)}}, "seed-1/single-task/boolq/es": '{"eval": {'})
    exp = load_experiment(root)
    assert list(exp.results) == ["base"]
    assert "| BoolQ | 50.0 [45.0, 55.0] | — |" in table1(exp).markdown()


def test_eval_note_prefers_the_recorded_n_then_the_per_task_limit():
    sp = spec(["boolq", "countdown", "math"], [1], per_task={"countdown": {"limit": 7, "max_new_tokens": 64}})
    sp["evaluation"]["limit"] = None
    exp = Experiment(Path("."), sp, [stage("base", kind="base")],
                     {"base": {"eval": {"boolq": {"n": 3270, "accuracy": 0.5}}}})
    assert eval_note(exp, ["boolq", "countdown", "math"]) == (
        "Greedy evaluation on the test split: BoolQ n=3270, 8 new tokens; Countdown n=7, 64 new tokens; "
        "Math n=all, 8 new tokens.")


# ---- the method tables ----------------------------------------------------------------------------------------

def method_experiment(seeds: list[int]) -> Experiment:
    sp = spec(["boolq"], seeds, passk={"k": [1, 4], "samples": 4, "temperature": 0.7, "top_p": 1.0})
    stages = [stage("base", kind="base")]

    def rec(acc: float, p4: float) -> dict:
        sampled = {"pass@k": {"1": {"value": acc, "ci95": [acc - 0.1, acc + 0.1]},
                              "4": {"value": p4, "ci95": [p4 - 0.1, p4 + 0.1]}}}
        return {"eval": {"boolq": summary(acc, constant=0.6, format_rate=1.0, sampled=sampled)}}

    results = {"base": rec(0.5, 0.7)}
    for i, seed in enumerate(seeds):
        key = f"seed-{seed}/single-task/boolq/es"
        stages.append(stage(key, seed, "es", "ES", "boolq", 1))
        results[key] = {**rec(0.6 + 0.1 * i, 0.8 + 0.1 * i), "steps": [step(seconds=10.0 + 10 * i)]}
    return Experiment(Path("."), sp, stages, results)


def test_method_table_of_one_seed_prints_each_interval():
    t = method_tables(method_experiment([1]))[0]
    assert t.columns == ["Method", "Accuracy %", "95% CI", "Format %", "pass@1 %", "pass@1 CI", "pass@4 %",
                         "pass@4 CI", "Train wall s"]
    assert all(len(cells) == len(t.columns) - 1 for _, cells in t.rows)
    md = t.markdown()
    assert "| Constant answer | 60.0 | [50.0, 70.0] | — | — | — | — | — |" in md
    assert "| ES | 60.0 | [55.0, 65.0] | 100.0 | 60.0 | [50.0, 70.0] | 80.0 | [70.0, 90.0] | 10.0 |" in md
    assert "| Base | 50.0 | [45.0, 55.0] | 100.0 | 50.0 | [40.0, 60.0] | 70.0 | [60.0, 80.0] | — |" in md


def test_method_table_of_several_seeds_averages_them_and_prints_no_single_seed_interval():
    """An interval of seed 1's evaluation is not an interval of the mean over seeds: with two seeds the CI
    columns are dashes, and every value (accuracy, pass@k, wall time) is the mean ± std of both seeds."""
    md = method_tables(method_experiment([1, 2]))[0].markdown()
    assert "| ES | 65.00 ± 7.07 | — | 100.00 ± 0.00 | 65.00 ± 7.07 | — | 85.00 ± 7.07 | — | 15.00 ± 7.07 |" in md
    # the base model, evaluated once for every seed: its one value with its intervals, not a mean ± 0 of copies
    assert "| Base | 50.0 | [45.0, 55.0] | 100.0 | 50.0 | [40.0, 60.0] | 70.0 | [60.0, 80.0] | — |" in md
    # each seed's own accuracy stands beside its own interval in the per-seed rows
    per_seed = md.split("Per seed (1 / 2):")[1]
    assert "| ES | 60.0 [55.0, 65.0] / 70.0 [65.0, 75.0] | — |" in per_seed


# ---- results.csv and tables.md ---------------------------------------------------------------------------------

def test_results_csv_and_tables_md(tmp_path):
    stages = [stage("base", kind="base"), stage("seed-1/single-task/boolq/es", 1, "es", "ES", "boolq", 1),
              stage("seed-1/single-task/boolq/grpo", 1, "grpo", "GRPO", "boolq", 1),
              stage("seed-1/single-task/boolq/dart", 1, "dart", "DART", "boolq", 1)]
    results = {"base": {"eval": {"boolq": summary(0.5, ci=[0.41, 0.59])}},
               "seed-1/single-task/boolq/es": {"eval": {"boolq": summary(0.6)}},
               # a stage being rerun keeps its earlier result.json: it is not done until its status says so
               "seed-1/single-task/boolq/dart": {"eval": {"boolq": summary(0.6)}}}
    statuses = {"base": {"status": "done"}, "seed-1/single-task/boolq/es": {"status": "done"},
                "seed-1/single-task/boolq/grpo": {"status": "failed", "error": "OOM"},
                "seed-1/single-task/boolq/dart": {"status": "running"}}
    root = write_experiment(tmp_path / "e", spec(["boolq"], [1]), stages, results, statuses)
    (root / "invocations.jsonl").write_text('{"wall_s": 3600}\n{"wall_s": 1800}\nnot json\n')
    header, base, es = results_csv(load_experiment(root)).splitlines()[:3]
    values = dict(zip(header.split(","), base.split(",")))
    assert (values["accuracy"], values["ci95_low"], values["ci95_high"]) == ("0.5", "0.41", "0.59")
    assert (values["seed"], values["track"], values["method"], values["trained_task"]) == ("", "", "Base", "")
    values = dict(zip(header.split(","), es.split(",")))  # a trained stage names its seed, track, method and task
    assert (values["stage"], values["seed"], values["track"], values["method"], values["index"],
            values["trained_task"], values["eval_task"]) == ("seed-1/single-task/boolq/es", "1", "es", "ES", "1",
                                                             "boolq", "boolq")
    text = write_all_tables(root).read_text()
    assert "2 of 4 stages done." in text
    assert "- seed-1/single-task/boolq/grpo: failed (OOM)" in text
    assert "- seed-1/single-task/boolq/dart: running" in text
    assert "Wall time of all `esft experiment run` invocations: 5,400 s (1.50 h)." in text


def test_a_stage_being_run_again_shows_no_result_until_it_is_done(tmp_path):
    """A stage re-evaluated after a change of evaluation settings keeps its earlier result.json while it runs, and
    after a failure or a stop: those numbers were measured under the old settings (another limit: other examples
    than the base model's and its constant answer's). The tables showed them as the stage's result."""
    stages = [stage("base", kind="base"), stage("seed-1/single-task/boolq/es", 1, "es", "ES", "boolq", 1),
              stage("seed-1/single-task/boolq/grpo", 1, "grpo", "GRPO", "boolq", 1),
              stage("seed-1/single-task/boolq/dart", 1, "dart", "DART", "boolq", 1)]
    old = {"eval": {"boolq": {**summary(0.9), "n": 5}}}
    results = {"base": {"eval": {"boolq": summary(0.5, constant=0.6)}},
               "seed-1/single-task/boolq/es": {"eval": {"boolq": summary(0.6)}},
               "seed-1/single-task/boolq/grpo": old, "seed-1/single-task/boolq/dart": old}
    statuses = {"base": {"status": "done"}, "seed-1/single-task/boolq/es": {"status": "done"},
                "seed-1/single-task/boolq/grpo": {"status": "failed", "error": "OOM"},
                "seed-1/single-task/boolq/dart": {"status": "running"}}
    exp = load_experiment(write_experiment(tmp_path / "e", spec(["boolq"], [1]), stages, results, statuses))
    assert sorted(exp.results) == ["base", "seed-1/single-task/boolq/es"]
    assert "| BoolQ | 60.0 [50.0, 70.0] | 50.0 [45.0, 55.0] | 60.0 [55.0, 65.0] | — | — |" in table1(exp).markdown()
    assert [line.split(",")[0] for line in results_csv(exp).splitlines()[1:]] == ["base",
                                                                                  "seed-1/single-task/boolq/es"]
    assert "BoolQ n=10" in eval_note(exp, ["boolq"])  # the n of the done stages' evaluations


def test_an_ifeval_instruction_level_share_has_no_prompt_level_interval():
    """IFEval's recorded interval is the Wilson interval of the prompt-level strict share over its n prompts. An
    instruction-level share that happened to equal it (both 0 on a weak model) was given that interval, though it
    is a share of the n_instructions instructions: 0 of 10 prompts is [0, 27.8], 0 of 25 instructions [0, 13.3]."""
    ci = [0.0, 0.2775]
    rec = {"eval": {"ifeval": {"n": 10, "accuracy": 0.0, "ci95": ci, "prompt_strict": 0.0, "prompt_loose": 0.0,
                               "instruction_strict": 0.0, "instruction_loose": 0.0, "n_instructions": 25}}}
    assert interval(rec, "ifeval", "prompt_strict") == pytest.approx((0.0, 27.75))
    assert interval(rec, "ifeval", "prompt_loose") == pytest.approx((0.0, 27.75))  # equal share of the same prompts
    assert interval(rec, "ifeval", "instruction_strict") is None
    assert interval(rec, "ifeval", "instruction_loose") is None
    # an older summary without the prompt-strict key: `accuracy` is that level, with its interval
    assert interval({"eval": {"ifeval": {"accuracy": 0.5, "ci95": [0.3, 0.7]}}}, "ifeval") == (30.0, 70.0)
    sp = spec(["ifeval"], [1])
    sp["ifeval_metric"] = "instruction_strict"
    exp = Experiment(Path("."), sp, [stage("base", kind="base"), stage("seed-1/single-task/ifeval/es", 1, "es", "ES",
                                                                       "ifeval", 1)],
                     {"base": rec, "seed-1/single-task/ifeval/es": rec})
    assert "| IFEval | 0.0 | 0.0 |" in table1(exp).markdown()


# ---- Table 18: compute -----------------------------------------------------------------------------------------

def test_compute_row_sums_the_steps_of_a_chain():
    # P is the first parameter count a step recorded; a step without one still counts its tokens
    rec = {"steps": [step(params=1000, gens=10, prompt=60, generated=40, fwd=0, seconds=1.0, coef=100, text="A"),
                     step(params=None, gens=30, prompt=100, generated=200, fwd=50, seconds=2.0, coef=300, text="B")]}
    row = compute_row(rec)
    assert (row["generations"], row["prompt_tokens"], row["tokens_generated"], row["train_forward_tokens"]) == (
        40, 160, 240, 50)
    assert row["train_seconds"] == 3.0 and row["coefficient"] == 400 and row["formula"] == "A + B"
    assert row["num_params"] == 1000 and row["mean_sequence_tokens"] == 10.0  # (160 + 240) / 40
    assert row["measured_flops"] == 2 * 1000 * 400 + 6 * 1000 * 50
    assert row["formula_flops"] == 400 * 1000 * 10.0  # coefficient * P * L at the measured L
    assert compute_row({"steps": []}) is None


def compute_experiment(kinds=("single-task",), grpo_params=(1000, 1000)) -> Experiment:
    """ES and GRPO (and a GRPO->ES chain listed first), seeds 1 and 2, on one task."""
    stages, results = [stage("base", kind="base")], {}
    tracks = (("grpo->es", "GRPO->ES", 900), ("es", "ES", 800), ("grpo", "GRPO", 400))
    for kind in kinds:
        for track, display, coef in tracks:
            for i, seed in enumerate((1, 2)):
                key = f"seed-{seed}/{kind}/{track}/1-boolq"
                stages.append(stage(key, seed, track, display, "boolq", 1))
                params = grpo_params[i] if track == "grpo" else 1000
                scale = 1 if kind == "single-task" else 100
                results[key] = {"steps": [step(params=params, gens=10 * scale, coef=coef, text=f"{coef}PL",
                                               seconds=10.0 * (i + 1))]}
    return Experiment(Path("."), spec(["boolq"], [1, 2], kinds[0]), stages, results)


def test_table18_is_relative_to_plain_grpo_and_shows_the_formula_at_measured_length():
    main, detail = table18(compute_experiment())
    md = main.markdown()
    assert "relative to GRPO:" in md  # the GRPO->ES chain, listed first, is not the reference
    # formula 400 * P * L with L = (60 + 40) / 10 = 10: 4e6; measured 2 * P * 100 = 2e5; time (10 + 20) / 2
    assert "| GRPO | 400PL = 400 PL | 1.00× | 10 | 60 | 40 | 0 | 2.000e+05 | 1.00× | 4.000e+06 | 15 |" in md
    assert "| ES | 800PL = 800 PL | 2.00× | 10 | 60 | 40 | 0 | 2.000e+05 | 1.00× | 8.000e+06 | 15 |" in md
    assert "| GRPO | BoolQ | 10 | 60 | 40 | 0 | 2.000e+05 | 4.000e+06 | 15 |" in detail.markdown()


def test_table18_means_count_only_stages_that_measured_the_value():
    """A stage without a parameter count has no FLOPs: the mean is over the stages that have one, not a zero."""
    md = table18(compute_experiment(grpo_params=(1000, None)))[0].markdown()
    assert "| GRPO | 400PL = 400 PL | 1.00× | 10 | 60 | 40 | 0 | 2.000e+05 | 1.00× | 4.000e+06 | 15 |" in md


def test_table18_of_single_task_stages_leaves_the_sequential_ones_out():
    md = table18(compute_experiment(kinds=("single-task", "sequential")))[0].markdown()
    assert "| GRPO | 400PL = 400 PL | 1.00× | 10 | 60 | 40 | 0 | 2.000e+05 |" in md


def test_tables5_8_carry_one_constant_cell_per_trained_task():
    exp = sequential_with_constants({"countdown": 0.3, "boolq": 0.6})
    exp.spec["evaluation"]["holdout"] = ["mmlu"]  # the trained tasks' baselines, not the holdout's
    exp.results["base"]["eval"]["mmlu"] = summary(0.5, constant=0.25)
    es, _ = tables5_8(exp)
    assert "| Constant answer | 30.0 [20.0, 40.0] | 60.0 [50.0, 70.0] |" in es.markdown()


def test_table18_without_a_parameter_count_prints_dashes_for_flops():
    exp = compute_experiment()
    for key, rec in exp.results.items():
        if "/es/" in key:
            rec["steps"][0].pop("num_params")
    md = table18(exp)[0].markdown()
    assert "| ES | 800PL = 800 PL | 2.00× | 10 | 60 | 40 | 0 | — | — | — | 15 |" in md


def test_table18_detail_has_one_row_per_method_and_task():
    exp = compute_experiment()
    exp.spec["tasks"] = ["boolq", "countdown"]
    for seed in (1, 2):
        key = f"seed-{seed}/single-task/grpo/1-countdown"
        exp.stages.append(stage(key, seed, "grpo", "GRPO", "countdown", 1))
        exp.results[key] = {"steps": [step(gens=30, seconds=50.0)]}
    rows = [(label, cells[:2]) for label, cells in table18(exp)[1].rows if label == "GRPO"]
    assert rows == [("GRPO", ["BoolQ", "10"]), ("GRPO", ["Countdown", "30"])]


def test_all_tables_holds_every_table_the_stages_support_in_order():
    exp = compute_experiment(kinds=("single-task", "sequential"))
    exp.spec["evaluation"]["holdout"] = ["boolq"]
    assert [t.name for t in all_tables(exp)] == [
        "table1_single_task", "table2_holdout", "table5-8_sequential_grpo-es", "table5-8_sequential_es",
        "table5-8_sequential_grpo", "methods_boolq", "table18_compute", "table18_compute_by_task"]


def test_table18_shows_each_formula_of_stages_that_differ_beside_their_mean():
    """A per_task budget (ES `per_task: {boolq: {iterations: 1}}` beside `iterations: 3`) gives the stages other
    formulas: their mean was printed after the first stage's formula, "2(3)(2)(2)PL = 16 PL"."""
    exp = compute_experiment()
    exp.results["seed-2/single-task/es/1-boolq"]["steps"][0]["formula"] = {"coefficient": 400, "text": "2(1)PL"}
    md = table18(exp)[0].markdown()
    assert "| ES | mean of 800PL = 800 PL, 2(1)PL = 400 PL: 600 PL | 1.50× |" in md, md
    assert "| GRPO | 400PL = 400 PL | 1.00× |" in md  # one formula: as before
