"""Table 18: compute per task, the study's formulas (esft.paper's FLOP accounting) beside what the runs generated
(generations, prompt and generated tokens, FLOPs from those counts), from an experiment folder's stage records."""

from __future__ import annotations

from typing import Any

from esft import paper
from esft.experiments.records import Experiment, task_name
from esft.tables import DASH, Row, Table, sci


def compute_row(rec: dict[str, Any]) -> dict[str, Any] | None:
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
        row["measured_flops"] = (float(paper.FLOPS_FORWARD) * p * seq_tokens
                                 + float(paper.FLOPS_FORWARD_BACKWARD) * p * acc["train_forward_tokens"])
        row["formula_flops"] = coefficient * p * mean_len if mean_len else None
    return row


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def _stage_rows(exp: Experiment, kind: str) -> tuple[dict[str, list[dict[str, Any]]],
                                                     dict[tuple[str, str], list[dict[str, Any]]]]:
    """compute_row of every finished training stage of `kind`, by track and by (track, task)."""
    per: dict[str, list[dict[str, Any]]] = {}
    per_task: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for s in exp.stages:
        rec = exp.results.get(s["key"])
        if s["kind"] != "train" or f"/{kind}/" not in f"/{s['key']}/" or not rec:
            continue
        row = compute_row(rec)
        if row:
            per.setdefault(s["track"], []).append(row)
            per_task.setdefault((s["track"], s["task"]), []).append(row)
    return per, per_task


def _method_row(rs: list[dict[str, Any]], ref_coef: float | None, ref_flops: float | None) -> list[str]:
    coef = _mean(rs, "coefficient")
    flops = _mean(rs, "measured_flops")
    # stages of other budgets or sizes (a per_task override) have other formulas: each is shown beside their mean,
    # which was printed after the first stage's formula alone ("2(3)(2)(2)PL = 16 PL")
    each = list(dict.fromkeys(f"{r['formula']} = {r['coefficient']:,.0f} PL" for r in rs))
    return [each[0] if len(each) == 1 else f"mean of {', '.join(each)}: {coef:,.0f} PL",
            f"{coef / ref_coef:.2f}×" if ref_coef else DASH,
            f"{_mean(rs, 'generations'):,.0f}", f"{_mean(rs, 'prompt_tokens'):,.0f}",
            f"{_mean(rs, 'tokens_generated'):,.0f}", f"{_mean(rs, 'train_forward_tokens'):,.0f}",
            sci(flops), f"{flops / ref_flops:.2f}×" if flops and ref_flops else DASH,
            sci(_mean(rs, "formula_flops")), f"{_mean(rs, 'train_seconds'):,.0f}"]


def _notes(kind: str, p: int | None) -> list[str]:
    return [f"Per task: mean over the {kind} stages of each method (every task and seed). P = {p:,} parameters; "
            f"L = mean tokens per generated sequence (prompt + completion), measured." if p else
            f"Per task: mean over the {kind} stages of each method.",
            f"Measured FLOPs = {paper.FLOPS_FORWARD}·P·(prompt + generated tokens of every rollout) + "
            f"{paper.FLOPS_FORWARD_BACKWARD}·P·(positions in the GRPO "
            "forward+backward passes); the KL-to-base forward that GRPO runs only to log KL at beta = 0 and the "
            "evaluations are not counted. The formula column is the study's (Table 18) with this run's "
            "iterations, population, batch, steps, prompts and group size."]


def table18(exp: Experiment) -> tuple[Table, Table] | None:
    kind = "single-task" if exp.tracks("single-task") else "sequential"
    tracks = exp.tracks(kind)
    if not tracks:
        return None
    per, per_task = _stage_rows(exp, kind)
    if not per:
        return None
    ref_track = next((t for t, d in tracks if t in per and d.upper().startswith("GRPO") and "->" not in d),
                     next(t for t, _ in tracks if t in per))
    ref_coef = _mean(per[ref_track], "coefficient")
    ref_flops = _mean(per[ref_track], "measured_flops")
    ref_name = dict(tracks)[ref_track]
    cols = ["Method", "FLOPs (formula)", f"vs. {ref_name} (formula)", "Generations (measured)",
            "Prompt tokens (measured)", "Generated tokens (measured)", "Train fwd+bwd tokens (measured)",
            "FLOPs (measured)", f"vs. {ref_name} (measured)", "Formula FLOPs at measured L", "Train time (s)"]
    rows: list[Row] = [(display, _method_row(per[track], ref_coef, ref_flops) if per.get(track)
                        else [DASH] * (len(cols) - 1)) for track, display in tracks]
    p = next((r["num_params"] for rs in per.values() for r in rs if r.get("num_params")), None)
    main = Table("table18_compute", "Table 18: Compute per task, relative to "
                 f"{ref_name}: the study's formulas beside what the runs generated.", cols, rows, _notes(kind, p),
                 seeds=[])
    cols_t = ["Method", "Task", "Generations", "Prompt tokens", "Generated tokens", "Train fwd+bwd tokens",
              "FLOPs (measured)", "FLOPs (formula at measured L)", "Train time (s)"]
    rows_t: list[Row] = []
    for track, display in tracks:
        for task in exp.tasks:
            rs = per_task.get((track, task))
            if not rs:
                continue
            rows_t.append((display, [task_name(task), f"{_mean(rs, 'generations'):,.0f}",
                                     f"{_mean(rs, 'prompt_tokens'):,.0f}", f"{_mean(rs, 'tokens_generated'):,.0f}",
                                     f"{_mean(rs, 'train_forward_tokens'):,.0f}", sci(_mean(rs, "measured_flops")),
                                     sci(_mean(rs, "formula_flops")), f"{_mean(rs, 'train_seconds'):,.0f}"]))
    detail = Table("table18_compute_by_task", "Table 18 detail: measured compute per method and task "
                   "(mean over seeds).", cols_t, rows_t, seeds=[])
    return main, detail
