"""pass@k in the study's tables: the cells the methods table and the sequential pass@k tables share, and one
sequential pass@k table per sequential track.

With `evaluation.passk` in the spec, every stage's evaluation samples the chosen tasks n times per question
(esft.experiments.stage_eval: `<stage>/eval/<task>.passk.json`, kept in the stage's result.json as the task's
`sampled` entry: pass@k per k with its 95% bootstrap interval over questions). The sequential pass@k table of a
track has the rows Base and After <task> (each stage of the track), and per sampled task and k a value column and
its interval column, as the methods table's pass@k columns:

* a value is the pass@k in % of one seed, or the mean ± std over the seeds (the base model is sampled once);
* the interval column is that one evaluation's bootstrap interval; over several seeds it is a dash (an interval of
  one seed's evaluation is not one of their mean), and each seed's value is in the per-seed rows;
* a task whose scores are not 0/1 has no pass@k (esft.passk.not_right_or_wrong): its cells read n/a, and the
  notes give the reason;
* a stage whose pass@k was sampled with other settings than the spec's is left out by esft.experiments.records
  (`Experiment.stale_sampled`): its cells are dashes, and tables.md names the stage.

A chain such as `grpo->es` is one method (each stage trains GRPO, then ES from GRPO's weights, and is evaluated
after its last step), so in a sequential experiment it is a track of its own with its own table; in a single-task
experiment its pass@k and that of `grpo` beside it (the chain's first step: esft.experiments.plan) are rows of the
methods table.
"""

from __future__ import annotations

from typing import Any, Sequence

from esft.experiments.method_figures import sampled_summary
from esft.experiments.records import Experiment, ci_text, percent, seed_note, table_slug, task_name
from esft.tables import DASH, NA, Cell, Row, Table

#: note of every table with pass@k columns
PASSK_NOTE = ("pass@k: unbiased estimator over the sampled completions with a bootstrap CI over questions (the "
              "Wilson interval where every question scores alike: esft.passk.bootstrap_ci).")

#: note of a sequential pass@k table over several seeds
SEEDS_NOTE = ("The base model is sampled once too (its sampling seed is evaluation.passk's, not the training seed). "
              "A CI column holds one evaluation's interval: over several seeds it is a dash, and the per-seed rows "
              "give each seed's value.")


def passk_spec(exp: Experiment) -> dict[str, Any]:
    """The spec's `evaluation.passk` block ({} without one)."""
    return exp.spec.get("evaluation", {}).get("passk") or {}


def passk_ks(exp: Experiment) -> list[str]:
    """The k's of the spec's pass@k, as the sampled summaries key them ("1", "4")."""
    return [str(k) for k in passk_spec(exp).get("k", [])]


def passk_columns(ks: Sequence[str], prefix: str = "") -> list[str]:
    """A value and an interval column per k: `pass@4 %`, `pass@4 CI` (`prefix` names the task)."""
    return [c for k in ks for c in (f"{prefix}pass@{k} %", f"{prefix}pass@{k} CI")]


def passk_entry(record: dict[str, Any] | None, task: str, k: str) -> dict[str, Any]:
    """{"value", "ci95"} of pass@k of `task` in a stage's record; {} where it was not sampled."""
    return ((sampled_summary(record, task) or {}).get("pass@k") or {}).get(k) or {}


def passk_keys(ks: Sequence[str]) -> list[str]:
    """results.csv's pass@k columns: `pass@4`, `pass@4_ci95_low`, `pass@4_ci95_high` per k (shares, as `accuracy`)."""
    return [f"pass@{k}{end}" for k in ks for end in ("", "_ci95_low", "_ci95_high")]


def passk_values(record: dict[str, Any] | None, task: str, ks: Sequence[str]) -> dict[str, Any]:
    """The values of `passk_keys(ks)` for `task` in a stage's record; None where it has no pass@k of that k."""
    out: dict[str, Any] = {}
    for k in ks:
        entry = passk_entry(record, task, k)
        ci = entry.get("ci95") or [None, None]
        out.update({f"pass@{k}": entry.get("value"), f"pass@{k}_ci95_low": ci[0], f"pass@{k}_ci95_high": ci[1]})
    return out


