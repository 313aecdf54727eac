"""What the `esft analyze` commands accept: ranges checked when their configs are built, and the checkpoints, runs
and files they read checked to exist, so that a typo fails before the base model loads (seconds to minutes)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from esft.config import ConfigError, check_fields
from esft.config_rules import Rule, at_least, non_negative, positive
from esft.rundir import check_output_dir
from esft.validation import check_device, check_task


def _fractions(what: str) -> Rule:
    return Rule(f"a list of {what} in [0, 1]", lambda v: all(math.isfinite(x) and 0 <= x <= 1 for x in v))


#: rules by field name, for whichever of these fields an analysis config has
RULES: dict[str, Rule] = {
    "eps": non_negative(), "limit": at_least(1), "max_new_tokens": at_least(1), "batch_size": at_least(1),
    "kl_batch_size": at_least(1), "temperature": non_negative(), "population": at_least(1), "alpha": positive(),
    "interpolation_points": at_least(2), "magnitude_points": at_least(0), "threads": at_least(1),
    "max_passage_chars": at_least(1), "targets": _fractions("target sparsities"),
    "taus": Rule("a list of thresholds >= 0", lambda v: all(math.isfinite(x) and x >= 0 for x in v)),
}

#: fields naming what an analysis reads, and the words for it
PATHS: dict[str, str] = {
    "tuned": "checkpoint folder", "stages": "checkpoint folder", "es": "checkpoint folder",
    "grpo": "checkpoint folder", "aggregate": "kl.json file", "run": "run folder or drift JSONL file",
    "grpo_run": "run folder or drift JSONL file",
}


def check_analysis(config: Any) -> None:
    """Raise ConfigError for the first field of `config` (an analysis dataclass) out of range, naming a task esft
    cannot build, or naming a path that does not exist."""
    check_fields(config, RULES)
    for key in ("device", "stable_rank_device"):  # used only once the base model has loaded (torch's traceback)
        check_device(key, getattr(config, key, None))
    if getattr(config, "output_dir", None):  # written only after the analysis has run, for minutes
        check_output_dir(config.output_dir)
    check_counts(config)
    for key in ("tasks", "holdout_tasks"):  # built only after the base model has loaded
        for name in getattr(config, key, None) or []:
            check_task(key, name)
    for name, what in PATHS.items():
        value = getattr(config, name, None)
        for path in [value] if isinstance(value, str) else list(value or []):
            if path and not Path(path).exists():
                raise ConfigError(name, path, f"an existing {what}")
            if path and what == "checkpoint folder" and not Path(path).is_dir():  # read later as "does not exist"
                raise ConfigError(name, path, f"a {what}; {path} is a file")
            run = Path(str(path))  # a run directory given for its checkpoint: say which folder to give
            if path and what == "checkpoint folder" and (run / "checkpoints").is_dir() \
                    and not (run / "config.json").exists():
                raise ConfigError(name, path, f"a {what}; {run} is a run directory: its model is a checkpoint "
                                  f"folder, e.g. {run / 'checkpoints' / 'final'}")
    base = Path(str(getattr(config, "base", "") or ""))
    if base.name and (base / "checkpoints").is_dir() and not (base / "config.json").exists():
        raise ConfigError("base", str(base), f"a model name or folder; {base} is a run directory: its model is a "
                          f"checkpoint folder, e.g. {base / 'checkpoints' / 'final'}")
    check_kl_tables(getattr(config, "aggregate", None) or [])
    check_sides(config)


def check_kl_tables(paths: list[str]) -> None:
    """Each file `esft analyze kl --aggregate` names is one seed's kl.json: read only after the options were
    accepted, anything else ended in a JSON decoder's message without the file's name, or a KeyError traceback."""
    what = "a kl.json file written by `esft analyze kl --stages`"
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            reason = "a folder" if Path(path).is_dir() else f"not JSON: {e}"
            raise ConfigError("aggregate", path, f"{what}; {path} is {reason}") from None
        table = data.get("result", data) if isinstance(data, dict) else data
        if isinstance(table, dict) and "seeds" in table:  # its cells hold medians over seeds, not one seed's KL
            raise ConfigError("aggregate", path, f"{what}; {path} is already an aggregate over seeds")
        if not (isinstance(table, dict) and {"stages", "tasks", "incremental", "cumulative"} <= table.keys()):
            raise ConfigError("aggregate", path, f"{what} (stages, tasks, incremental and cumulative KL); {path} "
                              "holds other JSON")


def check_sides(config: Any) -> None:
    """`esft analyze landscape`'s --es and --grpo each name a checkpoint of that algorithm's run where the
    checkpoint's run folder says which: a swapped pair would label every table and figure the other way round."""
    from esft.analysis.runs import classify, read_config

    if not (hasattr(config, "es") and hasattr(config, "grpo")):  # only the landscape's config has both sides
        return
    names = {"es": "an ES", "grpo": "a GRPO"}
    runs: dict[str, tuple[str, Path]] = {}  # side -> (algorithm of its checkpoint's run, that run)
    for side in ("es", "grpo"):
        path = getattr(config, side)
        run = Path(str(path)).parent.parent
        if not path or Path(path).parent.name != "checkpoints" or not (run / "config.yaml").is_file():
            continue
        try:
            runs[side] = classify(run, read_config(run / "config.yaml")), run
        except ValueError:  # a config.yaml that cannot be read says nothing of the algorithm
            continue
    wrong = [side for side, (algorithm, _) in runs.items() if algorithm in names and algorithm != side]
    if len(wrong) == 2:
        raise ConfigError("es", config.es, f"an ES checkpoint; --es and --grpo are swapped ({runs['es'][1]} is a "
                          f"GRPO run, {runs['grpo'][1]} an ES run): give each as the other")
    for side in wrong:
        other = runs[side][0]
        taken = runs.get(other, ("", None))[0] == other  # the other flag already names a run of that algorithm
        advice = f"give {names[side]} run's checkpoint as --{side}" if taken else f"give its checkpoint as --{other}"
        raise ConfigError(side, getattr(config, side), f"{names[side]} checkpoint; {runs[side][1]} is "
                          f"{names[other]} run: {advice}")


def check_counts(config: Any) -> None:
    """Lists that must match another: names beyond the checkpoints they name (the analyses pair them with zip,
    which would drop a stage past the last name without a word), and a sparsity sweep with no point at all."""
    for key, of in (("stage_labels", "stages"), ("labels", "tuned")):
        names, paths = getattr(config, key, None), getattr(config, of, None)
        if names and paths is not None and (len(names) != len(paths) if key == "stage_labels"
                                            else len(names) > len(paths)):
            most = "" if key == "stage_labels" else "at most "
            raise ConfigError(key, names, f"{most}one name per --{of} folder ({len(paths)} given)")
        if names and len(set(names)) < len(names):  # results are keyed by name: a repeated one replaces another's
            raise ConfigError(key, names, "distinct names")
    if hasattr(config, "taus") and not config.taus and not getattr(config, "targets", None):
        raise ConfigError("targets", config.targets, "at least one target sparsity (or thresholds in --taus): an "
                          "empty sweep evaluates nothing")


__all__ = ["PATHS", "RULES", "check_analysis", "check_counts", "check_kl_tables"]
