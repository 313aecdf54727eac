"""esft.analysis.plots: the study's colours (ES blue, GRPO red, whatever the label's case) and `save`, which
writes a figure on the Agg backend into a folder it creates and closes the figure.

Run: pytest -q tests/test_analysis_plots.py   (seconds)
"""

from __future__ import annotations

import matplotlib

from esft.analysis import plots


def test_colours_of_the_study_whatever_the_case():
    assert [plots.color(x) for x in ("ES", "es", "GRPO", "grpo", "Random")] == \
        ["tab:blue", "tab:blue", "tab:red", "tab:red", "tab:gray"]
    assert plots.color("ES-lowrank") == "tab:green"  # any other method


def test_pyplot_selects_agg_and_save_writes_into_a_new_folder_and_closes(tmp_path):
    before = matplotlib.get_backend()
    matplotlib.use("svg", force=True)  # a caller's other backend (e.g. an interactive one) is switched
    try:
        plt = plots.pyplot()
        assert matplotlib.get_backend().lower() == "agg"
    finally:
        matplotlib.use(before, force=True)
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    path = plots.save(fig, tmp_path / "new" / "folder" / "f.png")
    assert path == tmp_path / "new" / "folder" / "f.png" and path.stat().st_size > 1000
    assert not plt.fignum_exists(fig.number)  # closed: a long report does not keep every figure in memory
