"""A run's summary and figure (esft.es.curve) on the cases the core tests leave out: means over more than two
iterations, a zero total time, held-out sets that differ only in their recorded baseline or in size, an
accuracy axis widened to a reward outside [0, 1], and the data, x range and names of each drawn series.

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


def test_time_shares_of_lanes_side_by_side_are_shares_of_wall_time():
    """Two lanes each generating 9 s within a 10 s evaluation log generate = 18 s (summed over lanes): its share of
    a 12 s iteration was 1.5. Scaled to the evaluation's span, the member parts share its 10 s."""
    split = {"total": 12.0, "evaluate": 10.0, "generate": 18.0, "perturb": 2.0, "update": 1.0}
    assert curve.wall_fractions(split) == pytest.approx({"generate": 9 / 12, "perturb": 1 / 12, "update": 1 / 12})
    # the local executor scores after its lanes, on one thread: 3 s of wall time, the lanes share the other 9.5 s
    scored = {"total": 13.0, "evaluate": 12.5, "generate": 18.0, "score": 3.0, "update": 0.5}
    assert curve.wall_fractions(scored) == pytest.approx({"generate": 9.5 / 13, "score": 3 / 13, "update": 0.5 / 13})
    # Ray workers each score their own members: every member part is summed over them
    ray = {"total": 10.0, "evaluate": 10.0, "generate": 16.0, "score": 4.0}
    assert curve.wall_fractions(ray, serial=()) == pytest.approx({"generate": 0.8, "score": 0.2})


def test_the_summary_treats_scoring_as_serial_except_under_ray(tmp_path):
    line = {"kind": "train", "step": 1, "generated_tokens_per_s": 1.0, "fitness": {"mean": 0.1, "min": 0.0, "max": 0.2},
            "time": {"total": 10.0, "evaluate": 10.0, "generate": 16.0, "score": 4.0}}
    local = _run(tmp_path / "local", [line])
    (local / "config.yaml").write_text("executor: local\n")
    assert curve.summarize(local)["time_split_fraction"] == pytest.approx({"generate": 0.6, "score": 0.4})
    ray = _run(tmp_path / "ray", [line])
    (ray / "config.yaml").write_text("executor: ray\n")
    assert curve.summarize(ray)["time_split_fraction"] == pytest.approx({"generate": 0.8, "score": 0.2})
    one_lane = {"total": 12.0, "evaluate": 10.0, "generate": 8.0, "perturb": 1.0, "update": 1.0}  # no scaling
    assert curve.wall_fractions(one_lane) == pytest.approx({"generate": 8 / 12, "perturb": 1 / 12, "update": 1 / 12})
    assert curve.wall_fractions({"total": 4.0, "generate": 6.0}) == {"generate": 1.5}  # no span recorded: as logged


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


def test_no_recomputed_baseline_beside_a_mean_reward(tmp_path):
    """A reward outside [0, 1] records no baseline (esft.rundir.held_out_fields): the summary must not recompute
    one from config.yaml either."""
    record = {"kind": "eval", "step": 0, "test_n": 19, "test_accuracy": 0.5, "test_ci95": [-0.2, 1.2]}
    run = _run(tmp_path / "run", [record])
    (run / "config.yaml").write_text("task: boolq\neval_limit: 19\n")
    assert curve.heldout_constant_baseline(run) is None
    assert "heldout_constant_baseline" not in curve.summarize(run)
    (run / "metrics.jsonl").write_text(json.dumps({**record, "test_ci95": [0.2, 0.8]}) + "\n")  # the control
    assert curve.heldout_constant_baseline(run)["constant_answer"] is not None
    # one score of 1.05 among 0s and 1s (the samples file keeps them): a mean and interval in [0, 1], a mean reward
    (run / "samples").mkdir()
    scores = [1.0] * 9 + [0.0] * 9 + [1.05]
    (run / "samples" / "eval_000000.jsonl").write_text("".join(json.dumps({"index": i, "score": x}) + "\n"
                                                               for i, x in enumerate(scores)))
    assert curve.heldout_constant_baseline(run) is None
    (run / "samples" / "eval_000000.jsonl").write_text(json.dumps({"index": 0, "score": 1.0}) + "\n")
    assert curve.heldout_constant_baseline(run) is not None  # scores in [0, 1]: an accuracy


