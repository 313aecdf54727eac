"""The Runs section of `esft report` (esft.analysis.report_builder): the runs it reads, the chains it follows and
the runs it left out, each said only when there are some. Run: `pytest tests/test_report_builder_mutmutcli.py -q`."""

from __future__ import annotations

import yaml

from esft.analysis.report_builder import Report, ReportConfig


def _run(path, algorithm, model, task, checkpoints=("final",)):
    """A run folder as discovery reads it: config.yaml, metrics.jsonl and checkpoint folders (names only)."""
    path.mkdir(parents=True)
    cfg = {"model": str(model), "task": task, "seed": 42}
    cfg.update({"population_size": 4, "sigma": 0.1, "alpha": 0.05} if algorithm == "es" else
               {"algorithm": "grpo", "learning_rate": 1e-6})
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    (path / "metrics.jsonl").write_text("")
    for name in checkpoints:
        (path / "checkpoints" / name).mkdir(parents=True)
        (path / "checkpoints" / name / "config.json").write_text("{}")
        (path / "checkpoints" / name / "model.safetensors").write_text("")
    return path


def _runs_section(root, **options):
    report = Report(ReportConfig(dir=str(root), **options), progress=False)
    report.discover()
    report.section_runs()
    return report, report.sections[0]


def test_the_runs_section_lists_the_chains_in_stage_order_and_the_runs_left_out(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    first = _run(tmp_path / "seq/es/1-countdown/run", "es", base, "countdown")
    _run(tmp_path / "seq/es/2-math/run", "es", first / "checkpoints/final", "math")
    _run(tmp_path / "single/boolq/grpo/run", "grpo", base, "boolq")

    report, text = _runs_section(tmp_path)
    assert report.chains and not report.left_out
    assert "| run | algorithm | task | seed |" in text and "No run directories found." not in text
    assert "\nChains (stage order): " + "; ".join(c.label for c in report.chains) + "\n" in text
    assert "ES countdown->math seed 42 (run)" in text
    assert "Left out" not in text

    report, text = _runs_section(tmp_path, exclude=["grpo"])
    assert report.left_out == [("single/boolq/grpo/run", "matches --exclude 'grpo'")]
    assert "\nLeft out:\n\n- `single/boolq/grpo/run`: matches --exclude 'grpo'" in text


def test_a_folder_without_runs_says_so_and_lists_no_chains(tmp_path):
    report, text = _runs_section(tmp_path)
    assert not report.runs and "No run directories found." in text
    assert "| run |" not in text and "Chains" not in text and "Left out" not in text


def test_the_weights_section_shows_table_20_for_a_pair_only_and_names_missing_checkpoints(tmp_path, monkeypatch):
    from esft.analysis import report_builder
    from esft.analysis.weights_report import UpdateComparison

    paired = UpdateComparison("ES vs GRPO, boolq, seed 42", tmp_path / "base", "es", True,
                              norms=[["1", "0.5", "0.25", "2.00", "-"]], sparsity=[["1", "0", "0", "3", "4", "-"]],
                              cosines=[["1", "0.01", "-"]], notes=["stage 2: GRPO has no checkpoint."],
                              budget="The study's ES values are of 100 iterations per stage; these ES stages ran 300.")
    alone = UpdateComparison("ES countdown seed 1 (run)", tmp_path / "base", "es", False,
                             norms=[["1", "0.7", "-"]], sparsity=[["1", "0.1", "5", "-"]])
    monkeypatch.setattr(report_builder, "report_weights", lambda ctx: [paired, alone])
    report = Report(ReportConfig(dir=str(tmp_path)), progress=False)
    report.section_weights()
    pair_text, alone_text = report.sections[0].split("### ")[1:]
    assert "**Table 3: update norm ||dtheta||_2**" in pair_text and "| ES/GRPO |" in pair_text
    assert "**Table 20: cosine(ES update, GRPO update)**" in pair_text and "| 0.01 |" in pair_text
    assert "\nMissing checkpoints: stage 2: GRPO has no checkpoint." in pair_text
    assert ("\nThe study's ES values are of 100 iterations per stage; these ES stages ran 300. By the random-walk "
            "law an ES update's norm grows as the square root of its iterations.") in pair_text
    assert "iterations per stage" not in alone_text
    assert "**Table 3: update norm**" in alone_text and "| ES norm |" in alone_text
    assert "Table 20" not in alone_text and "Missing checkpoints" not in alone_text


def test_the_drift_section_shows_the_grpo_family_table_only_beside_a_grpo_series(tmp_path, monkeypatch):
    from esft.analysis import report_builder
    from esft.analysis.drift_runs import RunDrift

    with_grpo = RunDrift("es-1", None, {"fit": 1}, grpo="grpo series")
    alone = RunDrift("es-2", None, {"fit": 2}, grpo=None)
    monkeypatch.setattr(report_builder, "report_drift", lambda ctx: ([with_grpo, alone], []))
    monkeypatch.setattr(report_builder, "law_rows", lambda result, compared: [["rho", f"{result['fit']}"]])
    monkeypatch.setattr(report_builder, "drift_notes", lambda run: [])
    monkeypatch.setattr(report_builder, "family_rows", lambda result: [])
    monkeypatch.setattr(report_builder, "grpo_family_rows", lambda result: [["q_proj", "2", "0.5", "0.9"]])
    report = Report(ReportConfig(dir=str(tmp_path)), progress=False)
    report.section_drift()
    first, second = report.sections[0].split("### ES ")[1:]
    assert first.startswith("es-1") and "GRPO with the same scaling" in first and "| q_proj |" in first
    assert second.startswith("es-2") and "GRPO with the same scaling" not in second


def test_a_kl_group_says_whether_its_cells_are_one_seed_or_the_median_over_its_seeds(tmp_path, monkeypatch):
    from esft.analysis import report_builder
    from esft.analysis.kl_report import KLGroup

    seq = ("countdown", "math")
    agg = {"tasks": ["countdown"], "stages": ["1:countdown"]}
    groups = [KLGroup("es", "es", seq, [{}], agg, [1]), KLGroup("grpo", "grpo", seq, [{}] * 3, agg, [1, 2, 3]),
              KLGroup("es", "es@300", seq, [{}] * 2, agg, [0, 0], [300, 300, 300, 300]),
              KLGroup("grpo->es", "grpo->es", seq, [{}], agg, [4], [300, 300])]
    monkeypatch.setattr(report_builder, "report_kl", lambda ctx: (groups, None))
    monkeypatch.setattr(report_builder, "kl_rows", lambda g, kind: (["stage", "k3"], [["1", "0.1"]]))
    report = Report(ReportConfig(dir=str(tmp_path)), progress=False)
    report.section_kl()
    one, three, chains, hybrid = report.sections[0].split("### ")[1:]
    assert one.startswith("ES countdown->math (1 seed)\n") and "**incremental** (one seed)" in one
    assert three.startswith("GRPO countdown->math (3 seeds)\n")
    assert "**cumulative** (median [min, max] over seeds)" in three and "one seed" not in three
    # runs of one seed in two folders are two chains, not two seeds
    assert chains.startswith("ES@300 countdown->math (2 chains (seeds 0, 0))\n")
    assert "**cumulative** (median [min, max] over chains)" in chains
    # the study's ES values are of 100 iterations per stage: a chain of another budget says so, one of 100 not
    assert "(Table 11). The study's ES values are of 100 iterations per stage; these ES stages ran 300.\n" in chains
    assert "(Table 11).\n" in one and "iterations per stage" not in three
    # a chain the study did not run has no cell of its: no note about the study's values, its budget included
    assert hybrid.startswith("GRPO->ES countdown->math (1 seed)\n") and "Paper values" not in hybrid
    assert "iterations per stage" not in hybrid
