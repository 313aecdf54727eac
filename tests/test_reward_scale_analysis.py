"""A task whose reward scores outside [0, 1] (a `module:function` reward scoring -2 .. 5, say) in the landscape and
sparsity analyses (esft.analysis.landscape, barrier, landscape_tables, sparsity, commands) and in the experiment's
long-format results.csv (esft.experiments.study_tables.results_csv): its score is named "mean reward" (from the
per-example scores, not the means alone), its barrier uses the sample standard error of the scores instead of
the binomial one, and it has no constant-answer cells. Accuracy tasks print as before. Stub evaluations on a tiny
model, hand-made records (a few seconds).

Run: PYTHONPATH=src pytest -q tests/test_reward_scale_analysis.py
"""

from __future__ import annotations

import csv
import io
import math
import statistics

import pytest

from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from esft.analysis import barrier as B
from esft.analysis import landscape as L
from esft.analysis import landscape_report as LR
from esft.analysis import sparsity as SP
from esft.analysis.commands import format_landscape
from esft.analysis.landscape_tables import (interpolation_header, interpolation_notes, interpolation_rows, sweep_notes,
                                              sweep_rows)
from esft.analysis.report_builder import Report, ReportConfig
from esft.experiments.study_tables import results_csv
from test_analysis_landscape import tiny
from test_score_scale_tables import single_task

#: per-example scores (4 examples) at t = 0, 0.5, 1 of three tasks: a reward on -2 .. 5 ("r"), a reward whose
#: means all lie in [0, 1] ("m"), and a right-or-wrong accuracy ("a")
POINTS = {"r": [[-2, 5, 3, 2], [-2, 5, 0, 1], [0, 5, 3, 4]],
          "m": [[-2, 3, 0, 0], [-2, 2, 0, 0], [-1, 3, 0, 0]],
          "a": [[1, 1, 0, 0], [0, 0, 0, 1], [1, 1, 1, 0]]}


def scripted(points, calls=None):
    """A stand-in for landscape.accuracy: call i returns every task's mean of points[task][i] and hands its
    scores to `scores_out`."""
    count = [0]

    def accuracy(model, tokenizer, tasks, gen_config, scores_out=None, progress=False):
        i = count[0]
        count[0] += 1
        if scores_out is not None:
            scores_out.update({t: [float(v) for v in points[t][i]] for t in tasks})
        return {t: statistics.fmean(points[t][i]) for t in tasks}

    return accuracy


@pytest.fixture
def path(monkeypatch):
    monkeypatch.setattr(L, "accuracy", scripted(POINTS))
    a, b, work = tiny(0), tiny(1), tiny(2)
    return L.interpolation_path(work, None, a, b, [0.5], {t: (None, [0] * 4) for t in POINTS}, None)


def test_a_reward_paths_barrier_is_the_paired_test_over_its_examples(path):
    """r: means 2, 1, 3; the line is at 2.5 at t = 0.5, a drop of 1.5. Each example's own line there is (-1, 5, 3,
    3), its drop (1, 0, 3, 2): sample sd sqrt(5 / 3), SE 0.6455, z = 2.32 > 1.96 (one interior point): a barrier.
    The binomial SE of 2.5 has no real root (2.5 * (1 - 2.5) < 0), and the SE of the scores at t = 0.5 alone
    (1.472) ignores that every point scores the same examples."""
    r = path["barrier"]["r"]
    assert path["score"]["r"] == "mean reward"
    assert (r["max_drop"], r["at"], r["line_at"]) == pytest.approx((1.5, 0.5, 2.5))
    assert r["se"] == pytest.approx(math.sqrt(5 / 3) / 2) and r["se_of"] == "paired" and r["barrier"]
    assert r["z_crit"] == pytest.approx(1.959964) and r["min_accuracy"] == 1.0


