"""Run-log callbacks of a GRPO run: `metrics.jsonl` train / eval records, `samples/`, a one-line progress bar.

A train record (one per optimizer step) has the ES trainer's keys where they mean the same thing (`kind`, `step`,
`iteration`, `accuracy`, `format_rate`, `tokens_generated`, `prompt_tokens`, `finished_rate`,
`generated_tokens_per_s`, `time`, `peak_rss_mb`), `reward` where ES has `fitness` (same summary keys), the
measured accounting of `esft.grpo.ledger` with running `totals`, and GRPO's own: `kl`, `clip_ratio`, `entropy`,
`loss`, `grad_norm`, `learning_rate`, `frac_reward_zero_std`, `drift_total`; everything TRL logged is kept under
`trl`. Eval records have ES's keys (esft.rundir.EVAL_KEYS: `test_accuracy`, `test_ci95`, `test_format_rate`, ...).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from transformers import TrainerCallback

from esft.grpo.ledger import StepLedger, add_totals
from esft.rundir import (NonFiniteError, append_jsonl, held_out_fields, held_out_text, peak_rss_mb,
                         rewrite_jsonl)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def check_finite_logs(logs: dict[str, Any], step: int) -> None:
    """A NaN or infinite loss or gradient norm stops the run here: transformers logs a step before it saves it,
    so the weights of that step are never written and the last checkpoint stays the last good one."""
    bad = {k: logs[k] for k in ("loss", "grad_norm") if isinstance(logs.get(k), (int, float))
           and not math.isfinite(logs[k])}
    if bad:
        raise NonFiniteError(f"step {step}: non-finite {bad}; GRPO stops before this step is saved (the last "
                             f"checkpoint is intact; lower learning_rate or check the rewards)")


#: train record keys no tracker gets: labels of the record and copies of TRL's logs (`clip_ratio` is its
#: `clip_ratio/region_mean`), which reach the trackers themselves
_NOT_REPORTED = {"kind", "step", "iteration", "trl", "clip_ratio"}


class RunLogCallback(TrainerCallback):
    """Writes one `kind: train` record per optimizer step from TRL's logs plus the trainer's ledger."""

    def __init__(self, run_dir: Path, trainer: Any, drift: Any = None, totals: dict[str, int] | None = None,
                 progress: bool = True, report: Callable[[dict[str, Any]], None] | None = None,
                 table: Callable[[str, list[dict[str, Any]]], None] | None = None):
        self.out = Path(run_dir)
        self.report = report  # the record to the run's trackers (report_to), under ES's `train/` names
        self.table = table  # the step's sample completions to TensorBoard, as ES's `samples` table
        self.trainer = trainer
        self.drift = drift
        self.totals = dict(totals or {})
        self.progress = progress
        self.bar = None
        self._t_begin: float | None = None
        self._t_end: float | None = None
        self.last: dict[str, Any] | None = None
        self.setup_rss: float | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any):
        self.setup_rss = peak_rss_mb()  # model, KL reference / theta_0 copy, optimizer not yet allocated
        if self.progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc="GRPO", unit="step",
                            dynamic_ncols=True)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any):
        self._t_begin = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any):
        self._t_end = time.perf_counter()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any):
        logs = dict(logs or {})
        if "train_runtime" in logs or "loss" not in logs and "reward" not in logs:
            return  # the end-of-training summary, not a step
        check_finite_logs(logs, int(state.global_step))
        ledger: StepLedger = self.trainer.ledger
        self.trainer.ledger = StepLedger()
        step = int(state.global_step)
        total = (self._t_end or time.perf_counter()) - (self._t_begin or time.perf_counter())
        timings = dict(ledger.time)
        if self.drift is not None:
            timings["drift"] = self.drift.last_seconds
        timings["train"] = max(0.0, total - sum(timings.values()))
        timings["total"] = total
        self.totals = add_totals(self.totals, ledger)
        rec: dict[str, Any] = {"kind": "train", "iteration": step - 1, "step": step, **ledger.record()}
        rec.update({
            "generated_tokens_per_s": ledger.tokens_generated / max(1e-9, timings.get("generate", 0.0)),
            "kl": logs.get("kl"), "clip_ratio": logs.get("clip_ratio/region_mean"), "entropy": logs.get("entropy"),
            "loss": logs.get("loss"), "grad_norm": logs.get("grad_norm"), "learning_rate": logs.get("learning_rate"),
            "frac_reward_zero_std": logs.get("frac_reward_zero_std"),
            "drift_total": _last_drift(self.drift, step),
            "time": timings, "peak_rss_mb": peak_rss_mb(),
            "peak_rss_mb_after": {"setup": self.setup_rss, **ledger.peak_rss_mb, "step": peak_rss_mb()},
            "totals": self.totals,
            "trl": {k: _finite(v) for k, v in logs.items() if isinstance(v, (int, float)) or v is None},
        })
        rec = {k: _finite(v) for k, v in rec.items()}
        append_jsonl(self.out / "metrics.jsonl", rec)
        if self.report is not None:
            # what TRL's logs lack, under the names ES logs (`train/accuracy`, `train/format_rate`,
            # `train/tokens_generated`, `train/time/total`, ...); TRL's own keys reached the trackers already
            self.report({k: v for k, v in rec.items() if k not in logs and k not in _NOT_REPORTED})
        if ledger.samples:
            rewrite_jsonl(self.out / "samples" / f"iter_{step - 1:06d}.jsonl", ledger.samples)
            if self.table is not None:
                self.table("samples", ledger.samples)
        self.last = rec
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            reward = rec.get("reward", {}).get("mean", float("nan"))
            fmt = {"fmt": f"{rec['format_rate']:.2f}"} if "format_rate" in rec else {}
            self.bar.set_postfix(reward=f"{reward:.3f}", **fmt, s_step=f"{total:.0f}")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any):
        self.close_bar()

    def close_bar(self) -> None:
        """At the end of training, and when a Ctrl-C or an error stops it: an open bar is redrawn when it is
        collected, under the message the command line prints."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def tracker_callbacks(trainer: Any) -> list[Any]:
    """The trainer's tracker callbacks: the transformers integrations TRL adds for `report_to`."""
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    kinds = tuple(INTEGRATION_TO_CALLBACK.values())
    return [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, kinds)]


