"""`train_grpo(config)`: build model, task, dataset and TRL trainer, run (or resume) GRPO, write the run directory.

Layout of `output_dir` (the ES layout, with drift.jsonl where ES keeps seeds.jsonl):
    config.yaml                resolved GRPOConfig (+ `_run`: precision, parameter dtypes, versions, batch shape)
    metrics.jsonl              {"kind": "train", ...} per optimizer step, {"kind": "eval", ...} per evaluation
    drift.jsonl                ||theta_t - theta_0||^2 per step, total and per tensor
    samples/                   iter_XXXXXX.jsonl (a few rollouts of the step), eval_XXXXXX.jsonl (held-out)
    checkpoints/iter_XXXXXX/   Hugging Face folder (safetensors, config, tokenizer) + TRL/transformers
    checkpoints/final/         optimizer, scheduler, RNG and trainer state; XXXXXX = optimizer steps done

Resume (`resume=True`) restarts from the latest intact checkpoint at the start of a generation round (every step
with num_iterations 1; `esft.grpo.checkpoints`) through transformers' own
resume (weights, AdamW moments, LR scheduler, RNG and step count), drops log lines written after that checkpoint,
and continues. The config must match the original run except for RESUMABLE_CHANGES; max_steps may grow only where
the LR schedule does not depend on it (SCHEDULES_WITHOUT_END: the extended run then equals one started with the
larger max_steps).
An interrupt (Ctrl-C, SIGTERM) first writes the checkpoint of the last finished step (esft.grpo.interrupt), so
a resume continues from there, not from the last scheduled checkpoint; not for a step inside a generation round,
which a resume could not start from.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch
import yaml

from esft import rundir
from esft.config import ConfigError, locked_changes, resume_refusal
from esft.grpo.checkpoints import list_checkpoints, resume_checkpoint
from esft.grpo.grpo_config import (SCHEDULES_WITHOUT_END, GRPOConfig, check_prompts_per_step, check_trl_arg_names,
                                   resolve_precision, resumable_changes, to_trl_config)
from esft.grpo.interrupt import StepBoundary, interrupted_message
from esft.grpo.trl_trainer import EsftGRPOTrainer, TaskReward
from esft.models import without_transformers_bars
from esft.run_undo import locked_run_folder
from esft.rundir import CHECKPOINTS, DISK_FULL, RunFailed, RunInterrupted, TrainResult, filter_jsonl, read_jsonl
from esft.saved_config import with_earlier_segments
from esft.tasks.base import format_bonus_warning
from esft.tasks.custom import as_task
from esft.tasks.task_code import task_code, warn_if_task_code_changed
from esft.version import __version__


@dataclass
class GRPOTrainResult(TrainResult):
    """esft.rundir's TrainResult (output_dir, steps, final_checkpoint, last_eval) plus the TRL trainer that ran
    (None when there was nothing to do): its state, ledger and last rollout tensors, for inspection. The run is
    over: its trackers (wandb, TensorBoard) are closed, so `trainer.log` or `trainer.train` on it is not a way to
    go on (resume the run folder instead)."""

    trainer: Any = field(default=None, repr=False)


# ---- run directory ---------------------------------------------------------------------------------------------

def read_run_config(run_dir: str | Path) -> tuple[GRPOConfig, dict[str, Any]]:
    """(config, run info) from `<run_dir>/config.yaml` as written by train_grpo."""
    from esft.config import build_config
    from esft.saved_config import read_saved_config

    data = read_saved_config(run_dir, "grpo")
    extra = data.pop("_run", {}) or {}
    return build_config(GRPOConfig, overrides=data, overrides_source=f"{Path(run_dir) / 'config.yaml'}"), extra


def _write_config(config: GRPOConfig, path: Path, resume: bool, extra: dict[str, Any]) -> None:
    if resume:  # each earlier segment's threads, versions, machine (a fresh run's file is an abandoned attempt's)
        extra = with_earlier_segments(path, extra)
    rundir.write_text_atomic(path, yaml.safe_dump({**config.to_dict(), "_run": extra}, sort_keys=False))


def _check_resumable(run_dir: Path, config: GRPOConfig) -> None:
    old, _ = read_run_config(run_dir)
    diffs = locked_changes(old, config, resumable_changes(old))
    if diffs:
        why = (f"; max_steps sets the {old.lr_scheduler_type!r} LR schedule (runs on "
               f"{' or '.join(SCHEDULES_WITHOUT_END)} can be extended)" if "max_steps" in diffs else "")
        raise resume_refusal(run_dir, diffs, why)


def _prepare_dir(out: Path, config: GRPOConfig) -> tuple[Path | None, int]:
    """Returns (checkpoint to resume from or None, its step); trims logs past that step."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "samples").mkdir(exist_ok=True)
    for stale in out.glob("checkpoint-*"):  # a save interrupted before it was moved into checkpoints/
        shutil.rmtree(stale, ignore_errors=True)
    resume_from, start = None, 0
    holds_run = bool(read_jsonl(out / "metrics.jsonl") or list_checkpoints(out))
    if config.resume and (holds_run or (out / "config.yaml").exists()):
        _check_resumable(out, config)  # a missing, empty or unreadable config.yaml refuses here
        start, resume_from = resume_checkpoint(out, config.num_iterations, config.max_steps,
                                               bool(config.trl_args.get("save_only_model")))
        if start > config.max_steps:
            raise ValueError(f"cannot resume {out} with max_steps {config.max_steps}: it has trained for {start} "
                             "steps already")
    elif holds_run:
        raise rundir.occupied_error(out, "grpo")
    for name in ("metrics.jsonl", "drift.jsonl"):
        filter_jsonl(out / name, lambda r: r.get("step", 0) <= start)
    return resume_from, start


