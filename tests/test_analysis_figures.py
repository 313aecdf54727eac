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