def point_tensorboard(trainer: Any, folder: Path, resume_step: int | None = None) -> None:
    """TensorBoard event files in `folder` (`<run>/tensorboard`, where ES writes them) instead of transformers'
    dated `<run>/runs/<time>_<host>`: one place per run, whichever the algorithm. A resume from `resume_step`
    redoes the steps after it, which a crash may have logged already: TensorBoard hides the earlier files' events
    from `resume_step + 1` on (`purge_step`), so that each step shows once, as in metrics.jsonl."""
    from transformers.integrations import TensorBoardCallback

    for cb in tracker_callbacks(trainer):
        if isinstance(cb, TensorBoardCallback) and cb.tb_writer is None:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            cb.tb_writer = SummaryWriter(log_dir=str(folder), purge_step=purge)


def open_wandb_run(trainer: Any, folder: Path, name: str, config: Mapping[str, Any] | None = None) -> Any:
    """The run folder's wandb run (esft.tracking.open_wandb, as an ES run opens it) where `report_to` names wandb,
    opened before transformers' WandbCallback opens its own (project "huggingface", files in `./wandb`, a new run
    on every resume): the callback logs to the run it finds open. None without wandb, and where the caller has a
    run open already (a notebook's own): the callback logs to that one, which stays the caller's to finish. `name`:
    the run's (run_name or the folder's), not TRL's run_name, which point_trackio may have made trackio's. `config`:
    the run's esft config, the wandb config an ES run has (task, precision...); transformers adds TRL's arguments
    and the model's config to it."""
    from transformers.integrations import WandbCallback

    from esft.tracking import open_wandb

    if not any(isinstance(cb, WandbCallback) for cb in tracker_callbacks(trainer)):
        return None
    import wandb

    return open_wandb(folder, name, config) if wandb.run is None else None