def test_a_reward_is_named_from_its_scores_even_when_its_means_stay_in_0_1(path):
    """m's means 0.25, 0, 0.5 would read as an accuracy; its scores (-2, 3) do not. At t = 0.5 the examples'
    drops below their own lines are (0.5, 1, 0, 0): SE sqrt(0.6875 / 3) / 2, z 1.57, no barrier."""
    assert path["score"]["m"] == "mean reward"
    m = path["barrier"]["m"]
    assert m["se"] == pytest.approx(math.sqrt(0.6875 / 3) / 2) and m["max_drop"] == pytest.approx(0.375)
    assert not m["barrier"]


def test_an_accuracy_paths_barrier_is_the_paired_one_too(path):
    """a: right/wrong per example; drops (1, 1, 0.5, -1) at t = 0.5: SE sqrt(2.6875 / 3) / 2."""
    a = path["barrier"]["a"]
    assert path["score"]["a"] == "accuracy" and a["se_of"] == "paired"
    assert a["se"] == pytest.approx(math.sqrt(2.6875 / 3) / 2) and a["max_drop"] == pytest.approx(0.375)
    assert not a["barrier"]


def test_a_paired_test_of_one_example_shows_no_verdict():
    from esft.analysis.landscape_tables import interpolation_rows

    one = {"t": [0.0, 0.5, 1.0], "accuracy": {"a": [1.0, 0.0, 1.0]}, "score": {"a": "accuracy"},
           "barrier": {"a": B.paired_barrier([0, 0.5, 1], [[1], [0], [1]])}, "n": {"a": 1}}
    assert interpolation_rows(one, ["a"])[0][5:7] == ["n/a", "n/a"]


def test_a_sample_standard_error_declares_a_barrier_past_two_of_it():
    b = B.barrier([0, 0.5, 1], [3.0, -1.0, 3.0], n=4, sd=[1.0, 1.0, 1.0])
    assert b["se"] == pytest.approx(0.5) and b["barrier"] and b["max_drop"] == pytest.approx(4.0)
    assert not B.barrier([0, 0.5, 1], [3.0, 2.5, 3.0], n=4, sd=[1.0, 4.0, 1.0])["barrier"]  # 0.5 < 2 * 2 / 2
    assert B.barrier([0, 0.5, 1], [3.0, 2.5, 3.0], n=1, sd=[None, None, None])["se"] is None


def test_the_interpolation_table_names_a_mean_reward_and_its_paired_se(path):
    header = interpolation_header(path, ["r"], ("ES", "GRPO"))
    assert header == ["task", "ES mean reward", "GRPO mean reward", "min on path", "largest drop below the line",
                      "paired SE", "barrier (> 1.96 SE)"]
    assert interpolation_rows(path, ["r", "m"]) == [
        ["r", "2.000", "3.000", "1.000", "+1.500 at t=0.50", "0.6455", "yes"],
        ["m", "0.250", "0.500", "0.000", "+0.375 at t=0.50", "0.2394", "no"]]
    paired, reward = interpolation_notes(path, ["r", "m", "a"])
    assert paired.startswith("Paired SE: the standard error over the examples of each one's drop below its own "
                             "straight line") and "exceeds 1.96 SE" in paired and "the path's 1 interior point " in paired
    assert reward == ("Mean reward, a plain number on its reward function's scale (not %): r, m; the drop is on "
                      "that scale.")


