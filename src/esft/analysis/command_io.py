"""What every `esft analyze` command shares (esft.analysis.commands): model folders from model specs, the model
with a checkpoint's weights, the generation settings of its evaluations, its JSON written, and the refusal to
overwrite the results of other inputs.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any


def model_folder(spec: str) -> str:
    """A folder for a model spec (embedded names such as smollm2-135m resolve to their cache folder)."""
    from esft.models import resolve_model_path

    p = resolve_model_path(spec)
    if not Path(p).is_dir():
        raise FileNotFoundError(f"{spec!r} is not a model folder on disk (weight analyses read checkpoints)")
    return p


def write_json(out: Path, name: str, payload: Any) -> Path:
    """`payload` as `out/name` (the folder made where missing), written whole or not at all: a Ctrl-C while it is
    written leaves the earlier file or none, not a cut one."""
    from esft.rundir import write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    write_text_atomic(path, json.dumps(payload, indent=1, default=str))
    return path


#: config fields that say where or how fast an analysis runs, or what its figure calls it, not what it computes
NOT_RESULTS = ("output_dir", "threads", "stable_rank_device", "check_base", "label")


def check_previous(out: Path, name: str, cfg: Any) -> None:
    """FileExistsError when `out/name` holds an analysis of other inputs (other checkpoints, tasks, limit, ...):
    writing this one there would replace it, and its figures, without a word, as `esft eval` refuses for its
    summary.json. The same analysis again (repeated or interrupted) may overwrite its own; options a newer esft
    added, which that JSON does not record, do not count."""
    path = out / name
    try:
        old = json.loads(path.read_text(encoding="utf-8"))["config"] if path.is_file() else None
    except (OSError, ValueError, KeyError, TypeError):
        old = None  # not an analysis of esft's: nothing to keep
    if not isinstance(old, dict):
        return
    new = json.loads(json.dumps(asdict(cfg), default=str))  # as the JSON records it
    changed = [f"{k}: {old[k]!r} there, {new[k]!r} now" for k in new
               if k in old and k not in NOT_RESULTS and old[k] != new[k]]
    if changed:
        raise FileExistsError(f"{path} holds the results of another analysis ({'; '.join(changed[:3])}"
                              f"{', ...' if len(changed) > 3 else ''}): choose another --output-dir, or delete "
                              f"that {name} to replace them")


def generation(max_new_tokens: int, batch_size: int, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
    """The GenerationConfig of an analysis' evaluations (greedy unless a temperature is given)."""
    from esft.generation import GenerationConfig

    return GenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                            batch_size=batch_size, seed=seed)


def load_with_weights(base: str, weights: str | None, dtype: str, device: str | None):
    """Model and tokenizer of `base`, with the weights of checkpoint `weights` (folders need no tokenizer)."""
    from esft.analysis.landscape import set_weights
    from esft.models import load_model

    model, tok = load_model(base, dtype=dtype, device=device)
    if weights is not None and Path(weights).resolve() != Path(base).resolve():
        set_weights(model, weights)
    return model, tok


def task_options_for(max_passage_chars: int | None) -> dict[str, dict[str, Any]]:
    """Task options by task name: BoolQ's passages cut to `max_passage_chars` where given."""
    return {"boolq": {"max_passage_chars": max_passage_chars}} if max_passage_chars else {}


def set_threads(threads: int | None) -> None:
    """torch's intra-op threads for the analysis (None: torch's default)."""
    if threads:
        import torch

        torch.set_num_threads(int(threads))


__all__ = ["NOT_RESULTS", "check_previous", "generation", "load_with_weights", "model_folder", "set_threads",
           "task_options_for", "write_json"]