def test_accuracy_axis_widens_to_a_reward_outside_zero_one():
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    ax.plot([0, 1, 2], [-0.5, 0.4, 1.25])
    curve.accuracy_axis(ax)
    # each widened side with a margin of 4% of the range (a cap on the frame hid in its line)
    assert ax.get_ylim() == pytest.approx((-0.57, 1.32)) and ax.get_ylabel() == "accuracy"
    inside = Figure().subplots()
    inside.plot([0, 1], [0.5, 0.51])  # a flat curve inside [0, 1] keeps the whole range
    curve.accuracy_axis(inside, "")
    assert inside.get_ylim() == (0.0, 1.0) and inside.get_ylabel() == ""


# ---- what each line of the figure is drawn from (a mutation audit found these unchecked) -------------------------
def _es_lines() -> list[dict]:
    """Two iterations at steps 3 and 7 and two evaluations at 0 and 7, every series with distinct values."""
    train = [{"kind": "train", "step": s, "fitness": {"mean": mean, "min": low, "max": high}, "format_rate": rate}
             for s, mean, low, high, rate in ((3, 0.4, 0.1, 0.6, 0.25), (7, 0.5, 0.2, 0.8, 0.75))]
    evals = [{"kind": "eval", "step": s, "test_n": 8, "test_accuracy": acc, "test_ci95": [acc - 0.1, acc + 0.1],
              "test_format_rate": rate} for s, acc, rate in ((0, 0.3, 0.45), (7, 0.6, 0.95))]
    return train + evals


def test_format_rate_lines_plot_the_format_rates_at_their_steps(tmp_path):
    train_ax, heldout_ax = curve.run_figure(_run(tmp_path / "run", _es_lines())).axes
    (train_rate,) = [line for line in train_ax.get_lines() if line.get_label() == "format rate"]
    # a batch at step s was scored around the weights of s - 1 updates: it sits above that held-out point
    assert list(train_rate.get_xdata()) == [2, 6] and list(train_rate.get_ydata()) == [0.25, 0.75]
    (held_rate,) = [line for line in heldout_ax.get_lines() if line.get_label() == "held-out format rate"]
    assert list(held_rate.get_xdata()) == [0, 7] and list(held_rate.get_ydata()) == [0.45, 0.95]


def test_min_max_band_spans_the_logged_steps(tmp_path):
    train_ax, _ = curve.run_figure(_run(tmp_path / "run", _es_lines())).axes
    (band,) = train_ax.collections
    xs = band.get_paths()[0].vertices[:, 0]
    assert (min(xs), max(xs)) == (2, 6)  # the band sits under the mean line (steps 3 and 7 at 2 and 6)
    assert list(train_ax.get_lines()[0].get_xdata()) == [2, 6]


def test_both_panels_name_their_x_axis_and_the_algorithms_population(tmp_path):
    es_train, es_heldout = curve.run_figure(_run(tmp_path / "es", _es_lines())).axes
    assert es_train.get_xlabel() == es_heldout.get_xlabel() == "iteration (updates applied)"
    assert es_train.get_title() == "train batch (perturbed members)"
    assert "min-max over members" in es_train.get_legend_handles_labels()[1]
    grpo = [{"kind": "train", "step": s, "reward": {"mean": 0.5, "min": 0.0, "max": 1.0}} for s in (1, 2)]
    grpo += [{"kind": "eval", "step": 2, "test_n": 8, "test_accuracy": 0.5, "test_ci95": [0.2, 0.8]}]
    grpo_train, grpo_heldout = curve.run_figure(_run(tmp_path / "grpo", grpo)).axes
    assert grpo_train.get_xlabel() == grpo_heldout.get_xlabel() == "step (updates applied)"
    assert grpo_train.get_title() == "train batch (sampled completions)" and grpo_heldout.get_title() == "model"
    assert "min-max over completions" in grpo_train.get_legend_handles_labels()[1]