def test_the_interpolation_table_of_accuracies(path):
    assert interpolation_header(path, ["a"], ("ES", "GRPO")) == [
        "task", "ES acc", "GRPO acc", "min on path", "largest drop below the line", "paired SE",
        "barrier (> 1.96 SE)", "best constant answer (95% CI)"]
    # the stand-in task brings no gold answers: no constant answer to show
    assert interpolation_rows(path, ["a"]) == [["a", "50.0%", "75.0%", "25.0%", "+0.375 at t=0.50", "0.4732", "no",
                                                "n/a"]]
    assert [n[:10] for n in interpolation_notes(path, ["a"])] == ["Paired SE:"]
    mixed = interpolation_header(path, ["a", "r"], ("ES", "GRPO"))
    assert mixed[1:3] == ["ES acc or mean reward", "GRPO acc or mean reward"] and mixed[5] == "paired SE"
    # a result computed before the paired test: its tests of the means, named as before
    path["barrier"] = {t: B.barrier(path["t"], path["accuracy"][t], 4) for t in ("a", "r")}
    assert interpolation_header(path, ["a", "r"], ("ES", "GRPO"))[5:7] == ["binomial SE or sample SE",
                                                                            "barrier (> 2 SE)"]
    assert interpolation_rows(path, ["a"])[0][5:7] == ["0.2421", "no"] and interpolation_notes(path, ["a"]) == []


def test_a_reward_result_without_per_example_scores_shows_no_se_or_barrier(path):
    """A result computed before it recorded the scores has a binomial SE for a reward, meaningless on its scale:
    n/a; its name then comes from the values (r's leave [0, 1])."""
    del path["score"]
    path["barrier"] = {t: B.barrier(path["t"], path["accuracy"][t], 4) for t in ("a", "r")}
    row = interpolation_rows(path, ["r"])[0]
    assert row[1] == "2.000" and row[5:] == ["n/a", "n/a"]
    path["barrier"]["a"].pop("se_of")  # an accuracy from such a result keeps its binomial SE
    assert interpolation_rows(path, ["a"])[0][5:] == ["0.2421", "no", "n/a"]


def test_a_direction_sweep_names_each_task_from_its_scores(monkeypatch):
    """Two directions at |d| 0 and 1: the origin is evaluated once (call 0), then each direction's point."""
    points = {"m": [[-2, 3, 0, 0], [0, 1, 1, 0], [1, 0, 1, 0]], "a": [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]]}
    monkeypatch.setattr(L, "accuracy", scripted(points))
    a, b, work = tiny(0), tiny(1), tiny(2)
    dirs = [L.DeltaDirection(a, b, "ES"), L.RandomDirection(L.DeltaDirection(a, b), label="random")]
    res = L.direction_sweep(work, None, a, dirs, [0.0, 1.0], {t: (None, [0] * 4) for t in points}, None)
    assert res["score"] == {"m": "mean reward", "a": "accuracy"}
    header, rows = sweep_rows(res)
    # an accuracy over its 4 examples with the 95% Wilson interval, a mean reward alone
    assert rows == [["ES", rows[0][1], "m", "0.250", "0.500"],
                    ["ES", rows[0][1], "a", "25.0% [4.6, 69.9]", "50.0% [15.0, 85.0]"],
                    ["random", rows[2][1], "m", "0.250", "0.500"],
                    ["random", rows[2][1], "a", "25.0% [4.6, 69.9]", "0.0% [0.0, 49.0]"]]
    over = "[a, b]: the 95% Wilson interval of the accuracy over the evaluated examples ({})."
    assert sweep_notes(res) == [over.format("a n = 4"),
                                "Mean reward, a plain number on its reward function's scale (not %): m."]
    res["score"]["m"] = "accuracy"
    assert sweep_notes(res) == [over.format("m n = 4, a n = 4")]
    assert sweep_rows(res)[1][0][3:] == ["25.0% [4.6, 69.9]", "50.0% [15.0, 85.0]"]


def test_landscape_accuracy_hands_over_every_examples_score(monkeypatch):
    from esft import evaluation

    def evaluate_task(model, tokenizer, task, examples, gen_config, progress=True, records_out=None):
        records_out.extend({"score": s} for s in task)
        return {"accuracy": statistics.fmean(task)}

    monkeypatch.setattr(evaluation, "evaluate_task", evaluate_task)
    got: dict = {}
    assert L.accuracy(None, None, {"r": ([-2, 5], [])}, None, scores_out=got) == {"r": 1.5}
    assert got == {"r": [-2.0, 5.0]}


