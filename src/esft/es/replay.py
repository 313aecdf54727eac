"""Rebuild ES weights theta_t from the base model and `seeds.jsonl` alone (no checkpoints needed).

Every update is a seeded noise sum with logged coefficients, so applying the logged updates to the base model
with the run's parameter selection and noise mode reproduces the trained masters bit for bit (same device
type: CPU and CUDA generators draw different numbers). Adam runs are replayed through a fresh optimizer, which
is deterministic too. A run of noise stream k > 0 (a later stage of a sequential chain) logged its own seeds;
replay checks that the log and config.yaml name the same stream, so the stage's seeds are applied to the stage's
start model (its config's `model`, the previous stage's checkpoint).

    model, tok = load_model(...)                    # the run's base model, same dtype
    rebuild(model, "runs/es", step=20)              # model now holds theta_20
    for rec in drift(model, "runs/es"): ...         # ||theta_t - theta_0||^2, total and per tensor, per step
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from esft.es import es_rundir
from esft.es.build import make_strategy, make_weights
from esft.es.es_config import ESConfig, read_run_config
from esft.es.noise import MasterWeights


@dataclass
class ReplayState:
    step: int
    """number of updates applied (theta_step)"""
    weights: MasterWeights
    record: dict[str, Any] | None
    """the seeds.jsonl line of the last applied update (None at step 0)"""


def load_base(run_dir: str | Path, device: str | None = None, other_type: str = "refuse") -> tuple[Any, Any]:
    """The run's base model and tokenizer, loaded with the run's dtype and device (needs esft.models). `device`
    (e.g. "cuda:1") picks one of the run's device type; another type, whose noise differs, is refused, or with
    `other_type="recorded"` left for the run's own device."""
    from esft.models import load_model

    config, info = read_run_config(run_dir)
    dtype, recorded = base_placement(config, info)
    if device is not None and recorded is not None and torch.device(device).type != torch.device(recorded).type:
        if other_type == "recorded":
            return load_model(config.model, dtype=dtype, device=recorded)
        raise ValueError(f"{run_dir} drew its noise on {torch.device(recorded).type}; a replay on {device} would draw "
                         f"other numbers (CPU and CUDA generators differ) and rebuild other weights: replay it on "
                         f"{torch.device(recorded).type} (leave the device unset)")
    return load_model(config.model, dtype=dtype, device=device or recorded)


def base_placement(config: ESConfig, info: dict[str, Any]) -> tuple[str | None, str | None]:
    """(dtype, device type) the run's model had. A run that left them to the loader (`dtype` / `device` None)
    is replayed with what its config.yaml recorded, not with this machine's defaults: a CPU run replayed on a
    GPU machine would otherwise draw CUDA noise from a bf16 base, and its replay would silently differ."""
    device = config.device
    if device is None and info.get("device"):
        device = torch.device(str(info["device"])).type
    dtype = config.dtype
    recorded = info.get("param_dtypes") or {}
    if dtype in (None, "auto") and len(recorded) == 1:
        dtype = str(next(iter(recorded)))
    return dtype, device


def replay(model: torch.nn.Module, run_dir: str | Path, upto: int | None = None) -> Iterator[ReplayState]:
    """Apply the logged updates to `model` (the base weights) in place, yielding after step 0, 1, ..., upto."""
    config, _ = read_run_config(run_dir)
    records = es_rundir.read_seed_log(run_dir)
    es_rundir.check_noise_stream(records, config.noise_stream, Path(run_dir))
    if upto is None:
        upto = len(records)
    if not 0 <= upto <= len(records):
        raise ValueError(f"step {upto} not in the seed log of {run_dir} (0..{len(records)})")
    for p in model.parameters():
        p.requires_grad_(False)
    weights = make_weights(model, config)
    optimizer = make_strategy(config).make_optimizer(list(weights.master.values()))
    yield ReplayState(0, weights, None)
    for rec in records[:upto]:
        weights.apply(es_rundir.update_from_record(rec), optimizer)
        yield ReplayState(rec["iteration"] + 1, weights, rec)


def rebuild(model: torch.nn.Module, run_dir: str | Path, step: int | None = None) -> MasterWeights:
    """Set `model` (base weights) to theta_step (default: the last logged step); returns its masters."""
    state = None
    for state in replay(model, run_dir, upto=step):
        pass
    assert state is not None
    return state.weights


@torch.no_grad()
def drift(model: torch.nn.Module, run_dir: str | Path, upto: int | None = None,
          per_tensor: bool = True) -> Iterator[dict[str, Any]]:
    """Per step t >= 1: ||theta_t - theta_0||^2 in total and per tensor (float64 sums), plus `expected`, the
    random-walk expectation accumulated from the logged coefficients: sum_t scale_t^2 * d_tensor * sum_k c_k^2
    (SGD runs; with z-scored fitness and independent members sum_k c_k^2 = N, giving alpha^2 T d / N).
    Keeps one fp32 copy of theta_0; no checkpoint is written."""
    config: ESConfig = read_run_config(run_dir)[0]
    base: dict[str, torch.Tensor] | None = None
    expected_unit = 0.0  # sum_t scale^2 sum_k c_k^2: expected squared step per coordinate
    for state in replay(model, run_dir, upto=upto):
        if base is None:
            base = {n: m.clone() for n, m in state.weights.iter_masters()}
            sizes = {n: m.numel() for n, m in base.items()}
            continue
        rec = state.record
        if rec.get("kind", "sgd") == "sgd":
            expected_unit += rec["scale"] ** 2 * sum(c * c for c in rec["coefficients"])
        tensors = {}
        total = 0.0
        for name, m in state.weights.iter_masters():
            sq = float((m.double() - base[name].double()).pow(2).sum())
            total += sq
            if per_tensor:
                tensors[name] = sq
        out: dict[str, Any] = {"step": state.step, "total": total, "num_params": sum(sizes.values()),
                               "population_size": config.population_size,
                               "expected": expected_unit * sum(sizes.values()) if config.optimizer == "sgd" else None}
        if per_tensor:
            out["per_tensor"] = tensors
            out["numel"] = sizes
        yield out