@pytest.mark.parametrize("steps", [(1, 2, 3), (1,)])
def test_both_panels_tick_whole_steps_only(tmp_path, steps):
    """A run of a few steps got ticks at 1.25, 1.5, ... on its iteration axes; a run of one step 0.945, 0.96, ..."""
    lines = [{"kind": "train", "step": s, "reward": {"mean": 0.5, "min": 0.0, "max": 1.0}} for s in steps]
    lines += [{"kind": "eval", "step": s, "test_n": 2, "test_accuracy": 0.5, "test_ci95": [0.1, 0.9]}
              for s in sorted({0, steps[-1]})]
    fig = curve.run_figure(_run(tmp_path / "run", lines))
    fig.canvas.draw()
    for ax in fig.axes:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_a_grpo_run_is_drawn_in_the_studys_grpo_red_and_an_es_run_in_es_blue(tmp_path):
    from matplotlib.colors import to_rgba

    grpo = [{"kind": "train", "step": s, "reward": {"mean": 0.2 * s, "min": 0.0, "max": 1.0}} for s in (1, 2)]
    grpo.append({"kind": "eval", "step": 2, "test_n": 10, "test_accuracy": 0.5, "test_ci95": [0.2, 0.8]})
    train_ax, heldout_ax = curve.run_figure(_run(tmp_path / "grpo", grpo)).axes
    assert to_rgba(train_ax.get_lines()[0].get_color()) == to_rgba("tab:red")
    assert to_rgba(train_ax.collections[0].get_facecolor()[0], 1.0) == to_rgba("tab:red")  # the min-max band
    assert to_rgba(heldout_ax.get_lines()[0].get_color()) == to_rgba("tab:red")
    train_ax, _ = curve.run_figure(_run(tmp_path / "es", _es_lines())).axes
    assert to_rgba(train_ax.get_lines()[0].get_color()) == to_rgba("tab:blue")


def test_es_batches_and_grpo_steps_sit_at_the_updates_before_them(tmp_path):
    """An ES iteration logged at step 1 scored members around the base model (0 updates), as the held-out point at
    0 did; so did GRPO's step 1, whose completions the base model sampled (it was drawn at 1, one step to the right
    of the ES batch it is compared with)."""
    es = [{"kind": "train", "step": s, "fitness": {"mean": 0.1, "min": 0.0, "max": 0.2}} for s in (1, 2, 3)]
    train_ax, _ = curve.run_figure(_run(tmp_path / "es", es)).axes
    assert list(train_ax.get_lines()[0].get_xdata()) == [0, 1, 2]
    assert train_ax.get_xlabel() == "iteration (updates applied)"
    grpo = [{"kind": "train", "step": s, "reward": {"mean": 0.1, "min": 0.0, "max": 0.2}} for s in (1, 2, 3)]
    train_ax, _ = curve.run_figure(_run(tmp_path / "grpo", grpo)).axes
    assert list(train_ax.get_lines()[0].get_xdata()) == [0, 1, 2]


def test_a_one_iteration_run_shows_its_min_max_range_and_format_rate(tmp_path):
    line = {"kind": "train", "step": 1, "time": {"total": 1.0}, "generated_tokens_per_s": 1.0,
            "fitness": {"mean": 0.02, "min": 0.0, "max": 0.07}, "format_rate": 0.015}
    train_ax, _ = curve.run_figure(_run(tmp_path / "one", [line])).axes
    (band,) = train_ax.containers  # a vertical bar from min to max: a fill over one step has no width
    assert band.get_label() == "min-max over members"
    (segment,) = band.lines[2][0].get_segments()
    assert [tuple(p) for p in segment] == [(0.0, 0.0), (0.0, 0.07)]  # around the base model, at 0
    rate = next(x for x in train_ax.get_lines() if x.get_label() == "format rate")
    assert rate.get_marker() not in (None, "None", "", " ")  # a line through one point alone draws nothing


def test_legends_sit_under_their_panels_and_cover_no_data(tmp_path):
    lines = [{"kind": "train", "step": s, "reward": {"mean": 0.5, "min": 0.0, "max": 1.0}, "format_rate": 0.9}
             for s in range(1, 9)]
    fig = curve.run_figure(_run(tmp_path / "grpo", lines))
    fig.canvas.draw()
    train_ax = fig.axes[0]
    legend = train_ax.get_legend().get_window_extent()
    assert legend.y1 <= train_ax.get_window_extent().y0  # the band fills the panel: inside it, it hid points


def test_a_one_iteration_bar_runs_from_the_minimum_to_the_maximum_not_from_zero(tmp_path):
    """The bar's height is max - min from min: with a minimum of 0 a sum would draw the same bar."""
    line = {"kind": "train", "step": 3, "time": {"total": 1.0}, "generated_tokens_per_s": 1.0,
            "fitness": {"mean": 0.5, "min": 0.25, "max": 0.75}}
    train_ax, _ = curve.run_figure(_run(tmp_path / "one", [line])).axes
    (band,) = train_ax.containers
    (segment,) = band.lines[2][0].get_segments()
    assert [tuple(p) for p in segment] == [(2.0, 0.25), (2.0, 0.75)]
