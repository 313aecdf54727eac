"""The report's figures as matplotlib objects, just before they are saved: which series each line, band, marker
and reference line is drawn from, in which colour (ES blue, GRPO red, random grey) and under which label. The
PNG's bytes say none of this, and a figure is read instead of the tables, so a swapped series or a missing
baseline misleads.

Run: PYTHONPATH=src pytest -q tests/test_analysis_figures.py   (seconds)
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from matplotlib.colors import to_rgba

from esft.analysis import drift as D
from esft.analysis import kl as K
from esft.analysis import landscape as L
from esft.analysis import plots
from esft.analysis import sparsity as SP
from esft.analysis import weights as W

BLUE, RED, GREY = to_rgba("tab:blue"), to_rgba("tab:red"), to_rgba("tab:gray")


@pytest.fixture()
def drawn(monkeypatch, tmp_path):
    """draw(fn, *args) -> the Figure that fn would have saved (closed afterwards)."""
    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, path: figures.append(fig) or path)

    def draw(fn, *args, **kwargs):
        fn(*args, tmp_path / "f.png", **kwargs)
        (fig,) = figures[-1:]
        plots.pyplot().close(fig)
        return fig

    return draw


def _xy(line) -> tuple[list, list]:
    return [float(x) for x in line.get_xdata()], [float(y) for y in line.get_ydata()]


def _by_label(ax) -> dict:
    return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


# ---- drift (Figures 6, 9, 10, 11) ---------------------------------------------------------------------------------
def test_total_drift_of_a_grpo_run_against_the_es_law_is_labelled_grpo(drawn):
    """A GRPO run's drift measured against the ES law (`esft analyze drift --run RUNS/grpo --alpha --population`)
    was labelled "ES" and drawn in ES's blue in both panels."""
    grpo = D.DriftSeries(steps=[1, 2], total=[0.5, 1.0], num_params=32)
    left, right = drawn(D.plot_total, grpo, 0.5, 4, method="grpo").axes
    assert left.get_lines()[0].get_label().startswith("GRPO (R$^2$ vs theory")
    assert right.get_lines()[0].get_label() == "GRPO"
    assert to_rgba(left.get_lines()[0].get_color()) == to_rgba(right.get_lines()[0].get_color()) != BLUE


def test_total_drift_draws_es_its_prediction_and_grpo_scaled_by_grpos_own_size(drawn):
    # alpha 0.5, N 4, d 32: the prediction alpha^2 T d / N is 2 T; GRPO's 64 parameters give it the unit 4
    es = D.DriftSeries(steps=[1, 2, 4], total=[1.0, 3.0, 5.0], num_params=32, expected=[1.5, 2.5, 4.5])
    grpo = D.DriftSeries(steps=[1, 2], total=[0.5, 1.0], num_params=64)
    left, right = drawn(D.plot_total, es, 0.5, 4, grpo=grpo).axes
    lines = left.get_lines()
    assert [_xy(line) for line in lines] == [([1, 2, 4], [1.0, 3.0, 5.0]), ([1, 2, 4], [2.0, 4.0, 8.0]),
                                             ([1, 2, 4], [1.5, 2.5, 4.5])]
    assert lines[0].get_label().startswith("ES") and to_rgba(lines[0].get_color()) == BLUE
    assert lines[2].get_label() == "expectation from the logged updates"
    # on top of the measured line, which an exact run's expectation lies on, and not in its colour
    assert lines[2].get_zorder() > lines[0].get_zorder() and to_rgba(lines[2].get_color()) != BLUE
    assert (left.get_xlabel(), left.get_ylabel()) == ("step T", r"$\|\Delta\theta_T\|^2$")
    (inset,) = left.child_axes
    (g,) = inset.get_lines()
    assert inset.get_title() == "GRPO" and _xy(g) == ([1, 2], [0.5, 1.0]) and to_rgba(g.get_color()) == RED
    lab = _by_label(right)
    assert list(lab) == ["ES", "GRPO (same scaling)", "theory (identity)"]
    assert _xy(lab["ES"]) == ([1, 2, 4], [0.5, 1.5, 2.5]) and to_rgba(lab["ES"].get_color()) == BLUE
    assert _xy(lab["GRPO (same scaling)"]) == ([1, 2], [0.125, 0.25])
    assert to_rgba(lab["GRPO (same scaling)"].get_color()) == RED
    assert _xy(lab["theory (identity)"]) == ([1, 2, 4], [1, 2, 4])
    assert right.get_xlabel() == "step T" and right.get_legend() is not None

    assert all(line.get_marker() in ("None", None, "") for ax in (left, right, inset) for line in ax.get_lines())


def test_the_grpo_inset_goes_where_no_es_curve_passes(drawn):
    """Lower right, unless a drift that rises late crosses it (it covered the ES curve there): then upper left."""
    grpo = D.DriftSeries(steps=[1, 2], total=[0.5, 1.0], num_params=64)
    linear = D.DriftSeries(steps=[1, 2, 3], total=[2.0, 4.0, 6.0], num_params=32)  # on its prediction 2 T
    left = drawn(D.plot_total, linear, 0.5, 4, grpo=grpo).axes[0]
    assert _place(left) == pytest.approx(D.INSET_PLACES[0], abs=1e-6)
    late = D.DriftSeries(steps=[1, 2, 3, 4], total=[0.1, 0.2, 0.3, 40.0], num_params=32)
    left = drawn(D.plot_total, late, 0.5, 4, grpo=grpo).axes[0]
    assert _place(left) == pytest.approx(D.INSET_PLACES[1], abs=1e-6)
    assert D.inset_place(left, [1, 2, 3, 4], [[0.1, 0.2, 0.3, 40.0]]) == D.INSET_PLACES[1]


