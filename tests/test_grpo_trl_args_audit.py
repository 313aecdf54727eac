"""`--trl-args` values TRL would refuse are refused before `esft train grpo` makes the run folder, as unknown keys
are (tests/test_grpo.py): a typo in a value must not leave an empty run folder (its lock and samples/) behind.

Run: pytest -q tests/test_grpo_trl_args_audit.py   (a few seconds; no model loads)
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from esft.config import ConfigError  # noqa: E402
from esft.grpo import GRPOConfig  # noqa: E402
from esft.grpo.grpo_config import check_trl_arg_names  # noqa: E402
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


def test_trl_save_total_limit_is_refused_naming_esfts_own_option():
    """trl_args: {save_total_limit: 2} was accepted and did nothing: esft moves TRL's checkpoints into
    checkpoints/, where TRL's rotation never looks; esft's own save_total_limit prunes them."""
    with pytest.raises(ConfigError, match=r"no save_total_limit there \(TRL's rotation never sees the checkpoints "
                                          r"esft keeps; use esft's own save_total_limit option \(a run that "
                                          r"recorded it in its config.yaml's trl_args, where it did nothing, resumes "
                                          r"once that line is deleted\)\)"):
        GRPOConfig(trl_args={"save_total_limit": 2})
    assert GRPOConfig(save_total_limit=2).save_total_limit == 2


def _file_option_refused(tmp_path, line: str, match: str) -> None:
    """A GRPO config file holding `line` is refused with `match`, and the hint does not send the option to trl_args."""
    from esft.config import build_config
    from esft.grpo.grpo_config import PRESETS

    path = tmp_path / "run.yaml"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=match) as raised:
        build_config(GRPOConfig, PRESETS, None, str(path), {})
    assert "trl_args" not in str(raised.value)


def test_generation_batch_size_names_the_options_that_set_it_in_a_config_file_and_in_trl_args(tmp_path):
    """The config-file hint sent generation_batch_size to trl_args, where TRL then refused it next to the
    steps_per_generation esft sets; both places name esft's options instead."""
    from esft.es.es_config import ESConfig

    assert "generation_batch_size" in ESConfig.__dataclass_fields__  # as under `esft train`: ES's option too
    _file_option_refused(tmp_path, "generation_batch_size: 8", r"unknown option 'generation_batch_size' \(TRL's "
                         r"option; esft sets it to prompts_per_step \* num_generations")
    with pytest.raises(ConfigError, match=r"no generation_batch_size there \(esft sets it to prompts_per_step \* "
                                          r"num_generations.*set prompts_per_step and num_generations"):
        GRPOConfig(trl_args={"generation_batch_size": 8})


def test_warmup_ratio_says_to_use_warmup_steps(tmp_path):
    """transformers 5 removed warmup_ratio: the config-file hint sent it to trl_args, which refused it without
    saying what to use."""

    _file_option_refused(tmp_path, "warmup_ratio: 0.1", r"unknown option 'warmup_ratio' \(transformers 5 has no "
                         r"warmup_ratio; use esft's warmup_steps")
    with pytest.raises(ConfigError, match=r"\['warmup_ratio'\] are not; transformers 5 has no warmup_ratio; use "
                                          r"esft's warmup_steps"):
        check_trl_arg_names(GRPOConfig(trl_args={"warmup_ratio": 0.1}))
