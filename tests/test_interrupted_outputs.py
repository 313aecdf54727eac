"""Ctrl-C or SIGTERM (KeyboardInterrupt in esft: esft.sigterm) while `esft report`, `esft analyze`, `esft eval` and
`esft export` write their outputs: each file is the earlier one or the new one, never a cut one that a later run
takes as complete.

Run: pytest -q tests/test_interrupted_outputs.py   (seconds)
"""

from __future__ import annotations

import io

import pytest


def _cut_savefig(fig):
    """`fig.savefig` that writes half the PNG to the file asked for, then is interrupted (Ctrl-C mid-write)."""
    real = fig.savefig

    def savefig(fname, **kwargs):
        buf = io.BytesIO()
        real(buf, **{**kwargs, "format": kwargs.get("format") or "png"})
        with open(fname, "wb") as fh:
            fh.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        raise KeyboardInterrupt

    fig.savefig = savefig


def _figure():
    from esft.analysis.plots import pyplot

    fig, ax = pyplot().subplots()
    ax.plot([0, 1], [0, 1])
    return fig


@pytest.mark.parametrize("writer", ["analysis", "passk"])
def test_a_figure_interrupted_while_written_leaves_the_earlier_one_or_none(tmp_path, writer):
    """A report whose analysis data is cached keeps a PNG that is there (ReportContext.plot): a cut one, left by a
    Ctrl-C inside savefig, was kept by every later report. The figure is now written aside and renamed."""
    from esft.analysis.plots import save
    from esft.passk_figure import save_figure

    write = save if writer == "analysis" else save_figure
    new, old = tmp_path / "new.png", tmp_path / "old.png"
    write(_figure(), old)
    before = old.read_bytes()
    for path in (new, old):
        fig = _figure()
        _cut_savefig(fig)
        with pytest.raises(KeyboardInterrupt):
            write(fig, path)
    assert not new.exists() and old.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.png"]  # no temporary file left beside it