def _place(ax) -> list[float]:
    """Where the drawn figure put `ax`'s inset, in `ax`'s fractions (inset_axes' argument)."""
    (inset,) = ax.child_axes
    ax.figure.canvas.draw()  # places the inset
    p, q = ax.get_position(), inset.get_position()
    return [(q.x0 - p.x0) / p.width, (q.y0 - p.y0) / p.height, q.width / p.width, q.height / p.height]


def test_total_drift_writes_the_displacement_ratio_beside_the_fit_not_over_grpos_inset_line(drawn):
    es = D.DriftSeries(steps=[1, 2], total=[4.0, 8.0], num_params=32)
    grpo = D.DriftSeries(steps=[1, 2], total=[0.01, 0.02], num_params=32)
    left, _ = drawn(D.plot_total, es, 0.5, 4, grpo=grpo).axes
    (inset,) = left.child_axes
    assert not inset.texts
    assert [t.get_text() for t in left.texts][1] == "displacement ES/GRPO = 20x at T=2"  # sqrt(8 / 0.02)


def test_total_drift_of_a_one_step_run_marks_its_points(drawn):
    """A line through one point draws nothing: a one-iteration ES stage beside a one-step GRPO run left both panels
    with axes and a legend but no data."""
    es = D.DriftSeries(steps=[1], total=[2.0], num_params=32, expected=[2.0])
    grpo = D.DriftSeries(steps=[1], total=[0.5], num_params=64)
    left, right = drawn(D.plot_total, es, 0.5, 4, grpo=grpo).axes
    (inset,) = left.child_axes
    drawn_lines = [*left.get_lines(), *inset.get_lines(), *right.get_lines()]
    assert len(drawn_lines) == 7 and all(line.get_marker() == "o" for line in drawn_lines)


def test_total_drift_puts_a_long_run_name_over_both_panels_and_keeps_d_n_alpha(drawn):
    """The report titles the figure with the run's folder: as the left panel's title a long one ran past the
    figure's left edge and replaced the panel's d, N and alpha."""
    es = D.DriftSeries(steps=[1, 2], total=[1.0, 2.0], num_params=32)
    name = "seed-42/sequential/es/1-countdown.numbers=2.max_number=50.ops=plustimes.ask_format=1.shots=2/run" * 2
    fig = drawn(D.plot_total, es, 0.5, 4, title=name)
    left, right = fig.axes
    assert left.get_title() == "d = 32, N = 4, alpha = 0.5" and right.get_title().startswith("scaled by")
    assert fig.get_suptitle().replace("\n", "") == name
    assert max(len(line) for line in fig.get_suptitle().split("\n")) <= 100

TENSORS = [  # q_proj rho 0.5, 1, 3 (quartiles 0.75, 1, 2); two per-layer norm gains
    {"name": f"layers.{i}.self_attn.q_proj.weight", "role": "q_proj", "layer": i, "kind": "attention", "numel": 64,
     "rho": rho, "r2_fit": r2} for i, (rho, r2) in enumerate(((0.5, 0.9), (1.0, 0.8), (3.0, 0.7)))
] + [
    {"name": f"layers.{i}.input_layernorm.weight", "role": "input_layernorm", "layer": i, "kind": "norm",
     "numel": 8, "rho": rho, "r2_fit": r2} for i, (rho, r2) in enumerate(((0.2, 0.4), (0.4, 0.6)))
]


def test_families_figure_puts_each_family_median_and_quartiles_in_its_panel(drawn):
    fig = drawn(D.plot_families, {"tensors": TENSORS})
    (rho_m, rho_n), (r2_m, r2_n) = np.asarray(fig.axes).reshape(2, 2)
    assert (rho_m.get_title(), rho_n.get_title()) == ("matrices", "norms")
    assert rho_m.get_ylabel() == r"$\rho = d_{eff}/d$" and r2_m.get_ylabel() == "R$^2$ (fit through origin)"
    for ax, vals in ((rho_m, [0.5, 1.0, 3.0]), (r2_m, [0.9, 0.8, 0.7]), (rho_n, [0.2, 0.4]), (r2_n, [0.4, 0.6])):
        (points,) = ax.collections[:1]
        assert sorted(points.get_offsets()[:, 1]) == sorted(vals)
    (median,) = rho_m.containers
    assert _xy(median.lines[0]) == ([0.0], [1.0])
    (bar,) = median.lines[2]
    assert tuple(bar.get_segments()[0][:, 1]) == (0.75, 2.0)  # first to third quartile
    assert [t.get_text() for t in r2_m.get_xticklabels()] == ["q_proj"] and not rho_m.get_xticklabels()[0].get_text()


def test_families_figure_says_why_a_panel_has_no_points(drawn):
    """Every step after an ES run's first moved nothing, so no tensor had an R^2: the R^2 panels were left empty
    without a word."""
    flat = [{**r, "r2_fit": None} for r in TENSORS]
    (rho_m, rho_n), (r2_m, r2_n) = np.asarray(drawn(D.plot_families, {"tensors": flat}).axes).reshape(2, 2)
    for ax in (r2_m, r2_n):
        assert [t.get_text() for t in ax.texts] == ["no R$^2$: fewer than two distinct values over the steps"]
    assert not rho_m.texts and not rho_n.texts


