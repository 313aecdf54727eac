"""Experiment trackers for ES runs: `report_to` (TRL's name and values) = none, tensorboard, wandb, trackio or a
comma-separated list of them. Off by default; each backend is an optional extra (`pip install 'esft[tensorboard]'`,
`'esft[wandb]'`, `'esft[trackio]'`). GRPO hands the same value to TRL, which logs through its own integrations
(esft.grpo.callbacks points TensorBoard at `<run_dir>/tensorboard`, opens the folder's wandb run as ES does, and adds
the held-out evaluations under `eval/` and the train values TRL does not log under ES's names: `train/accuracy`,
`train/format_rate`, `train/time/total`...).

    tracker = open_tracker("tensorboard", run_dir, run_name, config_dict)
    tracker.log({"fitness": {"mean": 0.4}, "test_ci95": [0.2, 0.6]}, step=3, prefix="train")
    tracker.log_table("samples", [{"score": 1.0, "completion": "..."}], step=3)
    tracker.close()

Records are flattened to scalars (`train/fitness/mean`, `eval/test_ci95/low` and `/high`); text and flags are left
out. TensorBoard writes event files to `<run_dir>/tensorboard`; wandb to `<run_dir>/wandb`, in the run the folder
keeps the id of (open_wandb; `WANDB_PROJECT`, `WANDB_MODE=offline` runs without a network); trackio to its own
place (`TRACKIO_PROJECT`), in the run whose name the folder keeps (trackio_run_name).
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

REPORT_TO = ("none", "tensorboard", "wandb", "trackio")
_EXTRAS = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}


def parse_report_to(value: str | Iterable[str] | None) -> list[str]:
    """The backends `value` names ("none" and empty = none); a ValueError for an unknown one."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(v).strip().lower() for v in items if str(v).strip()]
    bad = [n for n in names if n not in REPORT_TO]
    if bad:
        raise ValueError(f"report_to: unknown tracker {bad[0]!r}; one of {', '.join(REPORT_TO)} (or a comma list)")
    return list(dict.fromkeys(n for n in names if n != "none"))


def report_to_text(value: Any) -> Any:
    """`report_to` as the comma text a config stores: TRL's configs take a list too (`report_to: [tensorboard]`),
    so a list of names is joined; anything else is left for the field's checks."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return ",".join(value) or "none"
    return value


def report_to_rule() -> Any:
    """The `report_to` field's rule for esft.config.check_fields (so its error names where the value was set)."""
    from esft.config_rules import Rule

    def ok(value: Any) -> bool:
        try:
            parse_report_to(value)
        except ValueError:
            return False
        return True

    return Rule(f"one of {', '.join(REPORT_TO)} or a comma list of them", ok)


#: numbers of a record that are not measurements: its x axis (top-level keys only: GRPO's
#: `peak_rss_mb_after: {step: ...}` is a measurement), and the answer a constant-answer baseline gives
#: (Countdown's 55 is a value of the task, not a score)
NOT_SCALARS = ("step", "iteration")
NOT_SCALAR_SUFFIXES = ("constant_answer",)


def flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Finite numbers of a (nested) record under slash-joined keys; a two-number list is an interval (low/high).
    The record's own NOT_SCALARS and names ending in NOT_SCALAR_SUFFIXES are left out."""
    return _numbers({k: v for k, v in record.items() if str(k) not in NOT_SCALARS}, prefix)


