"""The study's tables from an experiment folder's measured stage records (`result.json`), as Markdown and CSV.

    Table 1      single-task accuracy: rows tasks; columns Base, then each method (ES (iter=100), ..., GRPO)
    Table 2      holdout accuracy through the sequence: rows Base model, After Task k (Name), Δ (base → final);
                 columns method x holdout, holdout-major (ES (MMLU), GRPO (MMLU), ES (IFEval), GRPO (IFEval))
    Tables 5-8   one per sequential method: rows Base, After <task>; columns the trained tasks; the task just
                 trained in bold
    Table 18     compute per task: the study's formulas (2*iters*N*batch*P*L, 8*T*prompts*K*P*L) beside what the
                 runs actually generated (generations, prompt and generated tokens, FLOPs from those counts)

Cells are accuracies in %: one seed prints the value; several print mean ± std (sample std, ddof = 1), and the
per-seed values follow in a second table. CSV files keep the layout, with numeric mean / std / per-seed columns.

Where the evaluations recorded it (`constant_baseline`, esft.evaluation), every accuracy table also shows the
*constant answer* baseline: the accuracy of always giving the most frequent gold answer of the evaluated examples,
with its 95% Wilson interval (a column of Table 1, a row of the others). An accuracy inside that interval is
what a prior alone reaches.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

TASK_NAMES = {"countdown": "Countdown", "math": "Math", "chemistry": "Chemistry", "boolq": "BoolQ",
              "mmlu": "MMLU", "ifeval": "IFEval"}
SHORT_NAMES = {**TASK_NAMES, "chemistry": "SciK"}  # the header of the paper's Tables 5-8
TABLES_DIR = "tables"
DASH = "—"


def task_name(task: str, short: bool = False) -> str:
    """Display name; a task with options (countdown:numbers=2,ops=+) shows them: Countdown (numbers=2, ops=+)."""
    base, _, options = task.partition(":")
    name = (SHORT_NAMES if short else TASK_NAMES).get(base, base)
    return f"{name} ({options.replace(',', ', ')})" if options else name


# ---- loading ---------------------------------------------------------------------------------------------------------

@dataclass
class Experiment:
    root: Path
    spec: dict[str, Any]
    stages: list[dict[str, Any]]
    """plan entries (plan.json), in execution order"""
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    """stage key -> result.json of finished stages"""
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def seeds(self) -> list[int]:
        return list(self.spec.get("seeds", []))

    @property
    def tasks(self) -> list[str]:
        return list(self.spec.get("tasks", []))

    @property
    def holdout(self) -> list[str]:
        return list(self.spec.get("evaluation", {}).get("holdout", []))

    @property
    def ifeval_metric(self) -> str:
        return self.spec.get("ifeval_metric", "prompt_strict")

    def tracks(self, kind: str) -> list[tuple[str, str]]:
        """(track, display) of the training stages of a kind ("single-task" / "sequential"), in plan order."""
        seen: dict[str, str] = {}
        for s in self.stages:
            if s["kind"] == "train" and f"/{kind}/" in f"/{s['key']}/":
                seen.setdefault(s["track"], s["display"])
        return list(seen.items())

    def find(self, kind: str, seed: int, track: str, task: str | None = None, index: int | None = None
             ) -> dict[str, Any] | None:
        for s in self.stages:
            if (s["kind"] == "train" and s["seed"] == seed and s["track"] == track and f"/{kind}/" in f"/{s['key']}/"
                    and (task is None or s["task"] == task) and (index is None or s["index"] == index)):
                return self.results.get(s["key"])
        return None

    @property
    def base(self) -> dict[str, Any] | None:
        return self.results.get("base")


def load_experiment(root: str | Path) -> Experiment:
    root = Path(root)
    plan_path = root / "plan.json"
    if not plan_path.exists():
        raise FileNotFoundError(f"{root} is not an experiment folder (no plan.json; run `esft experiment run` first)")
    plan = json.loads(plan_path.read_text())
    exp = Experiment(root, plan["spec"], plan["stages"])
    for s in exp.stages:
        for name, target in (("result.json", exp.results), ("status.json", exp.statuses)):
            path = root / s["key"] / name
            if path.exists():
                try:
                    target[s["key"]] = json.loads(path.read_text())
                except json.JSONDecodeError:
                    pass
    return exp


def accuracy(record: dict[str, Any] | None, task: str, ifeval_metric: str = "prompt_strict") -> float | None:
    """Accuracy in % of `task` in a stage record (IFEval: the chosen strict/loose level)."""
    if not record:
        return None
    summary = record.get("eval", {}).get(task)
    if not summary:
        return None
    key = ifeval_metric if task == "ifeval" and ifeval_metric in summary else "accuracy"
    value = summary.get(key)
    return None if value is None else 100.0 * float(value)


def constant_baseline(exp: Experiment, task: str) -> dict[str, Any] | None:
    """The constant-answer baseline of `task`'s evaluated examples: from the base model's evaluation, else from
    the first stage that recorded one (every stage evaluates the same examples)."""
    for rec in [exp.base, *exp.results.values()]:
        summary = ((rec or {}).get("eval") or {}).get(task) or {}
        if summary.get("constant_baseline") is not None:
            return summary
    return None


def constant_text(summary: dict[str, Any] | None, ci: bool = True) -> str:
    """`63.5 [56.6, 69.9]` (%, with the Wilson interval), or a dash."""
    if not summary:
        return DASH
    text = f"{100 * float(summary['constant_baseline']):.1f}"
    interval = summary.get("constant_baseline_ci95")
    return f"{text} [{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]" if ci and interval else text


CONSTANT_LABEL = "Constant answer"
CONSTANT_NOTE = ("Constant answer: accuracy (%) of always giving the most frequent gold answer of the evaluated "
                 "examples, with its 95% Wilson interval.")


def _constant_row(exp: Experiment, tasks: Sequence[str], repeat: int = 1) -> tuple[str, list[Cell | str]] | None:
    """A table row of constant-answer baselines, one per task, each repeated `repeat` times; None without any."""
    found = [constant_baseline(exp, t) for t in tasks]
    if not any(found):
        return None
    return CONSTANT_LABEL, [constant_text(f) for f in found for _ in range(repeat)]


# ---- cells -------------------------------------------------------------------------------------------------------------

@dataclass
class Cell:
    """Values of one table cell across seeds (None = missing for that seed)."""

    per_seed: dict[int, float | None]
    bold: bool = False

    @property
    def values(self) -> list[float]:
        return [v for v in self.per_seed.values() if v is not None]

    @property
    def mean(self) -> float | None:
        v = self.values
        return sum(v) / len(v) if v else None

    @property
    def std(self) -> float | None:
        v = self.values
        if len(v) < 2:
            return None
        m = sum(v) / len(v)
        return math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))

    def text(self, signed: bool = False) -> str:
        m = self.mean
        if m is None:
            return DASH
        if len(self.per_seed) > 1:
            s = f"{_num(m, 2, signed)} ± {self.std:.2f}" if self.std is not None else _num(m, 2, signed)
        else:
            s = _num(m, 1, signed)
        if len(self.values) < len(self.per_seed):
            s += f" (n={len(self.values)})"
        return f"**{s}**" if self.bold else s

    def seeds_text(self, signed: bool = False) -> str:
        return " / ".join(DASH if v is None else _num(v, 1, signed) for v in self.per_seed.values())


def _num(x: float, digits: int, signed: bool) -> str:
    if not signed:
        return f"{x:.{digits}f}"
    return f"+{x:.{digits}f}" if x >= 0 else f"−{abs(x):.{digits}f}"  # the paper's minus sign


@dataclass
class Table:
    name: str
    """file stem, e.g. table1_single_task"""
    title: str
    columns: list[str]
    rows: list[tuple[str, list[Cell | str]]]
    notes: list[str] = field(default_factory=list)
    signed_rows: set[str] = field(default_factory=set)
    seeds: list[int] = field(default_factory=list)

    def markdown(self) -> str:
        out = [f"### {self.title}", "", _md_row(self.columns), _md_row(["---"] * len(self.columns))]
        for label, cells in self.rows:
            out.append(_md_row([label] + [c if isinstance(c, str) else c.text(label in self.signed_rows)
                                          for c in cells]))
        if len(self.seeds) > 1 and any(isinstance(c, Cell) for _, cells in self.rows for c in cells):
            out += ["", f"Per seed ({' / '.join(map(str, self.seeds))}):", "", _md_row(self.columns),
                    _md_row(["---"] * len(self.columns))]
            for label, cells in self.rows:
                out.append(_md_row([label] + [c if isinstance(c, str) else c.seeds_text(label in self.signed_rows)
                                              for c in cells]))
        out += [""] + [f"{n}" for n in self.notes] + ([""] if self.notes else [])
        return "\n".join(out).rstrip() + "\n"

    def csv(self) -> str:
        """Same rows and columns; a Cell becomes `<col>`, `<col> std`, and `<col> seed S` numeric columns."""
        header = [self.columns[0]]
        cell_cols = [i for i in range(1, len(self.columns))
                     if any(isinstance(cells[i - 1], Cell) for _, cells in self.rows)]
        for i in range(1, len(self.columns)):
            col = self.columns[i]
            header.append(col)
            if i in cell_cols:
                header.append(f"{col} std")
                header += [f"{col} seed {s}" for s in self.seeds]
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(header)
        for label, cells in self.rows:
            row: list[Any] = [label]
            for i, c in enumerate(cells, start=1):
                if isinstance(c, Cell):
                    row += [_fmt(c.mean), _fmt(c.std)] + [_fmt(c.per_seed.get(s)) for s in self.seeds]
                else:
                    row.append(c)
                    if i in cell_cols:
                        row += [""] * (1 + len(self.seeds))
            w.writerow(row)
        return buf.getvalue()


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.4f}".rstrip("0").rstrip(".") if x != 0 else "0"


def _md_row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _cell(exp: Experiment, get: Any, bold: bool = False) -> Cell:
    return Cell({seed: get(seed) for seed in exp.seeds}, bold)


def _eval_note(exp: Experiment, tasks: Sequence[str]) -> str:
    ev = exp.spec.get("evaluation", {})
    parts = []
    for t in tasks:
        per = ev.get("per_task", {}).get(t, {})
        limit = per.get("limit", ev.get("limit"))
        tokens = per.get("max_new_tokens", ev.get("max_new_tokens"))
        n = _eval_n(exp, t)
        parts.append(f"{task_name(t)} n={n if n is not None else limit or 'all'}, {tokens} new tokens")
    return "Greedy evaluation on the test split: " + "; ".join(parts) + "."


def _eval_n(exp: Experiment, task: str) -> int | None:
    for r in exp.results.values():
        s = r.get("eval", {}).get(task)
        if s and "n" in s:
            return int(s["n"])
    return None


def _seed_note(exp: Experiment) -> str:
    n = len(exp.seeds)
    if n == 1:
        return f"Seed {exp.seeds[0]}."
    return f"Mean ± sample std (ddof=1) over {n} seeds ({', '.join(map(str, exp.seeds))}); the base model is " \
           f"evaluated once (greedy decoding does not depend on the seed)."


# ---- the tables ------------------------------------------------------------------------------------------------------

def table1(exp: Experiment) -> Table | None:
    tracks = exp.tracks("single-task")
    if not tracks:
        return None
    constants = [constant_baseline(exp, t) for t in exp.tasks]
    with_constant = any(constants)
    cols = ["Task"] + ([CONSTANT_LABEL] if with_constant else []) + ["Base"] + [d for _, d in tracks]
    rows = []
    for task, constant in zip(exp.tasks, constants):
        cells: list[Cell | str] = [constant_text(constant)] if with_constant else []
        cells.append(_cell(exp, lambda s, t=task: accuracy(exp.base, t, exp.ifeval_metric)))
        for track, _ in tracks:
            cells.append(_cell(exp, lambda s, tr=track, t=task: accuracy(exp.find("single-task", s, tr, t), t,
                                                                         exp.ifeval_metric)))
        rows.append((task_name(task), cells))
    notes = [_seed_note(exp), _eval_note(exp, exp.tasks)] + ([CONSTANT_NOTE] if with_constant else [])
    return Table("table1_single_task", f"Table 1: Accuracy (%) for single task training ({exp.spec.get('model')}).",
                 cols, rows, notes, seeds=exp.seeds)


def table2(exp: Experiment) -> Table | None:
    tracks = exp.tracks("sequential")
    if not tracks or not exp.holdout:
        return None
    cols = ["Stage"] + [f"{d} ({task_name(h)})" for h in exp.holdout for _, d in tracks]
    k_max = len(exp.tasks)

    def value(seed: int, track: str, h: str, k: int) -> float | None:
        rec = exp.base if k == 0 else exp.find("sequential", seed, track, index=k)
        return accuracy(rec, h, exp.ifeval_metric)

    def delta(seed: int, track: str, h: str) -> float | None:
        a, b = value(seed, track, h, 0), value(seed, track, h, k_max)
        return None if a is None or b is None else b - a

    rows: list[tuple[str, list[Cell | str]]] = []
    constant = _constant_row(exp, exp.holdout, repeat=len(tracks))
    if constant:
        rows.append(constant)
    for k in range(k_max + 1):
        label = "Base model" if k == 0 else f"After Task {k} ({task_name(exp.tasks[k - 1])})"
        rows.append((label, [_cell(exp, lambda s, tr=tr, h=h, k=k: value(s, tr, h, k))
                             for h in exp.holdout for tr, _ in tracks]))
    delta_label = "Δ (base → final)"
    rows.append((delta_label, [_cell(exp, lambda s, tr=tr, h=h: delta(s, tr, h)) for h in exp.holdout
                               for tr, _ in tracks]))
    notes = [_seed_note(exp), _eval_note(exp, exp.holdout)] + ([CONSTANT_NOTE] if constant else [])
    if "ifeval" in exp.holdout:
        notes.append(f"IFEval: {exp.ifeval_metric.replace('_', '-')} accuracy.")
    return Table("table2_holdout", "Table 2: Holdout benchmark accuracy (%) throughout sequential training.",
                 cols, rows, notes, signed_rows={delta_label}, seeds=exp.seeds)


def tables5_8(exp: Experiment) -> list[Table]:
    out = []
    for track, display in exp.tracks("sequential"):
        cols = ["Stage"] + [task_name(t, short=True) for t in exp.tasks]
        constant = _constant_row(exp, exp.tasks)
        rows: list[tuple[str, list[Cell | str]]] = [constant] if constant else []
        rows.append(("Base", [_cell(exp, lambda s, t=t: accuracy(exp.base, t, exp.ifeval_metric))
                              for t in exp.tasks]))
        for k, trained in enumerate(exp.tasks, start=1):
            rows.append((f"After {task_name(trained)}",
                         [_cell(exp, lambda s, t=t, k=k: accuracy(exp.find("sequential", s, track, index=k), t,
                                                                  exp.ifeval_metric), bold=(t == trained))
                          for t in exp.tasks]))
        seeds = len(exp.seeds)
        what = f"mean ± std over {seeds} seeds" if seeds > 1 else "single seed"
        title = (f"Tables 5-8 layout: {exp.spec.get('model')}: accuracy (%, {what}) throughout sequential "
                 f"training with {display}. Bold indicates the task just trained at that stage.")
        slug = track.replace("@", "_").replace("->", "-").replace("/", "-")
        out.append(Table(f"table5-8_sequential_{slug}", title, cols, rows,
                         [_seed_note(exp), _eval_note(exp, exp.tasks)] + ([CONSTANT_NOTE] if constant else []),
                         seeds=exp.seeds))
    return out


# ---- method comparison (issue 8: plain ES, DART-ES, low-rank ES, GRPO on one task) --------------------------------

def _summary(record: dict[str, Any] | None, task: str) -> dict[str, Any]:
    return ((record or {}).get("eval") or {}).get(task) or {}


def _pct(value: Any) -> float | None:
    return None if value is None else 100.0 * float(value)


def _ci_text(summary: dict[str, Any]) -> str:
    ci = summary.get("ci95")
    return f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci and None not in ci else DASH


def method_tables(exp: Experiment) -> list[Table]:
    """Per trained task of a single-task experiment: every method beside the base model, greedy accuracy with its
    Wilson CI, format rate, pass@k of the sampled evaluation (when the spec has `evaluation.passk`) with bootstrap
    CIs, and the measured training wall time."""
    tracks = exp.tracks("single-task")
    if not tracks:
        return []
    pk = exp.spec.get("evaluation", {}).get("passk") or {}
    ks = [str(k) for k in pk.get("k", [])]
    out = []
    for task in exp.tasks:
        first = exp.seeds[0] if exp.seeds else None
        cols = ["Method", "Accuracy %", "95% CI", "Format %"]
        cols += [c for k in ks for c in (f"pass@{k} %", f"pass@{k} CI")] + ["Train wall s"]

        def row(get_record: Any, timed: bool) -> list[Cell | str]:
            cells: list[Cell | str] = [
                _cell(exp, lambda s: _pct(_summary(get_record(s), task).get("accuracy"))),
                _ci_text(_summary(get_record(first), task)) if len(exp.seeds) == 1 else DASH,
                _cell(exp, lambda s: _pct(_summary(get_record(s), task).get("format_rate")))]
            for k in ks:
                cells.append(_cell(exp, lambda s, k=k: _pct(((_summary(get_record(s), task).get("sampled") or {})
                                                               .get("pass@k") or {}).get(k, {}).get("value"))))
                sampled = (_summary(get_record(first), task).get("sampled") or {}).get("pass@k", {}).get(k, {})
                cells.append(_ci_text(sampled) if len(exp.seeds) == 1 else DASH)
            if timed:
                cells.append(_cell(exp, lambda s: (_compute_row(get_record(s) or {}) or {}).get("train_seconds")))
            else:
                cells.append(DASH)
            return cells

        rows: list[tuple[str, list[Cell | str]]] = []
        constant = constant_baseline(exp, task)
        if constant:
            ci = constant.get("constant_baseline_ci95")
            rows.append((CONSTANT_LABEL, [constant_text(constant, ci=False),
                                          f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else DASH]
                         + [DASH] * (len(cols) - 3)))
        rows.append(("Base", row(lambda s: exp.base, False)))
        for track, display in tracks:
            rows.append((display, row(lambda s, tr=track: exp.find("single-task", s, tr, task), True)))
        notes = [_seed_note(exp), _eval_note(exp, [task]),
                 "95% CI: Wilson interval of the greedy accuracy; pass@k: unbiased estimator over the sampled "
                 "completions with a bootstrap CI over questions."] + ([CONSTANT_NOTE] if constant else [])
        if pk:
            notes.append(f"Sampled evaluation: {pk.get('samples')} completions per question at temperature "
                         f"{pk.get('temperature')}, top_p {pk.get('top_p')}.")
        out.append(Table(f"methods_{task}", f"Methods on {task_name(task)} ({exp.spec.get('model')}): accuracy, "
                                            f"pass@k and training time.", cols, rows, notes, seeds=exp.seeds))
    return out


# ---- Table 18 ----------------------------------------------------------------------------------------------------------

def _compute_row(rec: dict[str, Any]) -> dict[str, Any] | None:
    """Measured and formula compute of one training stage (summed over the steps of a chain)."""
    steps = rec.get("steps") or []
    if not steps:
        return None
    p = next((s.get("num_params") for s in steps if s.get("num_params")), None)
    acc = {"generations": 0, "prompt_tokens": 0, "tokens_generated": 0, "train_forward_tokens": 0,
           "train_seconds": 0.0}
    coefficient, texts = 0, []
    for s in steps:
        for k in acc:
            acc[k] += s.get("accounting", {}).get(k, 0) or 0
        coefficient += int(s.get("formula", {}).get("coefficient", 0))
        texts.append(s.get("formula", {}).get("text", ""))
    seq_tokens = acc["prompt_tokens"] + acc["tokens_generated"]
    mean_len = seq_tokens / acc["generations"] if acc["generations"] else None
    row = {**acc, "num_params": p, "coefficient": coefficient, "formula": " + ".join(texts),
           "mean_sequence_tokens": mean_len}
    if p:
        # the formulas' accounting: 2 FLOPs per parameter per processed token forward, 6 for forward + backward
        row["measured_flops"] = 2.0 * p * seq_tokens + 6.0 * p * acc["train_forward_tokens"]
        row["formula_flops"] = coefficient * p * mean_len if mean_len else None
    return row


def table18(exp: Experiment) -> tuple[Table, Table] | None:
    kind = "single-task" if exp.tracks("single-task") else "sequential"
    tracks = exp.tracks(kind)
    if not tracks:
        return None
    per: dict[str, list[dict[str, Any]]] = {}
    per_task: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for s in exp.stages:
        rec = exp.results.get(s["key"])
        if s["kind"] != "train" or f"/{kind}/" not in f"/{s['key']}/" or not rec:
            continue
        row = _compute_row(rec)
        if row:
            per.setdefault(s["track"], []).append(row)
            per_task.setdefault((s["track"], s["task"]), []).append(row)
    if not per:
        return None

    def mean(rows: list[dict[str, Any]], key: str) -> float | None:
        vals = [r[key] for r in rows if r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    ref_track = next((t for t, d in tracks if t in per and d.upper().startswith("GRPO") and "->" not in d),
                     next(t for t, _ in tracks if t in per))
    ref_coef = mean(per[ref_track], "coefficient")
    ref_flops = mean(per[ref_track], "measured_flops")
    ref_name = dict(tracks)[ref_track]
    cols = ["Method", "FLOPs (formula)", f"vs. {ref_name} (formula)", "Generations (measured)",
            "Prompt tokens (measured)", "Generated tokens (measured)", "Train fwd+bwd tokens (measured)",
            "FLOPs (measured)", f"vs. {ref_name} (measured)", "Formula FLOPs at measured L", "Train time (s)"]
    rows: list[tuple[str, list[Cell | str]]] = []
    for track, display in tracks:
        rs = per.get(track)
        if not rs:
            rows.append((display, [DASH] * (len(cols) - 1)))
            continue
        coef = mean(rs, "coefficient")
        flops = mean(rs, "measured_flops")
        rows.append((display, [
            f"{rs[0]['formula']} = {coef:,.0f} PL",
            f"{coef / ref_coef:.2f}×" if ref_coef else DASH,
            f"{mean(rs, 'generations'):,.0f}", f"{mean(rs, 'prompt_tokens'):,.0f}",
            f"{mean(rs, 'tokens_generated'):,.0f}", f"{mean(rs, 'train_forward_tokens'):,.0f}",
            _sci(flops), f"{flops / ref_flops:.2f}×" if flops and ref_flops else DASH,
            _sci(mean(rs, "formula_flops")), f"{mean(rs, 'train_seconds'):,.0f}"]))
    p = next((r["num_params"] for rs in per.values() for r in rs if r.get("num_params")), None)
    notes = [f"Per task: mean over the {kind} stages of each method (every task and seed). P = {p:,} parameters; "
             f"L = mean tokens per generated sequence (prompt + completion), measured." if p else
             f"Per task: mean over the {kind} stages of each method.",
             "Measured FLOPs = 2·P·(prompt + generated tokens of every rollout) + 6·P·(positions in the GRPO "
             "forward+backward passes); the KL-to-base forward that GRPO runs only to log KL at beta = 0 and the "
             "evaluations are not counted. The formula column is the study's (Table 18) with this run's "
             "iterations, population, batch, steps, prompts and group size."]
    main = Table("table18_compute", "Table 18: Compute per task, relative to "
                 f"{ref_name}: the study's formulas beside what the runs generated.", cols, rows, notes,
                 seeds=[])
    cols_t = ["Method", "Task", "Generations", "Prompt tokens", "Generated tokens", "Train fwd+bwd tokens",
              "FLOPs (measured)", "FLOPs (formula at measured L)", "Train time (s)"]
    rows_t: list[tuple[str, list[Cell | str]]] = []
    for track, display in tracks:
        for task in exp.tasks:
            rs = per_task.get((track, task))
            if not rs:
                continue
            rows_t.append((display, [task_name(task), f"{mean(rs, 'generations'):,.0f}",
                                     f"{mean(rs, 'prompt_tokens'):,.0f}", f"{mean(rs, 'tokens_generated'):,.0f}",
                                     f"{mean(rs, 'train_forward_tokens'):,.0f}", _sci(mean(rs, "measured_flops")),
                                     _sci(mean(rs, "formula_flops")), f"{mean(rs, 'train_seconds'):,.0f}"]))
    detail = Table("table18_compute_by_task", "Table 18 detail: measured compute per method and task "
                   "(mean over seeds).", cols_t, rows_t, seeds=[])
    return main, detail


def _sci(x: float | None) -> str:
    return DASH if x is None else f"{x:.3e}"


# ---- long format and writing -------------------------------------------------------------------------------------------

def results_csv(exp: Experiment) -> str:
    """Every evaluation of every finished stage, one row per (stage, task)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    keys = ["n", "accuracy", "ci95_low", "ci95_high", "constant_baseline", "constant_ci95_low", "constant_ci95_high",
            "constant_answer", "balanced", "format_rate", "accuracy_among_boxed", "prompt_strict", "prompt_loose",
            "instruction_strict", "instruction_loose", "completion_tokens", "truncated_rate"]
    w.writerow(["stage", "seed", "track", "method", "index", "trained_task", "eval_task", *keys])
    for s in exp.stages:
        rec = exp.results.get(s["key"])
        if not rec:
            continue
        for task, summ in rec.get("eval", {}).items():
            ci = summ.get("ci95") or [None, None]
            cci = summ.get("constant_baseline_ci95") or [None, None]
            vals = {**summ, "ci95_low": ci[0], "ci95_high": ci[1], "constant_ci95_low": cci[0],
                    "constant_ci95_high": cci[1]}
            w.writerow([s["key"], s.get("seed") or "", s.get("track") or "", s.get("display") or "",
                        s.get("index"), s.get("task") or "", task,
                        *["" if vals.get(k) is None else vals.get(k) for k in keys]])
    return buf.getvalue()


def all_tables(exp: Experiment) -> list[Table]:
    out: list[Table] = []
    for t in (table1(exp), table2(exp)):
        if t is not None:
            out.append(t)
    out += tables5_8(exp)
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
    bad = {k: v for k, v in exp.statuses.items() if v.get("status") != "done"}
    done = sum(1 for v in exp.statuses.values() if v.get("status") == "done")
    parts += ["### Stages", "", f"{done} of {len(exp.stages)} stages done."]
    for key, st in bad.items():
        parts.append(f"- {key}: {st.get('status')}" + (f" ({st['error']})" if st.get("error") else ""))
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