def test_tensor_curves_predict_each_family_from_its_own_size(drawn):
    steps = [1, 2]
    series = D.DriftSeries(steps=steps, total=[0.0, 0.0], num_params=1000,
                           per_tensor={r["name"]: [i + 1.0, 2.0 * (i + 1)] for i, r in enumerate(TENSORS)})
    result = {"tensors": TENSORS, "families": {}}
    fig = drawn(D.plot_tensor_curves, series, result, 0.5, 4, families=["q_proj", "input_layernorm"])
    q, norm = fig.axes
    assert (q.get_title(), norm.get_title()) == ("q_proj", "input_layernorm")
    (pred,) = [line for line in q.get_lines() if line.get_linestyle() == "--"]
    assert _xy(pred) == ([1, 2], [4.0, 8.0])  # alpha^2 T d_p / N = 0.25 T 64 / 4
    curves = [_xy(line)[1] for line in q.get_lines() if line.get_linestyle() != "--"]
    assert curves == [[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]]  # layers 0, 1, 2
    (pred,) = [line for line in norm.get_lines() if line.get_linestyle() == "--"]
    assert _xy(pred)[1] == [0.5, 1.0]  # 0.25 T 8 / 4


def test_tensor_curves_name_their_lines_and_keep_tick_labels_off_the_next_panel(drawn):
    """Panels of different y scales side by side (0-2.5 beside 0-0.005): untightened, the second panel's tick
    labels were printed over the first panel; and nothing said the dashed line was the prediction."""
    steps = [1, 2]
    series = D.DriftSeries(steps=steps, total=[0.0, 0.0], num_params=1000,
                           per_tensor={r["name"]: [1.0, 2.5] if r["role"] == "q_proj" else [0.0001, 0.00042]
                                       for r in TENSORS})
    fig = drawn(D.plot_tensor_curves, series, {"tensors": TENSORS, "families": {}}, 0.01, 4,
                families=["q_proj", "input_layernorm"])
    q, norm = fig.axes
    assert [t.get_text() for t in q.get_legend().get_texts()] == ["tensors (darker: deeper layer)",
                                                                   r"$\alpha^2 T d_p / N$"]
    fig.draw_without_rendering()
    labels = [t.get_window_extent() for t in norm.get_yticklabels() if t.get_text()]
    assert labels and min(b.x0 for b in labels) > q.get_window_extent().x1


def test_total_drift_legends_cover_no_data(drawn):
    es = D.DriftSeries(steps=[1, 2, 3], total=[1.0, 2.0, 3.0], num_params=32, expected=[1.0, 2.0, 3.0])
    fig = drawn(D.plot_total, es, 0.5, 4)
    fig.draw_without_rendering()
    for ax in fig.axes:
        assert ax.get_legend().get_window_extent().y1 <= ax.get_window_extent().y0


def test_families_and_rho_r2_figures_say_what_their_marks_are(drawn):
    result = {"tensors": TENSORS, "families": {}}
    fig = drawn(D.plot_families, result)
    assert "median and interquartile range" in fig.get_suptitle() and "theory" in fig.get_suptitle()
    (ax,) = drawn(D.plot_rho_r2, result).axes
    assert "one point per tensor" in ax.get_title()


def test_rho_against_r2_puts_rho_on_x(drawn):
    fig = drawn(D.plot_rho_r2, {"tensors": TENSORS})
    (ax,) = fig.axes
    attention = next(c for c in ax.collections if c.get_label() == "attention")
    assert [tuple(p) for p in attention.get_offsets()] == [(0.5, 0.9), (1.0, 0.8), (3.0, 0.7)]
    assert ax.get_xlabel() == r"$\rho = d_{eff} / d_{total}$" and ax.get_ylabel() == "R$^2$"


# ---- landscape (Figures 3-5) and functional sparsity ------------------------------------------------------------
def test_interpolation_draws_the_path_and_the_chord_between_its_endpoints(drawn):
    acc = [0.6, 0.2, 0.5, 0.4]
    result = {"t": [0.0, 0.25, 0.75, 1.0], "accuracy": {"boolq": acc},
              "barrier": {"boolq": {"max_drop": -0.3, "barrier": True}}}
    (ax,) = drawn(L.plot_interpolation, result, labels=("ES", "GRPO")).axes
    path, chord = ax.get_lines()
    assert _xy(path) == ([0.0, 0.25, 0.75, 1.0], acc)
    assert _xy(chord) == ([0.0, 1.0], [0.6, 0.4])
    assert ax.get_xlabel() == "t  (ES = 0, GRPO = 1)" and ax.get_title() == "boolq: max drop -0.300 (barrier)"


def test_interpolation_legend_names_the_path_and_the_chord_without_a_baseline_too(drawn):
    result = {"t": [0.0, 0.5, 1.0], "accuracy": {"countdown": [0.6, 0.2, 0.4]},
              "barrier": {"countdown": {"max_drop": -0.3, "barrier": True}}}
    (ax,) = drawn(L.plot_interpolation, result, labels=("ES", "GRPO")).axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["weights (1 - t) ES + t GRPO",
                                                                   "straight line between the ends"]
    ax.figure.draw_without_rendering()
    assert ax.get_legend().get_window_extent().y1 <= ax.get_window_extent().y0  # under the panel, over no point


def test_interpolation_titles_of_task_names_with_options_fit_their_panels(drawn):
    """`countdown:numbers=2,max_number=20,ops=+*,ask_format=1` in one unbroken title ran into the next panel's."""
    name = "countdown:numbers=2,max_number=20,ops=+*,ask_format=1"
    result = {"t": [0.0, 1.0], "accuracy": {name: [0.2, 0.4], "boolq": [0.5, 0.5]},
              "barrier": {name: {"max_drop": 0.0, "barrier": False}, "boolq": {"max_drop": 0.0, "barrier": False}}}
    long, short = drawn(L.plot_interpolation, result).axes
    lines = long.get_title().split("\n")
    assert len(lines) > 1 and max(map(len, lines)) <= 40, lines
    assert long.get_title().replace("\n", " ").replace(", ", ",").startswith(name + ": max drop +0.000")
    assert short.get_title() == "boolq: max drop +0.000"


