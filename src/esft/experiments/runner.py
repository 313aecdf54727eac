"""`run_experiment(spec, output_dir)`: run every stage of a plan, robust to re-runs, kills and failures.

Per stage folder:
    status.json   {"status": done | failed | running | stopped | blocked, "trained": bool, "attempts", ...}
    error.txt     traceback of the last failure
    result.json   the stage's record for the tables: evaluation per task, measured accounting per step, configs
    eval/         one JSON (+ JSONL of completions) per evaluated task
    eval/steps/   with evaluation.checkpoints: eval/steps/<step>/<task>.json of each intermediate checkpoint

Re-running a spec skips stages whose status is done (and whose training options are unchanged: a changed option
fails before any compute, naming the stage and the fields), resumes an interrupted or failed stage through the
trainers' own `resume` (ES replays its seed log exactly; GRPO reloads its latest checkpoint), and re-evaluates
only tasks without a result. A failed stage records its error and the runner moves on; stages that need its
weights are marked blocked. Completed results are never deleted.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from esft.experiments.checkpoint_eval import checkpoints_current, evaluate_checkpoints
from esft.experiments.fingerprint import binding_steps, comparable, fingerprint_diff
from esft.experiments.invocation import Heartbeat, experiment_lock, timestamp
from esft.experiments.stage_eval import (evaluate_stage, plan_sampled_settings, plan_settings, read_json, same_model,
                                        write_json)
from esft.experiments.plan import BASE, Stage, Step, as_dict, build_plan, describe, has_noise_stream
from esft.experiments.spec import Spec
from esft.experiments.yamlines import SpecError
from esft.rundir import RunFailed, RunInterrupted, enclosing_run_dir, holds_run, is_run_dir
from esft.sigterm import sigterm_interrupts

STATUS = "status.json"
RESULT = "result.json"
ERROR = "error.txt"


@dataclass
class Hooks:
    """Seams for tests and unusual set-ups; the defaults use esft's own loaders and trainers."""

    load_model: Callable[[str, str, str | None], tuple[Any, Any]] | None = None
    """(name or checkpoint folder, dtype, device) -> (model, tokenizer), for evaluation"""
    train_kwargs: Callable[[Step, Any], dict[str, Any]] | None = None
    """(step, trainer config) -> extra keyword arguments of the trainer (model, tokenizer, generate_fn, ...)"""
    progress: bool = True
    collect_garbage: bool = True
    """free the previous stage's model (trainer objects hold reference cycles) before the next stage; a full
    collection costs ~1 s in a process that has imported TRL, which tests skip"""


@dataclass
class ExperimentResult:
    output_dir: Path
    statuses: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def failed(self) -> list[str]:
        return [k for k, s in self.statuses.items() if s in ("failed", "blocked")]

    @property
    def ok(self) -> bool:
        return not self.failed


def _default_load_model(ref: str, dtype: str, device: str | None) -> tuple[Any, Any]:
    from esft.models import load_model

    return load_model(ref, dtype=dtype, device=device)


# ---- fingerprints: what a stage was trained with ---------------------------------------------------------------

def _start_model(spec: Spec, stage: Stage, root: Path, stages: dict[str, Stage]) -> str:
    if stage.parent is None:
        return spec.model
    return str((root / stages[stage.parent].model_dir()).resolve())


def _step_configs(spec: Spec, stage: Stage, root: Path, stages: dict[str, Stage]) -> list[Any]:
    """The trainer config of each step (model = the previous step's or the parent stage's checkpoint; its trackers'
    run named after the experiment and the step's folder, where the spec names none: every stage's folder is `run`)."""
    configs = []
    model = _start_model(spec, stage, root, stages)
    for step in stage.steps:
        extra = {"noise_stream": step.noise_stream} if has_noise_stream(step.component) else {}
        if "run_name" not in step.component.overrides(stage.task):
            extra["run_name"] = f"{root.resolve().name}/{step.run_dir.removesuffix('/run')}"
        cfg = spec.config(step.component, stage.task, stage.seed, step.budget, model=model,
                          output_dir=str((root / step.run_dir).resolve()), resume=True, **extra)
        configs.append(cfg)
        model = str((root / step.model_dir()).resolve())
    return configs