def _numbers(record: Mapping[str, Any], prefix: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if str(key).endswith(NOT_SCALAR_SUFFIXES):
            continue
        if isinstance(value, Mapping):
            out.update(_numbers(value, name))
        elif isinstance(value, (list, tuple)) and len(value) == 2 and all(_is_number(v) for v in value):
            for end, v in zip(("low", "high"), value):
                if math.isfinite(float(v)):  # the rule of every scalar: a NaN end is left out
                    out[f"{name}/{end}"] = float(v)
        elif _is_number(value) and math.isfinite(float(value)):
            out[name] = float(value)
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def table_markdown(rows: list[Mapping[str, Any]], max_chars: int = 300) -> str:
    """Rows as a Markdown table (TensorBoard's text plugin renders it); long cells are cut."""
    if not rows:
        return ""
    columns = list(dict.fromkeys(k for r in rows for k in r))

    def cell(v: Any) -> str:
        text = str(v).replace("|", "\\|").replace("\n", " ")
        return text if len(text) <= max_chars else text[:max_chars] + "..."

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


class Tracker:
    """Sends records to every opened backend (none: does nothing)."""

    def __init__(self, backends: list[Any] | None = None):
        self.backends = backends or []

    def log(self, record: Mapping[str, Any], step: int, prefix: str = "") -> None:
        scalars = flatten(record, prefix)
        if scalars:
            for b in self.backends:
                b.log(scalars, step)

    def log_table(self, name: str, rows: list[Mapping[str, Any]], step: int) -> None:
        if rows:
            for b in self.backends:
                b.log_table(name, [dict(r) for r in rows], step)

    def close(self, failed: bool = False) -> None:
        """Closes every backend, even after one fails to (its unflushed data would be lost); then raises the
        first failure. `failed`: the training did not end normally (wandb marks the run failed)."""
        backends, self.backends, error = self.backends, [], None
        for b in backends:
            try:
                b.close(failed)
            except Exception as exc:  # re-raised below, once the others are closed
                error = error or exc
        if error is not None:
            raise error


class TensorBoardBackend:
    def __init__(self, run_dir: Path, run_name: str, config: Mapping[str, Any]):
        from torch.utils.tensorboard import SummaryWriter

        folder = run_dir / "tensorboard"
        resumed = folder.is_dir() and any(p.name.startswith("events.out.tfevents") for p in folder.iterdir())
        self.writer = SummaryWriter(log_dir=str(folder))
        if not resumed:  # a resume's copy at step 0 would stand beside the first; config.yaml records any change
            self.writer.add_text("config", "```\n" + "\n".join(f"{k}: {v}" for k, v in config.items()) + "\n```",
                                 0)

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        self.writer.add_text(name, table_markdown(rows), step)
        self.writer.flush()

    def close(self, failed: bool = False) -> None:
        self.writer.close()


#: where a run folder keeps its wandb run id (in wandb's own folder of the run)
WANDB_ID_FILE = "wandb/esft-run-id"
#: the x-axis of every esft metric in wandb and trackio, ES's and GRPO's alike (transformers' name: TRL's own
#: metrics use it; in trackio, GRPO's own step counts transformers' log calls, so only this key lines the two up)
WANDB_STEP = "train/global_step"


def wandb_run_id(run_dir: Path) -> str:
    """The wandb run id of `run_dir`: the one the folder keeps (WANDB_ID_FILE), else WANDB_RUN_ID where set
    (wandb's own variable), else a new random one; kept in the folder either way. A resumed run thus logs on in the
    wandb run it started instead of opening a second one, whatever the environment says by then."""
    import secrets
    import string

    path = Path(run_dir) / WANDB_ID_FILE
    kept = path.read_text().strip() if path.is_file() else ""
    if kept:
        return kept
    new = os.environ.get("WANDB_RUN_ID") or "".join(secrets.choice(string.ascii_lowercase + string.digits)
                                                     for _ in range(8))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new + "\n")
    return new


def open_wandb(run_dir: Path, run_name: str, config: Mapping[str, Any] | None = None) -> Any:
    """The wandb run of a run folder, for ES and GRPO alike: project WANDB_PROJECT (default "esft"), named after the
    run, its files in `<run>/wandb`, its id the folder's (wandb_run_id), resumed where it exists already. Metrics
    are plotted over WANDB_STEP, not wandb's own step: a resume logs again the evaluation a stop interrupted, at a
    step wandb's resumed counter has passed (it would drop it)."""
    import wandb

    run = wandb.init(project=os.environ.get("WANDB_PROJECT", "esft"), name=run_name, dir=str(run_dir),
                     id=wandb_run_id(run_dir), resume="allow", config=dict(config or {}), reinit="finish_previous")
    run.define_metric(WANDB_STEP)
    run.define_metric("*", step_metric=WANDB_STEP, step_sync=True)
    return run


def finish_wandb(run: Any, failed: bool) -> None:
    """Ends `run`, marked failed (exit code 1) when the training did not end normally. After a failure, an error
    of the finish itself is a warning: the training's error is the one to report."""
    import sys

    try:
        run.finish(exit_code=1 if failed else 0)
    except Exception as exc:
        if not failed:
            raise
        print(f"esft: warning: the wandb run did not finish cleanly: {type(exc).__name__}: {exc}", file=sys.stderr)


