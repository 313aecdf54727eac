"""Run-directory files shared by ES and GRPO runs: append-only JSONL logs, checkpoint folders, the run result.

Both trainers write the same layout (`config.yaml`, `metrics.jsonl`, `samples/`, `checkpoints/iter_XXXXXX/`,
`checkpoints/final/`), so analyses walk either kind of run the same way. What only ES writes (seeds.jsonl, fp32
masters in its checkpoints) is in esft.es.es_rundir; GRPO's TRL checkpoints in esft.grpo.trl_trainer.

Each JSONL line is written whole and fsynced, so a crash leaves at most a torn last line, which readers skip; an
unreadable line with records after it is damage, not a crash, and reading fails naming the file and line
(`CorruptLogError`) rather than dropping what follows. Checkpoint folders are written aside and renamed into place
(`replace_dir`), so a checkpoint is complete or absent. One writer per run directory: `RunLock` (an flock on
`<dir>/.lock`) is held by every trainer and experiment runner while it writes (a trainer takes it through
`esft.run_undo.locked_run_folder`).
"""

from __future__ import annotations

import errno
import fcntl
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


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped a run, which saved what it could; the message says how to continue it. The
    command line prints the message once, in place of its plain "interrupted"."""


#: The keys of every `kind: eval` record in metrics.jsonl, ES's and GRPO's alike (esft.analysis, esft.export and
#: esft.es.curve read them). `train_*` is the current weights on the step's train batch, which only ES measures:
#: None in a GRPO run. HELD_OUT_KEYS follow when the run has a held-out set (eval_limit > 0).
EVAL_KEYS = ("kind", "step", "train_reward", "train_accuracy", "train_format_rate", "seconds", "peak_rss_mb")
HELD_OUT_KEYS = ("test_n", "test_accuracy", "test_ci95", "test_format_rate", "test_accuracy_among_well_formed",
                 "test_tokens_generated", "test_constant_baseline", "test_constant_baseline_ci95",
                 "test_constant_answer", "test_answer_counts")


def say(line: str) -> None:
    """A progress line for the user ("esft: resuming ...", a Ray run's start), on stderr with esft's other
    progress lines; above a run's progress bar (tqdm) when one is showing, not through it."""
    from tqdm.auto import tqdm

    tqdm.write(line, file=sys.stderr)


def resuming_line(folder: str | Path, unit: str, at: int, total: int, source: str) -> str:
    """The line a resumed run starts with: where it continues, so a user sees it picked up the run meant."""
    return f"esft: resuming {folder} at {unit} {at} of {total} ({source})"


def finished_line(folder: str | Path, unit: str, done: int, setting: str, total: int) -> str:
    """What a resume of a run that has trained all it was asked to says instead of `resuming_line`."""
    return f"{folder}: already trained for {done} {unit}{'s' * (done != 1)} ({setting} {total}); nothing to do"


def held_out_fields(rows: list[dict[str, Any]], tokens_generated: int,
                    baseline: dict[str, Any] | None) -> dict[str, Any]:
    """The HELD_OUT_KEYS of an evaluation record, from one row per held-out example: `score`, `well_formed`
    (None or absent for a task that checks no format) and `extracted` where the task extracts an answer;
    `baseline` is the task's constant_baseline of the same examples ({} or None when gold answers are unknown),
    kept only while every score lies in [0, 1] (`score_name`: a share of examples says nothing beside a mean reward).
    A value the task does not give (format rate, answer counts, baseline) is None."""
    import math

    from esft.tasks.labels import ACCURACY, score_name, scores_interval

    n = len(rows)
    scores = [float(r["score"]) for r in rows]
    correct = math.fsum(scores)
    checked = bool(rows) and rows[0].get("well_formed") is not None
    formed = [float(r["score"]) for r in rows if r.get("well_formed")]
    answers: dict[str, int] = {}
    for r in rows:
        if "extracted" in r:  # e.g. a yes-bias shows here (docs/results/es-cpu-demo)
            answers[str(r["extracted"])] = answers.get(str(r["extracted"]), 0) + 1
    baseline = baseline if baseline and score_name(scores) == ACCURACY else {}
    return {
        "test_n": n, "test_accuracy": correct / n if n else 0.0, "test_ci95": list(scores_interval(scores)),
        "test_format_rate": sum(bool(r.get("well_formed")) for r in rows) / n if checked else None,
        "test_accuracy_among_well_formed": math.fsum(formed) / len(formed) if checked and formed else None,
        "test_tokens_generated": tokens_generated,
        **{f"test_{k}": baseline.get(k) for k in ("constant_baseline", "constant_baseline_ci95", "constant_answer")},
        "test_answer_counts": dict(sorted(answers.items(), key=lambda kv: -kv[1])[:10]) if answers else None,
    }


def held_out_text(rec: dict[str, Any]) -> str:
    """`held-out accuracy 0.500 [0.150, 0.850] (format 1.00), constant answer 'no' 0.750 [0.301, 0.954]`: an
    evaluation record's (held_out_fields) mean with its 95% interval and, for an accuracy, what always giving the
    most frequent gold answer scores on the same examples; a mean reward (esft.tasks.labels.score_name) has none."""
    from esft.tasks.labels import ACCURACY, summaries_score_name

    name = summaries_score_name([rec])
    lo, hi = rec["test_ci95"]
    text = f"held-out {name} {rec['test_accuracy']:.3f} [{lo:.3f}, {hi:.3f}]"
    if rec.get("test_format_rate") is not None:
        text += f" (format {rec['test_format_rate']:.2f})"
    baseline = rec.get("test_constant_baseline")
    if name == ACCURACY and baseline is not None:
        interval = rec.get("test_constant_baseline_ci95")  # none recorded: the point alone, no made-up bounds
        bounds = f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else ""
        text += f", constant answer {str(rec.get('test_constant_answer'))[:16]!r} {baseline:.3f}{bounds}"
    return text


class CorruptLogError(RuntimeError):
    """A JSONL log has an unreadable record before its last line (damage, not a torn write)."""


class NonFiniteError(RuntimeError):
    """A NaN or infinite fitness, update or loss: training stops before the bad weights are written."""


class RunFailed(RuntimeError):
    """An error after a run logged steps (a reward that raises on a new completion, say): a failure at run time
    (exit code 1), whose message keeps the cause and says what is kept and how to continue once it is fixed."""

    def resumed_by(self, how: str) -> "RunFailed":
        """This failure with its `esft train ... --resume` command replaced by `how` (an experiment resumes its
        stages itself), caused by the same error."""
        import re

        again = RunFailed(re.sub(r"`esft train [^`]*`", how, str(self)))
        again.__cause__ = self.__cause__
        return again


class RunDirBusy(RuntimeError):
    """Another process holds the lock of a run (or experiment) directory."""


class RunLock:
    """An exclusive, non-blocking flock on `<folder>/.lock` for as long as one writer works in `folder`; the
    kernel drops it when the process dies, so a killed run never leaves a stale lock."""

    def __init__(self, folder: str | Path, what: str = "run"):
        self.path = Path(folder) / ".lock"
        self.what = what
        self.fh: Any = None

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.path, "a+")
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.fh.seek(0)
            self.fh.truncate()
            self.fh.write(str(os.getpid()))
            self.fh.flush()
        except BaseException as exc:  # any failure (a busy lock, a file system without locks, a full disk) frees it
            fh, self.fh = self.fh, None
            try:
                fh.close()  # flushes the unwritten pid again: on a full disk that fails too, and must not hide `exc`
            except OSError:
                pass
            if isinstance(exc, BlockingIOError):
                raise RunDirBusy(f"another esft process is writing the {self.what} in {self.path.parent} "
                                 f"(it holds {self.path}); wait for it or choose another output folder") from None
            raise
        return self

    def release(self) -> None:
        if self.fh is not None:
            fcntl.flock(self.fh, fcntl.LOCK_UN)
            self.fh.close()
            self.fh = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def lock_held(folder: str | Path) -> bool:
    """True while a process holds the RunLock of `folder` (read-only probe: a shared non-blocking flock on its
    `.lock`, released at once; the file is neither created nor written)."""
    path = Path(folder) / ".lock"
    try:
        fh = open(path, "r")
    except OSError:
        return False
    try:
        fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        fh.close()  # closing drops a lock taken here
    return False


