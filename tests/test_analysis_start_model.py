"""`esft analyze weights` checks each checkpoint's recorded start model against --base (esft.analysis.start_model):
a checkpoint fine-tuned from another base model of the same architecture has the same tensor shapes and was
compared without a word.

Run: `pytest -q tests/test_analysis_start_model.py` (a few seconds: tiny random Llamas saved to tmp folders).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from conftest import make_tiny_model
from esft.cli import main


def save(folder: Path, seed: int) -> Path:
    make_tiny_model(vocab_size=256, seed=seed, hidden=16).save_pretrained(folder)
    return folder


def run(root: Path, name: str, model: str | None, seed: int) -> Path:
    """A run folder whose config.yaml records `model` as its start, with a final checkpoint."""
    (root / name / "checkpoints").mkdir(parents=True)
    config = {"algorithm": "es", "task": "boolq", **({"model": model} if model else {})}
    (root / name / "config.yaml").write_text(yaml.safe_dump(config))
    return save(root / name / "checkpoints" / "final", seed)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("start")
    a, b = save(root / "base_a", 0), save(root / "base_b", 1)
    shutil.copytree(b, root / "copy_of_b")
    return {"root": root, "a": a, "b": b, "copy_of_b": root / "copy_of_b",
            "from_b": run(root, "run_b", str(b), 2), "from_a": run(root, "run_a", str(a), 3),
            "bare": save(root / "bare", 4), "unrecorded": run(root, "run_none", None, 5)}


def weights(base: Path, tuned: Path, out: Path, *extra: str) -> int:
    return main(["analyze", "weights", "--base", str(base), "--tuned", str(tuned), "--no-stable-ranks",
                 "--output-dir", str(out), *extra])


def test_a_checkpoint_of_another_base_model_is_refused_before_it_is_compared(models, tmp_path, capsys, monkeypatch):
    from esft.analysis import weights as W

    monkeypatch.setattr(W, "compare_updates", lambda *a, **k: pytest.fail("compared against the wrong base"))
    assert weights(models["a"], models["from_b"], tmp_path / "o") == 2
    err = capsys.readouterr().err
    assert f"{models['from_b']} was fine-tuned from {str(models['b'])!r}" in err
    assert f"not from --base {models['a']}" in err and "--no-check-base" in err
    assert not (tmp_path / "o" / "weights.json").exists()


def test_the_recorded_base_a_copy_of_it_and_check_base_false_are_compared(models, tmp_path, capsys):
    assert weights(models["b"], models["from_b"], tmp_path / "same") == 0
    assert weights(models["copy_of_b"], models["from_b"], tmp_path / "copy") == 0
    assert "esft analyze weights:" not in capsys.readouterr().err  # nothing to say when the check passes
    assert weights(models["a"], models["from_b"], tmp_path / "forced", "--no-check-base") == 0
    # the check changes no result: the same analysis without it may overwrite its own folder
    assert weights(models["b"], models["from_b"], tmp_path / "same", "--no-check-base") == 0
    assert json.loads((tmp_path / "forced" / "weights.json").read_text())["labels"] == ["es"]


def test_a_later_stage_is_checked_through_the_checkpoint_it_started_from(models, tmp_path):
    stage2 = run(models["root"], "stage2", str(models["from_a"]), 6)
    assert weights(models["a"], stage2, tmp_path / "from_base") == 0
    assert weights(models["from_a"], stage2, tmp_path / "from_stage1") == 0
    assert weights(models["b"], stage2, tmp_path / "other") == 2


def test_a_checkpoint_that_records_nothing_gets_one_line_and_is_compared(models, tmp_path, capsys):
    assert weights(models["a"], models["bare"], tmp_path / "bare") == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("esft analyze weights:")]
    assert notes == [f"esft analyze weights: {models['bare']}: not inside a run folder, so nothing records which "
                     f"model it was fine-tuned from; not checked against --base {models['a']}"]
    assert weights(models["a"], models["unrecorded"], tmp_path / "unrecorded") == 0
    assert "records no start model; not checked" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["kl", "--stages", "{ck}"], ["landscape", "--es", "{ck}"],
                                  ["sparsity", "--tuned", "{ck}"]])
def test_kl_landscape_and_sparsity_refuse_it_before_loading_a_model(models, tmp_path, capsys, monkeypatch, argv):
    from esft.analysis import commands as C

    monkeypatch.setattr(C, "load_with_weights", lambda *a, **k: pytest.fail("loaded a model for a checkpoint of another base"))
    args = ["analyze", *[a.format(ck=models["from_b"]) for a in argv], "--base", str(models["a"]),
            "--output-dir", str(tmp_path / "o")]
    assert main(args) == 2
    assert f"{models['from_b']} was fine-tuned from {str(models['b'])!r}" in capsys.readouterr().err


def test_a_copy_of_the_base_saved_in_another_dtype_is_the_base(models, tmp_path):
    from transformers import AutoModelForCausalLM

    as_bf16 = tmp_path / "b_bf16"
    model = AutoModelForCausalLM.from_pretrained(models["b"])
    model.to(dtype=__import__("torch").bfloat16).save_pretrained(as_bf16)
    stage = run(tmp_path, "run_bf16", str(as_bf16), 7)  # fine-tuned from the bf16 copy
    fp32_again = tmp_path / "b_bf16_as_fp32"
    AutoModelForCausalLM.from_pretrained(as_bf16).to(dtype=__import__("torch").float32).save_pretrained(fp32_again)
    assert weights(fp32_again, stage, tmp_path / "o") == 0
