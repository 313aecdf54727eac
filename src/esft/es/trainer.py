"""The ES training loop (thin orchestration of strategy, noise, executor and run log).

Per iteration t:  batch = sample(seed, t);  members = ES.ask(t);  rewards = executor.evaluate_members(...)
(perturb -> greedy generate -> score per member, restore at the end);  fitness = rule(rewards);  update = ES.tell(...);
masters += update;  write samples/, append metrics.jsonl, then seeds.jsonl (fsynced: from here on the iteration
survives a crash; resume drops a metrics record whose seed-log line is missing, so the three are there or absent
together);  evaluation and checkpoint when due. A non-finite fitness, update or update norm stops the run before
anything of that iteration is logged or saved (`NonFiniteError`): the last checkpoint and the seed log stay the last
good state.

Resume rebuilds the state from the latest intact checkpoint (a damaged one is skipped for the one before it, or
the base model) plus the seed-log lines after it (replay is exact), so an interruption loses at most the iteration
in flight, and the resumed run ends bit-identical to an uninterrupted one; an evaluation or checkpoint that was
due when the run stopped is done on resume. One trainer per run directory (esft.rundir.RunLock). esft maximises
reward.

The executor is injected (`executor`, or `executor_factory` called with the trainer's model, weights, strategy
and optimizer); without either, `executor: local` gets the local executor of esft.es.build. Distributed
executors (`executor: ray`) are built by esft.es.distributed, which `esft.api.train_es` passes as the factory.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from esft.es import es_rundir
from esft.es.build import (check_executor_options, check_layout, check_lowrank_memory, check_selection,
                           fitness_rule as config_fitness_rule, generation_config, make_local_executor,
                           make_strategy, make_weights, rollout_precision, sample_batch, warn_unread_rank,
                           warn_unread_ray_options)
from esft.es.es_config import ESConfig, read_run_config, save_yaml
from esft.es.executor import Executor, PopulationResult
from esft.es.finished import check_resumable, eval_due
from esft.es.fitness import FitnessRule, as_fitness_rule, train_examples
from esft.evaluation import load_examples
from esft.tasks.base import checks_format, format_bonus_warning
from esft.tasks.custom import as_task
from esft.tasks.task_code import task_code, warn_if_task_code_changed
from esft.sample_rows import sample_row
from esft.saved_config import with_earlier_segments
from esft.rundir import (DISK_FULL, NonFiniteError, RunFailed, RunInterrupted, TrainResult, check_new_run,
                         check_output_dir, check_same_train_set, demote_final, examples_digest, finished_line,
                         held_out_fields, held_out_text, holds_run, occupied_error, peak_rss_mb, prune_checkpoints,
                         resuming_line, say)
from esft.run_undo import locked_run_folder
from esft.tracking import Tracker, check_backends, open_tracker
from esft.version import __version__

ExecutorFactory = Callable[..., Executor]
"""`factory(config, *, model, tokenizer, weights, task, gen_config, generate_fn, optimizer, strategy) -> Executor`
(esft.es.distributed.make_executor)"""


def _summary(values: np.ndarray) -> dict[str, float]:
    return {"mean": float(values.mean()), "std": float(values.std()), "min": float(values.min()),
            "max": float(values.max())}


def _check_finite(what: str, values: Any, iteration: int) -> None:
    values = np.asarray(values, dtype=np.float64)
    if not np.isfinite(values).all():
        raise NonFiniteError(f"iteration {iteration}: non-finite {what} {values.tolist()[:8]}; the run stops before "
                             f"this update is applied or logged (the last checkpoint and seeds.jsonl are intact)")


def _logged(steps: int) -> str:
    return f"{steps} iteration is logged" if steps == 1 else f"{steps} iterations are logged"


def _rollout_precision(config: ESConfig, injected: bool) -> Any:
    """The run's `RolloutPrecision`: "auto" on resume means the dtype the run directory recorded (fp32 for one
    made before the option existed), so a resumed run continues exactly as it started."""
    from esft.generation.precision import RolloutPrecision

    out = Path(config.output_dir)
    if injected:
        return RolloutPrecision("float32" if config.rollout_dtype == "auto" else config.rollout_dtype,
                                config.rollout_dtype, "the injected executor decides how members roll out")
    if config.resume and config.rollout_dtype == "auto" and (out / "config.yaml").exists():
        saved, _ = read_run_config(out)
        config = config.replace(rollout_dtype=saved.rollout_dtype)
    return rollout_precision(config)


class ESTrainer:
    """Holds the state of one run; `esft.api.train_es(config)` is the one-call entry point."""

    def __init__(self, config: ESConfig, *, model: Any = None, tokenizer: Any = None, task: Any = None,
                 executor: Executor | None = None, executor_factory: ExecutorFactory | None = None,
                 generate_fn: Any = None, fitness_rule: FitnessRule | Callable[..., Any] | None = None,
                 progress: bool = True):
        self.config = config
        check_backends(config.report_to)  # a missing tracker package fails before the model loads
        check_output_dir(config.output_dir)  # the output folder and the task before the model loads
        check_new_run(config.output_dir, "es", config.resume)
        if config.resume:
            es_rundir.check_not_shortened(config.output_dir, config.iterations)
            # a damaged metrics.jsonl (a line that does not parse, records after it) is refused here, not once the
            # model has loaded and the resume rewrites the log
            es_rundir.read_jsonl(Path(config.output_dir) / "metrics.jsonl")
        check_executor_options(config)  # a Ray run's unknown option keys, too
        warn_unread_ray_options(config)  # and a local run's Ray options
        warn_unread_rank(config)
        if task is None:
            from esft.tasks import get_task

            task = get_task(config.task, **config.task_kwargs())
            config.check_task_fit(task)  # as `esft train` checks it: a script's task string reaches here unchecked
        # an object that is not an esft Task as get_task builds it, so a resume from config.yaml prompts alike
        task = as_task(task)
        note = format_bonus_warning(task, config.format_bonus)
        if note is not None:
            warnings.warn(note, stacklevel=2)
        train_set = train_examples(task)  # an empty split before the model loads
        if config.resume:  # other train examples than the run's: refused before the model loads
            check_same_train_set(config.output_dir, examples_digest(train_set))
            warn_if_task_code_changed(config.output_dir, task)
            es_rundir.warn_if_noise_kernels_changed(Path(config.output_dir))
        # a bare fitness function becomes a stateless rule; stateful rules (DART-ES, esft.es.dart) keep per-train-
        # problem state and draw their own batches (FitnessRule hooks); made before the model loads (balanced: labels)
        self.rule = as_fitness_rule(config_fitness_rule(config, task) if fitness_rule is None else fitness_rule)
        if model is None:
            from esft.models import load_model

            check_selection(config)  # parameter names that select nothing fail before the weights load
            check_lowrank_memory(config)  # and a rank whose factors cannot fit in memory
            model, tokenizer = load_model(config.model, dtype=config.dtype, device=config.device)
        self.model, self.tokenizer, self.task = model, tokenizer, task
        self.model.eval()
        for p in self.model.parameters():  # ES needs no autograd; this also keeps generate() graph-free
            p.requires_grad_(False)
        # the rollout dtype is resolved once, before the masters exist (bf16 rollouts let them share the model's
        # storage), and the resolved one is what config.yaml records and a resume compares
        self.precision = _rollout_precision(config, injected=executor is not None)
        if self.precision.warning is not None:
            warnings.warn(self.precision.warning, stacklevel=2)
        config = self.config = config.replace(rollout_dtype=self.precision.dtype)
        self.weights = make_weights(model, config)
        self.strategy = make_strategy(config)
        self.optimizer = self.strategy.make_optimizer(list(self.weights.master.values()))
        self._owns_executor = executor is None  # an executor made here (e.g. Ray workers) is closed here
        if executor is None:
            executor = self._make_executor(executor_factory, generate_fn)
        if not isinstance(executor, Executor):
            raise TypeError(f"executor {type(executor).__name__} is not an esft.es.executor.Executor")
        self.executor = executor
        self.progress = progress
        self.out = Path(config.output_dir)
        self.train_set = train_set
        self.rule.bind(len(self.train_set), config.seed)
        self.sample_batch = self.rule.sample_batch
        self._test_set: list | None = None
        self.step = 0
        self.last_eval: dict[str, Any] | None = None
        self._evaluated: set[int] = set()
        self._damaged_checkpoints: set[int] = set()  # steps whose checkpoint folder failed to load on resume
        self._finished: Path | None = None  # the final checkpoint of a resumed run that has nothing left to do
        self.tracker = Tracker()  # opened by train() (esft.tracking; none by default)

    def _make_executor(self, factory: ExecutorFactory | None, generate_fn: Any) -> Executor:
        parts = dict(model=self.model, tokenizer=self.tokenizer, weights=self.weights, task=self.task,
                     gen_config=generation_config(self.config), generate_fn=generate_fn)
        if factory is not None:
            return factory(self.config, optimizer=self.optimizer, strategy=self.strategy, **parts)
        check_layout(self.config)
        if self.config.executor != "local":
            raise ValueError(f"executor {self.config.executor!r} runs members on workers that esft.es.distributed "
                             "builds: train with esft.api.train_es (esft.train_es), or pass "
                             "executor_factory=esft.es.distributed.make_executor or an executor")
        return make_local_executor(self.config, strategy=self.strategy, **parts)

    # ---- run directory ----------------------------------------------------------------------------------------
    @property
    def test_set(self) -> list:
        if self._test_set is None:
            self._test_set = (load_examples(self.task, "test", self.config.eval_limit, self.config.eval_balanced)
                              if self.config.eval_limit else [])
        return self._test_set

    def run_info(self) -> dict[str, Any]:
        device = str(next(iter(self.weights.params.values())).device)
        return {"algorithm": "es", "num_params": self.weights.num_params, "num_tensors": len(self.weights.params),
                "param_dtypes": self.weights.dtypes, "master_dtype": "float32", "update_accumulation": "float32",
                "device": device, "torch": str(torch.__version__), "numpy": str(np.__version__), "esft": __version__,
                "python": platform.python_version(), "machine": platform.machine(),
                # the noise is drawn by torch's vectorised kernels: the same bits on AVX2 and AVX-512, not on "DEFAULT"
                "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                "torch_threads": torch.get_num_threads(), **self._layout(),
                # decides how fast the CPU rollouts run (docs/performance.md, "threads"); chosen at start-up
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "OpenMP default"),
                "train_examples": len(self.train_set), "train_sha256": examples_digest(self.train_set),
                "task_code": task_code(self.task),
                **self.precision.record()}

    def _layout(self) -> dict[str, Any]:
        """The executor of this segment (a resume may change it); a Ray segment's members ran on its workers' torch
        threads (0: torch's default), which decide their bits as `torch_threads` does on the local executor."""
        spec = getattr(self.executor, "spec", None)
        workers = {"num_workers": self.config.num_workers, "worker_threads": spec.threads} if spec is not None else {}
        return {"executor": self.config.executor, **workers}

    def _prepare_dir(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "samples").mkdir(exist_ok=True)
        occupied = holds_run(self.out)  # a GRPO run's too: its metrics and checkpoints are never wiped
        if self.config.resume and (occupied or (self.out / "config.yaml").exists()):
            check_resumable(self.out, self.config)  # a missing, empty or unreadable config.yaml refuses here
            self._resume()
        elif occupied:
            # never mix two runs in one directory: a later resume would pick up the other run's state
            raise occupied_error(self.out, "es")
        else:
            for name in ("seeds.jsonl", "metrics.jsonl"):
                (self.out / name).unlink(missing_ok=True)
        if self._finished is None:  # a finished run keeps the record of the settings and machine it ran with
            save_yaml(self.config.replace(resume=False), self.out / "config.yaml",
                      extra=with_earlier_segments(self.out / "config.yaml", self.run_info())
                      if self.config.resume else self.run_info())

    def _resume(self) -> None:
        """Latest checkpoint not past the seed log, then exact replay of the logged iterations after it."""
        records = es_rundir.read_seed_log(self.out)
        es_rundir.check_noise_stream(records, self.config.noise_stream, self.out)
        start, folder = self._load_latest_intact(len(records))
        if folder is not None and folder.name == "final" and start < self.config.iterations:
            # an extended run: its last checkpoint is no longer final; keep it under its step, as a run started
            # with more iterations would (the new final replaces nothing)
            folder = demote_final(folder, start)
        rule_state = None
        if folder is not None:
            rule_state = json.loads((folder / es_rundir.STATE_FILE).read_text()).get("fitness_rule_state")
        stateful = self.rule.stateful
        if stateful and start and rule_state is None:
            raise ValueError(f"checkpoint {folder} holds no state of fitness rule {self.config.fitness_rule!r}")
        if stateful and rule_state is not None:
            self.rule.load_state_dict(rule_state)
        for rec in records[start:]:
            self.weights.apply(es_rundir.update_from_record(rec), self.optimizer)
            if stateful:  # the rule's state is a function of the logged history: replay it too
                self.rule.replay(rec)
        self.step = len(records)
        # drop log lines past the resume point (a torn line, or metrics of an iteration that was not logged)
        es_rundir.rewrite_jsonl(self.out / "seeds.jsonl", records)
        kept = es_rundir.filter_jsonl(self.out / "metrics.jsonl", lambda r: r.get("step", 0) <= self.step)
        self._evaluated = {r["step"] for r in kept if r.get("kind") == "eval"}
        pending_eval = self._eval_due(self.step) and self.step not in self._evaluated
        if folder is not None and folder.name == "final" and start == self.step >= self.config.iterations \
                and not pending_eval:
            self._finished = folder  # its updates, evaluations and final checkpoint are all there
        elif self.progress:
            replayed = self.step - start
            source = f"checkpoint {folder.name}" if folder is not None else "the base model"
            if replayed:
                source += f", then {replayed} logged update{'' if replayed == 1 else 's'} replayed"
            say(resuming_line(self.out, "iteration", self.step, self.config.iterations, source))

    def _load_latest_intact(self, logged: int) -> tuple[int, Path | None]:
        """(step, folder) of the newest checkpoint not past the seed log that loads; a damaged one (a file missing
        or unreadable) is reported and skipped. (0, None): none loads, replay starts from the base model."""
        usable = [(s, f) for s, f in es_rundir.list_checkpoints(self.out) if s <= logged]
        for step, folder in reversed(usable):
            try:
                return es_rundir.load_checkpoint(folder, self.model, self.weights, self.optimizer), folder
            except es_rundir.CheckpointDamaged as exc:
                self._damaged_checkpoints.add(step)  # rewritten when due again (the resume step's is due now)
                print(f"esft: warning: {exc}; resuming from the checkpoint before it and the seed log",
                      file=sys.stderr)
        return 0, None

    # ---- evaluation ---------------------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, Any]:
        """Unperturbed model: reward on the train batch of iteration `step`, accuracy on the held-out split."""
        t0 = time.perf_counter()
        idx = sample_batch(self.config.seed, self.step, len(self.train_set), self.config.batch_size)
        train = self.executor.evaluate_center([self.train_set[i] for i in idx])
        rewards = self.rule.rewards(train)
        rec: dict[str, Any] = {"kind": "eval", "step": self.step, "train_reward": float(rewards.mean()),
                               "train_accuracy": float(train.scores.mean()),
                               "train_format_rate": self._format_rate(train.well_formed)}
        table: list[dict[str, Any]] = []  # the sample rows the trackers get
        if self.test_set:
            test = self.executor.evaluate_center(self.test_set)
            rows = []
            for j, ex in enumerate(self.test_set):
                try:
                    details = self.task.details(test.texts[0][j], ex)
                except Exception:  # details are diagnostics only
                    details = {}
                # the example too, as `esft eval` and GRPO's rows hold it: its gold answer beside the completion
                formed = self._formed(test.well_formed[0, j])
                rows.append(sample_row({"index": j}, **test.cell(0, j, prompt=True), well_formed=formed,
                                       details=details, example=ex))
            # what a prior alone scores on the same examples, beside the accuracy (esft.tasks.labels)
            baseline = self.task.constant_baseline([{"example": ex} for ex in self.test_set])
            rec.update(held_out_fields(rows, test.tokens_generated, baseline))
            es_rundir.rewrite_jsonl(self.out / "samples" / f"eval_{self.step:06d}.jsonl", rows)
            table = rows[: self.config.samples_per_iteration]
        rec["seconds"] = time.perf_counter() - t0
        rec["peak_rss_mb"] = peak_rss_mb()
        es_rundir.append_jsonl(self.out / "metrics.jsonl", rec)
        # to the trackers once the record is in metrics.jsonl: an evaluation a stop interrupts before that is
        # redone on resume, and logged then
        self.tracker.log(rec, self.step, prefix="eval")
        self.tracker.log_table("eval_samples", table, self.step)
        self.last_eval = rec
        return rec

    def _eval_due(self, step: int) -> bool:
        return eval_due(step, self.config.eval_every, self.config.iterations)

    def checkpoint(self, name: str | None = None) -> Path:
        folder = es_rundir.save_checkpoint(self.out, name or es_rundir.checkpoint_name(self.step), self.step,
                                           self.model, self.tokenizer, self.weights, self.optimizer,
                                           extra={"seed_log_lines": self.step, **self._rule_state()})
        prune_checkpoints(es_rundir.list_checkpoints(self.out), self.config.save_total_limit)
        return folder

    def _rule_state(self) -> dict[str, Any]:
        state = self.rule.state_dict()
        return {} if state is None else {"fitness_rule_state": state}

    # ---- one iteration --------------------------------------------------------------------------------------------
    def iteration(self) -> dict[str, Any]:
        cfg, it = self.config, self.step
        t_start = time.perf_counter()
        idx = self.sample_batch(cfg.seed, it, len(self.train_set), cfg.batch_size)
        batch = [self.train_set[i] for i in idx]
        members = self.strategy.ask(it)
        t_eval = time.perf_counter()
        result: PopulationResult = self.executor.evaluate_members(members, batch)
        t_eval = time.perf_counter() - t_eval
        fitness = np.asarray(self.rule(result, batch), dtype=np.float64)
        _check_finite("fitness", fitness, it)
        shaped = self.strategy.shape(fitness)
        update = self.strategy.tell(members, fitness)
        _check_finite("update coefficients", [*update.coefficients, update.scale], it)
        self.executor.on_update(update, it + 1)  # remote replicas apply the same update (seeds, not weights)
        t0 = time.perf_counter()
        norm = self.weights.apply(update, self.optimizer)
        t_update = time.perf_counter() - t0
        _check_finite("update norm", [norm], it)
        # the iteration is committed once its seed-log line is on disk
        seed_line = es_rundir.seed_record(it, idx, members, fitness.tolist(), shaped.tolist(), update, norm,
                                          noise_stream=self.strategy.stream)
        rule_log = self.rule.log_record()  # what a stateful rule needs to replay this iteration on resume
        if rule_log is not None:
            seed_line["fitness_rule"] = rule_log
        # "evaluate": the wall time of the population's evaluation, whatever the executor (per-member timings are
        # summed over members, so with parallel lanes or Ray workers they can add up to more)
        timings = {**result.timings, "evaluate": t_eval, "update": t_update}
        timings["total"] = time.perf_counter() - t_start
        rec = {
            "kind": "train", "iteration": it, "step": it + 1,
            "fitness": _summary(fitness), "accuracy": float(np.asarray(result.scores).mean()),
            "format_rate": self._format_rate(result.well_formed),
            "update_norm": norm, "zero_update": update.is_zero,
            "time": timings, "tokens_generated": result.tokens_generated, "prompt_tokens": result.prompt_tokens,
            "finished_rate": result.finished / max(1, result.scores.size),
            "generated_tokens_per_s": result.tokens_generated / max(1e-9, t_eval),
            "peak_rss_mb": peak_rss_mb(),
        }
        rule_summary = self.rule.summary()
        if rule_summary is not None:
            rec["fitness_rule"] = rule_summary
        # samples, then metrics, then the seed-log line that commits the iteration: a crash before the commit
        # leaves files that resume drops or the redone iteration rewrites alike, never a committed iteration
        # without its metrics or samples
        k = min(cfg.samples_per_iteration, len(batch))
        rows = []
        if k and result.texts and result.texts[0]:
            rows = [sample_row({"iteration": it, "index": idx[j]}, **result.cell(0, j),
                               well_formed=self._formed(result.well_formed[0, j]))
                    | {"member": 0, "seed": members[0][0], "sign": members[0][1]} for j in range(k)]
            es_rundir.rewrite_jsonl(self.out / "samples" / f"iter_{it:06d}.jsonl", rows)
        es_rundir.append_jsonl(self.out / "metrics.jsonl", rec)
        es_rundir.append_jsonl(self.out / "seeds.jsonl", seed_line)
        self.step = it + 1
        self.tracker.log(rec, self.step, prefix="train")
        if rows:
            self.tracker.log_table("samples", rows, self.step)
        return rec

    # ---- the loop ----------------------------------------------------------------------------------------------------
    def train(self) -> TrainResult:
        from tqdm.auto import tqdm

        with locked_run_folder(self.out):  # a new run refused before it trains a step leaves no files behind
            return self._train_locked(tqdm)

    def _checkpoint_due(self, step: int) -> bool:
        every = self.config.checkpoint_every
        return bool(every) and step % every == 0 and 0 < step < self.config.iterations

    def _format_rate(self, well_formed: Any) -> float | None:
        """The share of well-formed completions; None for a task that checks no format (esft.tasks.base)."""
        return float(np.asarray(well_formed).mean()) if checks_format(self.task) else None

    def _formed(self, flag: Any) -> bool | None:
        return bool(flag) if checks_format(self.task) else None

    def _say_eval(self, ev: dict[str, Any], write: Callable[[str], None]) -> None:
        if "test_accuracy" in ev and self.progress:
            write(f"step {self.step}: {held_out_text(ev)}; train reward {ev['train_reward']:.3f}")

    def _train_locked(self, tqdm: Any) -> TrainResult:
        cfg = self.config
        self._prepare_dir()
        if self._finished is not None:  # a finished run resumed: nothing is evaluated or written
            if self._owns_executor:
                self.executor.close()  # Ray workers (and a Ray this run started) end here too
            prune_checkpoints(es_rundir.list_checkpoints(self.out), cfg.save_total_limit)  # a lowered limit
            if self.progress:
                print(finished_line(self.out, "iteration", self.step, "iterations", cfg.iterations))
            return TrainResult(self.out, self.step, self._finished, None)
        bar = tqdm(total=cfg.iterations, initial=min(self.step, cfg.iterations), desc="ES", unit="it",
                   disable=not self.progress, dynamic_ncols=True)
        ended = False  # the loop ran to its end (the trackers' runs are marked finished, else failed)
        try:  # from the first evaluation on, which is where Ray workers start: an error or Ctrl-C there ends them
            # in this block, so that a tracker that fails to open (wandb without an API key) ends the executor too
            self.tracker = open_tracker(cfg.report_to, self.out, cfg.tracking_name(), cfg.to_dict())
            # the evaluation and checkpoint of the current step may be missing (fresh run, or a stop during them)
            if cfg.eval_every and (self.step == 0 or self._eval_due(self.step)) and self.step not in self._evaluated:
                self._say_eval(self.evaluate(), bar.write)
            written = {s for s, _ in es_rundir.list_checkpoints(self.out)} - self._damaged_checkpoints
            if self._checkpoint_due(self.step) and self.step not in written:
                self.checkpoint()
            while self.step < cfg.iterations:
                rec = self.iteration()
                bar.update(1)
                fmt = {} if rec["format_rate"] is None else {"fmt": f"{rec['format_rate']:.2f}"}
                bar.set_postfix(fit=f"{rec['fitness']['mean']:.3f}", **fmt, s_it=f"{rec['time']['total']:.1f}")
                if self._eval_due(self.step):
                    self._say_eval(self.evaluate(), bar.write)
                if self._checkpoint_due(self.step):
                    self.checkpoint()
            ended = True
        except KeyboardInterrupt:
            if self.weights.perturbed is not None:
                self.weights.restore()
            # an interrupt between an iteration's seed-log line and `self.step = it + 1` leaves that iteration
            # committed (its update is applied): the message counts what the log holds, as a resume will
            self.step = max(self.step, len(es_rundir.read_seed_log(self.out)))
            raise self._interrupted() from None
        except OSError as exc:
            self._raise_if_disk_full(exc)
            raise
        except ValueError as exc:  # a reward or task that raises on new text; run-time errors keep their own class
            if self.step == 0:  # nothing trained: a refusal; a new run's folder is removed by locked_run_folder
                raise
            raise RunFailed(f"{exc} (after {_logged(self.step)} in {self.out}, which are kept; once the cause is "
                            f"fixed, continue with `esft train es --resume {self.out}`)") from exc
        finally:
            bar.close()
            if self._owns_executor:
                self.executor.close()
            self.tracker.close(failed=not ended)
        try:
            final = self.checkpoint("final")
        except KeyboardInterrupt:  # every iteration is logged: a resume writes the final checkpoint and stops
            raise self._interrupted() from None
        except OSError as exc:
            self._raise_if_disk_full(exc)
            raise
        return TrainResult(self.out, self.step, final, self.last_eval)

    def _interrupted(self) -> RunInterrupted:
        # the message is the one line the command line prints (esft.cli); a script sees it in the exception
        return RunInterrupted(f"interrupted: {_logged(self.step)} in {self.out}; continue with "
                              f"`esft train es --resume {self.out}`")

    def _raise_if_disk_full(self, exc: OSError) -> None:
        """A full disk (or quota) while the run writes: the error says where, what is kept and how to go on
        (a failed checkpoint is removed whole, a torn last log line is dropped on resume)."""
        if exc.errno in DISK_FULL:
            where = f" writing {exc.filename}" if exc.filename else ""
            message = (f"{exc.strerror}{where}: {_logged(self.step)} in {self.out}; free disk space, "
                       f"then continue with `esft train es --resume {self.out}`")
            raise OSError(exc.errno, message) from None


__all__ = ["ESTrainer", "ExecutorFactory"]
