"""The fp32 masters of a low-precision model are found under any of a parameter's names (tied weights are saved
once, under whichever alias), and `exact_start` says how many it set: none for a hub id or a missing folder
(esft.es.start_weights).

Run: PYTHONPATH=src pytest -q tests/test_start_weights_mutmutmisc.py   (a few seconds)
"""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from esft.es.start_weights import exact_start, rounded_masters


def test_a_master_stored_under_an_alias_is_found_and_fp32_params_are_not_read(tmp_path):
    stored = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7
    save_file({"lm_head.weight": stored, "norm.weight": torch.ones(3)}, str(tmp_path / "model.safetensors"))
    params = {"embed.weight": stored.bfloat16(), "norm.weight": torch.ones(3)}  # norm kept in fp32
    found = rounded_masters(params, tmp_path, {"embed.weight": ["embed.weight", "lm_head.weight"]})
    assert list(found) == ["embed.weight"] and torch.equal(found["embed.weight"], stored)
    assert rounded_masters(params, tmp_path) == {}  # no alias: its own name is not in the file
    assert rounded_masters({"norm.weight": torch.ones(3)}, tmp_path) == {}


class _Weights:
    def __init__(self):
        self.params = {"w": torch.zeros(2, dtype=torch.bfloat16)}
        self.master = {"w": torch.zeros(2)}


def test_a_hub_id_or_a_vanished_folder_sets_no_master(tmp_path, monkeypatch):
    import esft.models

    model = torch.nn.Linear(2, 1)
    assert exact_start(_Weights(), model, "owner/some-model") == 0  # a hub id: the loader reads its files

    def gone(name):
        raise FileNotFoundError(name)
    monkeypatch.setattr(esft.models, "resolve_model_path", gone)
    assert exact_start(_Weights(), model, str(tmp_path / "moved")) == 0


def test_a_stored_tensor_of_another_shape_is_refused_by_name(tmp_path):
    """The driver's exact start and the vLLM engine's (which calls rounded_masters alone) both refuse a stored
    fp32 tensor whose shape is not the parameter's: a (3,) tensor would broadcast into a (2, 3) master unnoticed."""
    import pytest

    save_file({"w": torch.ones(3)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"w is stored with shape \(3,\), the model's is \(2, 3\)"):
        rounded_masters({"w": torch.zeros(2, 3, dtype=torch.bfloat16)}, tmp_path)
    assert list(rounded_masters({"w": torch.zeros(3, dtype=torch.bfloat16)}, tmp_path)) == ["w"]