def test_direction_sweep_marks_each_updates_norm_in_its_colour_and_the_reference(drawn):
    mags = [0.0, 2.0, 5.0]
    result = {"magnitudes": mags, "directions": {
        "ES": {"norm": 2.0, "accuracy": {"boolq": [0.5, 0.7, 0.6]}},
        "GRPO": {"norm": 5.0, "accuracy": {"boolq": [0.5, 0.6, 0.8]}},
        "random (per-tensor norms of ES)": {"norm": 2.0, "accuracy": {"boolq": [0.5, 0.45, 0.3]}}}}
    (ax,) = drawn(L.plot_direction_sweep, result, reference={"base": {"boolq": 0.55}}).axes
    lab = {name: line for name, line in _by_label(ax).items() if line.get_linestyle() == "-"}
    assert list(lab) == list(result["directions"])
    for name, colour in (("ES", BLUE), ("GRPO", RED), ("random (per-tensor norms of ES)", GREY)):
        assert _xy(lab[name]) == (mags, result["directions"][name]["accuracy"]["boolq"])
        assert to_rgba(lab[name].get_color()) == colour
    norms = [(line.get_xdata()[0], to_rgba(line.get_color())) for line in ax.get_lines()
             if line.get_linestyle() == "--"]
    assert norms == [(2.0, BLUE), (5.0, RED)]  # none for the random direction
    (base,) = [line for line in ax.get_lines() if line.get_linestyle() == "-."]
    assert set(base.get_ydata()) == {0.55} and [t.get_text() for t in ax.texts] == ["base"]
    assert ax.get_xlabel() == r"distance moved $\|\Delta\theta\|_2$" and ax.get_ylabel() == "accuracy"


def test_direction_sweep_curves_of_equal_accuracy_all_show(drawn):
    """An ES update that changed no answer and the random direction of its norms have the same accuracies: the
    random curve, drawn last with the same marker and width, hid the ES curve, and the figure read as if ES were
    missing. Each curve is drawn thinner than the one before, with its own marker."""
    result = {"magnitudes": [0.0, 1.0], "directions": {d: {"norm": 1.0, "accuracy": {"t": [0.25, 0.25]}}
                                                       for d in ("ES", "GRPO", "random (per-tensor norms of ES)")}}
    (ax,) = drawn(L.plot_direction_sweep, result).axes
    curves = [line for line in ax.get_lines() if line.get_linestyle() == "-"]
    assert len(curves) == 3 and len({line.get_marker() for line in curves}) == 3
    widths, sizes = [line.get_linewidth() for line in curves], [line.get_markersize() for line in curves]
    assert widths == sorted(widths, reverse=True) and len(set(widths)) == 3
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 3


def test_direction_sweep_legend_names_the_dashed_norm_lines(drawn):
    result = {"magnitudes": [0.0, 2.0], "directions": {"ES": {"norm": 2.0, "accuracy": {"boolq": [0.5, 0.7]}},
                                                       "GRPO": {"norm": 1.0, "accuracy": {"boolq": [0.5, 0.6]}}}}
    (ax,) = drawn(L.plot_direction_sweep, result).axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ES", "norm of the ES update", "GRPO",
                                                                   "norm of the GRPO update"]
    ax.figure.draw_without_rendering()  # six entries over a panel hid points: the legend sits under it
    assert ax.get_legend().get_window_extent().y1 <= ax.get_window_extent().y0