# ---- building blocks -----------------------------------------------------------------------------------------

def _run_info(model: Any, config: GRPOConfig, precision: str, device: str, train_set: Sequence[Any],
              kl_reference: bool, task: Any = None) -> dict[str, Any]:
    import transformers
    import trl

    dtypes: dict[str, int] = {}
    for p in model.parameters():
        key = str(p.dtype).replace("torch.", "")
        dtypes[key] = dtypes.get(key, 0) + 1
    return {"algorithm": "grpo", "precision": precision, "master_dtype": "float32",
            "autocast_dtype": "bfloat16" if precision == "bf16-autocast" else None,
            "optimizer_state_dtype": "float32", "param_dtypes": dtypes,
            "num_params": sum(p.numel() for p in model.parameters()),
            "num_tensors": len(list(model.parameters())), "device": device, "kl_reference": kl_reference,
            "completions_per_step": config.completions_per_step,
            "gradient_accumulation_steps": config.gradient_accumulation_steps, "train_examples": len(train_set),
            "train_sha256": rundir.examples_digest(train_set),
            "task_code": None if task is None else task_code(task),
            "torch": str(torch.__version__), "transformers": transformers.__version__, "trl": trl.__version__,
            "numpy": str(np.__version__), "esft": __version__, "python": platform.python_version(),
            "machine": platform.machine(),
            # what step timings are read against, as ES records them (docs/performance.md, "threads")
            "torch_threads": torch.get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "OpenMP default")}


def build_dataset(examples: Sequence[dict[str, Any]], task: Any):
    """TRL dataset: the chat prompt and the example's index (the reward looks the example up by index)."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": task.prompt(ex), "example_index": i} for i, ex in enumerate(examples)])


def _remove_default_printers(trainer: Any) -> None:
    """transformers prints every log dict (ProgressCallback / PrinterCallback); RunLogCallback prints one line."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)


# ---- entry point ---------------------------------------------------------------------------------------------------

def train_grpo(config: GRPOConfig, *, model: Any = None, tokenizer: Any = None, task: Any = None,
               callbacks: Sequence[Any] = (), progress: bool = True) -> GRPOTrainResult:
    """Run (or resume, with config.resume) GRPO fine-tuning. Seams for tests: model, tokenizer, task, callbacks.
    Returns the run directory, steps done, final checkpoint and the last held-out evaluation (if any)."""
    from esft.tracking import check_backends

    check_backends(config.report_to)  # a missing tracker package fails before the model loads
    check_trl_arg_names(config)  # and a misspelt or mistyped trl_args key before the run folder is made
    out = Path(config.output_dir)
    rundir.check_output_dir(out)
    rundir.check_new_run(out, "grpo", config.resume)
    # an object that is not an esft Task as get_task builds it: its resume from config.yaml prompts alike
    task = None if task is None else as_task(task)
    from esft.models import current_device

    # one writer per run directory, a refusal leaves no files behind; `cuda:N` current before TRL's arguments set up
    # accelerate's device
    with locked_run_folder(out), current_device(config.device):
        return _train_locked(config, out, model, tokenizer, task, callbacks, progress)


