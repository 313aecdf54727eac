"""The sequential pass@k tables (esft.experiments.passk_tables) on hand-made stage records: one table per sequential
track, rows Base and After <task>, pass@k of each k with its bootstrap interval per sampled task, n/a where the
scores are not 0/1, dashes where a stage's pass@k was sampled with other settings. No model, no training (< 1 s).

Run: PYTHONPATH=src pytest -q tests/test_sequential_passk_tables.py
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from test_study_tables_audit import spec, stage, summary, write_experiment

from esft.experiments.passk_tables import sequential_passk_tables
from esft.experiments.records import Experiment, load_experiment
from esft.experiments.study_tables import all_tables, write_all_tables

TASKS = ["countdown", "boolq"]
PASSK = {"k": [1, 4], "samples": 4, "temperature": 0.7, "top_p": 1.0, "tasks": TASKS}
NOTE = "pass@k needs right/wrong scores (0 or 1); these include 0.5 (1 of 8 scores)"
HEADER = ("| Stage | Countdown pass@1 % | Countdown pass@1 CI | Countdown pass@4 % | Countdown pass@4 CI "
          "| BoolQ pass@1 % | BoolQ pass@1 CI | BoolQ pass@4 % | BoolQ pass@4 CI |")


def sampled(p1: float, p4: float) -> dict:
    """A sampled summary with pass@1 and pass@4 (intervals +-0.05 and +-0.1 around them)."""
    return {"pass@k": {"1": {"value": p1, "ci95": [p1 - 0.05, p1 + 0.05]},
                       "4": {"value": p4, "ci95": [p4 - 0.1, p4 + 0.1]}}}


def record(countdown: tuple[float, float], boolq: tuple[float, float] | None) -> dict:
    """A stage record whose sampled evaluations have these (pass@1, pass@4); boolq None: its scores are not 0/1."""
    boolq_sampled = sampled(*boolq) if boolq else {"pass@k": None, "pass@k_note": NOTE}
    return {"eval": {"countdown": summary(countdown[0], sampled=sampled(*countdown)),
                     "boolq": summary(0.5, sampled=boolq_sampled)}}


#: (pass@1, pass@4) of Countdown and BoolQ after each stage of each track, for seed 1; seed 2 adds 0.1
STAGES = {"grpo->es": [((0.2, 0.4), (0.6, 0.8)), ((0.3, 0.5), (0.7, 0.9))],
          "es": [((0.15, 0.35), (0.55, 0.75)), ((0.25, 0.45), (0.65, 0.85))]}


def experiment(seeds=(1,), passk=PASSK, boolq_na_after=None) -> tuple[dict, list[dict], dict]:
    """Spec, plan stages and results of a sequential experiment: tracks GRPO->ES and ES over Countdown then BoolQ.
    `boolq_na_after` (a stage index): that stage's BoolQ scores are not 0/1 in every track."""
    sp = spec(TASKS, list(seeds), "sequential", **({"passk": passk} if passk else {}))
    stages, results = [stage("base", kind="base")], {"base": record((0.1, 0.3), (0.5, 0.7))}
    for track, display in (("grpo->es", "GRPO->ES"), ("es", "ES")):
        for i, seed in enumerate(seeds):
            for k, (task, (cd, bq)) in enumerate(zip(TASKS, STAGES[track]), start=1):
                key = f"seed-{seed}/sequential/{track.replace('->', '-to-')}/{k}-{task}"
                stages.append(stage(key, seed, track, display, task, k))
                bump = 0.1 * i
                results[key] = record((cd[0] + bump, cd[1] + bump),
                                      None if k == boolq_na_after else (bq[0] + bump, bq[1] + bump))
    return sp, stages, results


def test_one_table_per_track_with_each_stages_pass_at_k_and_its_interval():
    exp = Experiment(Path("."), *experiment())
    grpo_es, es = sequential_passk_tables(exp)
    assert (grpo_es.name, es.name) == ("passk_sequential_grpo-es", "passk_sequential_es")
    md = grpo_es.markdown()
    assert md.startswith("### pass@k (%, 95% bootstrap intervals) throughout sequential training with GRPO->ES (m).")
    assert HEADER in md
    assert ("| Base | 10.0 | [5.0, 15.0] | 30.0 | [20.0, 40.0] | 50.0 | [45.0, 55.0] | 70.0 | [60.0, 80.0] |"
            in md)
    # the task just trained is bold, as in Tables 5-8
    assert ("| After Countdown | **20.0** | [15.0, 25.0] | **40.0** | [30.0, 50.0] | 60.0 | [55.0, 65.0] | 80.0 "
            "| [70.0, 90.0] |") in md
    assert ("| After BoolQ | 30.0 | [25.0, 35.0] | 50.0 | [40.0, 60.0] | **70.0** | [65.0, 75.0] | **90.0** "
            "| [80.0, 100.0] |") in md
    assert ("| After Countdown | **15.0** | [10.0, 20.0] | **35.0** | [25.0, 45.0] | 55.0 | [50.0, 60.0] | 75.0 "
            "| [65.0, 85.0] |") in es.markdown()
    assert "Sampled evaluation: 4 completions per question at temperature 0.7, top_p 1.0." in md
    assert "n/a" not in md
    assert sequential_passk_tables(Experiment(Path("."), *experiment(passk=None))) == []  # nothing sampled
    # the CSV keeps the intervals beside the values
    assert ('After BoolQ,30,,30,"[25.0, 35.0]",50,,50,"[40.0, 60.0]",70,,70,"[65.0, 75.0]",90,,90,"[80.0, 100.0]"'
            in grpo_es.csv())


