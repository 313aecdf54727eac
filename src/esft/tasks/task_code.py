"""The user code a task runs (its class, its reward functions): the files that define it and one digest of them,
recorded in a run's config.yaml (`_run.task_code`), so that a resume can say the code changed since the run
started. A data file's rows are checked by their own digest (`_run.train_sha256`, refused when they differ); code is
only warned of: a resume that fixes a reward's bug is a legitimate choice, but the run it continues no longer
scores as it did, which its curve would otherwise hide."""

from __future__ import annotations

import hashlib
import inspect
import warnings
from pathlib import Path
from typing import Any

from esft.tasks.custom import TaskAdapter
from esft.tasks.dataset_task import DatasetTask, reward_parts
from esft.tasks.verifiers import import_object

#: esft's own package folder: its built-in tasks and verifiers are the installed version's, recorded as `esft`
_PACKAGE = Path(__file__).resolve().parents[1]


def _code_objects(task: Any) -> list[Any]:
    """The classes and functions whose source decides what `task` does."""
    if isinstance(task, TaskAdapter):
        return [type(task.obj)]
    if isinstance(task, DatasetTask):
        found = []
        for part in reward_parts(task.reward):
            if callable(part):
                found.append(part)
            elif ":" in part and not part.startswith("regex:"):
                try:
                    found.append(import_object(part, "reward"))
                except ValueError:  # the task resolved it when it was built: nothing to record otherwise
                    pass
        return found
    return [type(task)]


def _source_file(obj: Any) -> Path | None:
    try:
        path = inspect.getsourcefile(obj)
    except (TypeError, OSError):  # a builtin, a class made at run time
        return None
    if path is None or not Path(path).is_file():
        return None
    path = Path(path).resolve()
    return None if _PACKAGE in path.parents else path


def task_code(task: Any) -> dict[str, Any] | None:
    """{"files": the user files defining `task`, "sha256": their digest}, or None for a task of esft's own."""
    files = sorted({f for obj in _code_objects(task) if (f := _source_file(obj)) is not None})
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}\0".encode() + path.read_bytes() + b"\0")
    return {"files": [str(f) for f in files], "sha256": digest.hexdigest()}


def warn_if_task_code_changed(run_dir: str | Path, task: Any) -> None:
    """Warn where the run at `run_dir` recorded task code (`_run.task_code` of its config.yaml) whose digest
    differs from that of `task`'s code now, which the resume runs."""
    from esft.saved_config import recorded_run

    recorded = recorded_run(run_dir).get("task_code")
    current = task_code(task) if isinstance(recorded, dict) and recorded.get("sha256") else None
    if current and recorded["sha256"] != current["sha256"]:
        warnings.warn(f"resuming {run_dir} with task code changed since the run started ({', '.join(current['files'])}"
                      f"): the steps from here on score with the new code, the earlier ones were scored with the "
                      "old; start a new run in another --output-dir to compare like with like", stacklevel=3)


__all__ = ["task_code", "warn_if_task_code_changed"]
