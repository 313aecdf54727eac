"""Matplotlib on the Agg backend (files only, no display), with the study's colours: ES blue, GRPO red."""

from __future__ import annotations

import math
from pathlib import Path

from esft.es.curve import accuracy_axis  # the training curve holds its held-out panel the same way

COLORS = {"es": "tab:blue", "grpo": "tab:red", "random": "tab:gray"}


def pyplot():
    """matplotlib.pyplot with the Agg backend selected before pyplot is first imported (headless machines)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def color(label: str) -> str:
    return COLORS.get(label.lower(), "tab:green")


def distance_axis(ax, positive) -> None:
    """A distance x axis from 0: symlog when the nonzero distances `positive` (an array) span more than 20x, with
    major ticks at 0 and at the decades past the linear part (the decades inside it would crowd the 0), and at the
    largest distance's leading digit where it lies well past the last decade (0.02-0.9: 0, 0.1 and 0.9)."""
    from matplotlib.ticker import FixedLocator

    if positive.size and positive.max() / positive.min() > 20:
        low, high = float(positive.min()), float(positive.max())
        ax.set_xscale("symlog", linthresh=low)
        top = math.floor(math.log10(high))
        ticks = [0.0, *(10.0 ** k for k in range(math.ceil(math.log10(low)), top + 1))]
        lead = math.floor(high / 10.0 ** top) * 10.0 ** top  # 0.9 of 0.93
        if lead > 3 * ticks[-1]:
            ticks.append(lead)
        ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.set_xlim(left=0.0)  # distances are >= 0: no margin of negative distances (markers on 0 drawn unclipped)


def say_empty(ax, text: str) -> None:
    """`text` in the middle of an empty panel, without ticks: a bare 0-1 frame read as a figure drawn wrong."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


def save(fig, path: str | Path) -> Path:
    """Write `fig` whole or not at all (esft.passk_figure.save_figure) and close it."""
    from esft.passk_figure import save_figure

    try:
        return save_figure(fig, path)
    finally:
        pyplot().close(fig)
