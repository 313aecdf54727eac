"""Matplotlib on the Agg backend (files only, no display), with the study's colours: ES blue, GRPO red."""

from __future__ import annotations

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


def save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return path
