"""Exit codes and last lines of `esft report` and `esft eval` (esft.cli): 0 when every analysis ran, 1 naming the
ones that failed; the files an evaluation wrote.
Run: `pytest tests/test_cli_mutmutcli.py -q`."""

from __future__ import annotations

import pytest

from esft.cli import main


@pytest.mark.parametrize("failed, code", [([], 0), (["kl", "landscape"], 1)])
def test_report_exits_0_when_every_analysis_ran_and_1_naming_those_that_failed(tmp_path, monkeypatch, capsys,
                                                                              failed, code):
    from esft.analysis import report_builder

    def build(self):
        self.failed = list(failed)
        return tmp_path / "report" / "report.md"

    monkeypatch.setattr(report_builder.Report, "build", build)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # a compute command would set it for the rest of the session
    assert main(["report", str(tmp_path)]) == code
    out, err = capsys.readouterr()
    assert out == f"wrote {tmp_path / 'report' / 'report.md'}\n"
    if failed:
        assert err == (f"esft: error: 2 analyses failed (kl, landscape); {tmp_path / 'report' / 'report.md'} says "
                       "why\n")
    else:
        assert err == ""


@pytest.mark.parametrize("flags, written", [
    ([], " and one JSONL of completions per task"),
    (["--samples", "2", "--temperature", "1.0"],
     ", one JSONL of completions and one pass@k figure (<task>.passk.png) per task")])
def test_eval_names_the_files_it_wrote_with_the_pass_k_figures_only_when_it_sampled(tmp_path, monkeypatch, capsys,
                                                                                  flags, written):
    from esft import evaluation

    monkeypatch.setattr(evaluation, "run_eval", lambda config: [])
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # a compute command would set it for the rest of the session
    out = tmp_path / "eval"
    assert main(["eval", "--tasks", "boolq", "--limit", "2", "--output-dir", str(out), *flags]) == 0
    assert capsys.readouterr().out == f"\nwrote {out}/summary.json{written}\n"
