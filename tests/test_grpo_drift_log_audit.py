"""esft.grpo.drift_log on small hand-made tensors: ||theta_t - theta_0||^2 exact in float64 across chunk
boundaries, theta_0 a copy independent of the live weights, and the drift.jsonl record of a step."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from transformers import TrainerControl, TrainerState  # noqa: E402

import esft.grpo.drift_log as drift_log  # noqa: E402
from esft.grpo.drift_log import DriftCallback, snapshot, squared_drift  # noqa: E402


def test_squared_drift_is_exact_across_chunks(monkeypatch):
    monkeypatch.setattr(drift_log, "_CHUNK", 3)  # 7 elements: chunks of 3, 3 and 1
    p = torch.arange(1, 8, dtype=torch.float32)
    base = {"w": torch.zeros(7), "v": torch.zeros(1)}
    v = torch.tensor([1 + 2 ** -12], dtype=torch.float32)  # its square needs 25 bits: inexact in float32
    total, per = squared_drift([("w", p), ("v", v)], base)
    assert per == {"w": 140.0, "v": (1 + 2 ** -12) ** 2}  # 1 + 4 + ... + 49 = 140
    assert total == 140.0 + (1 + 2 ** -12) ** 2


def test_snapshot_is_an_fp32_copy_of_the_weights():
    model = torch.nn.Linear(2, 1).to(torch.bfloat16)
    base = snapshot(model)
    assert set(base) == {"weight", "bias"} and all(t.dtype == torch.float32 for t in base.values())
    assert torch.equal(base["weight"], model.weight.detach().float())
    model32 = torch.nn.Linear(2, 1)
    base32 = snapshot(model32)
    before = base32["weight"].clone()
    with torch.no_grad():
        model32.weight.add_(1.0)
    assert torch.equal(base32["weight"], before)  # not a view of the live weights


def test_a_step_record_covers_the_tensors_of_theta_0(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    base = {n: t for n, t in snapshot(model).items() if n.startswith("0.")}  # theta_0 of the first layer only
    with torch.no_grad():
        model[0].weight.add_(torch.tensor([[1.0, 2.0], [0.0, 0.5]]))
        model[0].bias.add_(torch.tensor([3.0, 0.0]))
        model[1].weight.add_(10.0)
    cb = DriftCallback(tmp_path / "drift.jsonl", base)
    cb.on_step_end(None, TrainerState(global_step=7, max_steps=9), TrainerControl(), model=model)
    (rec,) = [json.loads(line) for line in (tmp_path / "drift.jsonl").read_text().splitlines()]
    assert rec["step"] == 7 and rec["num_params"] == 6 and rec["numel"] == {"0.weight": 4, "0.bias": 2}
    assert rec["per_tensor"] == pytest.approx({"0.weight": 5.25, "0.bias": 9.0}, rel=1e-6)
    assert rec["total"] == sum(rec["per_tensor"].values())
    assert cb.last == (7, rec["total"]) and cb.last_seconds >= 0.0