def check_not_busy(folder: str | Path) -> None:
    """Raise RunDirBusy while another esft process writes in `folder`. The probe (`lock_held`) creates nothing, so a
    run refused afterwards, before it starts (a missing tracker package, say), leaves no folder or lock behind."""
    if lock_held(folder):
        RunLock(folder).acquire().release()  # raises RunDirBusy, naming the holder's lock


#: errno values of a full disk or quota: a run's writes stop with the resume command (its trainer says which)
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def holds_run(folder: str | Path) -> bool:
    """True when `folder` holds records or checkpoints of any run, ES or GRPO: a new run there (without resume)
    would delete or overwrite them. A trainer that recognised only its own kind of run would wipe the other's."""
    folder = Path(folder)
    if any(read_jsonl(folder / name) for name in ("metrics.jsonl", "seeds.jsonl")):
        return True
    root = folder / CHECKPOINTS
    return root.is_dir() and any(not p.name.startswith(".") for p in root.iterdir())


def is_run_dir(folder: str | Path) -> bool:
    """True for a run directory as the analyses find one: config.yaml beside a log (metrics, seeds or drift) or
    checkpoints/."""
    folder = Path(folder)
    return (folder / "config.yaml").exists() and any((folder / n).exists() for n in
                                                     ("metrics.jsonl", "seeds.jsonl", "drift.jsonl", CHECKPOINTS))


