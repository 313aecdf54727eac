"""`esft experiment run` exits 1 when a stage failed, and names it (esft.experiments.experiment_cli): a script
or CI job running an experiment sees the failure in the exit status, not only in the printed lines.

Run: PYTHONPATH=src pytest -q tests/test_experiment_cli_mutmutmisc.py   (a few seconds)
"""

from __future__ import annotations

from esft.experiments.experiment_cli import spec_summary
from conftest import load_spec_text
from test_experiments import GOOD


def test_a_failed_stage_makes_the_run_exit_1_and_is_named(tmp_path, capsys, monkeypatch):
    import esft.experiments.runner as runner
    from esft.cli import main

    load_spec_text(tmp_path, GOOD)
    result = runner.ExperimentResult(tmp_path / "out", {"base": "done", "a": "failed", "b": "blocked"}, wall_s=3)
    monkeypatch.setattr(runner, "run_experiment", lambda spec, out: result)
    assert main(["experiment", "run", str(tmp_path / "spec.yaml"), "--output-dir", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out
    assert "1 of 3 stages done" in out and "  a: failed (see " in out and "  b: blocked (see " in out, out


def test_a_specs_summary_is_its_leading_comment_paragraph_on_one_line():
    text = "# First line of the\n#   description.\n#\n# Second paragraph.\nname: x\n"
    assert spec_summary(text) == "First line of the description."
    assert spec_summary("name: x\n# not leading\n") == ""
