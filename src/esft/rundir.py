"""Run-directory files shared by ES and GRPO runs: append-only JSONL logs, checkpoint folders, the run result.

Both trainers write the same layout (`config.yaml`, `metrics.jsonl`, `samples/`, `checkpoints/iter_XXXXXX/`,
`checkpoints/final/`), so analyses walk either kind of run the same way. What only ES writes (seeds.jsonl, fp32
masters in its checkpoints) is in esft.es.es_rundir; GRPO's TRL checkpoints in esft.grpo.trl_trainer.

Each JSONL line is written whole and fsynced, so a crash leaves at most a torn last line, which readers skip.
Checkpoint folders are written aside and renamed into place (`replace_dir`), so a checkpoint is complete or absent.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

CHECKPOINTS = "checkpoints"


@dataclass
class TrainResult:
    output_dir: Path
    steps: int
    final_checkpoint: Path | None
    last_eval: dict[str, Any] | None


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


# ---- JSONL logs -----------------------------------------------------------------------------------------------------

def append_jsonl(path: Path, record: dict[str, Any], sync: bool = True) -> None:
    line = json.dumps(record, separators=(",", ":")) + "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        if sync:
            os.fsync(fh.fileno())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL file; a torn (unparsable or unterminated) last line is ignored."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                break  # torn write at a crash
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return records


def rewrite_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Atomically replace a JSONL file (used on resume to drop records past the resume point)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def filter_jsonl(path: Path, keep: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    records = [r for r in read_jsonl(path) if keep(r)]
    if Path(path).exists():
        rewrite_jsonl(path, records)
    return records


# ---- checkpoint folders -------------------------------------------------------------------------------------------

def checkpoint_name(step: int) -> str:
    return f"iter_{step:06d}"


def replace_dir(src: Path, dst: Path) -> None:
    """Move the complete folder `src` to `dst`, replacing any folder there: the old one is renamed aside first
    and deleted last, so at every moment either the old or the new `dst` is complete (ES and GRPO checkpoints)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        old = dst.with_name(f".old_{dst.name}")
        if old.exists():
            shutil.rmtree(old)
        os.replace(dst, old)
        os.replace(src, dst)
        shutil.rmtree(old)
    else:
        os.replace(src, dst)


def list_checkpoints(run_dir: Path, state_file: str, step_key: str = "step") -> list[tuple[int, Path]]:
    """(step, folder) of the complete checkpoints under `run_dir/checkpoints`, sorted by step then name: a folder
    counts once its `state_file` (a JSON object holding the step under `step_key`) is there and readable."""
    root = Path(run_dir) / CHECKPOINTS
    out = []
    if not root.exists():
        return out
    for folder in root.iterdir():
        state = folder / state_file
        if folder.name.startswith(".") or not state.exists():
            continue
        try:
            out.append((int(json.loads(state.read_text())[step_key]), folder))
        except (ValueError, KeyError, json.JSONDecodeError):
            continue
    return sorted(out, key=lambda x: (x[0], x[1].name))


__all__ = ["CHECKPOINTS", "TrainResult", "append_jsonl", "checkpoint_name", "filter_jsonl", "list_checkpoints",
           "peak_rss_mb", "read_jsonl", "replace_dir", "rewrite_jsonl"]
