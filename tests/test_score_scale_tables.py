"""The experiment tables (esft.experiments.study_tables), the report's held-out rows (esft.analysis.runs) and its
landscape and sparsity tables (esft.analysis.landscape_tables, sparsity) show a task whose reward scores outside
[0, 1] as a mean reward: plain numbers with three decimals, not percentages, and no constant-answer baseline (n/a
where the table has that column or row for other tasks). Tasks scored in [0, 1] keep accuracies in % beside the
baseline (esft.tasks.labels.score_name). Hand-made records, no model (< 1 s).

Run: PYTHONPATH=src pytest -q tests/test_score_scale_tables.py
"""

from __future__ import annotations

import json
from pathlib import Path

from esft.analysis.landscape_tables import interpolation_rows, sweep_rows
from esft.analysis.report_builder import Report, ReportConfig
from esft.analysis.run_tables import accuracy_rows
from esft.analysis.runs import load_run
from esft.analysis.sparsity import SparsitySweep, sweep_table_rows
from esft.experiments.records import Experiment, constant_baseline
from esft.experiments.study_tables import method_tables, table1, table2, tables5_8
from esft.tables import Cell
from test_study_tables_audit import sequential_with_constants, spec, stage, summary


def single_task(reward_ci=(2.0, 3.0)) -> Experiment:
    """Base and ES on BoolQ (an accuracy with a constant answer) and on `custom` (scores of 2.5, say: a reward)."""
    stages = [stage("base", kind="base")]
    results = {"base": {"eval": {"boolq": summary(0.5, constant=0.6),
                                 "custom": summary(0.75, constant=0.5, ci=[-0.9, 2.4])}}}
    for task, value in (("boolq", summary(0.7)), ("custom", summary(2.5, constant=0.5, ci=list(reward_ci)))):
        key = f"seed-1/single-task/{task}/es"
        stages.append(stage(key, 1, "es", "ES", task, 1))
        results[key] = {"eval": {task: value}}
    return Experiment(Path("."), spec(["boolq", "custom"], [1]), stages, results)


def test_table1_shows_a_mean_reward_as_a_plain_number_with_no_constant_answer():
    md = table1(single_task()).markdown()
    assert "### Table 1: Accuracy (%) or mean reward for single task training (m)." in md
    assert "| BoolQ | 60.0 [50.0, 70.0] | 50.0 [45.0, 55.0] | 70.0 [65.0, 75.0] |" in md
    assert "| custom | n/a | 0.750 [-0.900, 2.400] | 2.500 [2.000, 3.000] |" in md
    assert "Mean reward, a plain number on its reward function's scale (not %): custom;" in md


def test_a_mean_reward_is_read_from_every_stage_and_its_interval():
    """The base model's mean of 0.75 lies in [0, 1] but its interval does not: the task is a mean reward."""
    exp = single_task(reward_ci=(0.5, 0.9))
    exp.results["seed-1/single-task/custom/es"]["eval"]["custom"]["accuracy"] = 0.7
    assert constant_baseline(exp, "custom") is None and constant_baseline(exp, "boolq") is not None
    assert "| custom | n/a | 0.750 [-0.900, 2.400] | 0.700 [0.500, 0.900] |" in table1(exp).markdown()


def test_a_table_of_mean_rewards_only_has_no_constant_column_and_says_mean_reward():
    exp = single_task()
    exp.spec["tasks"] = ["custom"]
    md = table1(exp).markdown()
    assert "### Table 1: Mean reward for single task training (m)." in md
    assert "| Task | Base | ES |" in md and "Constant answer" not in md and "%" not in md.split("\n\n")[1]
    assert "Wilson" not in md and "normal-approximation interval" in md  # its interval is not Wilson's
    assert "Wilson interval of that seed" in table1(single_task()).markdown()  # beside an accuracy it is


