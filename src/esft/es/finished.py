"""Resuming an ES run that has nothing left to do, answered from its run folder alone.

`esft train es --resume RUN` of a finished run would otherwise load the model (minutes for a large one, plus a Ray
cluster's start) only to find its final checkpoint already there. `finished_checkpoint` says so from the files;
where it cannot be sure (a damaged file, an evaluation still due, a longer run asked for) it answers None and the
trainer's own resume, which loads the model, decides.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from esft.config import locked_changes, resume_refusal
from esft.es import es_rundir
from esft.es.es_config import ESConfig, read_run_config, resumable_changes
from esft.rundir import CorruptLogError, TrainResult, finished_line, prune_checkpoints, read_jsonl
from esft.run_undo import locked_run_folder


def check_resumable(run_dir: Path, config: ESConfig) -> None:
    """Refuse to resume `run_dir` with settings that would change what its logged iterations did."""
    old, _ = read_run_config(run_dir)
    diffs = locked_changes(old, config, resumable_changes(old))
    if diffs:
        raise resume_refusal(run_dir, diffs)


def eval_due(step: int, eval_every: int, iterations: int) -> bool:
    """Whether the run evaluates its centre after `step` updates: every `eval_every`, and at its end."""
    return bool(eval_every) and (step % eval_every == 0 or step == iterations)


def intact(folder: Path, needs_optimizer: bool) -> bool:
    """Every file a resume reads from checkpoint `folder` is whole: each safetensors file's header and length
    (safe_open checks both without reading the tensors), and the optimizer state's archive where the run has one."""
    from safetensors import SafetensorError, safe_open

    try:
        state = json.loads((folder / es_rundir.STATE_FILE).read_text())
        files = sorted(folder.glob("*.safetensors"))
        if not any(f.name != es_rundir.MASTERS_FILE for f in files):
            return False
        if state.get("has_masters") and not (folder / es_rundir.MASTERS_FILE).is_file():
            return False
        index = folder / "model.safetensors.index.json"  # a sharded model: a shard missing leaves its tensors out
        if index.is_file() and not all((folder / name).is_file()
                                       for name in set(json.loads(index.read_text())["weight_map"].values())):
            return False
        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                handle.keys()
        if needs_optimizer:
            if not state.get("has_optimizer"):
                return False
            torch.load(folder / es_rundir.OPTIMIZER_FILE, weights_only=True, mmap=True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError, SafetensorError):
        return False
    return True


def finished_checkpoint(run_dir: Path, config: ESConfig) -> Path | None:
    """The final checkpoint of `run_dir` when resuming it with `config` has nothing to do: it holds every logged
    update, the log reaches `config.iterations`, the evaluation due at the end is logged, and its files are whole.
    None otherwise, or where the logs cannot be read (the trainer's resume reports those)."""
    try:
        records = es_rundir.read_seed_log(run_dir)
        evaluated = {r.get("step") for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("kind") == "eval"}
    except (OSError, ValueError, CorruptLogError):
        return None
    logged = len(records)
    usable = [(s, f) for s, f in es_rundir.list_checkpoints(run_dir) if s <= logged]
    # `final` beside a numbered checkpoint of its step (a run interrupted right after saving that step, then resumed
    # with nothing left to train) still ends the run: list_checkpoints sorts the numbered one after it
    final = next((f for s, f in usable if s == usable[-1][0] and f.name == "final"), None) if usable else None
    if final is None or usable[-1][0] != logged or logged < config.iterations:
        return None
    if eval_due(logged, config.eval_every, config.iterations) and logged not in evaluated:
        return None
    return final if intact(final, config.optimizer != "sgd") else None


def resume_finished(config: ESConfig, progress: bool = True) -> TrainResult | None:
    """Resume a finished run without loading its model: its settings are checked as any resume's, checkpoints past
    a lowered `save_total_limit` are pruned, and the finished line is printed. None where the run is not surely
    finished (`finished_checkpoint`), or is no run folder: the trainer resumes it."""
    out = Path(config.output_dir)
    if not (config.resume and (out / "config.yaml").is_file()):
        return None
    # fewer iterations than are logged: the trainer's refusal, not "nothing to do"
    es_rundir.check_not_shortened(out, config.iterations)
    with locked_run_folder(out):
        if config.rollout_dtype == "auto":  # on a resume: the dtype the run recorded, as the trainer reads it
            config = config.replace(rollout_dtype=read_run_config(out)[0].rollout_dtype)
        check_resumable(out, config)
        final = finished_checkpoint(out, config)
        if final is None:
            return None
        records = es_rundir.read_seed_log(out)
        es_rundir.check_noise_stream(records, config.noise_stream, out)
        prune_checkpoints(es_rundir.list_checkpoints(out), config.save_total_limit)
        step = len(records)
        if progress:
            print(finished_line(out, "iteration", step, "iterations", config.iterations))
        return TrainResult(out, step, final, None)


__all__ = ["check_resumable", "eval_due", "finished_checkpoint", "intact", "resume_finished"]
