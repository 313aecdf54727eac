"""`replay.load_base` loads the base model where the run's model was, not where this machine's defaults put it."""

from __future__ import annotations

import torch

from esft.es import replay
from esft.es.es_config import ESConfig, save_yaml


def _run_dir(tmp_path, **fields):
    save_yaml(ESConfig(model="tiny", **fields), tmp_path / "config.yaml",
              extra={"device": "cpu", "param_dtypes": {"float32": 3}})
    return tmp_path


def _loaded(monkeypatch, run_dir):
    # a GPU machine: the loader's defaults would be CUDA and bf16
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    calls = []
    import esft.models

    monkeypatch.setattr(esft.models, "load_model", lambda name, dtype=None, device=None: calls.append(
        (name, dtype, device)) or ("model", "tok"))
    assert replay.load_base(run_dir) == ("model", "tok")
    return calls


def test_cpu_run_with_loader_defaults_replays_on_cpu_in_fp32(tmp_path, monkeypatch):
    # CUDA noise from a bf16 base would rebuild other weights than the run trained
    assert _loaded(monkeypatch, _run_dir(tmp_path)) == [("tiny", "float32", "cpu")]


def test_explicit_dtype_and_device_win(tmp_path, monkeypatch):
    run = _run_dir(tmp_path, dtype="bfloat16", device="cpu")
    assert _loaded(monkeypatch, run) == [("tiny", "bfloat16", "cpu")]