def test_method_table_of_a_mean_reward():
    custom = [t for t in method_tables(single_task()) if "custom" in t.name][0]
    assert custom.columns[:3] == ["Method", "Mean reward", "95% CI"]
    assert custom.title == "Methods on custom (m): mean reward, pass@k and training time."
    md = custom.markdown()
    assert "| ES | 2.500 | [2.000, 3.000] |" in md and "| Base | 0.750 | [-0.900, 2.400] |" in md
    assert "Constant answer" not in md and "normal-approximation interval of the greedy mean reward" in md
    boolq = [t for t in method_tables(single_task()) if "boolq" in t.name][0]
    assert boolq.columns[1] == "Accuracy %" and "| Constant answer | 60.0 | [50.0, 70.0] |" in boolq.markdown()


def test_table2_and_tables5_8_put_n_a_under_a_mean_reward_and_keep_the_rest():
    exp = sequential_with_constants({"mmlu": 0.25, "custom": 0.5})
    for rec in exp.results.values():
        rec["eval"]["custom"]["accuracy"], rec["eval"]["custom"]["ci95"] = 2.5, [2.0, 3.0]
    exp.results["base"]["eval"]["custom"].update(accuracy=1.5, ci95=[1.0, 2.0])
    md = table2(exp).markdown()
    assert "### Table 2: Holdout benchmark accuracy (%) or mean reward throughout sequential training." in md
    assert "| Constant answer | 25.0 [15.0, 35.0] | 25.0 [15.0, 35.0] | n/a | n/a |" in md
    assert "| Base model | 50.0 [45.0, 55.0] | 50.0 [45.0, 55.0] | 1.500 [1.000, 2.000] |" in md
    assert "| Δ (base → final) | +0.0 | +0.0 | +1.000 | +1.000 |" in md
    assert "Mean reward, a plain number on its reward function's scale (not %): custom;" in md
    exp.spec["tasks"] = ["custom"]
    es = tables5_8(exp)[0].markdown()
    assert ": mean reward (single seed) throughout sequential training" in es and "Constant answer" not in es


def test_a_cell_prints_the_decimals_it_is_given():
    assert Cell({1: 2.5}, ci={1: (2.0, 3.25)}, digits=3).text() == "2.500 [2.000, 3.250]"
    assert Cell({1: 2.5, 2: 3.5}, digits=3).text() == "3.0000 ± 0.7071"
    assert Cell({1: 2.5, 2: None}, digits=3).seeds_text() == "2.500 / —"
    assert Cell({1: 62.5}, ci={1: (50.0, 70.0)}).text() == "62.5 [50.0, 70.0]"


