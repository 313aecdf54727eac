"""scripts/gpu_smoke.py, the one-command GPU check, run here on the CPU with tiny sizes: every check runs and
passes, and its JSON says so (the script is otherwise only ever run on a lent GPU, where a broken script would cost
the lease). Run alone: pytest -q tests/test_gpu_smoke_script.py"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_smoke_passes_on_the_cpu(tmp_path, tokenizer, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import gpu_smoke

    tokenizer.save_pretrained(tmp_path / "tok")
    out = tmp_path / "out"
    assert gpu_smoke.main(["--out", str(out), "--tokenizer", str(tmp_path / "tok"), "--device", "cpu",
                           "--rows", "2,3", "--new-tokens", "3", "--es-layers", "1", "--es-population", "2",
                           "--es-batch", "2", "--es-new-tokens", "3", "--es-generation-batch-size", "1"]) == 0
    report = json.loads((out / "gpu_smoke.json").read_text())
    assert report["exact_restore"]["float32"] == report["exact_restore"]["bfloat16"] == {
        "perturb_moves": True, "restore_exact": True, "same_update_same_weights": True}
    resume = report["exact_resume"]
    assert resume["resumed_equals_uninterrupted"] and resume["weights_moved"] and resume["exit_codes"] == [0, 0, 0]
    for rows in (2, 3):
        for engine in ("esft", "hf"):
            measured = report["throughput"]["by_rows"][str(rows)][engine]
            assert measured["generated_tokens"] == rows * 3 and measured["generated_tokens_per_s"] > 0
    es = report["es_iteration"]
    assert es["ok"] and es["weights_moved"] and len(es["iterations"]) == 2 and es["generation_batch_size"] == 1
    config = (out / "runs" / "es" / "config.yaml").read_text()
    assert "generation_batch_size: 1\n" in config
    assert all(it["tokens_generated"] > 0 and it["total_s"] > 0 for it in es["iterations"])


def test_gpu_smoke_says_when_there_is_no_gpu(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import gpu_smoke

    monkeypatch.setattr(gpu_smoke.torch.cuda, "is_available", lambda: False)
    assert gpu_smoke.main(["--out", str(tmp_path), "--tokenizer", str(tmp_path)]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_gpu_smoke_runs_the_checks_asked_for(tmp_path, tokenizer, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import gpu_smoke

    tokenizer.save_pretrained(tmp_path / "tok")
    out = tmp_path / "out"
    assert gpu_smoke.main(["--out", str(out), "--tokenizer", str(tmp_path / "tok"), "--device", "cpu",
                           "--checks", "exact_restore"]) == 0
    report = json.loads((out / "gpu_smoke.json").read_text())
    assert report["exact_restore"]["ok"] and not {"exact_resume", "throughput", "es_iteration"} & report.keys()
    with pytest.raises(SystemExit):
        gpu_smoke.main(["--out", str(out), "--tokenizer", str(tmp_path / "tok"), "--checks", "exact_restor"])