def test_direction_sweep_ticks_zero_apart_from_the_decades_on_a_symlog_axis(drawn):
    """Distances 0.5 to 32 take a symlog axis linear below 0.5: its 10^-1 tick sat next to the 0 and the two labels
    were printed on each other."""
    mags = [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    result = {"magnitudes": mags, "directions": {"ES": {"norm": 20.0, "accuracy": {"boolq": [0.6] * 8}}}}
    (ax,) = drawn(L.plot_direction_sweep, result).axes
    assert ax.get_xscale() == "symlog"
    assert [float(x) for x in ax.get_xticks() if 0.0 <= x <= 32.0] == [0.0, 1.0, 10.0]


@pytest.mark.parametrize("draw, result, text", [
    (L.plot_direction_sweep, {"magnitudes": [], "directions": {}}, "no direction or task evaluated"),
    (SP.plot_sparsity_sweep, {"es": {"rows": []}}, "no sparsity level evaluated"),
])
def test_an_empty_sweep_says_so_instead_of_a_bare_frame(drawn, draw, result, text):
    (ax,) = drawn(draw, result).axes
    assert [t.get_text() for t in ax.texts] == [text] and not ax.get_lines()


def test_sparsity_sweep_draws_accuracy_against_sparsity_and_each_base(drawn):
    results = {"es": {"rows": [{"sparsity": s, "accuracy": {"boolq": a}} for s, a in ((0.0, 0.7), (0.9, 0.65))],
                      "base_accuracy": {"boolq": 0.4}},
               "grpo": {"rows": [{"sparsity": s, "accuracy": {"boolq": a}} for s, a in ((0.0, 0.8), (0.5, 0.3))],
                        "base_accuracy": {"boolq": 0.45}}}
    (ax,) = drawn(SP.plot_sparsity_sweep, results).axes
    lab = _by_label(ax)
    assert _xy(lab["es"]) == ([0.0, 0.9], [0.7, 0.65]) and to_rgba(lab["es"].get_color()) == BLUE
    assert _xy(lab["grpo"]) == ([0.0, 0.5], [0.8, 0.3]) and to_rgba(lab["grpo"].get_color()) == RED
    bases = [(line.get_ydata()[0], to_rgba(line.get_color())) for line in ax.get_lines()
             if line.get_linestyle() == "-."]
    assert bases == [(0.4, BLUE), (0.45, RED)]
    assert ax.get_xlabel().startswith("sparsity") and ax.get_ylabel() == "accuracy"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["es", "grpo",
                                                                   "base model (dash-dot, method's colour)"]
    (ax,) = drawn(SP.plot_sparsity_sweep, {"es": {"rows": results["es"]["rows"]}}).axes  # no base line drawn
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["es"]
    # a method's point at the other's place still shows: the later one's marks are smaller, other-shaped, on top
    same = {"es": {"rows": results["es"]["rows"]}, "grpo": {"rows": results["es"]["rows"]}}
    lab = _by_label(drawn(SP.plot_sparsity_sweep, same).axes[0])
    assert lab["es"].get_marker() != lab["grpo"].get_marker()
    assert lab["grpo"].get_markersize() < lab["es"].get_markersize() and lab["grpo"].get_zorder() > lab["es"].get_zorder()


def test_sparsity_base_lines_and_their_legend_entry_look_unlike_the_constant_answer(drawn):
    """The base model's legend entry was a grey dotted line, the look of the constant-answer line beside it."""
    base = {"constant_baseline": 0.62, "constant_baseline_ci95": [0.55, 0.68], "constant_answer": "yes"}
    results = {"es": {"rows": [{"sparsity": 0.0, "accuracy": {"boolq": 0.7}}], "base_accuracy": {"boolq": 0.4},
                      "constant_baseline": {"boolq": base}}}
    (ax,) = drawn(SP.plot_sparsity_sweep, results).axes
    entries = dict(zip([t.get_text() for t in ax.get_legend().get_texts()], ax.get_legend().get_lines()))
    constant = next(h for name, h in entries.items() if name.startswith("best constant answer"))
    base_entry = next(h for name, h in entries.items() if name.startswith("base model"))
    look = (lambda h: (h.get_linestyle(), to_rgba(h.get_color())))
    assert look(base_entry) != look(constant) and base_entry.get_linestyle() != constant.get_linestyle()
    (base_line,) = [line for line in ax.get_lines() if list(line.get_ydata()) == [0.4, 0.4]]
    assert base_line.get_linestyle() == base_entry.get_linestyle()


# ---- weights and KL ---------------------------------------------------------------------------------------------
def test_weights_figure_draws_norms_and_stable_ranks_per_layer_in_each_methods_shades(drawn):
    rows = [{"role": "q_proj", "layer": layer, "es": {"sq": es_sq, "stable_rank": es_sr},
             "grpo": {"sq": g_sq, "stable_rank": g_sr}}
            for layer, es_sq, es_sr, g_sq, g_sr in ((1, 9.0, 2.0, 1.0, 1.5), (0, 4.0, 3.0, 16.0, None))]
    fig = drawn(W.plot_weights, {"labels": ["es", "grpo"], "tensors": rows}, title="es, stage 2: boolq")
    assert fig.get_suptitle() == "es, stage 2: boolq"
    norms, ranks = fig.axes
    lab = _by_label(norms)
    assert _xy(lab["es q_proj"]) == ([0, 1], [2.0, 3.0]) and _xy(lab["grpo q_proj"]) == ([0, 1], [4.0, 1.0])
    es_rgb, grpo_rgb = (to_rgba(lab[k].get_color()) for k in ("es q_proj", "grpo q_proj"))
    assert es_rgb[2] > es_rgb[0] and grpo_rgb[0] > grpo_rgb[2]  # a blue and a red
    es_sr, grpo_sr = (_xy(line)[1] for line in ranks.get_lines())
    assert es_sr == [3.0, 2.0] and math.isnan(grpo_sr[0]) and grpo_sr[1] == 1.5 and not ranks.texts
    assert norms.get_yscale() == "log" and (norms.get_ylabel(), ranks.get_ylabel()) == (r"$\|\Delta W\|_F$",
                                                                                       "stable rank")
    assert norms.get_xlabel() == ranks.get_xlabel() == "layer"


def test_weights_figure_without_a_given_title_names_its_updates_and_its_legend_is_readable_beside_the_panels(drawn):
    """`esft weights` passes no title: the figure said nothing of what it compared; its 14-entry legend, at size 5
    inside the norm panel, was unreadable and hid lines."""
    rows = [{"role": fam, "layer": 0, "es": {"sq": 4.0, "stable_rank": 2.0}, "grpo": {"sq": 1.0, "stable_rank": 1.0}}
            for fam in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")]
    fig = drawn(W.plot_weights, {"labels": ["es", "grpo"], "tensors": rows})
    assert fig.get_suptitle() == "update from the base model: es, grpo"
    norms, ranks = fig.axes
    assert norms.get_title() and ranks.get_title()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    (legend,) = legends
    assert len(legend.get_texts()) == 14 and min(t.get_fontsize() for t in legend.get_texts()) >= 7
    fig.draw_without_rendering()
    box = legend.get_window_extent()
    assert all(not box.overlaps(ax.get_window_extent()) for ax in fig.axes)


def test_weights_figure_tells_two_updates_of_one_algorithm_apart(drawn):
    """Two ES seeds (labels es_42, es_43) took the same blue for each family, so their lines could not be told
    apart: the second of one algorithm's colours is dashed, in both panels."""
    rows = [{"role": "q_proj", "layer": 0, **{lab: {"sq": 1.0, "stable_rank": 2.0}
                                              for lab in ("es_42", "es_43", "grpo")}}]
    norms, ranks = drawn(W.plot_weights, {"labels": ["es_42", "es_43", "grpo"], "tensors": rows}).axes
    lab = _by_label(norms)
    looks = {k: (to_rgba(lab[k].get_color()), lab[k].get_linestyle()) for k in lab}
    assert len(set(looks.values())) == 3
    assert looks["es_42 q_proj"][0] == looks["es_43 q_proj"][0]  # both still ES blue
    assert [line.get_linestyle() for line in ranks.get_lines()] == ["-", "--", "-"]


def test_weights_figure_of_updates_that_moved_nothing_keeps_a_linear_axis_and_says_so(drawn, recwarn):
    """Runs whose updates were all zero (e.g. every member scored alike) made matplotlib warn that a log axis
    had no positive values, and drew an empty panel without a word."""
    rows = [{"role": "q_proj", "layer": 0, "es": {"sq": 0.0, "stable_rank": None},
             "grpo": {"sq": 0.0, "stable_rank": None}}]
    norms, ranks = drawn(W.plot_weights, {"labels": ["es", "grpo"], "tensors": rows}).axes
    assert norms.get_yscale() == "linear" and [t.get_text() for t in norms.texts] == ["every update norm is 0"]
    assert [t.get_text() for t in ranks.texts] == ["no stable rank: no matrix was updated"]
    assert not [w for w in recwarn if "log" in str(w.message)]


def test_heatmap_names_rows_by_task_and_columns_by_stage_and_writes_each_value_in_its_cell(drawn):
    m = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])  # 2 evaluation tasks x 3 stages
    fig = drawn(K.plot_heatmap, {"ES": (m, ["boolq", "gsm8k"], ["1:boolq", "2:gsm8k", "3:arc"])})
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["boolq", "gsm8k"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["after 1:boolq", "after 2:gsm8k", "after 3:arc"]
    assert {t.get_position(): t.get_text() for t in ax.texts} == {
        (j, i): f"{m[i, j]:.3g}" for i in range(2) for j in range(3)}


def test_heatmap_says_n_a_in_a_cell_not_measured(drawn):
    m = np.array([[0.1, np.nan]])
    (ax, _) = drawn(K.plot_heatmap, {"ES": (m, ["boolq"], ["1:boolq", "2:math"])}).axes
    assert {t.get_position(): t.get_text() for t in ax.texts} == {(0, 0): "0.1", (1, 0): "n/a"}


def test_heatmap_colour_bar_of_small_kls_shows_short_labels_and_a_power_of_ten(drawn):
    m = np.array([[1.16e-4, 2.0e-6]])  # within LOG_SCALE_SPAN: a linear scale
    fig = drawn(K.plot_heatmap, {"ES": (m, ["boolq"], ["1:boolq", "2:math"])})
    fig.draw_without_rendering()
    bar = fig.axes[-1]
    labels = [t.get_text().replace("$\\mathdefault{", "").replace("}$", "") for t in bar.get_yticklabels()]
    assert labels and max(len(t) for t in labels) <= 4, labels  # not 0.00000 ... 0.00010
    assert "10^{\u22124}" in bar.yaxis.get_offset_text().get_text()  # matplotlib's minus sign


def test_heatmap_colour_bar_names_its_quantity_and_unit(drawn):
    """The colour bar of Figure 2 had no label: numbers without the unit (nats) or that they are per token."""
    m = np.array([[0.1, 0.2]])
    fig = drawn(K.plot_heatmap, {"incremental": (m, ["boolq"], ["1:boolq", "2:math"]),
                                 "cumulative": (m, ["boolq"], ["1:boolq", "2:math"])})
    assert fig.axes[-1].get_ylabel() == "KL per token (nats)"  # the colour bar, drawn last


def test_heatmap_row_labels_of_long_task_names_stay_clear_of_the_panel_to_their_left(drawn):
    """A data task's absolute path (or a task with options) as the GRPO panel's row label ran over the ES panel's
    cells, and its values."""
    m = np.array([[5.8e-4, 1e-3], [2e-3, 4e-3]])
    rows = ["/tmp/some/where/my-data/sums.jsonl", "countdown:numbers=2,max_number=20,ops=+*"]
    fig = drawn(K.plot_heatmap, {"ES": (m, rows, ["1:a", "2:b"]), "GRPO": (m * 1e3, rows, ["1:a", "2:b"])})
    fig.draw_without_rendering()
    es, grpo = fig.axes[:2]
    assert [t.get_text().replace("\n", "") for t in grpo.get_yticklabels()] == rows  # wrapped, not cut
    assert min(t.get_window_extent().x0 for t in grpo.get_yticklabels()) > es.get_window_extent().x1
    # a task with options longer still, on a single panel: the cells keep a width (the layout does not collapse)
    name = "c/sums.jsonl:prompt_field=question,reward=my_rewards:correct_sum"
    fig = drawn(K.plot_heatmap, {"incremental": (m[:1, :1], [name], ["es"]), "cumulative": (m[:1, :1], [name], ["es"])})
    fig.draw_without_rendering()
    inc, cum = fig.axes[:2]
    assert inc.get_window_extent().width > 50 and cum.get_window_extent().width > 50
    assert min(t.get_window_extent().x0 for t in cum.get_yticklabels()) > inc.get_window_extent().x1


def test_heatmap_row_labels_of_many_long_task_names_do_not_print_over_each_other(drawn):
    """Twenty data tasks' paths, each wrapped to two or three lines, in the fixed 3.6-inch-high figure: every row
    label overlapped its neighbours and none could be read."""
    rows = [f"/home/user/data/tasks/my_task_number_{i}.jsonl:prompt_field=question" for i in range(20)]
    m = np.linspace(0.0, 1.0, 40).reshape(20, 2)
    for panels in ({"ES": (m, rows, ["1:a", "2:b"]), "GRPO": (m, rows, ["1:a", "2:b"])},
                   {"ES": (m[:1], rows[:1], ["1:a", "2:b"])}):
        fig = drawn(K.plot_heatmap, panels)
        fig.draw_without_rendering()
        for ax in fig.axes[:len(panels)]:
            boxes = [t.get_window_extent() for t in ax.get_yticklabels()]
            assert not any(a.overlaps(b) for a, b in zip(boxes, boxes[1:]))
            assert ax.get_window_extent().height > 50  # the cells keep a height with one task too


def test_sparsity_tick_labels_do_not_overlap_when_the_sweeps_are_close(drawn):
    """One target each, reached at 50.08% (ES) and 50.38% (GRPO): the axis got seven 6-digit labels, printed over
    each other."""
    results = {lab: {"rows": [{"sparsity": x, "accuracy": {"t": 0.4}}], "algorithm": lab}
               for lab, x in (("es", 0.50076), ("grpo", 0.50384))}
    (ax,) = drawn(SP.plot_sparsity_sweep, results).axes
    fig = ax.figure
    fig.canvas.draw()
    lo, hi = ax.get_xlim()
    boxes = sorted((t.get_window_extent() for t, x in zip(ax.get_xticklabels(), ax.get_xticks()) if lo <= x <= hi
                    and t.get_text()), key=lambda b: b.x0)
    assert len(boxes) >= 2 and all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:]))


