"""What only an ES run writes into its run directory: the seed log and checkpoints that carry fp32 masters.

Layout of `output_dir` (the shared parts, and the JSONL / checkpoint-folder helpers, are esft.rundir's; they are
re-exported here so that one import reads a whole ES run directory):
    config.yaml                  resolved ESConfig (+ `_run`: precision, d, versions)
    seeds.jsonl                  one line per iteration: batch indices, members, fitness, update coefficients
                                 (+ noise_stream when the run draws a stream k > 0)
    metrics.jsonl                {"kind": "train", ...} per iteration and {"kind": "eval", ...} per evaluation
    samples/                     iter_XXXXXX.jsonl (a few member-0 completions), eval_XXXXXX.jsonl (held-out)
    checkpoints/iter_XXXXXX/     save_pretrained folder + es_state.json (+ masters.safetensors and an index of
    checkpoints/final/           the model file for non-fp32 models, optimizer.pt for Adam); XXXXXX = number of
                                 updates applied
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from esft import rundir
from esft.es.noise import MasterWeights, Update
from esft.models import without_transformers_bars
from esft.rundir import (CHECKPOINTS, append_jsonl, checkpoint_name, filter_jsonl, read_jsonl, replace_dir,
                         rewrite_jsonl)

STATE_FILE = "es_state.json"
MASTERS_FILE = "masters.safetensors"
OPTIMIZER_FILE = "optimizer.pt"


# ---- checkpoints --------------------------------------------------------------------------------------------------

def save_checkpoint(run_dir: Path, name: str, step: int, model: Any, tokenizer: Any, weights: MasterWeights,
                    optimizer: torch.optim.Optimizer | None = None, extra: dict[str, Any] | None = None) -> Path:
    """Write `checkpoints/<name>` atomically: save into a temp folder, then rename over any old one."""
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    tmp = root / f".tmp_{name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        _write_checkpoint(tmp, step, model, tokenizer, weights, optimizer, extra)
    except BaseException:
        # a failed write (a full disk) must not leave a half-written copy of the model taking the space
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, final)
    return final


def _write_checkpoint(tmp: Path, step: int, model: Any, tokenizer: Any, weights: MasterWeights,
                      optimizer: torch.optim.Optimizer | None, extra: dict[str, Any] | None) -> None:
    with without_transformers_bars():
        model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(tmp)
    state: dict[str, Any] = {"step": int(step), "has_masters": False, "has_optimizer": optimizer is not None}
    if not weights.all_fp32():
        # A bf16 (or fp16) model file holds rounded weights; the fp32 masters are needed to resume exactly.
        from safetensors.torch import save_file

        save_file({n: t.contiguous().cpu() for n, t in weights.iter_masters()}, str(tmp / MASTERS_FILE))
        state["has_masters"] = True
        index_single_model_file(tmp)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
    state.update(extra or {})
    (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))  # last: the folder counts once this is there


def index_single_model_file(folder: Path) -> None:
    """Give a folder whose model is one `model.safetensors` an index naming that file alone, as a sharded save
    has: loaders that otherwise take every `*.safetensors` of a folder (vLLM) then leave out the fp32 masters
    beside it, which hold the same tensor names (read twice, in three times the bytes, for nothing).
    Transformers still reads `model.safetensors` itself; a folder that already has an index is left as it is."""
    from safetensors import safe_open

    model_file, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if index.exists() or not model_file.is_file():
        return
    with safe_open(str(model_file), framework="pt") as fh:
        names = sorted(fh.keys())
    index.write_text(json.dumps({"metadata": {"total_size": model_file.stat().st_size},
                                 "weight_map": {n: model_file.name for n in names}}, indent=1))


#: torch CPU kernel tiers measured to draw the same noise bits (the main job on Zen 2 and Zen 4 machines)
SAME_NOISE_TIERS = ("AVX2", "AVX512")


def warn_if_noise_kernels_changed(run_dir: Path) -> None:
    """Warn when a resume runs on other torch CPU kernels than the run recorded (`_run.cpu_capability`) and the two
    are not known to draw the same noise: torch's DEFAULT tier draws other bits than AVX2 / AVX-512, so the replayed
    and later updates would not be the run's."""
    import warnings

    from esft.saved_config import recorded_run

    recorded = recorded_run(run_dir).get("cpu_capability")
    now = torch.backends.cpu.get_cpu_capability()
    if recorded and recorded != now and not {recorded, now} <= set(SAME_NOISE_TIERS):
        warnings.warn(f"resuming {run_dir} on torch CPU kernels {now!r} where it ran on {recorded!r}: they draw "
                      "other noise bits, so the updates replayed and made from here are not the run's own and it "
                      "will not replay bit for bit; resume it on a machine of the first kind", stacklevel=3)


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of complete ES checkpoints, sorted by step (`final` included under its step)."""
    return rundir.list_checkpoints(run_dir, STATE_FILE, "step")


def read_checkpoint_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder's model files (its fp32 masters file aside), by name."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        if file.name == MASTERS_FILE:
            continue
        tensors.update(load_file(str(file)))
    return tensors


def parameter_aliases(model: Any) -> dict[str, list[str]]:
    """Parameter name -> every state-dict name of the same tensor (tied weights are saved under one alias)."""
    by_id: dict[int, list[str]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        by_id.setdefault(id(t), []).append(name)
    return {name: by_id.get(id(p), [name]) for name, p in model.named_parameters()}


class CheckpointDamaged(RuntimeError):
    """A checkpoint folder that cannot be loaded (a file missing, unreadable or incomplete): a run-time failure
    of the run directory (the CLI exits 1), not bad input."""


def _read_checkpoint(folder: Path, model: Any, with_optimizer: bool) -> tuple[dict, dict, dict | None, Any]:
    """(state, tensors by parameter name, masters or None, optimizer state or None), all read before anything is
    loaded, so a damaged checkpoint leaves the model untouched. Raises CheckpointDamaged."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = json.loads((folder / STATE_FILE).read_text())
        tensors = read_checkpoint_tensors(folder)
        masters = load_file(str(folder / MASTERS_FILE)) if state.get("has_masters") else None
        optim = None
        if with_optimizer:
            if not state.get("has_optimizer"):
                raise CheckpointDamaged(f"checkpoint {folder} has no optimizer state")
            optim = torch.load(folder / OPTIMIZER_FILE, weights_only=True)
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as exc:
        if isinstance(exc, CheckpointDamaged):
            raise
        raise CheckpointDamaged(f"checkpoint {folder} is damaged ({type(exc).__name__}: {exc})") from None
    aliases = parameter_aliases(model)
    found = {}
    for name, _ in model.named_parameters():
        hit = next((a for a in aliases.get(name, [name]) if a in tensors), None)
        if hit is not None:
            found[name] = tensors[hit]
    return state, found, masters, optim


