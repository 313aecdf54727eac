"""esft bench as a demanding user meets it: bad input refused before the model loads, in one line."""

from __future__ import annotations

import pytest


def _main_without_model(monkeypatch, argv):
    import esft.models
    from esft.cli import main

    def no_load(*args, **kwargs):
        raise AssertionError("the model loaded before the options were checked")

    monkeypatch.setattr(esft.models, "load_model", no_load)
    return main(argv)


@pytest.mark.parametrize("flags, words", [
    (["--set", "lean=[1"], "--set lean: '[1' is not a YAML value"),
    (["--set", "batch_size=0"], "--set: batch_size = 0 is not accepted"),
    (["--set", "engine=bogus"], "--set: engine = 'bogus' is not accepted"),
    (["--set", "lean=maybe"], "--set: lean = 'maybe' is not accepted"),
])
def test_bad_generation_overrides_are_refused_before_the_model_loads(monkeypatch, capsys, flags, words):
    """`--set lean=[1` ended in a YAML traceback (exit 1); `--set batch_size=0` or `engine=bogus` loaded the model,
    timed the matmul and built the workload before GenerationConfig refused the value."""
    assert _main_without_model(monkeypatch, ["bench", "--workloads", "cpu-preset", *flags]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flags, words", [
    (["--workloads", ","], "--workloads: none given"),
    (["--workloads", "cpu-preset,cpu-preset"], "--workloads: 'cpu-preset' is given twice"),
    (["--workloads", "cpu-preset", "--noise", "lowrank", "--workers", "2"],
     "--workers: a low-rank population is one batched generation in one process"),
])
def test_workloads_and_layouts_that_cannot_run_are_refused_before_the_model_loads(monkeypatch, capsys, flags, words):
    """An empty --workloads loaded the model, timed the matmul and printed an empty table with exit status 0; a
    workload named twice ran twice, the second run replacing the first in the report; --noise lowrank with
    --workers 2 was refused only after the model loaded and the matmul was timed."""
    assert _main_without_model(monkeypatch, ["bench", *flags]) == 2
    assert words in capsys.readouterr().err
