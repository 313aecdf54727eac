"""esft.analysis.runs against its definitions where the mutation audit of 2026-12-05 found no test: an embedded
model's cache folder as a chain's base, and the stage records that are not training stages.

Run: PYTHONPATH=src pytest -q tests/test_analysis_runs_mutmutbench.py   (a second)
"""

from __future__ import annotations

import json

from esft.analysis import runs as R

from test_analysis_runs import ckpt, run_dir, stage_record


def test_resolve_model_finds_an_embedded_models_cache_folder(tmp_path, monkeypatch):
    """A spec that is no path on disk but an embedded model's name resolves to its cache folder (with config.json),
    the base that ES and GRPO chains started from; a cache folder without config.json is not a model."""
    import esft.models

    monkeypatch.chdir(tmp_path)
    cache = tmp_path / "cache" / "smollm2"
    cache.mkdir(parents=True)
    monkeypatch.setattr(esft.models, "resolve_model_path", lambda spec: str(cache))
    assert R.resolve_model("embedded-name") is None  # no config.json yet
    (cache / "config.json").write_text("{}")
    assert R.resolve_model("embedded-name") == cache.resolve()


def test_stage_records_other_than_training_stages_make_no_chain(tmp_path):
    """An experiment folder also holds the base stage's and evaluation stages' result.json: only training stages
    (kind "train", with steps and a key) become chains."""
    ckpt(run_dir(tmp_path / "a/run", {"algorithm": "es", "model": "m", "task": "t", "seed": 1}, []), "final")
    stage_record(tmp_path, "a", "a/run", None, "t")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "result.json").write_text(json.dumps({"key": "base", "kind": "base", "steps": []}))
    (tmp_path / "ev").mkdir()
    (tmp_path / "ev" / "result.json").write_text(json.dumps({"kind": "eval", "tasks": ["t"]}))
    (chain,) = R.chains_from_stage_records(R.find_runs(tmp_path), tmp_path)
    assert chain.tasks == ["t"] and chain.stages[0].checkpoint == tmp_path / "a/run/checkpoints/final"