def check_reference_source(model: Any) -> None:
    """With beta > 0 TRL loads its reference model again from `model.config._name_or_path`: a model object built in
    memory (no folder, no hub id there) would fail deep inside TRL, so it is refused here, before training."""
    from esft.models import is_hub_id

    name = str(getattr(getattr(model, "config", None), "_name_or_path", "") or "")
    if not (name and (Path(name).is_dir() or is_hub_id(name))):
        raise ValueError(f"beta > 0 needs a model TRL can load again as the KL reference, and this model's "
                         f"config._name_or_path is {name!r} (no folder, no hub id): save it with "
                         "save_pretrained(folder) and pass the model loaded from that folder, or set beta 0")


def check_masters_stay_fp32(trl_args: Any, given: dict[str, Any]) -> None:
    """TRL's continuous-batching generation (trl_args use_transformers_continuous_batching, or its deprecated alias
    use_transformers_paged) casts the training model itself to bf16 when TRL's bf16 is on, before its first
    rollout: AdamW would then update pure-bf16 weights, whose small steps round away (an update that looks sparse
    for no reason of the method's), while config.yaml records fp32 masters. Refused before the model loads."""
    if trl_args.bf16 and getattr(trl_args, "use_transformers_continuous_batching", False):
        raise ConfigError("trl_args", given, "no continuous batching with "
                          "precision bf16-autocast (TRL's continuous-batching generation casts the training weights "
                          "to bf16, so the fp32 master weights would be lost): give --precision fp32 with it, or "
                          "leave it out of trl_args")


def warn_if_precision_changed(out: Path, precision: str) -> None:
    """Warn when a resume computes in another precision than the run did (`_run.precision`): `precision: auto`
    on another device (a GPU run resumed on the CPU) turns bf16 autocast into fp32 or back, and the run's steps
    then mix the two."""
    from esft.saved_config import recorded_run

    recorded = recorded_run(out).get("precision")
    if recorded and recorded != precision:
        warnings.warn(f"resuming {out} in {precision} where its steps so far ran in {recorded} (precision auto "
                      "on another device): the steps from here on compute in the other precision", stacklevel=3)


def _say_resuming(out: Path, config: GRPOConfig, start: int, resume_from: Path | None) -> None:
    # a final checkpoint is named by its step: an extended run renames it so (rundir.demote_final)
    source = f"checkpoint {rundir.checkpoint_name(start)}" if resume_from is not None else \
        "no checkpoint yet: from the start"
    rundir.say(rundir.resuming_line(out, "step", start, config.max_steps, source))


