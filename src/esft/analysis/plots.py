"""Matplotlib on the Agg backend (files only, no display), with the study's colours: ES blue, GRPO red."""

from __future__ import annotations

from pathlib import Path

COLORS = {"es": "tab:blue", "grpo": "tab:red", "random": "tab:gray"}


def pyplot():
    """matplotlib.pyplot with the Agg backend selected before pyplot is first imported (headless machines)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def color(label: str) -> str:
    return COLORS.get(label.lower(), "tab:green")


def accuracy_axis(ax, label: str = "accuracy") -> None:
    """Hold an accuracy axis to [0, 1]: autoscaled, a flat curve (0.50 to 0.51) would fill the panel and read as
    large swings. Markers on 0 or 1 are drawn unclipped, so they show whole on the frame."""
    ax.set_ylim(0.0, 1.0)
    ax.set_ylabel(label)
    for line in ax.get_lines():
        line.set_clip_on(False)


def save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return path
