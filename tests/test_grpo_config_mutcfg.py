"""GRPOConfig's precision choice and its mapping onto TRL, pinned where a mutation audit found them untested."""

from __future__ import annotations

import pytest
import torch

from esft.grpo.grpo_config import resolve_precision


@pytest.mark.parametrize("precision, device", [("fp32", "cuda"), ("bf16-autocast", "cpu"), ("fp32", "cpu")])
def test_an_explicit_precision_is_kept_on_any_device(precision, device):
    assert resolve_precision(precision, device) == precision


@pytest.mark.parametrize("device, cuda, bf16, expected", [
    ("cpu", True, True, "fp32"),  # CPU bf16 matmuls are often slower than fp32
    ("cuda", True, True, "bf16-autocast"), ("cuda:1", True, True, "bf16-autocast"),
    ("cuda", True, False, "fp32"), ("cuda", False, True, "fp32"), (None, True, True, "fp32"),
])
def test_auto_precision_is_bf16_autocast_only_on_a_cuda_device_with_bf16(monkeypatch, device, cuda, bf16, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    assert resolve_precision("auto", device) == expected
