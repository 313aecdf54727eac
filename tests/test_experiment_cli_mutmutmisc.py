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


def test_an_unreadable_plan_or_status_is_named_with_its_file(tmp_path, capsys):
    """A damaged plan.json stopped `esft experiment status` and `tables` with a bare JSON error ("Unterminated
    string ...") and a damaged status.json stopped `status` likewise: the file is named, and status lists the other
    stages; `esft report` says it reports every run, the plan unread."""
    import json

    from esft.analysis.report_builder import Report, ReportConfig
    from esft.cli import main

    stages = [{"key": "base", "kind": "base", "steps": []}, {"key": "seed-42/a", "kind": "train", "steps": []},
              {"key": "seed-42/b", "kind": "train", "steps": []}]
    (tmp_path / "plan.json").write_text(json.dumps({"spec": {"name": "x"}, "stages": stages}))
    for key, text in (("base", '{"status": "done"}'), ("seed-42/a", '{"status": "do')):
        (tmp_path / key).mkdir(parents=True)
        (tmp_path / key / "status.json").write_text(text)
    assert main(["experiment", "status", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["base", "done"] and lines[2].split() == ["seed-42/b", "pending"]
    assert lines[1].startswith("seed-42/a") and f"unreadable {tmp_path / 'seed-42/a/status.json'} (" in lines[1]
    (tmp_path / "plan.json").write_text('{"spec": {"na')
    for command in ("status", "tables"):
        assert main(["experiment", command, str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert f"esft: error: {tmp_path / 'plan.json'} is unreadable (Unterminated string" in err, err
        assert f"`esft experiment run SPEC --output-dir {tmp_path}` writes it again" in err, err
    report = Report(ReportConfig(dir=str(tmp_path), output_dir=str(tmp_path / "r")), progress=False)
    report.gather_runs()
    assert report.unsupported == [("the experiment's plan", f"{tmp_path / 'plan.json'} is unreadable: every run "
                                   "under DIR is reported, as with --all-runs (`esft experiment run` writes it again)")]