def _train_locked(config: GRPOConfig, out: Path, model: Any, tokenizer: Any, task: Any, callbacks: Sequence[Any],
                  progress: bool) -> GRPOTrainResult:
    from esft.grpo.callbacks import RunLogCallback, point_trackers, tracker_report, tracker_table
    from esft.grpo.drift_log import DriftCallback, snapshot
    from esft.models import default_device

    device = config.device or default_device()
    precision = resolve_precision(config.precision, device)
    if task is None:  # before the model: a bad task (file, fields, reward) fails fast
        from esft.tasks import get_task

        task = get_task(config.task, **config.task_kwargs())
        # the checks `esft train` makes (splits, labels, a balanced set): a script's config naming its task by
        # string reaches here unchecked, and class_balanced would weigh an unlabelled task by its gold answers
        config.check_task_fit(task)
    # before the folder is prepared: a resume on other train examples is refused with its logs untouched
    train_set = _train_set(config, out, task)
    resume_from, start = _prepare_dir(out, config)
    if resume_from is not None and start >= config.max_steps:
        _evaluate_final(out, config, task, resume_from, tokenizer, device, progress)
        if progress:
            print(rundir.finished_line(out, "step", start, "max_steps", config.max_steps))
        return GRPOTrainResult(out, start, resume_from, None)
    if config.resume and progress and (out / "config.yaml").exists():
        _say_resuming(out, config, start, resume_from)
    if config.resume:
        warn_if_precision_changed(out, precision)

    # before the model: TRL's own option checks (and esft's on trl_args) fail fast
    trl_args = to_trl_config(config, str(out), precision, progress)
    check_masters_stay_fp32(trl_args, config.trl_args)
    model, tokenizer = _policy(config, model, tokenizer, device)

    trainer_box: list[EsftGRPOTrainer] = []
    reward = TaskReward(task, train_set, config.format_bonus, lambda: trainer_box[0].ledger,
                        config.samples_per_iteration, class_balanced=config.class_balanced)
    trainer = EsftGRPOTrainer(model, reward_funcs=[reward], args=trl_args, train_dataset=build_dataset(train_set, task),
                              processing_class=tokenizer, run_dir=out, log_kl=config.log_kl,
                              save_total_limit=config.save_total_limit)
    trainer_box.append(trainer)
    _remove_default_printers(trainer)
    point_trackers(trainer, out, start if config.resume else None, config.trl_args, config.to_dict())

    model = trainer.accelerator.unwrap_model(trainer.model)
    # theta_0 = the initial weights, taken before a resume loads the checkpoint into the model
    base = (dict(trainer.kl_reference.named_parameters()) if trainer.kl_reference is not None
            else snapshot(model))
    drift = DriftCallback(out / "drift.jsonl", base)
    prior = [r for r in read_jsonl(out / "metrics.jsonl")]
    totals = next((r["totals"] for r in reversed(prior) if r.get("kind") == "train" and "totals" in r), None)
    table = tracker_table(trainer, config.samples_per_iteration)
    runlog = RunLogCallback(out, trainer, drift, totals, progress, tracker_report(trainer, "train"), table)
    trainer.add_callback(drift)
    trainer.add_callback(runlog)
    evaluator = None
    if config.eval_every and config.eval_limit:
        evaluator = _evaluator(out, config, task, tokenizer, {r["step"] for r in prior if r.get("kind") == "eval"},
                               progress, tracker_report(trainer), table)
        trainer.add_callback(evaluator)
    for cb in callbacks:
        trainer.add_callback(cb)

    _write_config(config.replace(resume=False), out / "config.yaml", config.resume,
                  _run_info(model, config, precision, str(next(model.parameters()).device), train_set,
                            trainer.kl_reference is not None, task))
    # an extended run (start < max_steps here): its last checkpoint is no longer final. Renamed only now, once
    # config.yaml holds the new max_steps: a failure before this leaves the finished run as it was
    resume_from = _demote_final(out, config.max_steps, resume_from)
    _train_or_save(trainer, resume_from, runlog, config)
    final = out / CHECKPOINTS / "final"
    return GRPOTrainResult(out, int(trainer.state.global_step), final if final.exists() else None,
                           evaluator.last if evaluator is not None else None, trainer)


def _policy(config: GRPOConfig, model: Any, tokenizer: Any, device: str) -> tuple[Any, Any]:
    """The model GRPO trains, in fp32 (bf16 only as autocast: pure bf16 rounds small updates away). Where
    config.model is an ES checkpoint of a bf16 / fp16 model, its weights start from that run's fp32 masters
    (esft.es.start_weights.fp32_start), before the trainer copies its KL reference and drift base from them."""
    from esft.es.start_weights import fp32_start

    if model is None:
        from esft.models import load_model

        model, tokenizer = load_model(config.model, dtype="float32", device=device)
    elif config.beta > 0:
        check_reference_source(model)
    if any(p.dtype != torch.float32 for p in model.parameters()):
        model.to(torch.float32)
    fp32_start(model, config.model)
    model.requires_grad_(True)
    return model, tokenizer


