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


@pytest.fixture
def loss_help(monkeypatch):
    """Set the installed TRL's loss_type help text (what a newer or older TRL says), with the cached list cleared
    around the test."""
    import dataclasses

    from trl import GRPOConfig as TRLGRPOConfig

    from esft.grpo.grpo_config import trl_loss_types

    field = next(f for f in dataclasses.fields(TRLGRPOConfig) if f.name == "loss_type")
    trl_loss_types.cache_clear()
    yield lambda text: monkeypatch.setattr(field, "metadata", {"help": text})
    trl_loss_types.cache_clear()


def test_loss_types_are_read_from_the_installed_trls_help(loss_help):
    """A TRL that lists another loss type is taken at its word (a newer TRL's loss is not refused)."""
    from esft.grpo.grpo_config import trl_loss_types

    loss_help("The loss. Supported values are 'grpo' and 'new_loss'. 'grpo': ...")
    assert trl_loss_types() == ("grpo", "new_loss")


def test_loss_types_fall_back_to_trl_1_16s_without_the_sentence(loss_help):
    from esft.grpo.grpo_config import TRL_LOSS_TYPES, trl_loss_types

    loss_help("The loss to use.")
    assert trl_loss_types() == TRL_LOSS_TYPES


@pytest.mark.parametrize("schedule, trl_args, extendable", [
    ("linear", {}, False), ("cosine", {}, False), ("constant", {}, True), ("constant_with_warmup", {}, True),
])
def test_max_steps_may_change_on_a_resume_only_where_the_schedule_does_not_depend_on_it(schedule, trl_args,
                                                                                       extendable):
    """A linear or cosine schedule decays to 0 at max_steps: only a constant one can be extended (its warmup is
    warmup_steps, a count of steps: transformers 5 has no warmup_ratio, which check_trl_arg_names refuses)."""
    from esft.grpo.grpo_config import GRPOConfig, resumable_changes

    config = GRPOConfig(lr_scheduler_type=schedule, trl_args=trl_args)
    assert ("max_steps" in resumable_changes(config)) is extendable


def test_trl_args_given_as_numbers_pass_through_and_only_text_is_read_by_type():
    """A trl_args number for an optional number option of TRL's (`data_seed: 5`, `eval_steps: 0.5`) is passed on
    as it is; only text (YAML 1.1 reads `1e-8` as text) is read by the option's type."""
    from esft.grpo.grpo_config import GRPOConfig, check_trl_arg_names, _typed_trl_args
    from trl import GRPOConfig as TRLGRPOConfig

    config = GRPOConfig(trl_args={"data_seed": 5, "eval_steps": 0.5, "adam_epsilon": "1e-8"})
    check_trl_arg_names(config)
    assert _typed_trl_args(config, TRLGRPOConfig) == {"adam_epsilon": 1e-8}


def test_the_trl_options_esft_fixes(tmp_path):
    """What esft decides for every run, whatever TRL's defaults: dropout off (the policy and its rollouts are the
    same function), prompts loaded in this process with the example_index column kept for the reward, a
    checkpoint every save_steps (or only at max_steps), CPU and bf16 from device and precision, tqdm from
    progress."""
    from esft.grpo.grpo_config import GRPOConfig, trl_arguments

    args = trl_arguments(GRPOConfig(device="cpu", save_steps=5), str(tmp_path), "bf16-autocast", progress=False)
    assert (args["disable_dropout"], args["dataloader_num_workers"], args["remove_unused_columns"]) == (True, 0, False)
    assert (args["save_strategy"], args["save_steps"], args["logging_steps"]) == ("steps", 5, 1)
    assert (args["use_cpu"], args["bf16"], args["fp16"], args["disable_tqdm"]) == (True, True, False, True)
    args = trl_arguments(GRPOConfig(max_steps=7), str(tmp_path), "fp32")
    assert (args["save_steps"], args["use_cpu"], args["bf16"], args["disable_tqdm"]) == (7, False, False, False)


def test_a_warmup_as_long_as_the_run_is_warned_of():
    """`--warmup-steps 100 --max-steps 1` trained at a hundredth of the rate it named, without a word."""
    import warnings

    from esft.grpo import GRPOConfig

    with pytest.warns(UserWarning, match=r"warmup_steps 5 >= max_steps 5: the learning rate never reaches "
                                         r"learning_rate 2e-05"):
        GRPOConfig(warmup_steps=5, max_steps=5, learning_rate=2e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GRPOConfig(warmup_steps=4, max_steps=5)
