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


class _Cut:
    """A text file whose writes stop halfway with a KeyboardInterrupt: Ctrl-C while esft writes it."""

    def __init__(self, fh):
        self.fh = fh

    def write(self, text):
        self.fh.write(text[: len(text) // 2])
        self.fh.flush()
        raise KeyboardInterrupt

    def __getattr__(self, name):
        return getattr(self.fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()


@pytest.fixture
def cut_writes(monkeypatch):
    """`cut_writes(name)`: writing a file called `name` (or a temporary `.name...` beside it) is interrupted
    halfway, whether it is opened with open() or Path.write_text."""
    import builtins
    import io as io_module
    from pathlib import Path

    real = builtins.open

    def arm(name: str) -> None:
        def cut_open(file, mode="r", *args, **kwargs):
            fh = real(file, mode, *args, **kwargs)
            base = Path(str(file)).name if isinstance(file, (str, Path)) else ""
            hit = base == name or base.startswith(f".{name}")
            return _Cut(fh) if hit and ("w" in mode or "a" in mode) and "b" not in mode else fh

        monkeypatch.setattr(builtins, "open", cut_open)
        monkeypatch.setattr(io_module, "open", cut_open)

    return arm


def _written_whole(tmp_path, name, write, cut_writes):
    """`write()` once, then again interrupted halfway: the first file is there as it was, nothing beside it."""
    path = write()
    before = path.read_bytes()
    cut_writes(name)
    with pytest.raises(KeyboardInterrupt):
        write()
    assert path.read_bytes() == before
    assert not [p.name for p in path.parent.iterdir() if p.name.startswith(".")]


def test_an_analysis_json_interrupted_while_written_is_the_earlier_one(tmp_path, cut_writes):
    """`esft analyze ...`'s JSON (weights.json, kl.json, ...): a cut one, which `analyze kl --aggregate` reads."""
    from esft.analysis.command_io import write_json

    _written_whole(tmp_path, "kl.json", lambda: write_json(tmp_path, "kl.json", {"config": {}, "x": list(range(99))}),
                   cut_writes)


def test_a_drift_series_interrupted_while_written_is_the_earlier_one(tmp_path, cut_writes):
    """`esft analyze drift`'s series.jsonl: a cut one read back as a shorter run (read_series skips a torn last
    line), not as an error."""
    from esft.analysis.drift import DriftSeries

    series = DriftSeries(steps=list(range(1, 40)), total=[float(s) for s in range(1, 40)])
    _written_whole(tmp_path, "series.jsonl", lambda: series.write(tmp_path / "series.jsonl"), cut_writes)


def test_a_report_cache_entry_interrupted_while_written_leaves_no_temporary_file(tmp_path, cut_writes):
    from esft.analysis.report_cache import write_atomic

    def write():
        write_atomic(tmp_path / "kl_a.json", '{"params": {}, "result": ' + "1" * 999 + "}")
        return tmp_path / "kl_a.json"

    _written_whole(tmp_path, "kl_a.json", write, cut_writes)


@pytest.fixture
def ctrl_c_acts():
    """Python's Ctrl-C handler (pytest started from a background shell ignores SIGINT)."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("overwrite", [False, True], ids=["empty-target", "overwrite"])
def test_an_export_interrupted_while_it_moves_into_place_is_whole(tmp_path, monkeypatch, ctrl_c_acts, overwrite):
    """A Ctrl-C between the renames that put a built export in place left an empty target with some of its files
    (a model folder without its tokenizer, say) or, with --overwrite, no target: the earlier export renamed aside
    to .old_NAME, the new one deleted with the staging folder. It now takes effect once the export is there."""
    import os
    import signal
    import threading

    from test_export import checkpoint_folder

    from esft.export import export_run

    run, out = tmp_path / "run", tmp_path / "out"
    checkpoint_folder(run / "checkpoints" / "final")
    out.mkdir()
    if overwrite:
        export_run(run, out)
    before = sorted(p.name for p in out.iterdir()) if overwrite else None
    real = os.replace

    def replace_then_ctrl_c(src, dst, *args, **kwargs):
        real(src, dst, *args, **kwargs)
        if not str(os.path.basename(src)).startswith(".old_"):
            # to this thread, as a Ctrl-C reaches an export (no other thread runs there to take it)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    monkeypatch.setattr(os, "replace", replace_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        export_run(run, out, overwrite=overwrite)
    monkeypatch.undo()
    assert sorted(p.name for p in out.iterdir()) == (before or ["README.md", "config.json", "generation_config.json",
                                                               "model.safetensors", "tokenizer_config.json"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run"]  # no staging or .old_ folder left