def _train_set(config: GRPOConfig, out: Path, task: Any) -> list[Any]:
    """The task's train examples, checked before the model loads: the same as a resumed run's, enough for a step
    (also for a task object, which check_task_fit never saw); the format bonus warned of where it does nothing."""
    train_set = task.load("train")
    if config.resume:
        rundir.check_same_train_set(out, rundir.examples_digest(train_set))
        warn_if_task_code_changed(out, task)
    check_prompts_per_step(config, len(train_set))
    note = format_bonus_warning(task, config.format_bonus)
    if note is not None:
        warnings.warn(note, stacklevel=4)
    return train_set


def _demote_final(out: Path, max_steps: int, resume_from: Path | None) -> Path | None:
    """Renames a `final` checkpoint before max_steps as the numbered one of its step (rundir.demote_final), also one
    resume_checkpoint passed over (inside a generation round), which would otherwise stand as the run's final
    weights until the new last step; returns resume_from, renamed where it was that checkpoint."""
    for step, folder in list_checkpoints(out):
        if folder.name == "final" and step < max_steps:
            moved = rundir.demote_final(folder, step)
            resume_from = moved if resume_from == folder else resume_from
    return resume_from


def _continue_step(trainer: EsftGRPOTrainer) -> int:
    """The step `--resume` continues from: resume_checkpoint's choice (with num_iterations > 1, the start of the
    generation round a newer checkpoint lies in), its warnings left to the resume itself."""
    args = trainer.args
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return resume_checkpoint(trainer.run_dir, args.num_iterations, args.max_steps, bool(args.save_only_model))[0]


#: the start of transformers' notice on resume that the arguments differ from a checkpoint's trainer_state.json
_RESUME_ARGS_NOTICE = "Warning: The following arguments do not match the ones in the `trainer_state.json`"


class _DropResumeArgsNotice(logging.Filter):
    """Drops the notice only where save_steps is all it names; any other mismatch (a batch size) still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        head, *lines = str(record.msg).split("\n\t")
        return not (head.startswith(_RESUME_ARGS_NOTICE) and lines
                    and all(line.startswith("save_steps:") for line in lines))


def _evaluate_final(out: Path, config: GRPOConfig, task: Any, checkpoint: Path, tokenizer: Any, device: str,
                    progress: bool) -> None:
    """The last step's held-out evaluation where an interrupt cut it short: its checkpoint (`final`) was saved once
    the step's train record was written (esft.grpo.interrupt), so a resume has no step left to train and evaluates
    the saved weights, in fp32 as the trainer's model."""
    from esft.models import load_model
    from esft.tracking import open_tracker

    evaluated = {r.get("step") for r in read_jsonl(out / "metrics.jsonl") if r.get("kind") == "eval"}
    if not (config.eval_every and config.eval_limit) or config.max_steps in evaluated:
        return
    model, saved_tokenizer = load_model(str(checkpoint), dtype="float32", device=device)
    # no trainer, so no TRL integrations: the run's trackers opened as an ES run opens them (the folder's wandb and
    # trackio runs), so that the evaluation reaches them as every other one did
    tracker = open_tracker(config.report_to, out, config.tracking_name(), config.to_dict())
    step, ended = config.max_steps, False
    try:
        _evaluator(out, config, task, tokenizer or saved_tokenizer, evaluated, progress,
                   lambda rec: tracker.log(rec, step, prefix="eval"),
                   lambda name, rows: tracker.log_table(name, rows[:config.samples_per_iteration], step)
                   ).evaluate(model, step)
        ended = True
    finally:
        tracker.close(failed=not ended)


def _evaluator(out: Path, config: GRPOConfig, task: Any, tokenizer: Any, evaluated: set[int], progress: bool,
               report: Any = None, table: Any = None) -> Any:
    """The run's held-out EvalCallback (esft.grpo.callbacks): its test examples, cadence and generation budget."""
    from esft.evaluation import load_examples
    from esft.grpo.callbacks import EvalCallback

    return EvalCallback(out, task, tokenizer, load_examples(task, "test", config.eval_limit, config.eval_balanced),
                        config.eval_every, config.eval_max_new_tokens or config.max_completion_length, evaluated,
                        progress, report, table)