def run_dir(tmp_path: Path, name: str, points: list[tuple[float, list[float]]]) -> Path:
    run = tmp_path / name
    run.mkdir()
    (run / "config.yaml").write_text("task: q.jsonl\npopulation_size: 2\n")
    records = [{"kind": "eval", "step": 2 * i, "test_n": 4, "test_accuracy": a, "test_ci95": ci,
                "test_format_rate": 0.5} for i, (a, ci) in enumerate(points)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_the_reports_rows_show_a_mean_reward_as_a_plain_number(tmp_path):
    """Means of 0.75 and 0.9 whose intervals leave [0, 1] are a mean reward; Wilson intervals, an accuracy."""
    runs = [load_run(run_dir(tmp_path, "reward", [(0.75, [-0.9, 2.4]), (0.9, [0.4, 1.4])])),
            load_run(run_dir(tmp_path, "accuracy", [(0.25, [0.05, 0.7]), (0.5, [0.15, 0.85])]))]
    reward, acc = accuracy_rows(runs, lambda r: r.name)
    assert reward[3:8] == ["0.750 mean reward [-0.900, 2.400] (step 0)", "0.900 mean reward (step 2)", "[0.400, 1.400]", 4,
                          "50.0%"]
    assert acc[3:8] == ["25.0% [5.0%, 70.0%] (step 0)", "50.0% (step 2)", "[15.0%, 85.0%]", 4, "50.0%"]


def test_the_reports_heading_names_a_mean_reward_only_when_a_run_has_one(tmp_path):
    def heading(root: Path) -> str:
        report = Report(ReportConfig(dir=str(root), analyses=[], holdout_tasks=[]), progress=False)
        report.discover()
        report.section_accuracy()
        return report.sections[-1].splitlines()[0]

    (tmp_path / "a").mkdir()
    run_dir(tmp_path / "a", "accuracy", [(0.25, [0.05, 0.7])])
    assert heading(tmp_path / "a") == "## Held-out accuracy during training (paper Table 1)"
    run_dir(tmp_path / "a", "reward", [(2.5, [2.0, 3.0])])
    assert heading(tmp_path / "a") == "## Held-out accuracy or mean reward during training (paper Table 1)"


def test_a_sparsity_column_of_a_reward_outside_0_1_prints_plain_numbers():
    """A custom task's mean reward (e.g. 2.5) is no percentage ("250.0%"): its column prints three decimals, from
    every value the table has of it (one value of 1.5 decides the whole column), the accuracy column as before."""
    res = {"rows": [{"tau": 0.0, "sparsity": 0.125, "accuracy": {"a": 0.5, "r": 0.25}},
                    {"tau": 2e-5, "sparsity": 0.78, "accuracy": {"a": 0.375, "r": 1.5}}],
           "base_accuracy": {"a": 0.1, "r": 0.2}}
    rows = sweep_table_rows(SparsitySweep("es", ["r", "a"], res))
    assert rows == [["0", "n/a", "12.5%", "0.250", "50.0%"], ["2.000e-05", "n/a", "78.0%", "1.500", "37.5%"],
                    ["base (all reverted)", "", "100%", "0.200", "10.0%"],
                    ["best constant answer", "", "", "n/a", "n/a"]]  # a result from before recorded no baseline
    res["rows"][1]["accuracy"]["r"], res["base_accuracy"]["r"] = 0.75, -0.5  # only the base's leaves [0, 1]
    assert [row[3] for row in sweep_table_rows(SparsitySweep("es", ["r"], res))] == ["0.250", "0.750", "-0.500"]


def test_landscape_tables_print_a_reward_outside_0_1_as_plain_numbers():
    """Figures 3-5's tables: a task scored outside [0, 1] prints three decimals in every cell of its own (decided
    from all of them: the whole interpolation path, every direction's values), an accuracy task as before."""
    res = {"accuracy": {"acc": [0.5, 0.25, 0.75], "rew": [0.5, -0.25, 0.75]},  # only the path's middle leaves [0, 1]
           "barrier": {"acc": {"min_accuracy": 0.25, "max_drop": 0.375, "at": 0.5, "se": 0.125, "barrier": True},
                       "rew": {"min_accuracy": -0.25, "max_drop": 1.75, "at": 0.5, "se": 0.5, "se_of": "sample",
                               "barrier": True}},
           # a reward's gold labels may give it one: it says nothing on the reward's scale, so none is shown
           "constant_baseline": {t: {"constant_baseline": 0.5, "constant_baseline_ci95": [0.25, 0.75],
                                     "constant_answer": "no"} for t in ("acc", "rew")}}
    assert interpolation_rows(res, ["acc", "rew"]) == [
        ["acc", "50.0%", "75.0%", "25.0%", "+0.375 at t=0.50", "0.125", "yes", "'no' 50.0% [25.0, 75.0]"],
        ["rew", "0.500", "0.750", "-0.250", "+1.750 at t=0.50", "0.5", "yes", "n/a"]]
    sweep = {"magnitudes": [0.0, 2.0], "directions": {
        "es": {"norm": 2.0, "accuracy": {"acc": [0.5, 0.25], "rew": [0.5, 0.75]}},
        "random": {"norm": 2.0, "accuracy": {"acc": [0.5, 1.0], "rew": [0.5, 3.0]}}}}
    header, rows = sweep_rows(sweep)
    assert header == ["direction", "its norm", "task", "|d|=0", "|d|=2"]
    assert rows == [["es", "2", "acc", "50.0%", "25.0%"], ["es", "2", "rew", "0.500", "0.750"],
                    ["random", "2", "acc", "50.0%", "100.0%"], ["random", "2", "rew", "0.500", "3.000"]]