class WandbBackend:
    """An ES run's wandb run (open_wandb); a run the caller opened already (in a notebook: its entity, tags or
    group) is logged to and left open, as transformers does for GRPO."""

    def __init__(self, run_dir: Path, run_name: str, config: Mapping[str, Any]):
        import wandb

        self.wandb = wandb
        self.owned = wandb.run is None
        self.run = open_wandb(run_dir, run_name, config) if self.owned else wandb.run

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        self.run.log({**scalars, WANDB_STEP: step})

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
        # otherwise each column keeps its first row's type, down into a row's `example`: examples whose fields differ
        # from row to row in presence or type (a data file's, IFEval's kwargs) made wandb raise TypeError, which
        # stopped the run at its evaluation
        table = self.wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows],
                                 allow_mixed_types=True)
        self.run.log({name: table, WANDB_STEP: step})

    def close(self, failed: bool = False) -> None:
        if self.owned:
            finish_wandb(self.run, failed)


#: where a run folder keeps the name of its trackio run: trackio finds the run to resume by its name
TRACKIO_NAME_FILE = "trackio-run-name"


def trackio_project() -> str:
    """The trackio project of esft's runs, ES's and GRPO's alike: TRACKIO_PROJECT, default "esft"."""
    return os.environ.get("TRACKIO_PROJECT", "esft")


def trackio_run_name(run_dir: Path, run_name: str, project: str, remote: bool = False) -> str:
    """The trackio run name of `run_dir`: the one the folder keeps (TRACKIO_NAME_FILE), else `run_name`, with a
    random suffix where that name is another folder's in `project` (trackio would resume that folder's run), or
    where the runs are stored `remote`ly (a Space or server, whose runs are not listed here); kept in the folder
    either way, so that a resumed run logs on in the trackio run it started."""
    path = Path(run_dir) / TRACKIO_NAME_FILE
    kept = path.read_text().strip() if path.is_file() else ""
    if kept:
        return kept
    name = _suffixed(run_name) if remote else run_name
    while not _reserve_trackio_name(project, name, Path(run_dir)):
        name = _suffixed(run_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(name + "\n")
    return name


def _suffixed(name: str) -> str:
    import secrets
    import string

    return f"{name}-" + "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(6))


def _reserve_trackio_name(project: str, name: str, run_dir: Path) -> bool:
    """True when `name` is free for `run_dir` in `project`, and then reserved for it: no run of that name in
    trackio's local store, and none reserved by another folder in TRACKIO_DIR/esft-run-names (trackio lists a run
    only once it has logged, so two folders starting at once, or one stopped before its first log, would both
    find the name free)."""
    import hashlib

    import trackio
    from trackio.utils import TRACKIO_DIR

    try:
        if name in {run.name for run in trackio.Api().runs(project)}:
            return False
    except ValueError:  # no such project yet
        pass
    key = hashlib.sha256(f"{project}\n{name}".encode()).hexdigest()[:32]
    mark, owner = Path(TRACKIO_DIR) / "esft-run-names" / key, str(Path(run_dir).resolve())
    mark.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return mark.read_text().split("\n")[0] == owner
    with os.fdopen(fd, "w") as f:
        f.write(f"{owner}\n{project}\n{name}\n")
    return True


def trackio_remote() -> bool:
    """Whether trackio stores its runs in a Space or on a server (its own variables), not only locally."""
    return bool(os.environ.get("TRACKIO_SPACE_ID") or os.environ.get("TRACKIO_SERVER_URL"))


class TrackioBackend:
    """An ES run's trackio run (trackio_run_name), resumed where it exists already."""

    def __init__(self, run_dir: Path, run_name: str, config: Mapping[str, Any]):
        import trackio

        self.trackio = trackio
        project = trackio_project()
        name = trackio_run_name(run_dir, run_name, project, trackio_remote())
        self.run = trackio.init(project=project, name=name, resume="allow", config=dict(config))

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        self.trackio.log({**scalars, WANDB_STEP: step}, step=step)

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
        table = self.trackio.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])
        self.trackio.log({name: table, WANDB_STEP: step}, step=step)

    def close(self, failed: bool = False) -> None:
        self.trackio.finish()