def passk_na(exp: Experiment, get_record: Any, task: str) -> bool:
    """Whether some seed's sampled evaluation of `task` in `get_record(seed)` has no pass@k (scores not 0/1)."""
    return any((sampled_summary(get_record(s), task) or {}).get("pass@k_note") for s in exp.seeds)


def passk_note(exp: Experiment, task: str) -> str | None:
    """The reason a sampled evaluation of `task` in the experiment gives for having no pass@k, or None."""
    for rec in exp.results.values():
        note = (sampled_summary(rec, task) or {}).get("pass@k_note")
        if note:
            return note
    return None


def passk_cells(exp: Experiment, get_record: Any, task: str, ks: Sequence[str], once: bool = False,
                bold: bool = False) -> list[Cell | str]:
    """The cells of `passk_columns(ks)` for `task` in `get_record(seed)`: n/a throughout where pass@k is n/a
    (scores not 0/1: esft.passk.not_right_or_wrong); an interval where the value is one evaluation's (one seed, or
    `once`: the base model's), else a dash."""
    if passk_na(exp, get_record, task):
        return [NA] * (2 * len(ks))
    first = exp.seeds[0] if exp.seeds else None
    one = len(exp.seeds) == 1 or once
    cells: list[Cell | str] = []
    for k in ks:
        cells.append(exp.cell(lambda s, k=k: percent(passk_entry(get_record(s), task, k).get("value")), bold,
                              once=once))
        cells.append(ci_text(passk_entry(get_record(first), task, k)) if one else DASH)
    return cells


def passk_notes(exp: Experiment, tasks: Sequence[str]) -> list[str]:
    """The sampling settings, and why pass@k is n/a for each of `tasks` where it is."""
    pk = passk_spec(exp)
    notes = [f"Sampled evaluation: {pk.get('samples')} completions per question at temperature "
             f"{pk.get('temperature')}, top_p {pk.get('top_p')}."] if pk else []
    for task in tasks:
        na = passk_note(exp, task)
        if passk_ks(exp) and na:
            notes.append(f"pass@k n/a{f' ({task_name(task)})' if len(tasks) > 1 else ''}: {na}.")
    return notes


def sequential_passk_tables(exp: Experiment) -> list[Table]:
    """One table per sequential track (module docstring); none without `evaluation.passk`."""
    ks = passk_ks(exp)
    tasks = list(passk_spec(exp).get("tasks") or exp.tasks)
    if not ks or not tasks:
        return []
    out = []
    for track, display in exp.tracks("sequential"):
        cols = ["Stage"] + [c for t in tasks for c in passk_columns(ks, f"{task_name(t, short=True)} ")]
        rows: list[Row] = [("Base", [c for t in tasks for c in passk_cells(exp, lambda s: exp.base, t, ks, True)])]
        for k, trained in enumerate(exp.tasks, start=1):
            def stage(seed: int, k: int = k, track: str = track) -> dict[str, Any] | None:
                return exp.find("sequential", seed, track, index=k)

            rows.append((f"After {task_name(trained)}",
                         [c for t in tasks for c in passk_cells(exp, stage, t, ks, bold=t == trained)]))
        title = (f"pass@k (%, 95% bootstrap intervals) throughout sequential training with {display} "
                 f"({exp.spec.get('model')}). Bold indicates the task just trained at that stage.")
        several = [SEEDS_NOTE] if len(exp.seeds) > 1 else []
        out.append(Table(f"passk_sequential_{table_slug(track)}", title, cols, rows,
                         [seed_note(exp), PASSK_NOTE, *several, *passk_notes(exp, tasks)], seeds=exp.seeds))
    return out


__all__ = ["PASSK_NOTE", "SEEDS_NOTE", "passk_cells", "passk_columns", "passk_entry", "passk_keys", "passk_ks",
           "passk_na", "passk_note", "passk_notes", "passk_spec", "passk_values", "sequential_passk_tables"]