def _carries_optimizer(spec: Spec, stage: Stage, stages: dict[str, Stage]) -> bool:
    """The stage's first step starts from its parent's AdamW moments (spec: sequential.carry_optimizer_state):
    a GRPO step after a stage whose weights a GRPO step left, with its optimizer.pt."""
    if not (spec.carry_optimizer_state and stage.parent is not None and stage.steps):
        return False
    parent = stages[stage.parent]
    return stage.steps[0].algorithm == "grpo" and bool(parent.steps) and parent.steps[-1].algorithm == "grpo"


def _fingerprint(spec: Spec, stage: Stage, configs: list[Any], stages: dict[str, Stage]) -> list[dict[str, Any]]:
    out = [{"algorithm": step.algorithm, "config": json.loads(json.dumps(dataclasses.asdict(cfg), default=str))}
           for step, cfg in zip(stage.steps, configs)]
    if _carries_optimizer(spec, stage, stages):
        # not a trainer field, but it changes what the stage trains; absent when off, as recorded before it counted
        out[0]["config"]["carry_optimizer_state"] = True
    return comparable(out)


def _trained_steps(stage: Stage, status: dict[str, Any], root: Path) -> list[bool]:
    """Which steps of `stage` trained something: all of a stage recorded as trained or done, else those whose run
    folder holds logged steps or checkpoints (esft.rundir.holds_run, as the trainers tell a run from none)."""
    if status.get("trained") or status.get("status") == "done":
        return [True] * len(stage.steps)
    return [holds_run(root / step.run_dir) for step in stage.steps]


def check_existing(spec: Spec, stages: list[Stage], root: Path) -> None:
    """Before any compute: a stage already trained in `root` must have been trained with today's options (a stage,
    or a step of a chain, that trained nothing is held to none: it runs with today's)."""
    smap = {s.key: s for s in stages}
    for stage in stages:
        if stage.kind == BASE:
            continue
        status = read_json(root / stage.key / STATUS) or {}
        old = status.get("fingerprint")
        trained = _trained_steps(stage, status, root)
        if not old or not any(trained):
            continue
        new = _fingerprint(spec, stage, _step_configs(spec, stage, root, smap), smap)
        old = comparable(old)
        for before, now in zip(old, new):  # the start weights, where the experiment folder has moved (same_model)
            model = before["config"].get("model")
            if isinstance(model, str) and same_model(model, str(now["config"].get("model")), root, True):
                before["config"]["model"] = now["config"].get("model")
        old, new = binding_steps(old, new, trained)
        if old != new:
            raise SpecError(f"{root / stage.key} was trained with other options ({fingerprint_diff(old, new)}); "
                            f"use another --output-dir, or delete that stage folder (and those after it) to retrain")
        parent = (read_json(root / stage.parent / STATUS) or {}) if stage.parent else {}
        if status.get("parent_trained_at") and parent.get("trained_at") != status["parent_trained_at"]:
            if not parent and (root / stage.parent / STATUS).exists():  # not "deleted or trained again": damaged
                raise SpecError(f"{root / stage.parent / STATUS} is unreadable, so whether {root / stage.key} was "
                                "trained from that stage's present weights cannot be told; restore the file (esft "
                                "writes it whole), or delete that stage folder (and those after it) to retrain")
            raise SpecError(f"{root / stage.key} was trained from the weights of {root / stage.parent}, which "
                            "was deleted or trained again since; delete that stage folder (and those after it) to "
                            "retrain it from the new weights")


# ---- steps ---------------------------------------------------------------------------------------------------------

def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # checkpoints are replaced by rename, never edited in place: a hard link is a snapshot
    except OSError:
        shutil.copy2(src, dst)


def snapshot_checkpoint(src: Path, dst: Path) -> None:
    tmp = dst.with_name(f".tmp_{dst.name}")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(src, tmp, copy_function=_link_or_copy)
    if dst.exists():
        shutil.rmtree(dst)
    os.replace(tmp, dst)


def _carry_optimizer_callback(previous: Path) -> Any:
    """GRPO stage k starts with stage k-1's AdamW moments (spec: sequential.carry_optimizer_state). Only the
    per-parameter state is loaded; learning rates stay those of the new stage's fresh schedule."""
    import torch
    from transformers import TrainerCallback

    class CarryOptimizerState(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any):
            if state.global_step != 0 or optimizer is None:
                return  # a resumed stage has its own optimizer state in its checkpoint
            saved = torch.load(previous / "optimizer.pt", weights_only=True)
            current = optimizer.state_dict()
            current["state"] = saved["state"]
            optimizer.load_state_dict(current)

    return CarryOptimizerState()


