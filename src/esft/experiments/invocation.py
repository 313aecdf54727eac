"""One `esft experiment run` invocation in its folder: the lock that keeps a second runner out, and the heartbeat
that lets the next invocation log one killed without a chance to log itself (SIGKILL, power loss) with the wall
time it had reached.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from esft.experiments.stage_eval import read_json, write_json
from esft.rundir import RunDirBusy, RunLock


def timestamp() -> str:
    """The local time, to the second, as status.json and invocations.jsonl record it."""
    return datetime.datetime.now().isoformat(timespec="seconds")


class ExperimentBusy(RunDirBusy):
    """Another runner holds the experiment folder."""


def experiment_lock(root: Path) -> RunLock:
    """One runner per experiment folder (two would write the same run directories): esft.rundir's lock, with the
    runner's own error."""

    class _ExperimentLock(RunLock):
        def acquire(self) -> RunLock:
            try:
                return super().acquire()
            except RunDirBusy:
                raise ExperimentBusy(f"another `esft experiment run` is working in {root}") from None

    return _ExperimentLock(root, "experiment")


HEARTBEAT = ".heartbeat.json"
HEARTBEAT_EVERY_S = 30.0


class Heartbeat:
    """Keeps `<root>/.heartbeat.json` = {started, last, pid} fresh every HEARTBEAT_EVERY_S seconds while a runner
    works, so the wall time of an invocation killed without a chance to log it (SIGKILL, power loss) is still
    known, to within that interval, when the next invocation starts (`recover_killed_invocation`)."""

    def __init__(self, root: Path, started: str):
        self.path, self.started = root / HEARTBEAT, started
        self.t0 = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="esft-heartbeat", daemon=True)

    def beat(self) -> None:
        write_json(self.path, {"started": self.started, "last": timestamp(), "pid": os.getpid(),
                               "wall_s": time.perf_counter() - self.t0})

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_EVERY_S):
            self.beat()

    def __enter__(self) -> "Heartbeat":
        recover_killed_invocation(self.path.parent)  # a predecessor's heartbeat, before the first beat replaces it
        self.beat()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.path.unlink(missing_ok=True)


def recover_killed_invocation(root: Path) -> dict[str, Any] | None:
    """A heartbeat left behind means the previous invocation died without logging itself: log it now as
    interrupted, with the wall time it had reached at its last heartbeat. Call with the folder's lock held."""
    beat = read_json(root / HEARTBEAT)
    if not beat:
        return None
    record = {"started": beat.get("started"), "finished": beat.get("last"), "wall_s": float(beat.get("wall_s", 0.0)),
              "interrupted": True, "killed": True, "statuses": {}}
    with open(root / "invocations.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
    (root / HEARTBEAT).unlink(missing_ok=True)
    return record


__all__ = ["ExperimentBusy", "HEARTBEAT", "HEARTBEAT_EVERY_S", "Heartbeat", "experiment_lock",
           "recover_killed_invocation", "timestamp"]