@torch.no_grad()
def load_checkpoint(folder: Path, model: Any, weights: MasterWeights,
                    optimizer: torch.optim.Optimizer | None = None) -> int:
    """Load a checkpoint into an already built model (same architecture and dtype); returns its step.

    Every perturbed tensor must be found in the file under one of its names (tied weights are saved once,
    under either alias). Masters come from masters.safetensors when present, else from the (fp32) weights. A
    damaged checkpoint (missing or unreadable file, missing tensor) raises CheckpointDamaged before the model or
    the optimizer is touched.
    """
    folder = Path(folder)
    state, tensors, masters, optim = _read_checkpoint(folder, model, optimizer is not None)
    missing = [name for name, _ in model.named_parameters() if name in weights.params and name not in tensors]
    if missing:
        raise CheckpointDamaged(f"checkpoint {folder} lacks parameter {missing[0]} (model.safetensors missing or "
                                f"incomplete)")
    lacking = [name for name in weights.master if name not in masters] if masters is not None else []
    if lacking:  # checked here, not by load_masters once the model has been overwritten
        raise CheckpointDamaged(f"checkpoint {folder} lacks the fp32 master of {lacking[0]} ({MASTERS_FILE} "
                                f"incomplete)")
    for name, param in model.named_parameters():
        if name in tensors:
            param.copy_(tensors[name].to(param.dtype))
    if masters is not None:
        weights.load_masters(masters)
    else:
        weights.sync_from_model()
    if optimizer is not None:
        optimizer.load_state_dict(optim)
    return int(state["step"])