def test_pass_at_k_of_scores_not_0_or_1_reads_n_a_with_the_reason():
    exp = Experiment(Path("."), *experiment(boolq_na_after=2))
    md = sequential_passk_tables(exp)[0].markdown()
    assert ("| After Countdown | **20.0** | [15.0, 25.0] | **40.0** | [30.0, 50.0] | 60.0 | [55.0, 65.0] | 80.0 "
            "| [70.0, 90.0] |") in md
    assert "| After BoolQ | 30.0 | [25.0, 35.0] | 50.0 | [40.0, 60.0] | n/a | n/a | n/a | n/a |" in md
    assert f"pass@k n/a (BoolQ): {NOTE}." in md


def test_several_seeds_give_mean_and_std_and_each_seeds_value():
    """As in the methods table: an interval of one seed's evaluation is not one of the mean, so the CI columns are
    dashes over two seeds; the base model, sampled once, keeps its own value and interval."""
    exp = Experiment(Path("."), *experiment(seeds=(1, 2)))
    md = sequential_passk_tables(exp)[0].markdown()
    assert ("| After Countdown | **25.00 ± 7.07** | — | **45.00 ± 7.07** | — | 65.00 ± 7.07 | — | 85.00 ± 7.07 | — |"
            in md)
    assert "| Base | 10.0 | [5.0, 15.0] | 30.0 | [20.0, 40.0] | 50.0 | [45.0, 55.0] | 70.0 | [60.0, 80.0] |" in md
    per_seed = md.split("Per seed (1 / 2):")[1]
    assert "| After Countdown | 20.0 / 30.0 | — | 40.0 / 50.0 | — | 60.0 / 70.0 | — | 80.0 / 90.0 | — |" in per_seed
    assert "The base model is sampled once too" in md


def test_the_tables_are_written_and_listed_and_a_stale_stage_is_left_out(tmp_path):
    """tables.md holds each sequential pass@k table, tables/ its Markdown and CSV; a stage whose pass@k was sampled
    with other settings than the plan's (a re-run stopped before it) shows dashes, and tables.md names it."""
    sp, stages, results = experiment()
    root = write_experiment(tmp_path / "e", sp, stages, results)
    settings = {"samples": 4, "k": [1, 4], "temperature": 0.7, "top_p": 1.0, "seed": 0}
    plan = json.loads((root / "plan.json").read_text())
    (root / "plan.json").write_text(json.dumps({**plan, "sampled": {t: settings for t in TASKS}}))
    stale = "seed-1/sequential/grpo-to-es/2-boolq"
    (root / stale / "eval").mkdir()
    (root / stale / "eval" / "countdown.passk.json").write_text(json.dumps({"settings": {**settings, "samples": 8}}))
    assert [t.name for t in all_tables(load_experiment(root))][-2:] == ["passk_sequential_grpo-es",
                                                                       "passk_sequential_es"]
    text = write_all_tables(root).read_text()
    table = (root / "tables" / "passk_sequential_grpo-es.md").read_text()
    assert table in text and (root / "tables" / "passk_sequential_es.csv").exists()
    assert "| After BoolQ | — | — | — | — | **70.0** | [65.0, 75.0] | **90.0** |" in table
    assert f"- {stale}: its pass@k of Countdown was sampled with other settings than the spec's" in text
    # results.csv has every stage's pass@k and its interval too (shares), empty where it was left out
    written = csv.DictReader(io.StringIO((root / "tables" / "results.csv").read_text()))
    rows = {(r["stage"], r["eval_task"]): r for r in written}
    after = rows[("seed-1/sequential/grpo-to-es/1-countdown", "countdown")]
    assert [float(after[c]) for c in ("pass@1", "pass@1_ci95_low", "pass@1_ci95_high", "pass@4")] == pytest.approx(
        [0.2, 0.15, 0.25, 0.4])
    assert (rows[(stale, "countdown")]["pass@1"], rows[(stale, "boolq")]["pass@4_ci95_high"]) == ("", "1.0")