def test_a_sparsity_sweep_of_a_reward_is_named_from_its_scores(monkeypatch):
    points = {"m": [[-2, 3, 0, 0], [0, 1, 1, 0]], "a": [[1, 0, 0, 0], [1, 1, 0, 0]]}
    monkeypatch.setattr(SP, "accuracy", scripted(points))
    base, tuned, work = tiny(0), tiny(1), tiny(2)
    res = SP.sparsity_sweep(work, None, base, tuned, {t: (None, [0] * 4) for t in points}, None, taus=[0.0])
    assert res["score"] == {"m": "mean reward", "a": "accuracy"}
    sweep = SP.SparsitySweep("es", ["m", "a"], res)
    assert SP.sweep_table_header(sweep) == ["tau", "target sparsity", "sparsity reached", "m mean reward", "a acc"]
    rows = SP.sweep_table_rows(sweep)
    assert rows[0][3:] == ["0.250", "25.0% [4.6, 69.9]"]
    assert rows[1] == ["base (all reverted)", "", "100%", "0.500", "50.0% [15.0, 85.0]"]
    assert rows[2] == ["best constant answer", "", "", "n/a", "n/a"]  # the stand-ins bring no gold answers


def test_the_landscape_command_calls_a_rewards_path_mean_rewards(path):
    res = {"interpolation": path, "directions": {"directions": {}}}
    lines = format_landscape(res).splitlines()
    assert lines[0].startswith("interpolation r: mean rewards [2.0, 1.0, 3.0]")
    assert lines[2].startswith("interpolation a: accuracies 0.500 [0.150, 0.850]; 0.250 [0.046, 0.699]; "
                               "0.750 [0.301, 0.954]  ")


def test_the_reports_landscape_section_names_a_reward(path, tmp_path, monkeypatch):
    from esft.analysis import report_builder

    found = LR.LandscapeReport(("es", "grpo"), ["r", "a"], interpolation=path,
                              interpolation_figure=tmp_path / "i.png",
                              directions={"magnitudes": [0.0], "score": {"r": "mean reward"},
                                          "directions": {"ES": {"norm": 1.0, "accuracy": {"r": [0.5]}}}},
                              directions_figure=tmp_path / "d.png")
    monkeypatch.setattr(report_builder, "report_landscape", lambda ctx: found)
    report = Report(ReportConfig(dir=str(tmp_path), analyses=[], holdout_tasks=[]), progress=False)
    report.section_landscape()
    text = report.sections[-1]
    assert "| task | ES acc or mean reward | GRPO acc or mean reward | min on path | largest drop below the line | " \
           "paired SE | barrier (> 1.96 SE) |" in text
    assert "| r | 2.000 | 3.000 | 1.000 | +1.500 at t=0.50 | 0.6455 | yes |" in text
    assert "\n\nMean reward, a plain number on its reward function's scale (not %): r;" in text
    assert "| ES | 1 | r | 0.500 |\n\nMean reward, a plain number on its reward function's scale (not %): r.\n" in text


def test_the_reports_sparsity_section_names_a_reward(tmp_path, monkeypatch):
    from esft.analysis import report_builder

    res = {"rows": [{"tau": 0.0, "sparsity": 0.0, "accuracy": {"m": 0.5}}], "base_accuracy": {"m": 0.25},
           "score": {"m": "mean reward"}}
    monkeypatch.setattr(report_builder, "report_sparsity",
                        lambda ctx: ([SP.SparsitySweep("es", ["m"], res)], tmp_path / "s.png"))
    report = Report(ReportConfig(dir=str(tmp_path), analyses=[], holdout_tasks=[]), progress=False)
    report.section_sparsity()
    assert "| tau | target sparsity | sparsity reached | m mean reward |" in report.sections[-1]
    assert "| 0 | n/a | 0.0% | 0.500 |" in report.sections[-1]
    assert "constant" not in report.sections[-1]  # a mean reward alone: no constant-answer row


