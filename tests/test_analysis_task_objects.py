"""`esft report` on runs that trained a task object config.yaml cannot rebuild (a function among its values): the
analyses that evaluate skip those runs with the reason instead of failing the report, and `build_report(...,
tasks=[obj])` evaluates them with the object itself."""

from __future__ import annotations

import pytest
import yaml

from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from analysis_runs import make_base, make_es_run
from esft.analysis.report_builder import ReportConfig, build_report
from esft.cli import main


def _run_of(user_tasks, root, tokenizer, count=4):
    """An ES run whose config.yaml records Weighted(count=4, scorer=a lambda) as esft.api.with_task does."""
    from esft.api import with_task
    from esft.es import ESConfig

    base = make_base(root, tokenizer, hidden=16)
    run = make_es_run(root / "exp", base, steps=2, task="obj_tasks:Weighted")
    task = user_tasks.Weighted(count=count, scorer=lambda completion, example: 1.0)
    config, _ = with_task(ESConfig(output_dir=str(run)), task)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    saved.update(task=config.task, task_options=config.task_options)
    (run / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    assert saved["task_options"] == {"count": count, "scorer": "<not recorded: function>"}
    return root / "exp", task


ARGS = ["--analyses", "weights,kl,landscape,sparsity", "--limit", "1", "--max-new-tokens", "2", "--holdout-tasks",
        "", "--sparsity-targets", "0.0,0.5", "--magnitude-points", "2"]


def test_the_report_skips_what_needs_the_object_and_says_how_to_pass_it(user_tasks, tmp_path, tokenizer, capsys):
    """The report failed (exit 1) with the resume message of get_task for KL and functional sparsity."""
    exp, _ = _run_of(user_tasks, tmp_path, tokenizer)
    out = tmp_path / "rep"
    assert main(["report", str(exp), "--output-dir", str(out), *ARGS]) == 0
    text = (out / "report.md").read_text()
    assert "Failed" not in text and "Table 3" in text  # the weight-space tables need no task
    section = text.split("## What these runs could not support")[1]
    for analysis in ("KL (", "landscape (Figures 3-5) (", "functional sparsity ("):
        line = next(line for line in section.splitlines() if line.startswith(f"- **{analysis}"))
        assert "obj_tasks:Weighted was a task object that config.yaml cannot rebuild" in line
        assert "build_report(config, tasks=[task])" in line


def test_build_report_evaluates_with_the_task_object_given(user_tasks, tmp_path, tokenizer):
    exp, task = _run_of(user_tasks, tmp_path, tokenizer)
    cfg = ReportConfig(dir=str(exp), output_dir=str(tmp_path / "rep"), analyses=["kl", "landscape", "sparsity"],
                       limit=1, max_new_tokens=2, holdout_tasks=[], sparsity_targets=[0.0, 0.5], batch_size=1,
                       kl_batch_size=1, magnitude_points=2)
    text = build_report(cfg, progress=False, tasks=[task]).read_text()
    assert "Failed" not in text and "config.yaml cannot rebuild" not in text
    assert "## KL(pi_after" in text and "Figure 4" in text
    sweep = text.split("## Functional sparsity")[1].split("\n## ")[0]
    rows = [line for line in sweep.splitlines() if line.startswith("| ") and "%" in line
            and not line.startswith("| best constant answer")]  # (the baseline row: the gold labels' prior)
    # the object's scorer (always 1) scored every point; a Weighted built from its defaults scores with `contains`,
    # which 2 tokens of a tiny random model do not satisfy
    assert len(rows) == 3 and all(row.endswith("| 100.0% [20.7, 100.0] |") for row in rows), sweep  # n = 1


def test_an_object_no_run_trained_is_refused_before_any_model_loads(user_tasks, tmp_path, tokenizer, monkeypatch):
    exp, _ = _run_of(user_tasks, tmp_path, tokenizer)

    def no_model(*a, **k):
        raise AssertionError("a model was loaded before the task objects were checked")

    monkeypatch.setattr("esft.models.load_model", no_model)
    cfg = ReportConfig(dir=str(exp), output_dir=str(tmp_path / "rep"), analyses=["kl"], limit=1)
    other = user_tasks.Weighted(count=5, scorer=lambda completion, example: 1.0)
    with pytest.raises(ValueError, match=r"records as obj_tasks:Weighted \{'count': 5, .*which no run under .* trained "
                                         r"\(their tasks and options: obj_tasks:Weighted \{'count': 4"):
        build_report(cfg, progress=False, tasks=[other])