def enclosing_run_dir(path: str | Path) -> Path | None:
    """The nearest run directory above `path` (a checkpoint folder such as RUN/checkpoints/final is inside its
    run), or None."""
    return next((p for p in Path(path).resolve().parents if is_run_dir(p)), None)


def occupied_error(folder: str | Path, algorithm: str) -> FileExistsError:
    """The refusal of a new `algorithm` ('es' or 'grpo') run in a folder that holds a run: its advice to resume is
    the other trainer's command when config.yaml shows the other algorithm wrote the run (this trainer's --resume
    would refuse it)."""
    from esft.config import load_yaml_lines
    from esft.saved_config import RESUME_COMMAND, saved_algorithm

    try:
        found = saved_algorithm(load_yaml_lines(Path(folder) / "config.yaml")[0])
    except (OSError, ValueError):  # no or unreadable config.yaml: the resume itself says what is wrong
        found = None
    if found is not None and found != algorithm:
        kinds = {"es": "an ES", "grpo": "a GRPO"}
        return FileExistsError(f"{folder} already holds {kinds[found]} run (continue it with "
                               f"`{RESUME_COMMAND[found].format(dir=folder)}`): choose a new output_dir for this "
                               f"{algorithm.upper()} run")
    return FileExistsError(f"{folder} already holds a run: continue it with --resume (resume=True in Python) or "
                           "choose a new output_dir")