def point_trackio(args: Any, folder: Path, given: Mapping[str, Any]) -> None:
    """Where `report_to` names trackio, TRL's arguments name the project and run as an ES run's (TRACKIO_PROJECT,
    the name the folder keeps, made from the run's name) instead of transformers' (project "huggingface", a new run
    on every resume): transformers' callback opens the run with resume="allow", so a resume logs on in it. A
    `project` given in trl_args (`given`) is left as it is."""
    from esft.tracking import trackio_project, trackio_remote, trackio_run_name

    if "trackio" not in (args.report_to or []):
        return
    if "project" not in given:
        args.project = trackio_project()
    remote = trackio_remote() or bool(args.trackio_space_id)
    args.run_name = trackio_run_name(folder, args.run_name or folder.name, args.project, remote)


class TrackioConfig(TrainerCallback):
    """Adds the run's esft config (task, precision, eval settings...) to its trackio run, as an ES run's trackio
    config holds it: transformers' TrackioCallback records only TRL's arguments and the model's config. Added after
    that callback, whose on_train_begin opens the run; TRL's value stays where both name a key (as in wandb)."""

    def __init__(self, config: Mapping[str, Any]):
        self.config = dict(config)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any):
        import trackio

        if state.is_world_process_zero and trackio.context_vars.current_run.get() is not None:
            for key, value in self.config.items():
                trackio.config.setdefault(key, value)


def point_trackers(trainer: Any, folder: Path, resume_step: int | None, given: Mapping[str, Any],
                   config: Mapping[str, Any] | None = None) -> None:
    """The trainer's trackers write where an ES run's do: TensorBoard in `<run>/tensorboard` (point_tensorboard),
    trackio in the folder's run (point_trackio; `given`: the run's trl_args), with the run's esft `config`."""
    point_tensorboard(trainer, folder / "tensorboard", resume_step)
    point_trackio(trainer.args, folder, given)
    if config is not None and "trackio" in (trainer.args.report_to or []):
        trainer.add_callback(TrackioConfig(config))


def close_tensorboard(trainer: Any) -> None:
    """Closes the trainer's TensorBoard writer, which transformers closes only when training ends: after an error
    or Ctrl-C as well, its queued events reach the file and the file and writer thread are let go."""
    from transformers.integrations import TensorBoardCallback

    for cb in tracker_callbacks(trainer):
        if isinstance(cb, TensorBoardCallback) and cb.tb_writer is not None:
            writer, cb.tb_writer = cb.tb_writer, None
            writer.close()


def tracker_report(trainer: Any, kind: str = "eval") -> Callable[[dict[str, Any]], None] | None:
    """A function sending a record of `kind` ("eval" or "train") to the trainer's trackers under `eval/` or
    `train/` (the names ES logs: `eval/test_accuracy`, `eval/test_ci95/low`, `train/accuracy`, ...), at the trainer's
    current step; None without trackers."""
    from esft.tracking import flatten

    callbacks = tracker_callbacks(trainer)
    if not callbacks:
        return None

    def report(record: dict[str, Any]) -> None:
        # transformers' integrations file a key `eval_X` under `eval/X`, and any other key X under `train/X`
        logs = {(f"eval_{k}" if kind == "eval" else k): v for k, v in flatten(record).items()}
        for cb in callbacks:
            cb.on_log(trainer.args, trainer.state, trainer.control, logs=logs)

    return report