def _run_step(spec: Spec, stage: Stage, step: Step, config: Any, root: Path, stages: dict[str, Stage],
              hooks: Hooks, first: bool) -> None:
    algo = step.component.spec
    run_dir = root / step.run_dir
    model_dir = root / step.model_dir()
    done = algo.done_step(run_dir)
    if done is not None and done >= step.budget:
        if step.snapshot and not (model_dir / "config.json").exists():
            if done != step.budget:
                raise RuntimeError(f"{run_dir} is past {step.budget} steps and its snapshot {model_dir} is missing")
            snapshot_checkpoint(run_dir / "checkpoints" / "final", model_dir)
        elif not step.snapshot and done > step.budget:
            # the run served a larger budget the spec no longer lists: its final weights are not this budget's
            raise RuntimeError(f"{run_dir} has trained to {done} steps, past this stage's budget of {step.budget}, "
                               f"so {model_dir} holds other weights; list the larger budget again (the run keeps a "
                               f"snapshot at each listed budget) or use another --output-dir")
        return
    if not holds_run(run_dir):  # a fresh run: config.yaml of an attempt killed before its first step binds nothing
        config = config.replace(resume=False)
    kwargs: dict[str, Any] = dict(hooks.train_kwargs(step, config) if hooks.train_kwargs else {})
    kwargs.setdefault("progress", hooks.progress)
    if first and _carries_optimizer(spec, stage, stages):
        previous = root / stages[stage.parent].model_dir()
        if (previous / "optimizer.pt").exists():
            kwargs["callbacks"] = [*kwargs.get("callbacks", ()), _carry_optimizer_callback(previous)]
    algo.train(config, **kwargs)
    if step.snapshot:
        snapshot_checkpoint(run_dir / "checkpoints" / "final", model_dir)


# ---- stages ---------------------------------------------------------------------------------------------------------

def _stage_record(spec: Spec, stage: Stage, root: Path, configs: list[Any], evals: dict[str, Any],
                  seconds: dict[str, float]) -> dict[str, Any]:
    from esft.experiments.algorithms import run_info

    steps = []
    for step, cfg in zip(stage.steps, configs):
        algo = step.component.spec
        info = run_info(root / step.run_dir)
        steps.append({"algorithm": step.algorithm, "run_dir": step.run_dir, "budget": step.budget,
                      "model_dir": step.model_dir(), "num_params": info.get("num_params"),
                      "precision": info.get("precision") or info.get("master_dtype"),
                      "accounting": algo.accounting(root / step.run_dir, step.budget),
                      "formula": algo.formula(cfg, step.budget), "config": dataclasses.asdict(cfg),
                      **({"trained_by": step.owner} if step.owner else {})})
    return {**as_dict(stage), "model": stage.model_dir() or spec.model, "eval": evals, "steps": steps,
            "ifeval_metric": spec.ifeval_metric, "seconds": seconds, "finished": timestamp()}


def run_stage(spec: Spec, stage: Stage, root: Path, stages: dict[str, Stage], hooks: Hooks) -> dict[str, Any]:
    folder = root / stage.key
    folder.mkdir(parents=True, exist_ok=True)
    status = read_json(folder / STATUS) or {}
    configs = _step_configs(spec, stage, root, stages) if stage.kind != BASE else []
    status.pop("stopped", None)  # an earlier attempt's stop
    status.update({"status": "running", "started": timestamp(), "attempts": int(status.get("attempts", 0)) + 1,
                   "pid": os.getpid()})
    if configs:
        status["fingerprint"] = _fingerprint(spec, stage, configs, stages)
        if stage.parent is not None:  # which training of the parent stage this one starts from (check_existing)
            status["parent_trained_at"] = (read_json(root / stage.parent / STATUS) or {}).get("trained_at")
    write_json(folder / STATUS, status)
    load_model = hooks.load_model or _default_load_model
    t0 = time.perf_counter()
    model = _start_model(spec, stage, root, stages)
    for i, (step, cfg) in enumerate(zip(stage.steps, configs)):
        _run_step(spec, stage, step, cfg, root, stages, hooks, first=i == 0)
        model = str((root / step.model_dir()).resolve())
        _free_memory(hooks)
    t_train = time.perf_counter() - t0
    if stage.kind != BASE:
        status.update({"trained": True, "trained_at": status.get("trained_at") or timestamp()})
        write_json(folder / STATUS, status)
    t1 = time.perf_counter()
    evals = evaluate_stage(spec, model, stage.eval_tasks, folder, load_model, hooks.progress, root)
    _free_memory(hooks)
    seconds = {"train": t_train, "eval": time.perf_counter() - t1}
    # the intermediate checkpoints (spec: evaluation.checkpoints) after the final evaluation, whose files an
    # interrupted run keeps, and before the stage is done, so that a re-run finishes them; their time apart, and
    # recorded only where there were some, so the stage's evaluation time means what it meant before the option
    t2 = time.perf_counter()
    if evaluate_checkpoints(spec, stage, root, load_model, hooks.progress):
        seconds["checkpoint_eval"] = time.perf_counter() - t2
        _free_memory(hooks)
    record = _stage_record(spec, stage, root, configs, evals, seconds)
    write_json(folder / RESULT, record)
    status.update({"status": "done", "trained": True, "finished": timestamp(), "error": None})
    write_json(folder / STATUS, status)
    (folder / ERROR).unlink(missing_ok=True)
    return record


