"""Peak resident memory of an ES run against an evaluation (`esft bench --memory-rounds N`).

Each side runs as its own `esft` process, so that its peak resident set (the kernel's `ru_maxrss`, read when the
process is reaped) is its own: the ES side is `esft train es --preset cpu` for one iteration without a held-out
evaluation (its fast rollout engine, one lane), the evaluation side `esft eval` of the preset's task with the
preset's batch size as `--limit` (the first examples of the evaluation split, not the ES batch's training
examples), its passage cut, completion budget and generation batch size, on esft's exact default engine. The
rounds alternate the two, ES first, each in a folder of its own, because the peaks move by ~10% from run to run on
the VMs measured (glibc keeps freed memory): `ratio` is each round's ES peak over the evaluation right after it.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["measure_memory", "memory_commands", "peak_rss_kb", "peak_rss_rounds"]


def memory_commands(model: str, output: Path) -> tuple[list[str], list[str]]:
    """(ES command, evaluation command) for the `cpu` preset and `model`, writing under `output`."""
    from esft.es.es_config import PRESETS

    preset = PRESETS["cpu"]
    esft = [sys.executable, "-m", "esft"]
    es = [*esft, "train", "es", "--preset", "cpu", "--model", model, "--iterations", "1", "--eval-every", "0",
          "--output-dir", str(output / "es")]
    evaluation = [*esft, "eval", "--model", model, "--tasks", preset["task"], "--limit", str(preset["batch_size"]),
                  "--max-new-tokens", str(preset["max_new_tokens"]),
                  "--max-passage-chars", str(preset["max_passage_chars"]),
                  "--batch-size", str(preset["generation_batch_size"]), "--output-dir", str(output / "eval")]
    return es, evaluation


#: Runs argv[2:] and writes its ru_maxrss to argv[1]. Linux counts the address space a process leaves at exec in
#: its peak (`ru_maxrss`), so a child of this process, which holds the bench's model, would start from this
#: process's peak: each side is started by this small reaper instead (~10 MB, below anything measured here).
_REAPER = ("import os, subprocess, sys; p = subprocess.Popen(sys.argv[2:]); _, status, usage = os.wait4(p.pid, 0); "
           "open(sys.argv[1], 'w').write(str(usage.ru_maxrss)); sys.exit(os.waitstatus_to_exitcode(status))")


def peak_rss_kb(command: Sequence[str], log_path: Path) -> int:
    """Run `command` (its output to `log_path`) and return its peak resident set in kB; a failure raises with the
    log's tail."""
    log_path = Path(log_path)
    rss_file = log_path.with_suffix(".maxrss")
    with open(log_path, "w") as log:
        code = subprocess.call([sys.executable, "-c", _REAPER, str(rss_file), *command], stdout=log,
                               stderr=subprocess.STDOUT)
    if code != 0:
        tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-15:])
        raise RuntimeError(f"{_shown(command)} exited with {code}:\n{tail}")
    maxrss = int(rss_file.read_text())
    return maxrss // 1024 if sys.platform == "darwin" else maxrss  # bytes on macOS, kB on Linux


def peak_rss_rounds(commands: Callable[[int], tuple[Sequence[str], Sequence[str]]], rounds: int, folder: Path,
                    log: Callable[[str], None] = print) -> dict[str, Any]:
    """`rounds` alternated pairs (ES, then the evaluation) of peak RSS, logs in `folder`: the report's `memory`.
    `commands(k)`: round k's (ES, evaluation) commands (an ES run refuses an output folder that holds a run)."""
    pairs = []
    for k in range(1, rounds + 1):
        es, evaluation = commands(k)
        log(f"memory round {k}/{rounds}: ES ...")
        es_kb = peak_rss_kb(es, folder / f"es-{k}.log")
        log(f"memory round {k}/{rounds}: evaluation ...")
        eval_kb = peak_rss_kb(evaluation, folder / f"eval-{k}.log")
        pairs.append({"es_peak_rss_kb": es_kb, "eval_peak_rss_kb": eval_kb, "ratio": round(es_kb / eval_kb, 3)})
    ratios = [p["ratio"] for p in pairs]
    return {"es_command": _shown(es), "eval_command": _shown(evaluation), "rounds": pairs,
            "ratio_min": min(ratios), "ratio_median": round(statistics.median(ratios), 3), "ratio_max": max(ratios)}


def _shown(command: Sequence[str]) -> str:
    """The command as a user types it (`esft ...` for `python -m esft ...`)."""
    command = list(command)
    if command[1:3] == ["-m", "esft"]:
        command = ["esft", *command[3:]]
    return " ".join(command)


def measure_memory(model: str, rounds: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    """`peak_rss_rounds` of `memory_commands(model)`, in a temporary folder removed afterwards; {"error": what
    failed} when a side fails (the bench's workloads are measured by then, and kept)."""
    with tempfile.TemporaryDirectory(prefix="esft-bench-memory-") as tmp:
        try:
            return peak_rss_rounds(lambda k: memory_commands(model, Path(tmp) / f"round-{k}"), rounds, Path(tmp),
                                   log)
        except RuntimeError as exc:
            return {"error": str(exc)}
