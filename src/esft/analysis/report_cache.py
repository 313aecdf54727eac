"""The report's cache (esft.analysis.report_context): each analysis result is JSON under the output folder's
data/, reused while the identity of its inputs (paths and weight-file times) and its settings are unchanged."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence


def fingerprint(paths: Sequence[Path | None]) -> list[Any]:
    """Identity of the inputs of a cached result: paths and the modification times of their weight files."""
    out = []
    for p in paths:
        if p is None:
            out.append(None)
            continue
        p = Path(p)
        files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
        out.append([str(p), [round(f.stat().st_mtime, 3) for f in files if f.exists()]])
    return out


def json_default(x: Any) -> Any:
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


#: characters a report's file names spell out, as experiment folders do (esft.experiments.plan.task_slug)
_SPELT = {"+": "plus", "*": "times"}


def slug(text: str) -> str:
    """A file-name form of a label or path: ASCII letters, digits, `-` and `_` kept, `+` and `*` spelt out, any
    other character `_`. When that form could be another text's (a character replaced, or the form cut at 80), a
    hash of the text is appended: `countdown:ops=+` and `countdown:ops=*` once both became `countdown_ops__`, and
    the second figure overwrote the first. A form longer than 72 keeps its two ends (`_ends`)."""
    import hashlib
    import re

    if re.fullmatch(r"[A-Za-z0-9_-]{1,80}", text):
        return text
    readable = "".join(_SPELT.get(c, c if re.fullmatch(r"[A-Za-z0-9_-]", c) else "_") for c in text).strip("_")
    return f"{_ends(readable, 72)}-{hashlib.sha1(text.encode()).hexdigest()[:6]}"


def _ends(readable: str, width: int) -> str:
    """`readable` when it fits `width`, else its head and its tail, cut where a `_` parts words and joined by `__`:
    a run path's head names its seed and method (`seed-42_sequential_es_15`), its tail the stage's task and run
    folder, and the task options in the middle are the same in every run of a study. Kept whole, the tail alone
    left the files of seed 42 and seed 52 apart only by their hashes."""
    if len(readable) <= width:
        return readable
    head = readable[:width // 2]
    if "_" in head and readable[len(head)] != "_":
        head = head[:head.rindex("_")]
    room = width - len(head) - 2
    tail = readable[-room:]
    if "_" in tail and readable[-room - 1] != "_":
        tail = tail[tail.index("_") + 1:]
    return f"{head.rstrip('_')}__{tail.lstrip('_')}"


class Cache:
    """JSON results under the output folder, reused when their `params` match. `entries` records each result
    asked for in this process: (name, reused from the cache, seconds its computation took)."""

    def __init__(self, root: Path, recompute: bool):
        self.root, self.recompute = root, recompute
        self.entries: list[tuple[str, bool, float]] = []

    def get(self, name: str, params: Any, compute: Callable[[], Any], holds: Sequence[str] = (),
            accept: Callable[[Any], bool] | None = None) -> tuple[Any, bool]:
        """`compute()`'s result, or the cached one of the same `params`. `holds`: keys every result of this esft
        has somewhere inside it; a cached result without one of them was written by an older esft (a field added
        since, e.g. the constant-answer baseline) and is computed again rather than shown as n/a. `accept`: whether
        a cached result is one this esft would compute (an older esft's may hold what this one leaves out)."""
        path = self.root / "data" / f"{name}.json"
        params = json.loads(json.dumps(params, default=str))
        if path.exists() and not self.recompute:
            try:
                data = json.loads(path.read_text())
                if data.get("params") == params and all(_holds(data["result"], key) for key in holds) and (
                        accept is None or accept(data["result"])):
                    self.entries.append((name, True, float(data.get("seconds") or 0.0)))
                    return data["result"], True
            except (json.JSONDecodeError, KeyError, AttributeError, TypeError, ValueError):
                pass
        t0 = time.perf_counter()
        result = compute()
        seconds = time.perf_counter() - t0
        write_atomic(path, json.dumps({"params": params, "seconds": seconds, "result": result},
                                      default=json_default))
        self.entries.append((name, False, seconds))
        return json.loads(json.dumps(result, default=json_default)), False


def _holds(value: Any, key: str) -> bool:
    """Whether `key` is a key of `value` or of any dict nested in it (through dicts and lists)."""
    if isinstance(value, dict):
        return key in value or any(_holds(v, key) for v in value.values())
    if isinstance(value, list):
        return any(_holds(v, key) for v in value)
    return False


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename, so a report interrupted while writing
    (Ctrl-C, a kill) leaves the previous entry or none, never a truncated one (nor the temporary file)."""
    from esft.rundir import write_text_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)