def _free_memory(hooks: Hooks) -> None:
    if not hooks.collect_garbage:
        return
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _record_failure(folder: Path, exc: BaseException) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ERROR).write_text("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    status = read_json(folder / STATUS) or {}
    status.update({"status": "failed", "failed": timestamp(), "error": f"{type(exc).__name__}: {exc}",
                   "traceback": ERROR})
    write_json(folder / STATUS, status)


def _record_stop(folder: Path) -> None:
    """A stage stopped by Ctrl-C or SIGTERM says so in its status.json (a kill -9 leaves "running", which `esft
    experiment status` reads as stopped once no runner holds the folder). Best effort: the stop itself must go on."""
    try:
        status = read_json(folder / STATUS)
        if status and status.get("status") == "running":
            status.pop("pid", None)
            status.update({"status": "stopped", "stopped": timestamp(), "error": None})
            write_json(folder / STATUS, status)
    except OSError:
        pass


def output_dir_for(spec: Spec, output_dir: str | Path | None = None) -> Path:
    return Path(output_dir or spec.output_dir or Path("runs") / "experiments" / spec.name)


def _log(hooks: Hooks, message: str) -> None:
    if hooks.progress:
        print(message, flush=True)


def _evaluation_current(spec: Spec, stage: Stage, root: Path) -> bool:
    """True when every task of the stage was evaluated with today's settings (limits, tokens, model), and every
    intermediate checkpoint the spec asks evaluated (esft.experiments.checkpoint_eval) too."""
    from esft.experiments.stage_eval import is_current

    model = spec.model if stage.kind == BASE else str((root / stage.model_dir()).resolve())
    return all(is_current(root / stage.key, spec, task, model, root) for task in stage.eval_tasks) and \
        checkpoints_current(spec, stage, root)


def _visit(spec: Spec, stage: Stage, root: Path, smap: dict[str, Stage], hooks: Hooks, tag: str) -> str:
    """Run one stage unless it is done or blocked; returns its status. Only KeyboardInterrupt escapes."""
    folder = root / stage.key
    status = read_json(folder / STATUS) or {}
    if status.get("status") == "done" and (folder / RESULT).exists():
        if _evaluation_current(spec, stage, root):
            _log(hooks, f"{tag} {stage.key}: done, skipped")
            return "done"
        _log(hooks, f"{tag} {stage.key}: evaluation settings changed; re-evaluating (training is kept)")
    missing = [k for k in stage.after if not (read_json(root / k / STATUS) or {}).get("trained")]
    if missing:
        folder.mkdir(parents=True, exist_ok=True)
        status.update({"status": "blocked", "error": f"needs the weights of {', '.join(missing)}"})
        write_json(folder / STATUS, status)
        _log(hooks, f"{tag} {stage.key}: blocked (needs {', '.join(missing)})")
        return "blocked"
    _log(hooks, f"{tag} {stage.key}: " + ("resuming" if status.get("attempts") else "starting"))
    try:
        run_stage(spec, stage, root, smap, hooks)
        return "done"
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM (esft.sigterm): the next run resumes this stage. The trainer's own
        # hint (`esft train es --resume`) would bypass the experiment: this one replaces it, printed once by the
        # command line
        _record_stop(folder)
        raise RunInterrupted(f"interrupted in {stage.key}; run the same command again to resume") from None
    except Exception as exc:  # noqa: BLE001 - one stage's failure must not stop the others
        if isinstance(exc, RunFailed):  # its `esft train ... --resume` would bypass the experiment, as above
            exc = exc.resumed_by("running the same command again")
        _record_failure(folder, exc)
        _free_memory(hooks)
        print(f"{tag} {stage.key}: FAILED: {type(exc).__name__}: {exc} (traceback in {folder / ERROR})",
              file=sys.stderr, flush=True)
        return "failed"


def run_experiment(spec: Spec, output_dir: str | Path | None = None, hooks: Hooks | None = None,
                   write_tables: bool = True) -> ExperimentResult:
    """Run (or continue) every stage of `spec` in `output_dir`; returns each stage's status. SIGTERM stops it as
    Ctrl-C does (esft.sigterm), from a script as from `esft experiment run`: outside a trainer too (a stage's
    evaluation), the stage is marked stopped and the invocation and tables are written."""
    with sigterm_interrupts():
        return _run_experiment(spec, output_dir, hooks, write_tables)


def _run_experiment(spec: Spec, output_dir: str | Path | None, hooks: Hooks | None,
                    write_tables: bool) -> ExperimentResult:
    hooks = hooks or Hooks()
    root = output_dir_for(spec, output_dir)
    stages = checked_plan(spec, root)  # before any compute, and before the folder is made
    root.mkdir(parents=True, exist_ok=True)
    smap = {s.key: s for s in stages}
    result = ExperimentResult(root)
    started, t0 = timestamp(), time.perf_counter()
    with experiment_lock(root), Heartbeat(root, started):
        if spec.path and Path(spec.path).exists():
            shutil.copyfile(spec.path, root / "spec.yaml")
        write_json(root / "plan.json", {"spec": spec.to_dict(), "stages": [as_dict(s) for s in stages],
                                        "evaluation": plan_settings(spec), "sampled": plan_sampled_settings(spec)})
        interrupted = True
        try:
            for n, stage in enumerate(stages, start=1):
                result.statuses[stage.key] = _visit(spec, stage, root, smap, hooks, f"[{n}/{len(stages)}]")
            interrupted = False
        finally:
            result.wall_s = time.perf_counter() - t0
            # one line per invocation: the experiment's wall time is their sum, across kills and resumes
            with open(root / "invocations.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"started": started, "finished": timestamp(), "wall_s": result.wall_s,
                                     "interrupted": interrupted, "statuses": result.statuses}) + "\n")
            if write_tables:  # an interrupted run's too: its tables hold the stages done and name those stopped
                _write_tables(root, interrupted)
    return result