def test_sparsity_lines_take_the_colour_of_their_algorithm_not_of_their_label(drawn):
    """A report keys each sweep by its track name ("es@100" for one budget of several, a chain's label for a
    second sequence of a track): colour by the label alone drew those ES and GRPO lines in the same green."""
    rows = [{"sparsity": 0.0, "accuracy": {"boolq": 0.5}}]
    results = {"es@100": {"rows": rows, "base_accuracy": {"boolq": 0.4}, "algorithm": "es"},
               "GRPO boolq seed 2 (run)": {"rows": rows, "algorithm": "grpo"},
               "tuned": {"rows": rows}}  # esft-analysis sparsity: no algorithm, its label's colour
    (ax,) = drawn(SP.plot_sparsity_sweep, results).axes
    colours = [(line.get_label(), to_rgba(line.get_color())) for line in ax.get_lines() if line.get_linestyle() != "-."]
    assert colours == [("es@100", BLUE), ("GRPO boolq seed 2 (run)", RED), ("tuned", to_rgba("tab:green"))]
    (base,) = [line for line in ax.get_lines() if line.get_linestyle() == "-."]
    assert to_rgba(base.get_color()) == BLUE


def test_direction_sweep_draws_any_number_of_reference_accuracies(drawn):
    """Each further reference line was drawn 0.25 darker: a fourth one (base and three checkpoints) asked for an
    alpha of 1.25, and matplotlib's ValueError ended the figure."""
    result = {"magnitudes": [0.0, 1.0], "directions": {"ES": {"norm": 1.0, "accuracy": {"boolq": [0.5, 0.6]}}}}
    reference = {lab: {"boolq": acc} for lab, acc in (("base", 0.1), ("ES 1", 0.2), ("ES 2", 0.3), ("GRPO", 0.4))}
    (ax,) = drawn(L.plot_direction_sweep, result, reference=reference).axes
    lines = [line for line in ax.get_lines() if line.get_linestyle() == "-."]
    assert [line.get_ydata()[0] for line in lines] == [0.1, 0.2, 0.3, 0.4]
    assert [t.get_text() for t in ax.texts] == ["base", "ES 1", "ES 2", "GRPO"]
    assert [line.get_alpha() for line in lines] == [0.5, 0.75, 1.0, 1.0]