# ---- seeds.jsonl schema ------------------------------------------------------------------------------------------

def seed_record(iteration: int, batch_indices: list[int], members: list, fitness: list[float],
                shaped: list[float], update: Any, update_norm: float, noise_stream: int = 0) -> dict[str, Any]:
    """One seeds.jsonl line. Floats are written with Python's repr, which round-trips float64 exactly, so
    replay applies bit-identical coefficients. `noise_stream` (esft.es.strategy.member_seeds) is written only
    when k > 0, so stream-0 logs keep their format byte for byte (absent = stream 0)."""
    record = {
        "iteration": int(iteration),
        "batch": [int(i) for i in batch_indices],
        "members": [[int(s), int(g)] for s, g in members],
        "fitness": [float(f) for f in fitness],
        "shaped": [float(z) for z in shaped],
        "seeds": [int(s) for s in update.seeds],
        "coefficients": [float(c) for c in update.coefficients],
        "scale": float(update.scale),
        "kind": update.kind,
        "update_norm": float(update_norm),
    }
    if noise_stream:
        record["noise_stream"] = int(noise_stream)
    return record


def check_noise_stream(records: list[dict[str, Any]], stream: int, run_dir: Path) -> None:
    """Refuse a seed log drawn from another noise stream than the config's (a stage's run directory paired
    with another stage's config.yaml): resuming it would mix two streams in one run."""
    for rec in records:
        logged = int(rec.get("noise_stream", 0))
        if logged != int(stream):
            raise ValueError(f"{run_dir}/seeds.jsonl iteration {rec.get('iteration')} was drawn from noise_stream "
                             f"{logged}, but the run's config has noise_stream {stream}")


def update_from_record(record: dict[str, Any]) -> Update:
    return Update(seeds=tuple(int(s) for s in record["seeds"]),
                  coefficients=tuple(float(c) for c in record["coefficients"]),
                  scale=float(record["scale"]), kind=record.get("kind", "sgd"))


def read_seed_log(run_dir: Path) -> list[dict[str, Any]]:
    """Records of seeds.jsonl for iterations 0, 1, 2, ... (a torn last line is skipped; an unreadable line or an
    iteration out of order raises esft.rundir.CorruptLogError naming the file and record)."""
    path = Path(run_dir) / "seeds.jsonl"
    out = []
    for rec in read_jsonl(path):
        if rec.get("iteration") != len(out):
            raise rundir.CorruptLogError(f"{path}: record {len(out) + 1} is iteration {rec.get('iteration')!r}, "
                                         f"expected {len(out)}: the seed log is out of order")
        out.append(rec)
    return out


def check_not_shortened(run_dir: str | Path, iterations: int, option: str = "iterations") -> None:
    """Resuming `run_dir` with fewer `iterations` than its seed log holds would end before them (and label a longer
    run final): refused, in the words of the `option` that set them, before any model loads."""
    logged = len(read_seed_log(Path(run_dir)))
    if iterations < logged:
        raise ValueError(f"{run_dir} has {logged} iterations logged; {option} {iterations} would end before them "
                         f"(give at least {logged} to continue it)")


__all__ = ["CHECKPOINTS", "MASTERS_FILE", "OPTIMIZER_FILE", "SAME_NOISE_TIERS", "STATE_FILE", "append_jsonl",
           "check_noise_stream", "check_not_shortened", "checkpoint_name", "CheckpointDamaged", "filter_jsonl",
           "index_single_model_file", "list_checkpoints", "load_checkpoint", "parameter_aliases", "read_jsonl",
           "read_seed_log", "replace_dir", "rewrite_jsonl", "save_checkpoint", "seed_record", "update_from_record",
           "warn_if_noise_kernels_changed"]