@torch.no_grad()
def matches_checkpoint(model: torch.nn.Module, weights: MasterWeights, folder: str | Path) -> bool:
    """True when the masters equal a checkpoint's weights bit for bit (its fp32 masters when it saved them).
    A checkpoint that lacks a tensor or cannot be read raises es_rundir.CheckpointDamaged: damage is not a
    mismatch."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    masters_file = folder / es_rundir.MASTERS_FILE
    try:
        saved = (load_file(str(masters_file)) if masters_file.exists()
                 else es_rundir.read_checkpoint_tensors(folder))
    except (OSError, SafetensorError) as exc:
        raise es_rundir.CheckpointDamaged(f"checkpoint {folder} is damaged ({exc})") from None
    aliases = {n: [n] for n in saved} if masters_file.exists() else es_rundir.parameter_aliases(model)
    for name, m in weights.iter_masters():
        found = next((a for a in aliases.get(name, [name]) if a in saved), None)
        if found is None:
            raise es_rundir.CheckpointDamaged(f"checkpoint {folder} lacks {name} (its weights file is missing or "
                                              f"incomplete)")
        if not torch.equal(saved[found].to(torch.float32), m.cpu()):
            return False
    return True


def verify(run_dir: str | Path, model: torch.nn.Module | None = None) -> dict[str, Any]:
    """Rebuild the last logged step from the base model and compare it with the run's checkpoints of that step
    (`final`, `iter_XXXXXX` or both) bit for bit; also reports the run's noise stream. `checkpoint` names the
    first folder that differs or cannot be read, else the last one compared."""
    if model is None:
        model, _ = load_base(run_dir)
    weights = rebuild(model, run_dir)
    step = len(es_rundir.read_seed_log(run_dir))
    stream = read_run_config(run_dir)[0].noise_stream
    folders = [f for s, f in es_rundir.list_checkpoints(Path(run_dir)) if s == step]
    out: dict[str, Any] = {"step": step, "checkpoint": None, "bit_identical": None, "noise_stream": stream}
    for folder in folders:
        out["checkpoint"] = str(folder)
        try:
            out["bit_identical"] = matches_checkpoint(model, weights, folder)
        except es_rundir.CheckpointDamaged as exc:  # cannot be compared: neither identical nor different
            return {**out, "bit_identical": None, "damaged": str(exc)}
        if not out["bit_identical"]:
            break
    return out


def main(argv: list[str] | None = None) -> int:
    """python -m esft.es.replay verify RUN_DIR            rebuild the last step, compare with its checkpoint
       python -m esft.es.replay drift RUN_DIR OUT.jsonl   ||theta_t - theta_0||^2 per step (total, per tensor)
       python -m esft.es.replay rebuild RUN_DIR STEP DIR  save theta_STEP as a Hugging Face folder
    verify exits 0 when bit-identical, 1 when a checkpoint differs or is damaged, 3 when the run has no checkpoint of
    its last step to compare with; 2 is a usage error."""
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or {"verify": 2, "drift": 3, "rebuild": 4}.get(args[0]) != len(args):
        print(main.__doc__)
        return 2
    cmd, run_dir = args[0], args[1]
    problem = None  # bad arguments, named in one line before the model loads
    if not (Path(run_dir) / "seeds.jsonl").is_file() or not (Path(run_dir) / "config.yaml").is_file():
        problem = f"{run_dir} is not an ES run directory (it lacks seeds.jsonl or config.yaml)"
    elif cmd == "rebuild":
        last = len(es_rundir.read_seed_log(run_dir))
        if not (args[2].isdigit() and int(args[2]) <= last):
            problem = f"STEP {args[2]!r} is not a step of {run_dir} (0..{last})"
    if problem:
        print(f"esft.es.replay: error: {problem}", file=sys.stderr)
        return 2
    if cmd == "verify":
        result = verify(run_dir)
        print(json.dumps(result))
        if result["checkpoint"] is None:  # not a mismatch: nothing was compared
            print(f"esft.es.replay: {run_dir} has no checkpoint of its last step ({result['step']}) to compare with",
                  file=sys.stderr)
            return 3
        return 0 if result["bit_identical"] else 1
    model, tokenizer = load_base(run_dir)
    if cmd == "drift":
        with open(args[2], "w", encoding="utf-8") as fh:
            for rec in drift(model, run_dir):
                fh.write(json.dumps(rec) + "\n")
                print(f"step {rec['step']}: ||dtheta||^2 = {rec['total']:.6g} (expected {rec['expected']})")
        return 0
    rebuild(model, run_dir, step=int(args[2]))
    model.save_pretrained(args[3])
    if tokenizer is not None:
        tokenizer.save_pretrained(args[3])
    print(f"wrote theta_{args[2]} to {args[3]}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