_BACKENDS = {"tensorboard": TensorBoardBackend, "wandb": WandbBackend, "trackio": TrackioBackend}


def check_backends(report_to: str | Iterable[str] | None) -> list[str]:
    """The backends of `report_to`, each importable: a missing one is a ValueError naming its extra, raised before
    a run starts."""
    import importlib.util

    names = parse_report_to(report_to)
    for name in names:  # each tracker's import name is its report_to name
        spec = importlib.util.find_spec(name)
        folders = list(getattr(spec, "submodule_search_locations", None) or [])
        # a bare folder of that name on sys.path (wandb's own `./wandb` run folder, with `python -m esft` or in a
        # notebook) imports as an empty namespace package: the run would fail at `wandb.init`, after the model loads
        if spec is None or folders and spec.origin in (None, "namespace"):
            shadow = f" (found only the folder {folders[0]})" if folders else ""
            raise ValueError(f"report_to {name!r} needs the {name} package{shadow}: "
                             f"pip install 'esft[{_EXTRAS[name]}]'")
    if "wandb" in names:
        _check_wandb_account()
    if "trackio" in names:
        _check_trackio_space()
    return names


def _check_trackio_space() -> None:
    """A trackio Space (TRACKIO_SPACE_ID, trackio's own variable) takes a Hugging Face login: without one
    `trackio.init` fails once the model has loaded (an experiment's, after its base model's evaluations). Asked here
    instead, from the token huggingface_hub finds (HF_TOKEN, `hf auth login`); not verified (no network call)."""
    space = os.environ.get("TRACKIO_SPACE_ID")
    if not space:
        return
    from huggingface_hub import get_token

    if not get_token():
        raise ValueError(f"report_to 'trackio': TRACKIO_SPACE_ID={space!r} logs to a Hugging Face Space, which needs "
                         "a Hugging Face login (`hf auth login`, or HF_TOKEN); or unset TRACKIO_SPACE_ID to log to "
                         "trackio's local store")


def _check_wandb_account() -> None:
    """Online, wandb needs an account: without an API key `wandb.init` fails once the model has loaded. Asked here
    instead, through wandb's own login (which reads WANDB_API_KEY and ~/.netrc, and on a terminal asks for the key
    or offers to run offline); offline and disabled modes need none. The key is not verified (no network call):
    a revoked one still fails at `wandb.init`. Asked once per process and setting, not for every run of a spec."""
    mode = os.environ.get("WANDB_MODE", "online")
    if mode not in ("offline", "disabled", "dryrun"):
        _wandb_login(mode, os.environ.get("WANDB_API_KEY"))


@functools.cache
def _wandb_login(mode: str, key: str | None) -> None:  # cached when it passes: a refusal raises, and is asked again
    import wandb

    try:
        wandb.login(verify=False)
    except wandb.errors.UsageError as exc:
        raise ValueError(f"report_to 'wandb': {str(exc).rstrip('. ')}. Or log without an account, to <run>/wandb: "
                         "WANDB_MODE=offline") from None


def open_tracker(report_to: str | Iterable[str] | None, run_dir: str | Path, run_name: str,
                 config: Mapping[str, Any]) -> Tracker:
    """A Tracker over the backends `report_to` names (an empty one for none). A backend that fails to open (wandb
    without an API key) closes those opened before it, then its error is raised."""
    names = check_backends(report_to)
    tracker = Tracker()
    try:
        for n in names:
            tracker.backends.append(_BACKENDS[n](Path(run_dir), run_name, config))
    except BaseException as exc:
        try:
            tracker.close(failed=True)
        except Exception as close_error:  # the opening error is the one to report; this one goes beside it
            exc.add_note(f"closing the trackers opened before it failed too: {close_error!r}")
        raise
    return tracker


__all__ = ["REPORT_TO", "TRACKIO_NAME_FILE", "WANDB_ID_FILE", "WANDB_STEP", "Tracker", "check_backends",
           "finish_wandb", "flatten", "open_tracker", "open_wandb", "parse_report_to", "report_to_text",
           "table_markdown", "trackio_project", "trackio_remote", "trackio_run_name", "wandb_run_id"]