def test_sparsity_panels_hold_only_the_runs_that_evaluated_their_task(drawn):
    """A report sweeps the first seed of each task sequence (countdown->boolq, boolq->boolq): the panel of a task
    that one run did not evaluate looked its accuracy up there, and the KeyError ended the report."""
    results = {"es": {"rows": [{"sparsity": 0.0, "accuracy": {"countdown": 0.2, "boolq": 0.5}}],
                      "base_accuracy": {"countdown": 0.1, "boolq": 0.4}},
               "ES boolq->boolq": {"rows": [{"sparsity": 0.0, "accuracy": {"boolq": 0.6}}]}}
    boolq, countdown = drawn(SP.plot_sparsity_sweep, results).axes
    assert (boolq.get_title(), countdown.get_title()) == ("boolq", "countdown")
    assert [(line.get_label(), line.get_ydata()[0]) for line in boolq.get_lines() if line.get_linestyle() != "-."] \
        == [("es", 0.5), ("ES boolq->boolq", 0.6)]
    assert [line.get_label() for line in countdown.get_lines() if line.get_linestyle() != "-."] == ["es"]


def test_a_symlog_distance_axis_short_of_two_decades_labels_its_far_end(drawn):
    """Distances 0.02 to 0.9: the only decade past the linear part is 0.1, so without a tick at the far end the
    axis ran to 0.9 unlabelled."""
    mags = [0.0, 0.02, 0.05, 0.1, 0.3, 0.9]
    result = {"magnitudes": mags, "directions": {"ES": {"norm": 0.9, "accuracy": {"boolq": [0.6] * 6}}}}
    (ax,) = drawn(L.plot_direction_sweep, result).axes
    assert ax.get_xscale() == "symlog"
    assert [round(float(x), 6) for x in ax.get_xticks() if 0.0 <= x <= 0.9] == [0.0, 0.1, 0.9]


def _bars(ax) -> list[tuple[float, float, float]]:
    """(x, low, high) of each interval bar of the panel (an errorbar's LineCollection)."""
    from matplotlib.collections import LineCollection

    return [(float(seg[0][0]), float(seg[0][1]), float(seg[1][1])) for c in ax.collections
            if isinstance(c, LineCollection) for seg in c.get_segments()]