def examples_digest(examples: Iterable[Any]) -> str | None:
    """sha256 of a split's examples, in order (config.yaml's `_run.train_sha256`): the same on every machine;
    None for examples holding values JSON cannot write (a task object's own types, whose text may hold an address)."""
    import hashlib

    try:
        text = json.dumps(list(examples), sort_keys=True, ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_same_train_set(run_dir: str | Path, digest: str | None) -> None:
    """Refuse to resume `run_dir` on train examples other than those it started on (`examples_digest`, recorded
    in config.yaml by runs since esft recorded it): the resumed run would not continue the one it started."""
    from esft.saved_config import recorded_run

    recorded = recorded_run(run_dir).get("train_sha256")
    if recorded and digest and recorded != digest:
        raise ValueError(f"cannot resume {run_dir}: its train examples changed since it started (sha256 "
                         f"{recorded[:12]}..., now {digest[:12]}...: a data file edited, or the task reading other "
                         "rows), so the resumed run would not continue the one it started; restore the data, or "
                         "start a new run in another --output-dir")


def check_new_run(folder: str | Path, algorithm: str, resume: bool) -> None:
    """Refuse, before any model loads, a new `algorithm` run (not `resume`) in a folder that holds a run
    (`holds_run`; the trainer checks again under the run's lock), and any run in an experiment's folder or inside
    another run's: their files would mix, and `esft report` finds no run inside another."""
    if (Path(folder) / "plan.json").is_file():
        raise ValueError(f"{folder} is an experiment folder (it holds plan.json): a run there would write its "
                         "config.yaml and checkpoints among the experiment's files; choose another output_dir")
    outer = enclosing_run_dir(folder)
    if outer is not None:
        raise ValueError(f"{folder} is inside the run folder {outer}: a run there would mix its files with that "
                         "run's, and `esft report` would not find it; choose an output_dir outside it")
    if not resume and holds_run(folder):
        raise occupied_error(folder, algorithm)


def check_output_dir(path: str | Path, what: str = "output_dir") -> None:
    """Fail before any work when `path` cannot become a writable folder: it is a file, sits under a file, or its
    nearest existing folder is not writable."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{what} {path} is a file, not a folder")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise NotADirectoryError(f"{what} {path} cannot be created: {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"{what} {path} is not writable ({parent} does not allow writing)")


def write_text_atomic(path: str | Path, text: str) -> None:
    """Replace a file whole (config.yaml, an evaluation's JSONL and summary.json): written aside, fsynced, renamed
    over, so a crash or Ctrl-C leaves the old or the new file, never a cut one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk or a Ctrl-C leaves no cut copy beside the file
        raise


# ---- JSONL logs -----------------------------------------------------------------------------------------------------

def append_jsonl(path: Path, record: dict[str, Any], sync: bool = True) -> None:
    line = json.dumps(record, separators=(",", ":")) + "\n"
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
    except OSError as exc:
        if exc.filename is None:  # a failed write or flush (a full disk) names no file by itself
            exc.filename = str(path)
        raise


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL file. A torn last line (unterminated or unreadable: a crash mid-write) is ignored; an
    unreadable line with records after it raises CorruptLogError naming the file and line."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = fh.readlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line) if line.endswith("\n") or i < last else None
        except json.JSONDecodeError as exc:
            record, problem = None, str(exc)
        else:
            problem = "not a JSON object"
        if isinstance(record, dict):
            records.append(record)
        elif i == last:
            break  # torn write at a crash
        else:
            raise CorruptLogError(f"{path}:{i + 1}: unreadable record ({problem}); the {last - i} line(s) after it "
                                  f"are not dropped silently: repair or delete line {i + 1} and retry")
    return records


def rewrite_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Atomically replace a JSONL file (used on resume to drop records past the resume point)."""
    write_text_atomic(path, "".join(json.dumps(rec, separators=(",", ":")) + "\n" for rec in records))


def filter_jsonl(path: Path, keep: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    records = [r for r in read_jsonl(path) if keep(r)]
    if Path(path).exists():
        rewrite_jsonl(path, records)
    return records


# ---- checkpoint folders -------------------------------------------------------------------------------------------

def checkpoint_name(step: int) -> str:
    return f"iter_{step:06d}"


def current_umask() -> int:
    """This process's umask, read from /proc where Linux shows it; else by setting it and back, which leaves it 0
    for an instant (a file another thread creates then would be writable by all)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            return next(int(line.split()[1], 8) for line in fh if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        umask = os.umask(0)
        os.umask(umask)
        return umask


def replace_dir(src: Path, dst: Path) -> None:
    """Move the complete folder `src` to `dst`, replacing any folder there: the old one is renamed aside first
    and deleted last, so at every moment either the old or the new `dst` is complete (ES and GRPO checkpoints).
    Its files take the modes of any new file (the umask's), as the files beside them have: safetensors writes the
    weights 0600, readable by their owner only."""
    umask = current_umask()
    for folder, _, names in os.walk(src):
        for name in names:
            try:
                os.chmod(os.path.join(folder, name), 0o666 & ~umask)
            except OSError:  # a file of another user's (a shared run folder): its modes are theirs to keep
                pass
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
        if folder.name.startswith("."):
            continue
        try:
            out.append((int(json.loads((folder / state_file).read_text())[step_key]), folder))
        except (ValueError, KeyError, TypeError, OSError):
            # TypeError: JSON that is no object, or a step that is no number; OSError: no state file yet, or one that
            # cannot be read (nor its folder entered)
            continue
    return sorted(out, key=lambda x: (x[0], x[1].name))


def demote_final(folder: Path, step: int) -> Path:
    """The `final` checkpoint of a run being extended, renamed as the numbered checkpoint of its step (what a run
    started with more steps holds there), replacing any folder of that name (a damaged copy, or the same
    weights)."""
    target = folder.with_name(checkpoint_name(step))
    replace_dir(folder, target)
    return target


def prune_checkpoints(checkpoints: list[tuple[int, Path]], limit: int) -> list[Path]:
    """Delete the oldest numbered checkpoints (`iter_XXXXXX`) of `checkpoints` ((step, folder), as
    `list_checkpoints` returns them) beyond the newest `limit`; `final` is never counted or deleted, nor is
    anything when `limit` is 0 (keep all). Resuming needs only the newest checkpoint (ES replays its seed log
    past it), so a limit bounds the disk a long run takes. Returns the folders deleted."""
    if limit <= 0:
        return []
    numbered = [folder for _, folder in checkpoints if folder.name.startswith("iter_")]
    for stale in (numbered[0].parent.glob(".old_*") if numbered else ()):  # left by a process killed mid-delete
        shutil.rmtree(stale, ignore_errors=True)
    gone = numbered[:-limit]
    for folder in gone:
        aside = folder.with_name(f".old_{folder.name}")  # out of list_checkpoints' sight first: never half a folder
        os.replace(folder, aside)
        shutil.rmtree(aside)
    return gone


__all__ = ["CHECKPOINTS", "DISK_FULL", "EVAL_KEYS", "HELD_OUT_KEYS", "CorruptLogError",
           "NonFiniteError", "RunDirBusy", "RunInterrupted", "RunLock", "TrainResult", "append_jsonl",
           "check_not_busy", "check_output_dir", "checkpoint_name", "demote_final", "enclosing_run_dir",
           "filter_jsonl", "finished_line", "held_out_fields", "held_out_text", "holds_run", "is_run_dir",
           "list_checkpoints", "lock_held", "peak_rss_mb", "prune_checkpoints", "read_jsonl", "replace_dir",
           "rewrite_jsonl", "write_text_atomic"]
