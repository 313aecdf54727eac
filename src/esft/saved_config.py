"""A run's saved config.yaml: which trainer wrote it, and reading it back to resume that run (not the other
trainer's, and never with default settings in place of a lost file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from esft.config import load_yaml_lines

#: how to continue a run of each algorithm, for the error that meets the other trainer's resume
RESUME_COMMAND = {"es": "esft train es --resume {dir}", "grpo": "esft train grpo --resume --output-dir {dir}"}


def saved_algorithm(data: Mapping[str, Any]) -> str | None:
    """'es' or 'grpo': which trainer wrote a saved config mapping (GRPO records it in `_run`; an ES config is
    known by its population), None when neither shows."""
    recorded = (data.get("_run") or {}).get("algorithm") if isinstance(data.get("_run"), Mapping) else None
    if recorded in RESUME_COMMAND:
        return recorded
    if "population_size" in data:
        return "es"
    return "grpo" if "num_generations" in data else None


def recorded_run(run_dir: str | Path) -> dict[str, Any]:
    """The `_run` block the trainer recorded in `<run_dir>/config.yaml` (versions, machine, digests, precision);
    {} where there is none or the file does not read (a resume refuses such a file itself)."""
    import yaml

    try:
        block = (yaml.safe_load((Path(run_dir) / "config.yaml").read_text()) or {}).get("_run")
    except (OSError, AttributeError, yaml.YAMLError):
        return {}
    return block if isinstance(block, dict) else {}


def with_earlier_segments(path: str | Path, run_info: dict[str, Any]) -> dict[str, Any]:
    """`run_info`, the `_run` block of a run segment about to start, with the blocks of the segments before it
    (a resumed run's config.yaml) under `earlier`, oldest first: each keeps the threads, versions and machine it ran
    on, which a resume on another machine or thread count would otherwise overwrite."""
    import yaml

    try:
        old = (yaml.safe_load(Path(path).read_text()) or {}).get("_run")
    except (OSError, yaml.YAMLError):
        return run_info  # a fresh run, or one whose file the resume refused already
    if not isinstance(old, dict) or not old:
        return run_info
    earlier = list(old.pop("earlier", None) or [])
    return {**run_info, "earlier": earlier + [old]}


def no_config_words(run_dir: str | Path) -> str:
    """Why `run_dir` cannot be resumed when it holds no config.yaml, in the words of a refusal."""
    path = Path(run_dir)
    return "it holds no config.yaml" if path.is_dir() else "not a folder" if path.exists() else "no such folder"


def read_saved_config(run_dir: str | Path, algorithm: str | None = None) -> dict[str, Any]:
    """The mapping a trainer saved in `<run_dir>/config.yaml`, for resuming: a missing, empty or unreadable file
    is refused (resuming it with default settings would train another run on this run's state), and so is the
    other algorithm's run when `algorithm` ('es' or 'grpo') names the trainer that asks."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        what = no_config_words(run_dir)
        raise FileNotFoundError(f"cannot resume {run_dir}: {what} (start a new run without --resume, or restore the "
                                "run's config.yaml)")
    data, _ = load_yaml_lines(path)
    if not data:
        raise ValueError(f"cannot resume {run_dir}: {path} is empty; restore the run's config.yaml (resuming "
                         f"with default settings would train another run on this run's state)")
    found = saved_algorithm(data)
    if algorithm is not None and found is not None and found != algorithm:
        kinds = {"es": "an ES", "grpo": "a GRPO"}
        raise ValueError(f"{run_dir} holds {kinds[found]} run, not {kinds[algorithm]} one (continue it with "
                         f"`{RESUME_COMMAND[found].format(dir=run_dir)}`)")
    return data


#: keys of a run's config.yaml that readers of its records (esft report, esft export, the analyses) use, with the
#: types they take and those types in words: a hand-edited value of another type failed deep inside them
RECORDED_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "model": ((str,), "text (the model the run started from)"),
    "model_name_or_path": ((str,), "text (the model the run started from)"),
    "task": ((str, list), "text (the task name) or a list of task names"),
    "task_name": ((str, list), "text (the task name) or a list of task names"),
    "task_options": ((dict,), "a mapping of option: value"),
    "_run": ((dict,), "a mapping (esft's record of the run)"),
}


def read_recorded_config(path: str | Path) -> dict[str, Any]:
    """The mapping of a run's config.yaml at `path`, read for what the run recorded (not to resume it: see
    `read_saved_config`); {} for an empty file. A file that does not parse, is no mapping, or gives one of
    `RECORDED_TYPES` a value of another type fails as one ValueError line naming the file and line."""
    data, lines = load_yaml_lines(path)
    for key, (types, words) in RECORDED_TYPES.items():
        value = data.get(key)
        if value is None:
            continue
        fits = isinstance(value, types) and not isinstance(value, bool)
        if fits and isinstance(value, list):
            fits = bool(value) and all(isinstance(v, str) for v in value)
        if not fits:
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            raise ValueError(f"{path}:{lines.get(key, 1)}: {key} is {shown}, expected {words}; restore the run's "
                             "config.yaml (its trainer wrote it) or correct that line")
    return data