def _write_tables(root: Path, interrupted: bool) -> None:
    """tables/ of the stages done. After an interrupt (a second Ctrl-C included) a failure here is a warning: the
    interrupt's message, how to resume, is what the user needs."""
    from esft.experiments.study_tables import write_all_tables

    try:
        write_all_tables(root)
    except (Exception, KeyboardInterrupt) as exc:
        if not interrupted:
            raise
        print(f"esft: warning: the tables of {root} were not written ({type(exc).__name__}: {exc}); "
              f"`esft experiment tables {root}` writes them", file=sys.stderr, flush=True)


def plan_text(spec: Spec, root: Path | None = None) -> str:
    """The dry run's stage list; with `root` (an existing experiment folder) its stages trained with other
    options are refused as the run would refuse them, before anything runs."""
    return describe(checked_plan(spec, root))


def checked_plan(spec: Spec, root: Path | None) -> list[Stage]:
    """The plan for the experiment folder `root` (what its runs already hold decides a chain's first run), with
    its stages trained with other options refused (check_existing)."""
    inside = root if root is not None and is_run_dir(root) else enclosing_run_dir(root) if root is not None else None
    if inside is not None:  # its plan.json, tables and stage folders would mix with a training run's files
        raise FileExistsError(f"{root} {'is' if inside == root else 'lies inside'} a training run's folder "
                              f"({inside}): give the experiment a folder of its own (--output-dir)")
    stages = build_plan(spec, root)
    if root is not None and root.is_dir():
        check_existing(spec, stages, root)
    return stages
