"""A run's summary and figure (esft.es.curve) on the cases the core tests leave out: means over more than two
iterations, a zero total time, held-out sets that differ only in their recorded baseline or in size, and an
accuracy axis widened to a reward outside [0, 1].

Run: PYTHONPATH=src pytest -q tests/test_es_curve_audit.py   (seconds)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esft.es import curve


def _run(root: Path, lines: list[dict]) -> Path:
    root.mkdir(parents=True)
    (root / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    return root


def _train(step: int, total: float, tokens_per_s: float) -> dict:
    return {"kind": "train", "step": step, "time": {"total": total, "generate": total / 2},
            "fitness": {"mean": 0.1, "min": 0.0, "max": 0.2}, "generated_tokens_per_s": tokens_per_s}


def test_per_iteration_figures_are_means_not_medians(tmp_path):
    # three skewed iterations: the mean (4.0, 40.0) and the median (1.0, 10.0) differ
    s = curve.summarize(_run(tmp_path / "run", [_train(1, 1.0, 10.0), _train(2, 1.0, 10.0), _train(3, 10.0, 100.0)]))
    assert s["seconds_per_iteration"] == pytest.approx(4.0)
    assert s["time_split_s"] == pytest.approx({"total": 4.0, "generate": 2.0})
    assert s["generated_tokens_per_s"] == pytest.approx(40.0)


def test_a_zero_total_time_gives_zero_fractions_not_a_division_error(tmp_path):
    s = curve.summarize(_run(tmp_path / "run", [_train(1, 0.0, 0.0)]))
    assert s["seconds_per_iteration"] == 0.0 and s["time_split_fraction"] == {"generate": 0.0}


def test_a_changed_recorded_baseline_alone_marks_a_changed_held_out_set():
    """eval_balanced switched on resume keeps eval_limit (the same n) but evaluates other examples."""
    same_n = [{"test_n": 20, "test_constant_baseline": 0.6, "test_constant_answer": "yes"},
              {"test_n": 20, "test_constant_baseline": 0.5, "test_constant_answer": "yes"}]
    assert curve.heldout_set_changed(same_n)
    assert not curve.heldout_set_changed([same_n[0], dict(same_n[0])])
    assert curve.heldout_set_changed([same_n[0], dict(same_n[0], test_constant_answer="no")])


def test_no_recomputed_baseline_when_the_logged_count_differs_from_the_config(tmp_path):
    # 19 examples evaluated but config.yaml's eval_limit gives 20: not the same held-out examples
    run = _run(tmp_path / "run", [{"kind": "eval", "step": 0, "test_n": 19, "test_accuracy": 0.5,
                                   "test_ci95": [0.3, 0.7]}])
    (run / "config.yaml").write_text("task: boolq\neval_limit: 20\n")
    assert curve.heldout_constant_baseline(run) is None
    (run / "config.yaml").write_text("task: boolq\neval_limit: 19\n")  # the control: the same count recomputes
    assert curve.heldout_constant_baseline(run)["constant_answer"] is not None


def test_accuracy_axis_widens_to_a_reward_outside_zero_one():
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    ax.plot([0, 1, 2], [-0.5, 0.4, 1.25])
    curve.accuracy_axis(ax)
    assert ax.get_ylim() == (-0.5, 1.25) and ax.get_ylabel() == "accuracy"
    inside = Figure().subplots()
    inside.plot([0, 1], [0.5, 0.51])  # a flat curve inside [0, 1] keeps the whole range
    curve.accuracy_axis(inside, "")
    assert inside.get_ylim() == (0.0, 1.0) and inside.get_ylabel() == ""
