"""What a trainer adds to its run folder, undone when the run is refused or fails before it logs anything: the
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
    parents made for it, where empty) and restores a config.yaml that was overwritten, so a run refused or failed
    before it logged anything leaves the user's `output_dir` as it found it; nothing that was there before is
    removed."""

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

    def record(self) -> None:
        self.before = self._entries()
        config = self.folder / "config.yaml"
        self.config = config.read_bytes() if config.is_file() else None

    def _entries(self) -> set[str]:
        if not self.folder.is_dir():
            return set()
        found = {p.name for p in self.folder.iterdir()}
        for sub in _LAYOUT_DIRS:
            if (self.folder / sub).is_dir():
                found |= {f"{sub}/{p.name}" for p in (self.folder / sub).iterdir()}
        return found

    def undo(self) -> None:
        """Remove what was added since, unless the folder now holds a run or a GRPO step's drift line (then the run's
        resume needs it all)."""
        try:
            if not self.folder.is_dir() or holds_run(self.folder) or read_jsonl(self.folder / "drift.jsonl"):
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


@contextmanager
def locked_run_folder(folder: str | Path) -> Iterator[RunLock]:
    """The RunLock of `folder` while one trainer sets up and runs there; an Exception (a refusal, a failed first
    step) before the folder holds a run undoes what this invocation added (FolderChanges). Ctrl-C keeps it: the
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


__all__ = ["FolderChanges", "locked_run_folder"]
