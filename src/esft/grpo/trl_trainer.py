"""TRL's `GRPOTrainer` with esft's measurements added; the GRPO loss, sampling and optimizer are TRL's, unchanged.

What the subclass adds, each as a thin wrapper around one TRL method (pinned TRL range in pyproject):

- accounting (`StepLedger`): prompts, completions and tokens generated and trained on, counted from the tensors
  TRL built, plus wall time of generation, scoring and the KL forward pass;
- KL to the initial model while `beta = 0` (the study tracks it without a penalty; TRL measures KL only when it
  also optimises it): a frozen copy of the initial model scores the sampled completion ids (never re-tokenised
  text, which shifts tokens), and the policy's log-probs are the ones TRL's loss computes, so it costs one forward;
- rollouts in bf16 autocast when training uses it (TRL autocasts the loss forward but not `generate`);
- a prompt order that depends only on (seed, epoch), so a resumed run samples the same prompts as an
  uninterrupted one (TRL's sampler advances one generator across epochs, which a restart re-seeds);
- checkpoints moved into esft's run-directory layout (`checkpoints/iter_XXXXXX`, `checkpoints/final`), and
  the last finished step's checkpoint written when the run is interrupted (esft.grpo.interrupt);
- no model card (TRL writes one to the output folder and may look the base model up on the hub).

Masks: TRL pads prompts and completions from their lengths (explicit attention masks, never `ids != pad`), and a
completion keeps its first eos in the loss mask, so pad == eos models (SmolLM2, Llama) lose no real eos token
(tests/test_grpo.py checks it with pad == eos).
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler

from esft.grpo.interrupt import (StepBoundary, drop_interrupt_saves, interrupt_only, mark_interrupt_save,
                                 set_rng_states)
from esft.grpo.ledger import StepLedger
from esft.rundir import CHECKPOINTS, checkpoint_name, list_checkpoints, prune_checkpoints, replace_dir
from esft.sample_rows import sample_row
from esft.tasks.base import checks_format, completion_text


def balanced_rewards(rewards: Sequence[float | None], labels: Sequence[Any],
                     label_set: Sequence[Any] | None) -> list[float | None]:
    """Rewards weighted by `class_balanced_weights` of their labels; a label outside `label_set` (a Countdown
    target two operators reach) keeps weight 1. Their mean is the mean over labels of each label's mean reward.
    None (no reward applies: TRL's unscorable completion) stays None."""
    from esft.tasks.labels import class_balanced_weights

    allowed = None if label_set is None else set(label_set)
    known = [i for i, label in enumerate(labels) if allowed is None or label in allowed]
    out = [None if r is None else float(r) for r in rewards]
    if known:
        weights = class_balanced_weights([labels[i] for i in known])
        for i, w in zip(known, weights):
            out[i] = None if out[i] is None else out[i] * w
    return out


#: the transformers state file of a checkpoint (its `global_step` is the checkpoint's step)
TRAINER_STATE = "trainer_state.json"

class TaskReward:
    """The task's scorer as a TRL reward function (same reward as ES: score + format_bonus * well_formed).

    The dataset carries only `prompt` and `example_index`; the example itself is looked up here, so any task's
    examples work whatever their fields (no Arrow schema to infer). Scores and format flags go to the ledger.
    """

    def __init__(self, task: Any, examples: list[dict[str, Any]], format_bonus: float,
                 ledger: Callable[[], StepLedger], samples_per_iteration: int = 4, class_balanced: bool = False):
        self.task, self.examples, self.format_bonus = task, examples, format_bonus
        self.class_balanced = class_balanced
        self._reward = task.reward_function(format_bonus)
        self._ledger = ledger
        self.samples_per_iteration = samples_per_iteration
        self.__name__ = f"{task.name}_reward"  # TRL names the reward metric after it
        self.eos_token_ids: frozenset[int] = frozenset()
        """the ids that end a completion (EsftGRPOTrainer sets its own): a sample row's `finished`"""

    def __call__(self, completions: list[Any], example_index: list[int], **kwargs: Any) -> list[float | None]:
        examples = [self.examples[int(i)] for i in example_index]
        rewards = self._reward(completions, examples=examples)
        if self.class_balanced:
            rewards = balanced_rewards(rewards, [self.task.balance_key(ex) for ex in examples],
                                       self.task.label_set())
        texts = [completion_text(c) for c in completions]
        scores = [float(self.task.score(t, ex)) for t, ex in zip(texts, examples)]
        # (a task that checks no format has no format flags: esft.tasks.base.checks_format)
        formed = ([bool(self.task.is_well_formed(t, ex)) for t, ex in zip(texts, examples)]
                  if checks_format(self.task) else [None] * len(texts))
        trainer_state = kwargs.get("trainer_state")
        ledger = self._ledger()
        ledger.rewards += [r for r in rewards if r is not None]  # as TRL's reward metric, unscorable ones left out
        ledger.scores += scores
        ledger.well_formed += [f for f in formed if f is not None]
        room = self.samples_per_iteration - len(ledger.samples)
        ids = kwargs.get("completion_ids") or [[] for _ in texts]
        for j in range(min(max(room, 0), len(texts))):
            head = {"iteration": getattr(trainer_state, "global_step", None), "index": int(example_index[j])}
            ledger.samples.append(sample_row(head, score=scores[j], well_formed=formed[j],
                                             finished=bool(ids[j]) and int(ids[j][-1]) in self.eos_token_ids,
                                             completion_tokens=len(ids[j]), completion=texts[j])
                                  | {"reward": rewards[j]})
        return rewards


class EpochSeededRepeatSampler(RepeatSampler):
    """TRL's RepeatSampler with the shuffle of epoch e drawn from a generator seeded by (seed, e); transformers
    calls set_epoch(e) before every epoch, on a fresh run and on a resumed one alike."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        if self.shuffle:
            self.generator = torch.Generator()
            self.generator.manual_seed(int(self.seed or 0) * 1_000_003 + self.epoch)
        return super().__iter__()


class EsftGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` plus accounting, KL tracking at beta = 0 and esft's checkpoint layout (see module doc)."""

    def __init__(self, model: Any, *args: Any, run_dir: str | Path, log_kl: bool = True, save_total_limit: int = 0,
                 **kwargs: Any):
        grpo_args = kwargs.get("args")
        beta = getattr(grpo_args, "beta", 0.0)
        # Copy before TRL patches the model's forward (its fused LM head); the copy gets its own patch below.
        reference = copy.deepcopy(model) if log_kl and beta == 0.0 else None
        super().__init__(model, *args, **kwargs)
        if self.ref_model is not None:  # beta > 0: TRL loaded it again from the policy's model files
            from esft.es.start_weights import fp32_start

            # An ES checkpoint of a bf16 model holds the exact weights in masters.safetensors beside its rounded model
            # file, which is what TRL read; the policy starts from the masters (esft.grpo.run), so must its reference
            fp32_start(self.ref_model, str(getattr(model.config, "_name_or_path", "") or ""))
        self.run_dir = Path(run_dir)
        self.save_total_limit = save_total_limit  # esft.rundir.prune_checkpoints (TRL's own rotation never sees them)
        self.ledger = StepLedger()
        self.interrupt_save = False  # the checkpoint being written is an interrupt's (esft.grpo.interrupt)
        for func in self.reward_funcs:  # a sample row says whether its completion ended with eos, as TRL decides it
            if isinstance(func, TaskReward):
                func.eos_token_ids = frozenset(int(t) for t in self.eos_token_ids)
        self.last_rollout: dict[str, Any] | None = None  # tensors of the latest generation round (tests, debugging)
        self.kl_reference = None
        if reference is not None:
            from trl.trainer.utils import add_fused_lm_head

            reference.eval()
            reference.requires_grad_(False)
            reference.to(self.accelerator.device)
            # the policy's own head options (TRL's __init__), so that the KL of the first step is exactly 0
            add_fused_lm_head(reference, temperature=self.temperature,
                              cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32)
            self.kl_reference = reference
        self._capture_logps = False
        self._captured_logps: torch.Tensor | None = None

    def _get_train_sampler(self, dataset: Any = None):
        # same arguments as TRL's own sampler; only the per-epoch seeding differs (see EpochSeededRepeatSampler)
        return EpochSeededRepeatSampler(
            data_source=self.train_dataset if dataset is None else dataset,
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=self.shuffle_dataset,
            seed=self.args.seed,
        )

    # ---- measurements -----------------------------------------------------------------------------------------
    def _training(self) -> bool:
        return bool(self.model.training)

    def _generate(self, prompts: list):
        t0 = time.perf_counter()
        out = super()._generate(prompts)
        if self._training():
            prompt_ids, completion_ids = out[0], out[1]
            eos = set(self.eos_token_ids)
            led = self.ledger
            led.add_time("generate", time.perf_counter() - t0)
            led.mark_rss("generate")
            led.completions += len(completion_ids)
            led.prompt_tokens += sum(len(p) for p in prompt_ids)
            led.tokens_generated += sum(len(c) for c in completion_ids)
            led.finished += sum(1 for c in completion_ids if c and c[-1] in eos)
        return out

    def _generate_single_turn(self, *args: Any, **kwargs: Any):
        # Under bf16 training, sample from the same autocast numerics the loss forward uses.
        ctx = self.accelerator.autocast() if self.args.bf16 else contextlib.nullcontext()
        with ctx:
            return super()._generate_single_turn(*args, **kwargs)

    def _calculate_rewards(self, *args: Any, **kwargs: Any):
        t0 = time.perf_counter()
        out = super()._calculate_rewards(*args, **kwargs)
        if self._training():
            self.ledger.add_time("score", time.perf_counter() - t0)
        return out

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        out = super()._generate_and_score_completions(inputs)
        if not self._training():
            return out
        rows = int(out["completion_ids"].size(0))
        self.ledger.prompts += rows // self.num_generations
        self.ledger.signal_completions += int((out["advantages"] != 0).sum().item())
        if self.kl_reference is not None:
            t0 = time.perf_counter()
            out["esft_ref_per_token_logps"] = self._reference_logps(out)
            self.ledger.add_time("ref_logps", time.perf_counter() - t0)
            self.ledger.mark_rss("ref_logps")
        self.last_rollout = {k: out[k].detach().cpu() for k in
                             ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")}
        return out

    @torch.no_grad()
    def _reference_logps(self, out: dict[str, Any]) -> torch.Tensor:
        input_ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        attention_mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        logps, _, _ = self._get_per_token_logps_and_entropies(
            self.kl_reference, input_ids, attention_mask, out["completion_ids"].size(1),
            batch_size=self.args.per_device_train_batch_size)
        return logps

    def _get_per_token_logps_and_entropies(self, model, *args: Any, **kwargs: Any):
        result = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        if self._capture_logps:  # the policy forward of _compute_loss: reuse its log-probs for the KL metric
            self._captured_logps = result[0].detach()
            self._capture_logps = False
        return result

    def _compute_loss(self, model, inputs: dict[str, Any]):
        if not self._training():
            return super()._compute_loss(model, inputs)
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        led = self.ledger
        led.trained_tokens += int(mask.sum().item())
        led.trained_completions += int((mask.sum(dim=1) > 0).sum().item())
        led.forward_tokens += int(inputs["prompt_ids"].numel() + inputs["completion_ids"].numel())
        self._capture_logps = "esft_ref_per_token_logps" in inputs
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._capture_logps = False
        if self._captured_logps is not None:
            self._metrics["train"]["kl"].append(
                masked_k3_kl(self._captured_logps, inputs["esft_ref_per_token_logps"], mask))
            self._captured_logps = None
        return loss

    # ---- run directory -----------------------------------------------------------------------------------------
    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """Not written: config.yaml documents the run, and building a card may query the hub (offline here)."""
        return None

    def _save_checkpoint(self, model, trial) -> None:
        """TRL/transformers write `checkpoint-N` (HF weights + tokenizer + optimizer, scheduler, RNG and trainer
        state); move it whole into `checkpoints/iter_XXXXXX` (or `final` at max_steps), replacing atomically."""
        super()._save_checkpoint(model, trial)
        step, every = self.state.global_step, int(self.args.save_steps)
        src = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{step}"
        name = "final" if step >= self.state.max_steps else checkpoint_name(step)
        if self.interrupt_save and name != "final":  # marked whole or not at all: before the move
            mark_interrupt_save(src, step)
        move_checkpoint(src, self.run_dir / CHECKPOINTS / name)
        # an older checkpoint written only for an interrupt has served its resume once a newer one exists
        older = [(s, folder) for s, folder in list_checkpoints(self.run_dir, TRAINER_STATE, "global_step") if s < step]
        for folder in drop_interrupt_saves(older, every):
            print(f"esft: deleted {folder}: written when the run was interrupted, and it has a newer checkpoint now",
                  file=sys.stderr, flush=True)
        prune_checkpoints([(s, folder) for s, folder in list_checkpoints(self.run_dir, TRAINER_STATE, "global_step")
                           if not interrupt_only(s, folder, every)], self.save_total_limit)

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """transformers warns on every resume that a tied weight (SmolLM2's lm_head, saved once as the embeddings)
        is a missing key; the load filled it through the tensor it shares. Only keys missing in fact are passed on."""
        tied = tied_names(self.accelerator.unwrap_model(self.model))
        missing = [k for k in load_result.missing_keys if k not in tied]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))

    def inside_round(self, step: int) -> bool:
        """Whether `step` (before max_steps) ends inside a generation round of num_iterations > 1 updates, whose
        completions TRL keeps in memory only: esft.grpo.checkpoints.resume_checkpoint passes over its checkpoint."""
        return bool(step % self.args.num_iterations) and step < self.state.max_steps

    def save_finished_step(self, boundary: StepBoundary) -> Path | None:
        """After an interrupt: the checkpoint of the last finished step when it has none yet, with the RNG states
        and TRL's token count of that step's end (esft.grpo.interrupt); None when there is nothing to save, or
        the step lies inside a generation round (`inside_round`: a resume could not start from it)."""
        step = boundary.unsaved_step(self.state)
        if step is None or boundary.rng is None or self.inside_round(step):
            return None
        set_rng_states(boundary.rng)
        live_tokens = self.state.num_input_tokens_seen
        self.state.num_input_tokens_seen = boundary.tokens_seen
        saved = self.run_dir / CHECKPOINTS / ("final" if step >= self.state.max_steps else checkpoint_name(step))
        self.interrupt_save = True
        try:
            self._save_checkpoint(self.model, trial=None)
        except KeyboardInterrupt:  # a second Ctrl-C: a checkpoint moved whole stays, a half-written one goes
            if any(s == step and folder == saved for s, folder in list_checkpoints(self.run_dir, TRAINER_STATE,
                                                                                  "global_step")):
                return saved
            shutil.rmtree(Path(self._get_output_dir(trial=None)) / f"checkpoint-{step}", ignore_errors=True)
            raise
        finally:
            self.state.num_input_tokens_seen = live_tokens
            self.interrupt_save = False
        return saved


def tied_names(model: Any) -> set[str]:
    """Names of the parameters that share their tensor with an earlier-named one (tied weights): a checkpoint
    holds such a tensor once, under the first name."""
    first: dict[int, str] = {}
    tied = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if first.setdefault(id(param), name) != name:
            tied.add(name)
    return tied


def masked_k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over completion tokens of the k3 estimator of KL(policy || reference), as TRL logs it when beta > 0:
    exp(r - p) - (r - p) - 1 with p, r the policy and reference log-probs of the sampled token."""
    delta = (ref_logps - logps).float()
    per_token = torch.exp(delta) - delta - 1
    m = mask.to(per_token.dtype)
    return float((per_token * m).sum() / m.sum().clamp(min=1.0))


def move_checkpoint(src: Path, dst: Path) -> None:
    replace_dir(src, dst)
