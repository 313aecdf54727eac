"""End-to-end `esft eval` on the real embedded model over a few examples of every task.

Run: `pytest tests/test_eval_e2e.py -q` (about a minute on 2 CPU cores; marked slow).
"""

from __future__ import annotations

import json

import pytest

from esft.cli import main
from esft.tasks import TASK_NAMES


@pytest.mark.slow
def test_esft_eval_cli_all_tasks(tmp_path, capsys):
    out = tmp_path / "eval"
    rc = main(["eval", "--model", "smollm2-135m", "--tasks", ",".join(TASK_NAMES), "--limit", "2",
               "--max-new-tokens", "24", "--batch-size", "8", "--output-dir", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["results"]) == set(TASK_NAMES)
    for name in TASK_NAMES:
        res = summary["results"][name]
        assert res["n"] == 2 and 0.0 <= res["accuracy"] <= 1.0
        lo, hi = res["ci95"]
        assert 0.0 <= lo <= res["accuracy"] <= hi <= 1.0
        assert 0 < res["completion_tokens"] <= 2 * 24 and res["prompt_tokens"] > 0
        rows = [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]
        assert len(rows) == 2
        assert all(r["score"] in (0.0, 1.0) and isinstance(r["completion"], str) for r in rows)
        assert name in printed
    ifeval = summary["results"]["ifeval"]
    assert {"prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose"} <= set(ifeval)


def test_eval_cli_rejects_unknown_task(capsys):
    assert main(["eval", "--tasks", "nosuchtask", "--limit", "1"]) == 2
    assert "unknown task 'nosuchtask'" in capsys.readouterr().err
