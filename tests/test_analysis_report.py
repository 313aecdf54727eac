"""`esft report` and `esft analyze` on tiny synthetic ES and GRPO run directories (tests/analysis_runs.py).

Run: `pytest -q tests/test_analysis_report.py` (about 20 s: every analysis runs on a tiny random Llama with one or
two test examples and 2-3 generated tokens, so the numbers are meaningless; the structure is what is tested).
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from analysis_runs import make_base, make_es_run, make_grpo_run
from esft.analysis.report import ReportConfig, build_report
from esft.analysis.runs import build_chains, build_pairs, find_runs
from esft.cli import main


@pytest.fixture(autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def experiment(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("exp")
    base = make_base(root, tokenizer, hidden=16)
    make_es_run(root, base, steps=3)
    make_grpo_run(root, base, steps=3)
    return root


def test_discovery_pairs_es_with_grpo(experiment):
    runs = find_runs(experiment)
    assert sorted(r.algorithm for r in runs) == ["es", "grpo"]
    chains = build_chains(runs, experiment)
    pairs = build_pairs(chains)
    assert len(chains) == 2 and len(pairs) == 1
    assert pairs[0].es.base == (experiment / "base").resolve()


def test_report_has_every_table_and_says_what_is_unsupported(experiment, tmp_path):
    cfg = ReportConfig(dir=str(experiment), output_dir=str(tmp_path / "r"), limit=1, max_new_tokens=2,
                       holdout_tasks=["mmlu"], interpolation_points=3, magnitude_points=2,
                       sparsity_targets=[0.0, 0.5], batch_size=2, kl_batch_size=2)
    path = build_report(cfg, progress=False)
    text = path.read_text()
    for heading in ("Table 3", "Table 4", "Table 20", "Figure 2", "Figure 3", "Figure 4", "Figure 5",
                    "Figure 9", "Figure 10", "Figure 11", "Functional sparsity", "paper Table 1"):
        assert heading in text, heading
    # paper values sit next to ours
    assert "173.0 / 1.84 / 94x" in text and "2.7e-04 (Qwen)" in text and "paper 0.239 [0.094, 0.322]" in text
    # the drift law holds on the synthetic ES run and the table says so
    assert re.search(r"R\^2 of the theory line \(no fitted parameter\) \| (0\.99\d+|1\.0+) \|", text)
    # what the runs could not support is said plainly
    section = text.split("## What these runs could not support")[1]
    assert "single-stage runs only" in section
    assert "Failed" not in text
    for img in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (path.parent / img).stat().st_size > 3000, img
    results = json.loads((path.parent / "results.json").read_text())
    w = next(iter(results["results"]["weights"].values()))
    assert w["es"]["norm"] > 10 * w["grpo"]["norm"] and w["grpo"]["sparsity"] > 0.8
    # a second report reuses every cached analysis
    before = {p.name: p.read_text() for p in (path.parent / "data").glob("*.json")}
    build_report(cfg, progress=False)
    after = {p.name: p.read_text() for p in (path.parent / "data").glob("*.json")}
    assert before == after


def test_es_only_report_via_cli(tmp_path, tokenizer, capsys):
    base = make_base(tmp_path, tokenizer, hidden=16)
    make_es_run(tmp_path / "exp", base, steps=2)
    out = tmp_path / "rep"
    rc = main(["report", str(tmp_path / "exp"), "--output-dir", str(out), "--analyses", "weights,drift,landscape",
               "--limit", "1", "--max-new-tokens", "2", "--holdout-tasks", "", "--magnitude-points", "2"])
    assert rc == 0
    text = (out / "report.md").read_text()
    section = text.split("## What these runs could not support")[1]
    assert "ES/GRPO norm ratio and cosine" in section and "interpolation ES <-> GRPO (Figure 3)" in section
    assert "kl**: not requested" in section and "Figure 5**: no holdout tasks" in section
    assert "Table 3" in text and "Figure 4" in text


def test_analyze_commands(experiment, tmp_path, capsys):
    es, grpo = experiment / "es" / "checkpoints" / "final", experiment / "grpo" / "checkpoints" / "final"
    base = experiment / "base"
    assert main(["analyze", "weights", "--base", str(base), "--tuned", f"{es},{grpo}",
                 "--output-dir", str(tmp_path / "w")]) == 0
    rep = json.loads((tmp_path / "w" / "weights.json").read_text())
    assert rep["labels"] == ["es", "grpo"] and (tmp_path / "w" / "weights.png").exists()
    assert main(["analyze", "drift", "--run", str(experiment / "es"), "--grpo-run", str(experiment / "grpo"),
                 "--output-dir", str(tmp_path / "d")]) == 0
    assert json.loads((tmp_path / "d" / "drift.json").read_text())["total"]["r2_theory"] > 0.99
    assert main(["analyze", "kl", "--base", str(base), "--stages", str(es), "--limit", "1", "--max-new-tokens", "2",
                 "--max-passage-chars", "80", "--output-dir", str(tmp_path / "k")]) == 0
    assert (tmp_path / "k" / "kl_heatmap.png").exists()
    assert main(["analyze", "sparsity", "--base", str(base), "--tuned", str(grpo), "--targets", "0,0.95",
                 "--limit", "1", "--max-new-tokens", "2", "--output-dir", str(tmp_path / "s")]) == 0
    assert len(json.loads((tmp_path / "s" / "sparsity.json").read_text())["rows"]) == 2
    printed = capsys.readouterr().out
    assert "cosine" in printed and "R^2" in printed and "k3/token" in printed
    assert main(["analyze", "weights", "--base", str(base)]) == 2  # no --tuned: a clean error, not a traceback
