"""The study's tables from an experiment folder's measured stage records (`result.json`), as Markdown and CSV.

    Table 1      single-task accuracy: rows tasks; columns Base, then each method (ES (iter=100), ..., GRPO)
    Table 2      holdout accuracy through the sequence: rows Base model, After Task k (Name), Δ (base → final);
                 columns method x holdout, holdout-major (ES (MMLU), GRPO (MMLU), ES (IFEval), GRPO (IFEval))
    Tables 5-8   one per sequential method: rows Base, After <task>; columns the trained tasks; the task just
                 trained in bold
    pass@k       with `evaluation.passk`, one per sequential method (`passk_sequential_<track>`): the rows of
                 Tables 5-8; columns pass@k of each k with its 95% bootstrap interval, per sampled task
                 (esft.experiments.passk_tables)
    Table 18     compute per task: the study's formulas (2*iters*N*batch*P*L, 8*T*prompts*K*P*L) beside what the
                 runs actually generated (generations, prompt and generated tokens, FLOPs from those counts;
                 esft.experiments.compute_tables)

Cells are accuracies in % (a task whose reward scores outside [0, 1] has a mean reward, a plain number with three
decimals and no constant answer: esft.experiments.records): one seed prints the value; several print mean ± std
(sample std, ddof = 1), and the per-seed values follow in a second table. CSV files keep the layout, with numeric
mean / std / per-seed columns.

Where the evaluations recorded it (`constant_baseline`, esft.evaluation), every accuracy table also shows the
*constant answer* baseline: the accuracy of always giving the most frequent gold answer of the evaluated examples,
with its 95% Wilson interval (a column of Table 1, a row of the others). An accuracy inside that interval is
what a prior alone reaches.

A single-task experiment's methods table (`methods_<task>`) has a row per method, a `grpo->es` chain's among
them, with pass@k columns beside the greedy accuracy; results.csv has every stage's pass@k and its interval.
Beside each methods table, `tables/passk_<task>.png` draws its pass@k columns as curves over k with their 95%
intervals (esft.experiments.method_figures); a task whose scores are not 0/1 has no pass@k, its cells read n/a.

The records are read by esft.experiments.records; every table is an `esft.tables.Table` (rows of cells), which
renders the Markdown and CSV.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from esft.experiments.compute_tables import compute_row, table18
from esft.experiments.forgetting_figures import write_forgetting_figures
from esft.experiments.method_figures import write_method_figures
from esft.experiments.passk_tables import (PASSK_NOTE, passk_cells, passk_columns, passk_keys, passk_ks,
                                           passk_notes, passk_values, sequential_passk_tables)
from esft.experiments.plan import task_slug
from esft.experiments.records import (
    CONSTANT_LABEL, CONSTANT_NOTE, REWARD_DIGITS, Experiment, accuracy, ci_text, constant_baseline, constant_row,
    constant_text, eval_note, interval, load_experiment, percent, reward_note, score_words, seed_note, table_slug,
    task_name,
)
from esft.tables import DASH, NA, Cell, Row, Table, csv_text
from esft.tasks.labels import ACCURACY

TABLES_DIR = "tables"


# ---- the tables ------------------------------------------------------------------------------------------------------

#: note of every table whose cells carry each seed's interval
INTERVAL_NOTE = "[a, b]: the 95% Wilson interval of that seed's evaluation."


def interval_note(exp: Experiment, tasks: Sequence[str]) -> list[str]:
    """INTERVAL_NOTE where some of `tasks` is an accuracy (a mean reward's interval is in `reward_note`)."""
    return [INTERVAL_NOTE] if any(not exp.is_reward(t) for t in tasks) else []


def accuracy_cell(exp: Experiment, record_of: Any, task: str, bold: bool = False) -> Cell:
    """The accuracy (or mean reward) of `task` in `record_of(seed)` for every seed, with each evaluation's 95%
    interval."""
    scale, digits = _scale(exp, task)
    return exp.cell(lambda s: accuracy(record_of(s), task, exp.ifeval_metric, scale), bold,
                    ci=lambda s: interval(record_of(s), task, exp.ifeval_metric, scale), digits=digits)


def base_cell(exp: Experiment, task: str) -> Cell:
    """The base model's accuracy of `task`, evaluated once whatever the seeds: its value and 95% interval."""
    scale, digits = _scale(exp, task)
    return exp.cell(lambda s: accuracy(exp.base, task, exp.ifeval_metric, scale), digits=digits, once=True,
                    ci=lambda s: interval(exp.base, task, exp.ifeval_metric, scale))


def _scale(exp: Experiment, task: str) -> tuple[float, int]:
    """(factor, decimals) of `task`'s cells: a percentage with one decimal, or a mean reward as it is."""
    return (1.0, REWARD_DIGITS) if exp.is_reward(task) else (100.0, 1)


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def table1(exp: Experiment) -> Table | None:
    """Single-task accuracy; a sequential-only experiment's first stage is single-task training on its first task,
    so there Table 1 has that task's row."""
    kind, tasks = "single-task", exp.tasks
    tracks = exp.tracks(kind)
    if not tracks:
        kind, tracks, tasks = "sequential", exp.tracks("sequential"), exp.tasks[:1]
    if not tracks:
        return None
    constants = [constant_baseline(exp, t) for t in tasks]
    with_constant = any(constants)
    cols = ["Task"] + ([CONSTANT_LABEL] if with_constant else []) + ["Base"] + [d for _, d in tracks]
    rows = []
    for task, constant in zip(tasks, constants):
        cells: list[Cell | str] = [NA if exp.is_reward(task) else constant_text(constant)] if with_constant else []
        cells.append(base_cell(exp, task))
        for track, _ in tracks:
            where = {"task": task} if kind == "single-task" else {"index": 1}
            cells.append(accuracy_cell(exp, lambda s, tr=track, w=where: exp.find(kind, s, tr, **w), task))
        rows.append((task_name(task), cells))
    notes = [seed_note(exp), eval_note(exp, tasks), *interval_note(exp, tasks)] + ([CONSTANT_NOTE] if with_constant
                                                                                   else [])
    notes += reward_note(exp, tasks)
    if kind == "sequential":
        notes.insert(0, "Stage 1 of the sequential runs: single-task training on the first task.")
    title = f"Table 1: {_capital(score_words(exp, tasks))} for single task training ({exp.spec.get('model')})."
    return Table("table1_single_task", title,
                 cols, rows, notes, seeds=exp.seeds)


def table2(exp: Experiment) -> Table | None:
    tracks = exp.tracks("sequential")
    if not tracks or not exp.holdout:
        return None
    cols = ["Stage"] + [f"{d} ({task_name(h)})" for h in exp.holdout for _, d in tracks]
    k_max = len(exp.tasks)

    def value(seed: int, track: str, h: str, k: int) -> float | None:
        rec = exp.base if k == 0 else exp.find("sequential", seed, track, index=k)
        return accuracy(rec, h, exp.ifeval_metric, _scale(exp, h)[0])

    def delta(seed: int, track: str, h: str) -> float | None:
        a, b = value(seed, track, h, 0), value(seed, track, h, k_max)
        return None if a is None or b is None else b - a

    rows: list[Row] = []
    constant = constant_row(exp, exp.holdout, repeat=len(tracks))
    if constant:
        rows.append(constant)
    for k in range(k_max + 1):
        label = "Base model" if k == 0 else f"After Task {k} ({task_name(exp.tasks[k - 1])})"
        rows.append((label, [base_cell(exp, h) if k == 0 else
                             accuracy_cell(exp, lambda s, tr=tr, k=k: exp.find("sequential", s, tr, index=k), h)
                             for h in exp.holdout for tr, _ in tracks]))
    delta_label = "Δ (base → final)"
    rows.append((delta_label, [exp.cell(lambda s, tr=tr, h=h: delta(s, tr, h), digits=_scale(exp, h)[1])
                               for h in exp.holdout for tr, _ in tracks]))
    notes = [seed_note(exp), eval_note(exp, exp.holdout), *interval_note(exp, exp.holdout)] + (
        [CONSTANT_NOTE] if constant else [])
    notes += reward_note(exp, exp.holdout)
    if "ifeval" in exp.holdout:
        notes.append(f"IFEval: {exp.ifeval_metric.replace('_', '-')} accuracy.")
    return Table("table2_holdout", f"Table 2: Holdout benchmark {score_words(exp, exp.holdout)} throughout "
                 "sequential training.",
                 cols, rows, notes, signed_rows={delta_label}, seeds=exp.seeds)


def tables5_8(exp: Experiment) -> list[Table]:
    out = []
    for track, display in exp.tracks("sequential"):
        cols = ["Stage"] + [task_name(t, short=True) for t in exp.tasks]
        constant = constant_row(exp, exp.tasks)
        rows: list[Row] = [constant] if constant else []
        rows.append(("Base", [base_cell(exp, t) for t in exp.tasks]))
        for k, trained in enumerate(exp.tasks, start=1):
            rows.append((f"After {task_name(trained)}",
                         [accuracy_cell(exp, lambda s, k=k: exp.find("sequential", s, track, index=k), t,
                                        bold=(t == trained))
                          for t in exp.tasks]))
        seeds = len(exp.seeds)
        what = f"mean ± std over {seeds} seeds" if seeds > 1 else "single seed"
        words = score_words(exp, exp.tasks)
        words = f"accuracy (%, {what})" if words == "accuracy (%)" else f"{words} ({what})"
        title = (f"Tables 5-8 layout: {exp.spec.get('model')}: {words} throughout sequential "
                 f"training with {display}. Bold indicates the task just trained at that stage.")
        out.append(Table(f"table5-8_sequential_{table_slug(track)}", title, cols, rows,
                         [seed_note(exp), eval_note(exp, exp.tasks), *interval_note(exp, exp.tasks)]
                         + ([CONSTANT_NOTE] if constant else []) + reward_note(exp, exp.tasks),
                         seeds=exp.seeds))
    return out


# ---- method comparison (issue 8: plain ES, DART-ES, low-rank ES, GRPO on one task) --------------------------------

def _summary(record: dict[str, Any] | None, task: str) -> dict[str, Any]:
    return ((record or {}).get("eval") or {}).get(task) or {}


def _scaled_ci(summary: dict[str, Any], scale: float = 100.0) -> tuple[float, float] | None:
    ci = summary.get("ci95")
    return (scale * ci[0], scale * ci[1]) if ci and None not in ci else None


def method_tables(exp: Experiment) -> list[Table]:
    """Per trained task of a single-task experiment: every method beside the base model, greedy accuracy with its
    Wilson CI, format rate, pass@k of the sampled evaluation (when the spec has `evaluation.passk`) with bootstrap
    CIs, and the measured training wall time."""
    tracks = exp.tracks("single-task")
    if not tracks:
        return []
    ks = passk_ks(exp)
    out = []
    for task in exp.tasks:
        first = exp.seeds[0] if exp.seeds else None
        scale, digits = _scale(exp, task)
        score = exp.score_name(task)
        cols = ["Method", "Accuracy %" if score == ACCURACY else "Mean reward", "95% CI", "Format %"]
        cols += passk_columns(ks) + ["Train wall s"]

        def row(get_record: Any, timed: bool, once: bool = False) -> list[Cell | str]:
            several = len(exp.seeds) > 1 and not once  # then the per-seed rows carry each seed's interval
            cells: list[Cell | str] = [
                exp.cell(lambda s: percent(_summary(get_record(s), task).get("accuracy"), scale), digits=digits,
                         once=once, ci=(lambda s: _scaled_ci(_summary(get_record(s), task), scale)) if several
                         else None),
                ci_text(_summary(get_record(first), task), scale, digits) if len(exp.seeds) == 1 or once else DASH,
                exp.cell(lambda s: percent(_summary(get_record(s), task).get("format_rate")), once=once)]
            cells += passk_cells(exp, get_record, task, ks, once)
            if timed:
                cells.append(exp.cell(lambda s: (compute_row(get_record(s) or {}) or {}).get("train_seconds")))
            else:
                cells.append(DASH)
            return cells

        rows: list[Row] = []
        constant = constant_baseline(exp, task)
        if constant:
            ci = constant.get("constant_baseline_ci95")
            rows.append((CONSTANT_LABEL, [constant_text(constant, ci=False),
                                          f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else DASH]
                         + [DASH] * (len(cols) - 3)))
        rows.append(("Base", row(lambda s: exp.base, False, once=True)))
        for track, display in tracks:
            rows.append((display, row(lambda s, tr=track: exp.find("single-task", s, tr, task), True)))
        notes = [seed_note(exp), eval_note(exp, [task]),
                 f"95% CI: {'Wilson' if score == ACCURACY else 'normal-approximation'} interval of the greedy "
                 f"{score}; {PASSK_NOTE}"] + ([CONSTANT_NOTE] if constant else []) + reward_note(exp, [task])
        notes += passk_notes(exp, [task])
        title = f"Methods on {task_name(task)} ({exp.spec.get('model')}): {score}, pass@k and training time."
        out.append(Table(f"methods_{task_slug(task)}", title, cols, rows, notes, seeds=exp.seeds))
    return out


# ---- long format and writing -----------------------------------------------------------------------------------------

#: results.csv's constant-answer columns, empty on a mean reward's rows
CONSTANT_KEYS = ("constant_baseline", "constant_ci95_low", "constant_ci95_high", "constant_answer")


def results_csv(exp: Experiment) -> str:
    """Every evaluation of every finished stage, one row per (stage, task). A task whose reward scores outside
    [0, 1] (`Experiment.is_reward`) has its mean reward in `accuracy` and the interval of that mean in `ci95_*`,
    and its constant-answer cells are empty: that baseline is a share of examples, no reward on another scale.
    The columns stay the same for every task, so the file keeps one header whatever its tasks score. With
    `evaluation.passk`, each k of it adds `pass@k` and its bootstrap interval (shares), empty where the task was
    not sampled, its pass@k is n/a or it was sampled with other settings than the spec's."""
    ks = passk_ks(exp)
    keys = ["n", "accuracy", "ci95_low", "ci95_high", *CONSTANT_KEYS, "balanced", "format_rate",
            "accuracy_among_boxed", "prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose",
            "completion_tokens", "truncated_rate", *passk_keys(ks)]
    rows = []
    for s in exp.stages:
        rec = exp.results.get(s["key"])
        if not rec:
            continue
        for task, summ in rec.get("eval", {}).items():
            ci = summ.get("ci95") or [None, None]
            cci = summ.get("constant_baseline_ci95") or [None, None]
            vals = {**summ, "ci95_low": ci[0], "ci95_high": ci[1], "constant_ci95_low": cci[0],
                    "constant_ci95_high": cci[1], **passk_values(rec, task, ks)}
            if exp.is_reward(task):
                vals.update(dict.fromkeys(CONSTANT_KEYS))
            seed = s.get("seed")  # seed 0 is a seed: only the base stage, which has none, leaves the column empty
            rows.append([s["key"], "" if seed is None else seed, s.get("track") or "", s.get("display") or "",
                         s.get("index"), s.get("task") or "", task,
                         *["" if vals.get(k) is None else vals.get(k) for k in keys]])
    return csv_text(["stage", "seed", "track", "method", "index", "trained_task", "eval_task", *keys], rows)


def all_tables(exp: Experiment) -> list[Table]:
    out: list[Table] = []
    for t in (table1(exp), table2(exp)):
        if t is not None:
            out.append(t)
    out += tables5_8(exp)
    out += sequential_passk_tables(exp)
    out += method_tables(exp)
    t18 = table18(exp)
    if t18:
        out += list(t18)
    return out


def write_all_tables(root: str | Path) -> Path:
    """Write tables/<name>.md and .csv for every table the finished stages support, tables.md with all of them
    and the stage statuses, and results.csv (long format). Returns tables.md."""
    exp = load_experiment(root)
    folder = Path(root) / TABLES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    tables = all_tables(exp)
    parts = [f"# {exp.spec.get('name')}: {exp.spec.get('kind')} experiment, {exp.spec.get('model')}", ""]
    if exp.spec.get("description"):
        parts += [exp.spec["description"].strip(), ""]
    for t in tables:
        (folder / f"{t.name}.md").write_text(t.markdown())
        (folder / f"{t.name}.csv").write_text(t.csv())
        parts += [t.markdown(), ""]
    (folder / "results.csv").write_text(results_csv(exp))
    figures = write_method_figures(exp, folder)
    if figures:
        links = ", ".join(f"[{p.name}]({p.name})" for p in figures)
        parts += [f"pass@k figures (95% bootstrap intervals): {links}", ""]
    forgetting = write_forgetting_figures(exp, folder)
    if forgetting:
        links = ", ".join(f"[{p.name}]({p.name})" for p in forgetting)
        parts += [f"Accuracy during sequential training, at every evaluated checkpoint: {links}", ""]
    bad = {k: v for k, v in exp.statuses.items() if v.get("status") != "done"}
    done = sum(1 for v in exp.statuses.values() if v.get("status") == "done")
    parts += ["### Stages", "", f"{done} of {len(exp.stages)} stages done."]
    for key, st in bad.items():
        parts.append(f"- {key}: {st.get('status')}" + (f" ({st['error']})" if st.get("error") else ""))
    for key, tasks in exp.stale.items():
        parts.append(f"- {key}: its evaluation of {', '.join(map(task_name, tasks))} was made with other settings "
                     "than the spec's, so it is left out of the tables (run the same command again to re-evaluate)")
    for key, tasks in exp.stale_sampled.items():
        parts.append(f"- {key}: its pass@k of {', '.join(map(task_name, tasks))} was sampled with other settings "
                     "than the spec's, so it is left out of the tables (run the same command again to sample it again)")
    wall = _wall_time(Path(root))
    if wall:
        parts.append(f"\nWall time of all `esft experiment run` invocations: {wall:,.0f} s ({wall / 3600:.2f} h).")
    path = folder / "tables.md"
    path.write_text("\n".join(parts).rstrip() + "\n")
    return path


def _wall_time(root: Path) -> float:
    total = 0.0
    path = root / "invocations.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                total += float(json.loads(line).get("wall_s", 0.0))
            except (json.JSONDecodeError, ValueError):
                continue
    return total