@contextlib.contextmanager
def _without_resume_args_notice() -> Iterator[None]:
    """transformers' notice that a resume's save_steps differs from the checkpoint's off inside: esft checks a
    resume's changes itself before the trainer is built (resumable_changes), and the differences it lets through
    are intended: a new --save-steps, or a larger max_steps, which is the save interval of a run with save_steps
    0, a value the user never set (`save_steps: 3 (from args) != 2`)."""
    logger = logging.getLogger("transformers.trainer_utils")
    notice = _DropResumeArgsNotice()
    logger.addFilter(notice)
    try:
        yield
    finally:
        logger.removeFilter(notice)


def _train_or_save(trainer: EsftGRPOTrainer, resume_from: Path | None, runlog: Any, config: GRPOConfig) -> None:
    """trainer.train; on Ctrl-C or SIGTERM, first the checkpoint of the last finished step (esft.grpo.interrupt),
    so that a resume continues from there instead of from the last scheduled checkpoint. The run log's progress
    bar is closed whatever ends the training, before any message about it is printed."""
    from esft.grpo.callbacks import close_tensorboard, open_wandb_run
    from esft.tracking import finish_wandb

    boundary = StepBoundary()
    trainer.add_callback(boundary)  # last: a step's update begins after every other callback's pre-update hook
    # its step-end mark right after the run log, which writes the step's train record, and before the step's
    # evaluation: an interrupt during the evaluation keeps the step (the resume evaluates it first: EvalCallback)
    callbacks = trainer.callback_handler.callbacks
    callbacks.insert(callbacks.index(runlog) + 1, boundary.recorded())
    wandb_run, ended = None, False
    try:
        wandb_run = open_wandb_run(trainer, Path(trainer.run_dir), config.tracking_name(), config.to_dict())
        # the step bar only, not one per checkpoint; no notice of the resume's intended argument changes
        with warnings.catch_warnings(), without_transformers_bars(), _without_resume_args_notice():
            # TRL's own code still calls transformers' deprecated `model.is_gradient_checkpointing`,
            # `gradient_checkpointing_enable/disable` (FutureWarnings a user can do nothing about); esft passes the
            # new option name itself (grpo_config.checkpointing_argument)
            warnings.filterwarnings("ignore", message=r"`(is_)?gradient_checkpointing\w*` is deprecated",
                                    category=FutureWarning)
            trainer.train(resume_from_checkpoint=str(resume_from) if resume_from is not None else None)
        ended = True
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        raise OSError(exc.errno, f"{exc.strerror}{where} at step {trainer.state.global_step}: free disk space, then "
                      f"continue from step {_continue_step(trainer)} with `esft train grpo --resume --output-dir "
                      f"{trainer.run_dir}`") from None
    except KeyboardInterrupt:
        pending, saved, again = boundary.unsaved_step(trainer.state), None, False
        try:
            with without_transformers_bars():  # the interrupt's one line, not a "Writing model shards" bar under it
                saved = trainer.save_finished_step(boundary)
        except KeyboardInterrupt:  # a second Ctrl-C: save_finished_step removed the half-written checkpoint
            again = True
        done = list_checkpoints(trainer.run_dir)
        # the steps whose records are written (the trainer's own count already includes an update in progress);
        # before the first step began (a resume that loads its checkpoint), those the resume would continue from
        cont = _continue_step(trainer)
        finished = boundary.finished if boundary.finished is not None else cont
        # the message is the one line the command line prints (esft.cli); a script sees it in the exception
        raise RunInterrupted(interrupted_message(finished, trainer.args.max_steps, saved, pending, again,
                                                 trainer.args.num_iterations, done[-1][0] if done else None, cont,
                                                 trainer.run_dir)) from None
    except ValueError as exc:  # a reward or task that raises on new text; run-time errors keep their own class
        if not list_checkpoints(trainer.run_dir):  # no checkpoint: nothing to go on from
            raise
        raise RunFailed(f"{exc} (at step {trainer.state.global_step}; once the cause is fixed, continue from step "
                        f"{_continue_step(trainer)} with `esft train grpo --resume --output-dir "
                        f"{trainer.run_dir}`)") from exc
    finally:
        runlog.close_bar()
        try:
            close_tensorboard(trainer)
        finally:
            if wandb_run is not None:
                finish_wandb(wandb_run, failed=not ended)