def test_results_csv_leaves_a_rewards_constant_answer_cells_empty():
    """The custom task's records carry a constant baseline (its gold labels have one), which says nothing on a
    reward's scale: empty cells under the same header; BoolQ's stay."""
    exp = single_task()
    for rec in exp.results.values():
        for summ in rec["eval"].values():
            summ["constant_answer"] = "yes"
    rows = list(csv.DictReader(io.StringIO(results_csv(exp))))
    assert list(rows[0])[7:15] == ["n", "accuracy", "ci95_low", "ci95_high", "constant_baseline",
                                   "constant_ci95_low", "constant_ci95_high", "constant_answer"]
    custom = [r for r in rows if r["eval_task"] == "custom"]
    boolq = [r for r in rows if r["eval_task"] == "boolq"]
    assert len(custom) == 2 and len(boolq) == 2
    for r in custom:
        assert [r[k] for k in ("constant_baseline", "constant_ci95_low", "constant_ci95_high",
                               "constant_answer")] == ["", "", "", ""]
    assert [r["accuracy"] for r in custom] == ["0.75", "2.5"] and custom[1]["ci95_low"] == "2.0"
    base = boolq[0]
    assert (base["constant_baseline"], base["constant_ci95_low"], base["constant_answer"]) == ("0.6", "0.5", "yes")


def test_the_figures_label_a_rewards_axis_mean_reward(path, tmp_path, monkeypatch):
    from esft.analysis import plots

    labels = []
    real_save = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, p: labels.append([ax.get_ylabel() for ax in fig.get_axes()])
                        or real_save(fig, p))
    L.plot_interpolation(path, tmp_path / "i.png")
    L.plot_direction_sweep({"magnitudes": [0.0, 1.0], "score": {"r": "mean reward", "a": "accuracy"},
                            "directions": {"ES": {"norm": 1.0, "accuracy": {"r": [2.0, 3.0], "a": [0.5, 0.5]}}}},
                           tmp_path / "d.png")
    SP.plot_sparsity_sweep({"es": {"rows": [{"sparsity": 0.5, "accuracy": {"r": 2.0}}], "base_accuracy": {"r": 1.0},
                                   "score": {"r": "mean reward"}}}, tmp_path / "s.png")
    assert labels == [["mean reward", "mean reward", "accuracy"], ["mean reward", "accuracy"], ["mean reward"]]


def test_the_progress_lines_print_each_score_as_the_tables_do(monkeypatch, capsys):
    """A percentage for an accuracy, three decimals for a mean reward (they printed 0.500 and 2.000 alike)."""
    monkeypatch.setattr(L, "accuracy", scripted(POINTS))
    a, b, work = tiny(0), tiny(1), tiny(2)
    L.interpolation_path(work, None, a, b, [0.5], {t: (None, [0] * 4) for t in POINTS}, None, progress=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["interpolation t=0.000 r=2.000 m=0.250 a=50.0%",
                     "interpolation t=0.500 r=1.000 m=0.000 a=25.0%",
                     "interpolation t=1.000 r=3.000 m=0.500 a=75.0%"]
    # the origin, evaluated once, is named from its scores for every direction (from its mean alone, the reward
    # "m" read as 25.0% on the second)
    points = {"a": [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]], "m": [[-2, 3, 0, 0], [-1, 3, 0, 0], [2, 0, 0, 0]]}
    monkeypatch.setattr(L, "accuracy", scripted(points))
    dirs = [L.DeltaDirection(a, b, "ES"), L.DeltaDirection(b, a, "back")]
    L.direction_sweep(work, None, a, dirs, [0.0, 1.0], {t: (None, [0] * 4) for t in points}, None, progress=True)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == ["a=25.0% m=0.250", "a=50.0% m=0.500", "a=25.0% m=0.250",
                                                         "a=0.0% m=0.500"]
