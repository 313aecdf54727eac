"""What a trainer adds to its run folder, undone when a new run is refused or fails before it trains a step: the
user's `output_dir` is left as it was found, so the same command with the option fixed starts cleanly."""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from esft.rundir import CHECKPOINTS, DISK_FULL, CorruptLogError, RunLock, holds_run, read_jsonl
from esft.tracking import TRACKIO_NAME_FILE

#: the run layout's folders, whose entries `FolderChanges` notes too (a failed attempt's samples, say)
_LAYOUT_DIRS = ("samples", CHECKPOINTS, "tensorboard")
#: what a trainer writes at the top of a run folder (besides its `.lock`, removed last) and, as `checkpoint-N`,
#: what TRL writes there: in a folder that existed before, `undo` removes only these (a file that the user, or
#: another program, puts beside them meanwhile is not the run's)
_RUN_NAMES = {"config.yaml", "metrics.jsonl", "seeds.jsonl", "drift.jsonl", "curve.png", "wandb", TRACKIO_NAME_FILE,
              *_LAYOUT_DIRS}
_RUN_PREFIXES = ("checkpoint-",)


def _a_run_name(name: str) -> bool:
    top = name.split("/")[0]
    return top in _RUN_NAMES or top.startswith(_RUN_PREFIXES)


class FolderChanges:
    """What one invocation adds to a run folder. Made before the folder is (the folders to make, whether a `.lock`
    is there), then `record`ed once the run holds the folder's lock (its entries and config.yaml: another
    process's undo may still change them before that). `undo` removes the additions (the folder itself and
    parents made for it, where empty) and restores a config.yaml that was overwritten, so a new run refused or
    failed before it trained a step leaves the user's `output_dir` as it found it; nothing that was there before
    is removed."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.made = []  # folders that do not exist yet, deepest first
        parent = self.folder
        while not parent.exists():
            self.made.append(parent)
            parent = parent.parent
        self.had_lock = (self.folder / ".lock").exists()
        self.before: set[str] = set()
        self.config: bytes | None = None
        self.held_run = False

    def record(self) -> None:
        self.before = self._entries()
        config = self.folder / "config.yaml"
        self.config = config.read_bytes() if config.is_file() else None
        try:
            self.held_run = self.folder.is_dir() and holds_run(self.folder)
        except CorruptLogError:  # a damaged log is still a run's
            self.held_run = True

    def _entries(self) -> set[str]:
        if not self.folder.is_dir():
            return set()
        found = {p.name for p in self.folder.iterdir()}
        for sub in _LAYOUT_DIRS:
            if (self.folder / sub).is_dir():
                found |= {f"{sub}/{p.name}" for p in (self.folder / sub).iterdir()}
        return found

    def undo(self) -> None:
        """Remove what was added since, unless the folder held a run before (a resume's) or now holds a trained step
        (then the run's resume needs it all). A new run that failed after its step-0 evaluation alone is removed
        with it: that evaluation is redone by the command that starts the run again, which could otherwise not
        start there (the folder would hold a run) nor resume it with the option that caused the failure changed."""
        try:
            if not self.folder.is_dir() or self.held_run or trained_something(self.folder):
                return
        except CorruptLogError:  # a damaged log is still a run's
            return
        added = self._entries() - self.before - {".lock"}
        if not self.made:  # the user's folder: only what the run writes
            added = {name for name in added if _a_run_name(name)}
        for name in sorted(added, key=lambda n: -n.count("/")):
            path = self.folder / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        if self.config is not None:  # the user's own (`--config DIR/config.yaml --output-dir DIR`, say)
            (self.folder / "config.yaml").write_bytes(self.config)
        if not self.had_lock:  # last, while still held: no other run starts in the folder before the undo ends
            (self.folder / ".lock").unlink(missing_ok=True)
        for folder in self.made:
            try:
                folder.rmdir()  # only an empty one
            except OSError:
                break


def trained_something(folder: Path) -> bool:
    """Whether a run folder holds more than a step-0 evaluation: an update in seeds.jsonl, a checkpoint, a GRPO
    step's drift line, or a metrics record of a step past 0 or of training. The Ray executor's events (`kind:
    executor`: its start, checksums) carry a step only once an update was applied: before that they train nothing."""
    if read_jsonl(folder / "seeds.jsonl") or read_jsonl(folder / "drift.jsonl"):
        return True
    root = folder / CHECKPOINTS
    if root.is_dir() and any(not p.name.startswith(".") for p in root.iterdir()):
        return True
    return any(r.get("kind") not in ("eval", "executor") or r.get("step", 0) != 0
               for r in read_jsonl(folder / "metrics.jsonl"))


@contextmanager
def locked_run_folder(folder: str | Path) -> Iterator[RunLock]:
    """The RunLock of `folder` while one trainer sets up and runs there; an Exception (a refusal, a failed first
    step) before a new run has trained a step undoes what this invocation added (FolderChanges). Ctrl-C keeps it: the
    interrupted run's resume reads its config.yaml, as does that of a full disk's (its error says so)."""
    changes = FolderChanges(folder)
    lock = RunLock(folder)
    recorded = False
    try:
        lock.acquire()
        changes.record()
        recorded = True
        yield lock
    except Exception as exc:
        disk_full = isinstance(exc, OSError) and exc.errno in DISK_FULL
        # the lock's holder alone (a busy folder is another process's), and only once it knows what it added: an
        # undo before `record` would take the folder's own files for this invocation's
        if recorded and lock.fh is not None and not disk_full:
            try:
                changes.undo()  # the .lock file too, while still held, so no other process takes it first
            except OSError:  # the error to report is the run's own
                pass
        raise
    finally:
        lock.release()


__all__ = ["FolderChanges", "locked_run_folder", "trained_something"]