def test_landscape_and_sparsity_points_carry_the_wilson_interval_the_tables_print_beside_them(drawn):
    """The tables print each accuracy of the path, the sweeps and the sparsity levels with its 95% Wilson interval
    over the result's n examples; the figures drew the bare points, so a step of one example in fifty (a 0.02 dip)
    read as an effect."""
    from esft.tasks.labels import wilson_interval

    lo, hi = wilson_interval(0.5 * 50, 50)
    path = {"t": [0.0, 0.5, 1.0], "accuracy": {"boolq": [0.6, 0.5, 0.7]}, "n": {"boolq": 50},
            "barrier": {"boolq": {"max_drop": 0.15, "barrier": False}}}
    sweep = {"magnitudes": [0.0, 1.0], "n": {"boolq": 50},
             "directions": {"ES": {"norm": 1.0, "accuracy": {"boolq": [0.6, 0.5]}},
                            "GRPO": {"norm": 1.0, "accuracy": {"boolq": [0.6, 0.5]}}}}
    levels = {"es": {"rows": [{"sparsity": 0.9, "accuracy": {"boolq": 0.5}}], "n": {"boolq": 50}}}
    panels = [drawn(L.plot_interpolation, path).axes[0], drawn(L.plot_direction_sweep, sweep).axes[0],
              drawn(SP.plot_sparsity_sweep, levels).axes[0]]
    for ax, at in zip(panels, (0.5, 1.0, 0.9)):
        assert any(x == at and (low, high) == pytest.approx((lo, hi)) for x, low, high in _bars(ax)), _bars(ax)
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        assert texts.count("95% Wilson interval of each point (n=50)") == 1, texts
    reward = {**path, "accuracy": {"boolq": [2.0, 1.0, 3.0]}, "score": {"boolq": "mean reward"}}
    assert not _bars(drawn(L.plot_interpolation, reward).axes[0])  # no binomial interval on another scale
    assert not _bars(drawn(L.plot_interpolation, {k: v for k, v in path.items() if k != "n"}).axes[0])


def test_sparsity_legend_sits_under_the_panel_over_no_point(drawn):
    """Inside the panel, the legend of two sweeps, the base model and the constant answer covered the low
    accuracies of the sparsest levels, where the sweep's result is."""
    base = {"constant_baseline": 0.62, "constant_baseline_ci95": [0.55, 0.68], "constant_answer": "yes"}
    rows = [{"sparsity": s, "accuracy": {"boolq": a}} for s, a in ((0.0, 0.7), (0.5, 0.2), (0.99, 0.1))]
    results = {m: {"rows": rows, "algorithm": m, "base_accuracy": {"boolq": 0.3}, "n": {"boolq": 50},
                   "constant_baseline": {"boolq": base}} for m in ("es", "grpo")}
    (ax,) = drawn(SP.plot_sparsity_sweep, results).axes
    ax.figure.draw_without_rendering()
    assert ax.get_legend().get_window_extent().y1 <= ax.get_window_extent().y0


def test_heatmap_row_label_of_a_task_with_options_breaks_after_a_comma_not_inside_a_number(drawn):
    """`countdown:numbers=2,max_number=50,ops=+*` was wrapped at 32 characters, inside the 50: `max_number=5`
    over `0,ops=+*`."""
    name = "countdown:numbers=2,max_number=50,ops=+*"
    fig = drawn(K.plot_heatmap, {"ES": (np.array([[0.1]]), [name], ["1:countdown"])})
    (label,) = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert label == "countdown:numbers=2,\nmax_number=50,ops=+*"


def test_every_drift_figure_names_its_run_and_the_report_passes_the_name_to_each(drawn, monkeypatch, tmp_path):
    """Only the total's figure said which run it was; a study of two seeds and three ES runs has six families,
    tensor and rho-R^2 figures each, alike but for their numbers."""
    from esft.analysis import drift_runs

    name = "seed-42/sequential/es@15/2-countdown/run"
    result = {"tensors": TENSORS, "families": {}}
    fig = drawn(D.plot_families, result, title=name)
    assert fig.get_suptitle().startswith(name + "\n") and "median and interquartile range" in fig.get_suptitle()
    assert [ax.get_title() for ax in fig.axes[:2]] == ["matrices", "norms"]
    series = D.DriftSeries(steps=[1, 2], total=[0.0, 0.0], num_params=1000,
                           per_tensor={r["name"]: [1.0, 2.0] for r in TENSORS})
    assert drawn(D.plot_tensor_curves, series, result, 0.1, 4, title=name).get_suptitle() == name
    (ax,) = drawn(D.plot_rho_r2, result, title=name).axes
    assert ax.get_title().startswith(name + "\n") and ax.get_title().endswith("one point per tensor")
    titles = {}
    for fn in ("plot_total", "plot_families", "plot_tensor_curves", "plot_rho_r2"):
        monkeypatch.setattr(D, fn, lambda *a, _fn=fn, **kw: titles.setdefault(_fn, kw.get("title")))

    class Context:
        def fig(self, stem):
            return tmp_path / f"{stem}.png"

        def plot(self, cached, path, draw):
            draw()

    drift_runs._figures(Context(), name, series, result, None, 0.1, 4, False)
    assert titles == dict.fromkeys(("plot_total", "plot_families", "plot_tensor_curves", "plot_rho_r2"), name)


def test_direction_sweep_reference_lines_look_unlike_the_constant_answer(drawn):
    """The base model's accuracy (a dotted black line) beside the constant answer (a dotted grey one) at 32% and
    30%: the two read as one mark."""
    base = {"constant_baseline": 0.3, "constant_baseline_ci95": [0.19, 0.44], "constant_answer": "B"}
    result = {"magnitudes": [0.0, 1.0], "constant_baseline": {"mmlu": base},
              "directions": {"ES": {"norm": 1.0, "accuracy": {"mmlu": [0.32, 0.24]}}}}
    (ax,) = drawn(L.plot_direction_sweep, result, reference={"base": {"mmlu": 0.32}}).axes
    (constant,) = [line for line in ax.get_lines() if line.get_label().startswith("best constant answer")]
    (reference,) = [line for line in ax.get_lines() if list(line.get_ydata()) == [0.32, 0.32]]
    assert reference.get_linestyle() != constant.get_linestyle()
