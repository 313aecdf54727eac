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


def test_a_bad_trl_args_key_in_a_config_file_names_the_file_and_line(tmp_path):
    """The error named neither the file nor the flag (README: the error names the key, the value, `file:line`):
    trl_args were checked only when the run started, outside esft.config's located checks."""
    from esft.config import build_config
    from esft.grpo import PRESETS, GRPOConfig
    from esft.validation import check_names

    path = tmp_path / "bad.yaml"
    path.write_text("max_steps: 1\ntrl_args: {bogus: 1}\n")
    with pytest.raises(ConfigError, match=rf"^{path}:2: trl_args = \{{'bogus': 1\}}"):
        build_config(GRPOConfig, PRESETS, None, str(path), {}, check=check_names)


def test_an_experiment_spec_with_a_bad_trl_args_key_fails_its_checks(tmp_path):
    """`esft experiment run SPEC --dry-run` called such a spec valid: its GRPO stage failed only when it started,
    after the base model's evaluation."""
    from esft.experiments.spec import load_spec

    path = tmp_path / "spec.yaml"
    path.write_text("kind: single-task\nmodel: smollm2-135m\ntasks: [boolq]\nseeds: [1]\n"
                    "algorithms:\n  grpo: {preset: cpu, max_steps: 1, trl_args: {bogus_key: 1}}\n")
    with pytest.raises(ValueError, match=r"spec.yaml:6: .*\['bogus_key'\] are not"):
        load_spec(path)


def test_trl_args_checked_where_trl_is_missing_name_the_install_not_a_traceback(monkeypatch):
    """A spec's --dry-run on a machine without esft[grpo] ended in a ModuleNotFoundError traceback."""
    import sys

    from esft.grpo.grpo_config import GRPOConfig, check_trl_arg_names

    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` raises ImportError
    with pytest.raises(ConfigError, match=r"which is not installed here: pip install 'esft\[grpo\]'"):
        check_trl_arg_names(GRPOConfig(trl_args={"adam_epsilon": 1e-8}))