def tracker_table(trainer: Any, limit: int) -> Callable[[str, list[dict[str, Any]]], None] | None:
    """A function writing up to `limit` sample rows as a Markdown table to the trainer's TensorBoard at its current
    step, under ES's names (`samples`, `eval_samples`); None without TensorBoard. transformers' integrations log
    scalars only, so wandb and trackio get no table from a GRPO run."""
    from transformers.integrations import TensorBoardCallback

    from esft.tracking import table_markdown

    boards = [cb for cb in tracker_callbacks(trainer) if isinstance(cb, TensorBoardCallback)]
    if not boards or limit <= 0:
        return None

    def table(name: str, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        text = table_markdown(rows[:limit])
        for cb in boards:
            if cb.tb_writer is not None:
                cb.tb_writer.add_text(name, text, int(trainer.state.global_step))
                cb.tb_writer.flush()

    return table


def _last_drift(drift: Any, step: int) -> float | None:
    if drift is None or drift.last is None or drift.last[0] != step:
        return None
    return drift.last[1]


class EvalCallback(TrainerCallback):
    """Greedy held-out evaluation (esft.evaluation, the same scorer and generation settings as `esft eval`) at step
    0, every `eval_every` steps and at the end; writes a `kind: eval` record and `samples/eval_XXXXXX.jsonl`. The
    model is the trainer's fp32 one, outside TRL's autocast: `esft eval --dtype fp32` on a checkpoint matches it."""

    def __init__(self, run_dir: Path, task: Any, tokenizer: Any, examples: list[dict[str, Any]], every: int,
                 max_new_tokens: int, evaluated: set[int] | None = None, progress: bool = True,
                 report: Callable[[dict[str, Any]], None] | None = None,
                 table: Callable[[str, list[dict[str, Any]]], None] | None = None):
        self.out, self.task, self.tokenizer, self.examples = Path(run_dir), task, tokenizer, examples
        self.table = table  # sample completions to TensorBoard, as ES's `eval_samples` table
        self.every, self.max_new_tokens = every, max_new_tokens
        self.evaluated = set(evaluated or ())
        self.progress = progress
        self.report = report  # the record to the run's trackers (report_to), as ES logs its evaluations
        self.last: dict[str, Any] | None = None

    def due(self, step: int, max_steps: int) -> bool:
        return bool(self.every) and bool(self.examples) and step not in self.evaluated and (
            step == 0 or step % self.every == 0 or step == max_steps)

    def evaluate(self, model: Any, step: int) -> dict[str, Any]:
        from esft.evaluation import evaluate_task
        from esft.generation import GenerationConfig

        t0 = time.perf_counter()
        was_training = model.training
        model.eval()
        rows: list[dict[str, Any]] = []
        try:
            summary = evaluate_task(model, self.tokenizer, self.task, self.examples,
                                    GenerationConfig(max_new_tokens=self.max_new_tokens, temperature=0.0),
                                    output_path=self.out / "samples" / f"eval_{step:06d}.jsonl", progress=False,
                                    records_out=rows)
        finally:
            model.train(was_training)
        # ES's record (esft.rundir.EVAL_KEYS): GRPO does not re-score a train batch with the current weights; its
        # train records hold the sampled batch's reward
        rec = {"kind": "eval", "step": step, "train_reward": None, "train_accuracy": None, "train_format_rate": None,
               **held_out_fields(rows, summary["completion_tokens"], summary),
               "seconds": time.perf_counter() - t0, "peak_rss_mb": peak_rss_mb()}
        append_jsonl(self.out / "metrics.jsonl", rec)
        if self.report is not None:
            self.report(rec)
        if self.table is not None:
            self.table("eval_samples", rows)
        self.evaluated.add(step)
        self.last = rec
        if self.progress:
            print(f"step {step}: {held_out_text(rec)}", flush=True)
        return rec

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any):
        # step 0's, or a resumed step's whose evaluation an interrupt cut short (esft.grpo.interrupt); a scheduled
        # checkpoint always follows its step's evaluation
        step = int(state.global_step)
        if self.due(step, state.max_steps):
            self.evaluate(model, step)

    def on_log(self, args: Any, state: Any, control: Any, model: Any = None, logs: Any = None, **kwargs: Any):
        if logs and "train_runtime" not in logs and self.due(int(state.global_step), state.max_steps):
            self.evaluate(model, int(state.global_step))
