"""`--trl-args` values TRL would refuse are refused before `esft train grpo` makes the run folder, as unknown keys
are (tests/test_grpo.py): a typo in a value must not leave an empty run folder (its lock and samples/) behind.

Run: pytest -q tests/test_grpo_trl_args_audit.py   (a few seconds; no model loads)
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from esft.config import ConfigError  # noqa: E402
from esft.grpo.run import train_grpo  # noqa: E402
from grpo_tiny import ParityTask, tiny_config  # noqa: E402


def test_a_mistyped_trl_args_value_is_refused_before_the_run_folder_is_made(tmp_path):
    out = tmp_path / "typo"
    with pytest.raises(ConfigError, match=r"adam_epsilon: a number \(TRL's GRPOConfig\), not 'abc'"):
        train_grpo(tiny_config(out, trl_args={"adam_epsilon": "abc"}), task=ParityTask(), progress=False)
    assert not out.exists()


def test_use_vllm_without_vllm_is_refused_before_the_run_folder_is_made(tmp_path, monkeypatch):
    import importlib

    monkeypatch.setattr(importlib.import_module("trl.import_utils"), "is_vllm_available", lambda: False)
    out = tmp_path / "vllm"
    with pytest.raises(ConfigError, match=r"use_vllm only where vLLM is installed"):
        train_grpo(tiny_config(out, trl_args={"use_vllm": True}), task=ParityTask(), progress=False)
    assert not out.exists()
