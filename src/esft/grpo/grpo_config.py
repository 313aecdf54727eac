"""`GRPOConfig`: every knob of a GRPO run in one dataclass, its presets, and the mapping onto TRL's `GRPOConfig`.

Field names follow TRL (`num_generations`, `learning_rate`, `beta`, `epsilon`, `max_completion_length`, ...) where
the concept is the same, and the ES trainer's names (`task`, `format_bonus`, `eval_every`, ...) for what TRL does not
have. Flags, YAML files and presets are merged by `esft.config.build_config` (defaults < preset < YAML < flags).
Options TRL has and esft does not surface (e.g. `use_vllm`) go through `trl_args`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from esft.config import ConfigError, RunConfig, check_fields, mapping_field
from esft.config_rules import Rule, at_least, finite, in_range, non_negative, one_of, positive
from esft.grpo.trl_names import ESFT_TRL_ARGS, NOT_TRL_OPTIONS, REFUSED_TRL_ARGS, TRL_EQUIVALENTS
from esft.tracking import report_to_rule, report_to_text


@dataclass
class GRPOConfig(RunConfig):
    """A GRPO fine-tuning run (TRL's GRPOTrainer underneath). esft maximises reward."""
    command = "esft train grpo"
    # their hints say more than "an option of `esft train es`" (ES also has a generation_batch_size)
    hinted_names = frozenset({*TRL_EQUIVALENTS, *NOT_TRL_OPTIONS})
    generation_fields = ("max_completion_length", "eval_max_new_tokens")

    model: str = "smollm2-135m"
    """model name (esft.models registry), local Hugging Face folder or hub id"""
    task: str = "boolq"
    """task name (esft.tasks.get_task; options as in countdown:numbers=2), a data file (with --prompt-field and
    --reward) or module:Class (docs/custom-tasks.md); its scorer is the reward"""
    output_dir: str = "runs/grpo"
    """run directory (config.yaml, metrics.jsonl, drift.jsonl, samples/, checkpoints/)"""
    seed: int = 42
    """seed of TRL's prompt shuffling, sampling and initialisation"""
    max_steps: int = 80
    """optimizer steps (one update each, and a generation round every num_iterations of them)"""
    prompts_per_step: int = 63
    """distinct prompts per optimizer step; each gets num_generations completions"""
    num_generations: int = 8
    """K: completions sampled per prompt (the group for the relative advantage)"""
    per_device_train_batch_size: int = 8
    """completions per forward/backward micro-batch; gradient accumulation covers the rest of the step, so
    prompts_per_step * num_generations must be a multiple of it"""
    learning_rate: float = 3e-6
    """peak learning rate"""
    optim: str = "adamw_torch"
    """optimizer (TRL / transformers name)"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """gradient clipping by global norm (0 = off)"""
    lr_scheduler_type: str = "linear"
    """learning-rate schedule (transformers name): "linear" decays to 0 at max_steps; with "constant" or
    "constant_with_warmup" a finished run can be extended (`--resume` with a larger max_steps)"""
    warmup_steps: int = 0
    """linear warm-up steps"""
    epsilon: float = 0.2
    """PPO clip range of the probability ratio"""
    beta: float = 0.0
    """KL coefficient in the loss (0 = no KL penalty; the KL is still measured when log_kl)"""
    log_kl: bool = True
    """measure KL(policy || initial model) on the sampled completions every step even when beta = 0 (keeps a
    frozen copy of the initial model and runs one extra forward pass per step)"""
    loss_type: str = "grpo"
    """TRL loss aggregation: "grpo" (mean over each completion's tokens, then over completions: the study's code),
    "dapo", "dr_grpo", "bnpo", ..."""
    scale_rewards: str = "group"
    """advantage scaling: "group" (divide by the group's reward std), "batch" or "none" (Dr. GRPO)"""
    num_iterations: int = 1
    """updates per generated batch (mu); 1 = the study's single update per batch"""
    mask_truncated_completions: bool = False
    """leave completions that hit max_completion_length out of the loss"""
    temperature: float = 1.0
    """sampling temperature of the rollouts"""
    top_p: float = 0.95
    """nucleus sampling mass of the rollouts"""
    max_completion_length: int = 1024
    """generation budget per completion (tokens)"""
    format_bonus: float = 0.0
    """reward added for a well-formed answer (same meaning as in ES); 0 = the paper's binary reward"""
    class_balanced: bool = False
    """opt-in class-balanced reward: each completion's reward weighted by n / (K * count of its label) over the
    generation batch (the task's `balance_key` labels, e.g. BoolQ yes/no), so a majority-label prior earns no
    more than a minority one. Needs scale_rewards "batch" or "none": with "group" every prompt's group shares
    one weight, which the per-group normalisation cancels"""
    precision: str = "auto"
    """"auto" (bf16 autocast where the device supports it, else fp32), "fp32" or "bf16-autocast". Master weights,
    gradients and optimizer state are fp32 in every case."""
    device: str | None = None
    """torch device ("cpu", "cuda"); None = CUDA when available"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass (less memory, about a quarter more compute)"""
    save_steps: int = 0
    """save a Hugging Face checkpoint every k steps (0 = only the final one); drift.jsonl covers every step"""
    save_total_limit: int = 0
    """keep at most this many numbered checkpoints (iter_XXXXXX, each with its AdamW state: ~3x the weights),
    deleting the oldest as new ones are written (0 = keep all; the final checkpoint is always kept): a resume
    needs the newest"""
    eval_every: int = 0
    """greedy held-out evaluation every k steps and at start and end (0 = never; `esft eval` does it afterwards).
    It runs the fp32 master weights without autocast: `esft eval --dtype fp32` gives a checkpoint the same numbers,
    while `esft eval`'s default dtype on a bf16 GPU loads it in bf16"""
    eval_limit: int = 200
    """held-out (test split) examples for those evaluations; 0 = none, as eval_every 0"""
    eval_balanced: bool = False
    """those examples are a label-balanced subset of the test split (`limit` in all; a labelled task's labels: BoolQ's
    yes/no, a Countdown variant's operator, ...; esft.evaluation.load_examples), so a prior cannot pass for a skill"""
    eval_max_new_tokens: int | None = None
    """generation budget of those evaluations; None = max_completion_length"""
    samples_per_iteration: int = 4
    """completions written to samples/ each step"""
    max_passage_chars: int | None = None
    """task option (BoolQ): cut passages to this many characters to shorten prompts on CPU"""
    task_options: dict[str, Any] = field(default_factory=dict)
    """further keyword options for the task's constructor"""
    report_to: str = "none"
    """experiment trackers, passed to TRL: none, tensorboard, wandb, trackio, or a comma list"""
    run_name: str | None = None
    """the run's name in those trackers (TRL's name); None = the output folder's name (an experiment names each
    stage's run by its stage)"""
    trl_args: dict[str, Any] = field(default_factory=dict)
    """further TRL GRPOConfig options, passed through unchanged (e.g. {use_vllm: true}); not those esft sets
    itself (ESFT_TRL_ARGS: seed, learning_rate, logging_steps, ...), which go through esft's own options"""
    resume: bool = False
    """continue the run in output_dir from its latest checkpoint (step count, optimizer and LR schedule continue)"""

    @staticmethod
    def unknown_option_hint(name: str, close: list[str]) -> str:
        """What an unknown key of a config file or spec means to a TRL user (ConfigHooks.unknown_option_hint): TRL's
        option that esft sets from one of its own, or where the rest of TRL's options go."""
        if name in TRL_EQUIVALENTS:
            return f" (TRL's option; {TRL_EQUIVALENTS[name]})"
        if name in NOT_TRL_OPTIONS:
            return f" ({NOT_TRL_OPTIONS[name]})"
        if name in ESFT_TRL_ARGS:
            return " (TRL's option, which esft sets itself)"
        close_text = f"did you mean {', '.join(close)}? " if close else ""
        return f" ({close_text}another option of TRL's GRPOConfig goes under trl_args: {{{name}: ...}})"

    def __post_init__(self) -> None:
        from esft.tasks.custom import absolute_data_task, absolute_task_options, external_kind

        self.task = absolute_data_task(self.task)  # config.yaml must rebuild it from any directory
        self.report_to = report_to_text(self.report_to)
        self.task_options = mapping_field("task_options", self.task_options)
        self.trl_args = mapping_field("trl_args", self.trl_args)
        if "run_name" in self.trl_args:  # TRL's option, the way to name the run before esft had its own
            self.run_name = self.run_name or self.trl_args["run_name"]
            self.trl_args = {k: v for k, v in self.trl_args.items() if k != "run_name"}
        if external_kind(self.task) == "data":  # its test_file too
            self.task_options = absolute_task_options(self.task_options)
        check_fields(self, self.rules)
        if self.completions_per_step % self.per_device_train_batch_size:
            raise ConfigError(
                "per_device_train_batch_size", self.per_device_train_batch_size,
                f"a divisor of prompts_per_step * num_generations = {self.completions_per_step} completions per step "
                f"({self.completions_per_step} is not a multiple of {self.per_device_train_batch_size})")
        managed = sorted(set(self.trl_args) & set(ESFT_TRL_ARGS))
        if managed:
            raise ConfigError("trl_args", self.trl_args, f"TRL options esft does not set itself; {managed} may not "
                              "be overridden there: set them through esft's own options (same name where one "
                              "exists; bf16/fp16: precision, use_cpu: device, steps_per_generation and "
                              "gradient_accumulation_steps: prompts_per_step, num_generations and "
                              "per_device_train_batch_size), so that config.yaml records what ran")
        refused = sorted(set(self.trl_args) & set(REFUSED_TRL_ARGS))
        if refused:
            raise ConfigError("trl_args", self.trl_args, "; ".join(
                f"no {name} there ({REFUSED_TRL_ARGS[name]})" for name in refused))
        if self.warmup_steps >= self.max_steps > 0:  # a schedule that never reaches the rate the run names
            warnings.warn(f"warmup_steps {self.warmup_steps} >= max_steps {self.max_steps}: the learning rate never "
                          f"reaches learning_rate {self.learning_rate:g}", stacklevel=3)
        if self.class_balanced and self.scale_rewards == "group":
            raise ConfigError("scale_rewards", self.scale_rewards, "'batch' or 'none' with class_balanced (a "
                              "per-group normalisation cancels a weight shared by the group's completions): give "
                              "--scale-rewards batch, or leave out --class-balanced")

    def check_task_fit(self, task: Any, name: str | None = None) -> None:
        from esft.validation import check_balanced_set, check_splits, require_labels

        held_out = ("test",) if self.eval_every and self.eval_limit else ()
        sizes = check_splits("task", self.task, task, ("train", *held_out))
        check_prompts_per_step(self, sizes["train"])
        # trl_args need TRL imported, so they are checked with the task (esft.validation.check_names), where flags,
        # YAML files and experiment specs name their origin, not only when the run starts
        if self.trl_args:
            check_trl_arg_names(self)
        if self.class_balanced:
            require_labels("class_balanced", self.class_balanced, "false", task)
        if self.eval_balanced and held_out:  # eval_every 0 reads no eval option (a preset's balanced 400, say)
            check_balanced_set(task, self.eval_limit)

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.num_generations

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.completions_per_step // self.per_device_train_batch_size


def check_prompts_per_step(config: GRPOConfig, train_examples: int) -> None:
    """A step samples prompts_per_step distinct train prompts, and TRL's sampler drops an epoch's incomplete last
    batch: a train split smaller than one step would end the run at step 0 without an error."""
    if config.prompts_per_step > train_examples:
        raise ConfigError("prompts_per_step", config.prompts_per_step, f"at most the task's {train_examples} train "
                          "examples (each step samples that many distinct prompts; a train split smaller than one "
                          "step gives no step at all)")


def transformers_name(enum: str, examples: str) -> Rule:
    """A value of transformers' enum `enum` ("training_args.OptimizerNames"), imported only to check one: TRL
    would refuse another only once the model has loaded."""
    def ok(value: Any) -> bool:
        module, _, name = enum.rpartition(".")
        return value in {e.value for e in getattr(importlib.import_module(f"transformers.{module}"), name)}

    return Rule(f"a name of transformers' {enum.rpartition('.')[2]} ({examples}, ...)", ok)


#: TRL 1.16's GRPO loss aggregations, used where the installed TRL's own list cannot be read (`trl_loss_types`)
TRL_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "vespo", "luspo")


@functools.lru_cache(maxsize=1)  # read once per process: every GRPOConfig built checks its loss_type
def trl_loss_types() -> tuple[str, ...]:
    """The loss types the installed TRL supports, read from its GRPOConfig's `loss_type` help, so that a TRL which
    adds one is not refused; TRL_LOSS_TYPES where that help cannot be read. GRPOTrainer itself refuses an unknown
    type only at its first loss, after a generation round."""
    try:
        from trl import GRPOConfig as TRLGRPOConfig
    except ImportError:
        return TRL_LOSS_TYPES
    fields = {f.name: f for f in dataclasses.fields(TRLGRPOConfig)}
    help_text = fields["loss_type"].metadata.get("help", "") if "loss_type" in fields else ""
    return loss_types_in(help_text) or TRL_LOSS_TYPES


def loss_types_in(help_text: str) -> tuple[str, ...]:
    """The names quoted in the sentence "Supported values are 'grpo', 'dr_grpo', ... and 'vespo'." of TRL's help;
    () without that sentence."""
    import re

    sentence = re.search(r"Supported values are ([^.]*)\.", help_text)
    return tuple(re.findall(r"'([a-z0-9_]+)'", sentence.group(1))) if sentence else ()


def trl_loss_type() -> Rule:
    return Rule(f"a loss type of the installed TRL (TRL 1.16's: {', '.join(TRL_LOSS_TYPES)})",
                lambda value: value in trl_loss_types())

#: what each field accepts beyond its type (esft.config.check_fields); checked whenever a GRPOConfig is built
RULES: dict[str, Rule] = {
    "max_steps": at_least(1), "prompts_per_step": at_least(1),
    # the advantage is relative to the group: one completion has none
    "num_generations": at_least(2), "per_device_train_batch_size": at_least(1), "learning_rate": positive(),
    "weight_decay": non_negative(), "max_grad_norm": non_negative(), "warmup_steps": at_least(0),
    "epsilon": positive(), "beta": non_negative(), "scale_rewards": one_of("group", "batch", "none"),
    "num_iterations": at_least(1), "temperature": positive(), "top_p": in_range(0.0, 1.0),
    "max_completion_length": at_least(1), "format_bonus": finite(),
    # TRL seeds NumPy's legacy generator with it, which refuses 2^32 and above only once the model has loaded
    "seed": Rule("an integer from 0 to 2^32 - 1 (TRL seeds NumPy's legacy generator with it)",
                 lambda v: 0 <= v < 2**32),
    "precision": one_of("auto", "fp32", "bf16-autocast"), "save_steps": at_least(0), "save_total_limit": at_least(0),
    "eval_every": at_least(0),
    "eval_limit": at_least(0), "eval_max_new_tokens": at_least(1), "samples_per_iteration": at_least(0),
    "max_passage_chars": at_least(1), "model": Rule("a model name, folder or hub id (non-empty)", bool),
    "output_dir": Rule("a folder (non-empty)", bool), "report_to": report_to_rule(),
    "optim": transformers_name("training_args.OptimizerNames", "adamw_torch, adamw_torch_fused, sgd, adafactor"),
    "lr_scheduler_type": transformers_name("trainer_utils.SchedulerType", "linear, cosine, constant, "
                                           "constant_with_warmup"),
    "loss_type": trl_loss_type(),
}
GRPOConfig.rules = RULES

PRESETS: dict[str, dict[str, Any]] = {
    # Paper, Table 17 and the study's public GRPO config: K = 8, 63 prompts per step (21 per GPU x 3), lr 3e-6,
    # AdamW without weight decay, clip 0.2, KL coefficient 0 with KL tracked, linear decay without warm-up,
    # group-std advantages, per-completion token mean ("grpo" loss), temperature 1.0, top_p 0.95, 1024 tokens.
    "paper": dict(num_generations=8, prompts_per_step=63, per_device_train_batch_size=8, max_steps=80,
                  learning_rate=3e-6, optim="adamw_torch", weight_decay=0.0, max_grad_norm=1.0,
                  lr_scheduler_type="linear", warmup_steps=0, epsilon=0.2, beta=0.0, log_kl=True, loss_type="grpo",
                  scale_rewards="group", num_iterations=1, temperature=1.0, top_p=0.95, max_completion_length=1024),
    # 2-core CPU with SmolLM2-135M, on the ES cpu preset's task and format (BoolQ, passages cut to 400 characters,
    # format bonus 0.1, 24 new tokens), 32 completions per step (4 prompts x K = 8): the training forward/backward of
    # every prompt+completion (~240 positions each) dominates a step. Measured (runs/grpo-cpu, other jobs holding the
    # load average at ~5): 316-624 s per step, peak RSS 9.3 GB; the base model boxes ~0-3% of sampled answers, so
    # the learning rate is far above the paper's to learn within 10 steps. It learned the format (sampled boxed rate
    # 0 -> 100% by step 8) and answered "yes" to everything (held-out accuracy = the majority rate).
    "cpu": dict(task="boolq", max_passage_chars=400, format_bonus=0.1, num_generations=8, prompts_per_step=4,
                per_device_train_batch_size=8, max_steps=10, learning_rate=5e-5, max_completion_length=24,
                temperature=1.0, top_p=0.95, precision="fp32", device="cpu", save_steps=5, eval_every=0),
    # The ES cpu-countdown preset's task (two worked puzzles, + and *), sampled rollouts: 32 completions per step
    # (4 prompts x K = 8) of ~300 prompt + ~30 generated tokens; 110 s per step on 2 cores (training forward and
    # backward 87 s of it; bf16 autocast was no faster: docs/results/cpu-study/grpo-probe), so the CPU budget is
    # steps, not samples. Two departures from the paper besides the scale: lr 2e-5 (above its 3e-6, as "cpu"'s 5e-5 is,
    # for a 10-step budget) and log_kl off (the paper tracks KL at beta 0): no frozen copy of the model and no extra
    # forward pass per step, as the probe and the cpu-study runs ran; `--log-kl` records the KL.
    "cpu-countdown": dict(task="countdown:numbers=2,max_number=50,ops=+*,ask_format=1,shots=2", format_bonus=0.0,
                          num_generations=8, prompts_per_step=4, per_device_train_batch_size=4, max_steps=10,
                          learning_rate=2e-5, max_completion_length=40, temperature=1.0, top_p=0.95,
                          precision="fp32", device="cpu", save_steps=5, eval_every=0, eval_limit=400,
                          eval_balanced=True, log_kl=False),
}

# LR schedules that do not depend on max_steps: a run on one of them may be extended (resumed with a larger
# max_steps) and then equals a run started with that max_steps (tests/test_grpo.py)
SCHEDULES_WITHOUT_END = ("constant", "constant_with_warmup")


def resumable_changes(config: "GRPOConfig") -> set[str]:
    """Fields a resume of a run made with `config` may change: RESUMABLE_CHANGES, plus max_steps where the LR
    schedule does not depend on it."""
    without_end = config.lr_scheduler_type in SCHEDULES_WITHOUT_END
    return RESUMABLE_CHANGES | ({"max_steps"} if without_end else set())


# fields that may change when resuming (everything else, the LR schedule's max_steps included unless the schedule
# does not depend on it, must match)
RESUMABLE_CHANGES = {"report_to", "run_name", "save_steps", "save_total_limit", "eval_every", "eval_limit",
                     "eval_balanced", "eval_max_new_tokens", "samples_per_iteration", "resume", "output_dir", "device",
                     # recomputes the same activations in the backward pass: memory and time change, not the math
                     "gradient_checkpointing"}


def resume_config(run_dir: str, overrides: dict[str, Any] | None = None) -> GRPOConfig:
    """Config to continue `run_dir` (`esft train grpo --resume --output-dir RUN_DIR`): its saved config.yaml, plus
    the explicit flags among RESUMABLE_CHANGES, with resume=True. The other flags need not be repeated; one that
    differs from the run's own value is an error (repeating them unchanged is accepted)."""
    from pathlib import Path

    from esft.config import build_config
    from esft.saved_config import read_saved_config
    from esft.tasks.custom import absolute_data_task

    data = read_saved_config(run_dir, "grpo")
    data.pop("_run", None)
    config = build_config(GRPOConfig, overrides=data, overrides_source=f"{Path(run_dir) / 'config.yaml'}")
    overrides = {k: v for k, v in (overrides or {}).items() if k not in ("resume", "output_dir")}
    if "task" in overrides:  # as config.yaml recorded it (a data file's absolute path)
        overrides["task"] = absolute_data_task(overrides["task"])
    changes = {k: v for k, v in overrides.items() if getattr(config, k) != config.stored_value(k, v)}
    allowed = resumable_changes(config)
    bad = sorted(set(changes) - allowed)
    if bad:
        why = (f"; max_steps sets the {config.lr_scheduler_type!r} LR schedule (runs on "
               f"{' or '.join(SCHEDULES_WITHOUT_END)} can be extended)" if "max_steps" in bad else "")
        raise ValueError(f"cannot change {bad} when resuming {run_dir} (a resume may change only "
                         f"{', '.join(sorted(allowed - {'resume', 'output_dir'}))}){why}")
    return dataclasses.replace(config, **changes, resume=True, output_dir=str(run_dir))


def preset(name: str, config_file: str | None = None, **overrides: Any) -> GRPOConfig:
    """GRPOConfig from a preset ("paper" or "cpu"), an optional YAML file and overrides (esft.config rules)."""
    from esft.config import build_config

    return build_config(GRPOConfig, PRESETS, name, config_file, overrides)


def resolve_precision(precision: str, device: str) -> str:
    """"fp32" or "bf16-autocast". "auto" picks bf16 autocast only on a CUDA device with bf16 support: on CPUs
    bf16 matmuls are often slower than fp32 (docs/performance.md)."""
    if precision != "auto":
        return precision
    import torch

    if str(device).startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16-autocast"
    return "fp32"


def trl_arguments(config: GRPOConfig, trl_output_dir: str, precision: str, progress: bool = True) -> dict[str, Any]:
    """The keyword arguments of TRL's GRPOConfig for this run (ESFT_TRL_ARGS, then config.trl_args): one
    generation round per optimizer step (steps_per_generation = gradient_accumulation_steps), logging every step,
    checkpoints every save_steps and at the end."""
    from esft.models import default_device  # lazy: parsing a GRPO config needs no torch
    from esft.tracking import check_backends

    save_steps = config.save_steps if config.save_steps > 0 else config.max_steps
    use_cpu = str(config.device or "").startswith("cpu")
    args: dict[str, Any] = dict(
        output_dir=trl_output_dir,
        seed=config.seed,
        max_steps=config.max_steps,
        per_device_train_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        steps_per_generation=config.gradient_accumulation_steps,
        num_generations=config.num_generations,
        learning_rate=config.learning_rate,
        optim=config.optim,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        lr_scheduler_type=config.lr_scheduler_type,
        warmup_steps=config.warmup_steps,
        epsilon=config.epsilon,
        beta=config.beta,
        loss_type=config.loss_type,
        scale_rewards=config.scale_rewards,
        num_iterations=config.num_iterations,
        mask_truncated_completions=config.mask_truncated_completions,
        temperature=config.temperature,
        top_p=config.top_p,
        max_completion_length=config.max_completion_length,
        # TRL defaults bf16 to True; esft decides precision explicitly (fp32 masters either way)
        bf16=precision == "bf16-autocast",
        fp16=False,
        use_cpu=use_cpu,
        **{checkpointing_argument(): config.gradient_checkpointing},
        disable_dropout=True,
        logging_steps=1,
        save_strategy="steps",
        save_steps=save_steps,
        report_to=check_backends(config.report_to) or "none",  # TRL's own integrations log
        run_name=config.tracking_name(),
        disable_tqdm=not progress,
        remove_unused_columns=False,  # the reward needs the example_index column
        dataloader_num_workers=0,
        logging_nan_inf_filter=False,  # else transformers logs a NaN loss as the mean of earlier ones (0.0 at first)
        # pinned host memory only serves copies to a GPU; without one, torch warns on every dataloader
        dataloader_pin_memory=not use_cpu and default_device() == "cuda",
    )
    return {**args, **config.trl_args}



def checkpointing_argument() -> str:
    """TRL's (transformers') name of the activation-recomputation switch: transformers 5.x renamed
    `gradient_checkpointing` to `activation_checkpointing` and warns (FutureWarning) on every run given the old
    name; older versions know only the old one. esft's own option keeps TRL's documented name."""
    from transformers import TrainingArguments

    fields = getattr(TrainingArguments, "__dataclass_fields__", {})
    return "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"


def check_trl_arg_names(config: GRPOConfig) -> None:
    """A trl_args key TRL's GRPOConfig does not know, a value that is not of its option's type, or `use_vllm`
    without vLLM installed is a ConfigError (train_grpo asks before it makes the run folder; TRL itself would
    raise a TypeError, or an ImportError once the trainer is built)."""
    import dataclasses as dc

    try:
        from trl import GRPOConfig as TRLGRPOConfig
        from trl.import_utils import is_vllm_available
    except ImportError:  # e.g. an experiment spec's --dry-run on a machine without the GRPO extra
        raise ConfigError("trl_args", config.trl_args, "options checked against TRL, which is not installed here: "
                          "pip install 'esft[grpo]'") from None
    unknown = sorted(set(config.trl_args) - {f.name for f in dc.fields(TRLGRPOConfig)})
    if unknown:
        hints = "".join(f"; {NOT_TRL_OPTIONS[name]}" for name in unknown if name in NOT_TRL_OPTIONS)
        raise ConfigError("trl_args", config.trl_args, f"options of TRL's GRPOConfig ({unknown} are not{hints})")
    typed = {**config.trl_args, **_typed_trl_args(config, TRLGRPOConfig)}
    if typed.get("use_vllm") and not is_vllm_available():
        raise ConfigError("trl_args", config.trl_args, "use_vllm only where vLLM is installed: pip install "
                          "'esft[vllm]'")


def to_trl_config(config: GRPOConfig, trl_output_dir: str, precision: str, progress: bool = True):
    """TRL's GRPOConfig for this run (trl_arguments); trl_args that TRL would refuse are a ConfigError here
    (check_trl_arg_names)."""
    from trl import GRPOConfig as TRLGRPOConfig

    check_trl_arg_names(config)
    args = trl_arguments(config, trl_output_dir, precision, progress)
    args.update(_typed_trl_args(config, TRLGRPOConfig))
    return TRLGRPOConfig(**args)


_KINDS = {int: "an integer", float: "a number", bool: "true or false"}


def _typed_trl_args(config: GRPOConfig, trl_class: type) -> dict[str, Any]:
    """The trl_args given as text for a number or boolean option of TRL's GRPOConfig, as that type: YAML 1.1 reads
    `adam_epsilon: 1e-8` as text, which TRL keeps and torch's optimizer refuses only after the model has loaded."""
    import typing

    from esft.config_flags import converter, unwrap_optional

    hints = typing.get_type_hints(trl_class)
    out = {}
    for key, value in config.trl_args.items():
        inner, _ = unwrap_optional(hints[key])
        if isinstance(value, str) and inner in (int, float, bool):
            try:
                out[key] = converter(hints[key])(value)
            except (ValueError, argparse.ArgumentTypeError):
                raise ConfigError("trl_args", config.trl_args, f"{key}: {_KINDS[inner]} (TRL's GRPOConfig), "
                                  f"not {value!r}") from None
    return out
