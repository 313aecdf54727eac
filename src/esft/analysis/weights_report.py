"""The report's weight-space section (paper Tables 3, 4 and 20): every chain's update against its base, stage by
stage, ES-GRPO pairs side by side, beside the study's values (measured with esft.analysis.weights)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from esft import paper
from esft.analysis.report_cache import fingerprint, slug
from esft.analysis.weights import compare_updates, plot_weights
from esft.export import checkpoint_step
from esft.tables import NA, pct

if TYPE_CHECKING:
    from esft.analysis.report_context import ReportContext
    from esft.analysis.runs import Chain


@dataclass
class UpdateComparison:
    """Tables 3, 4 and 20 of one chain (and of its ES-GRPO partner when `paired`), one row per stage, beside the
    study's values; the last stage per family and its figure; `notes`: stages where one side has no checkpoint
    (its cells read "missing", the other side's update is still measured)."""

    label: str
    base: Path
    algorithm: str
    paired: bool
    norms: list[list[Any]] = field(default_factory=list)
    sparsity: list[list[Any]] = field(default_factory=list)
    cosines: list[list[Any]] = field(default_factory=list)
    families: tuple[list[str], list[list[Any]]] | None = None
    figure: Path | None = None
    last_stage: str = ""
    """the stage `families` and `figure` show ("2 (countdown)")"""
    notes: list[str] = field(default_factory=list)
    budget: str = ""
    """paper.es_budget_note of the ES stages set beside the study's values ("" when none differs)"""


MISSING = "missing"  # the cell of a side whose checkpoint is not on disk


def stage_iterations(stage: Any) -> int | None:
    """The ES iterations behind a chain stage's weights: its checkpoint's own step (a budget snapshot such as
    iter_000100 of a run continued to 300 holds 100), else its run's configured iterations."""
    step = checkpoint_step(stage.checkpoint) if stage.checkpoint is not None else None
    return step if step is not None else stage.run.config.get("iterations")


def report_weights(ctx: ReportContext) -> list[UpdateComparison] | None:
    """Every chain's update against its base, stage by stage (ES-GRPO pairs side by side); None without runs."""
    items: list[tuple[str, Chain, Chain | None]] = [(p.label, p.es, p.grpo) for p in ctx.pairs]
    paired = {id(p.es) for p in ctx.pairs} | {id(p.grpo) for p in ctx.pairs}
    items += [(c.label, c, None) for c in ctx.chains if id(c) not in paired]
    if not items:
        ctx.skip("weights", "no runs with checkpoints")
        return None
    out, results = [], {}
    for label, a, b in items:
        if a.base is None:
            ctx.skip(f"weights ({label})", f"base model {a.base_spec!r} is not a folder on disk")
            continue
        comp = UpdateComparison(label, a.base, a.algorithm, b is not None)
        if any(paper.stage_index(t) is not None for t in a.tasks):
            comp.budget = paper.es_budget_note(stage_iterations(st) for c in (a, b)
                                               if c is not None and c.algorithm == "es" for st in c.stages)
        last_rep, cached = None, False
        for i in range(len(a.stages)):
            found = _weights_stage(ctx, comp, a, b, i)
            if found is None:
                continue
            last_rep, cached = found
            comp.last_stage = f"{i + 1} ({a.shown_tasks[i]})"
            results[f"{label} stage {i + 1}"] = last_rep["total"]
        if not comp.paired:
            ctx.skip(f"ES/GRPO norm ratio and cosine (Tables 3, 20) for {label}", _unpaired(ctx, a))
        if last_rep is not None:
            comp.families = family_rows(last_rep)
            path = ctx.fig(f"weights_{slug(label)}")
            title = textwrap.fill(f"{label}, stage {comp.last_stage}: update from the base model", 110)
            comp.figure = ctx.plot(cached, path, lambda rep=last_rep, path=path: plot_weights(rep, path, title))
        out.append(comp)
    ctx.results["weights"] = results
    return out


def _unpaired(ctx: ReportContext, a: Chain) -> str:
    """Why chain `a` has no partner: no chain of the other algorithm from its base on its tasks, or each such
    chain paired already (pairs match seeds first, then order: esft.analysis.runs.build_pairs)."""
    other = {"es": "grpo", "grpo": "es"}.get(a.algorithm)
    alike = [c for c in ctx.chains if c.algorithm == other and c.base == a.base and c.tasks == a.tasks]
    if not alike:
        return "no run of the other algorithm from the same base model on the same task sequence"
    runs = ", ".join(f"`{ctx.rel_run(c.stages[-1].run)}`" for c in alike)
    return (f"the {other.upper()} run(s) from the same base model on the same task sequence ({runs}) are each "
            f"paired with another {a.algorithm.upper()} run (pairs match seeds first, then run order)")


def _weights_stage(ctx: ReportContext, comp: UpdateComparison, a: Chain, b: Chain | None,
                   i: int) -> tuple[dict[str, Any], bool] | None:
    """Stage i of chain `a` (and of its partner `b`): the update of each side that has a checkpoint, its rows
    added to `comp`; a side without one is named (report notes, unsupported list). None when neither has one."""
    label = comp.label
    la = a.algorithm
    lb = None if b is None else (b.algorithm if b.algorithm != la else f"{b.algorithm}_2")
    sides = {la: a.stages[i].checkpoint}
    if b is not None:
        sides[lb] = b.stages[i].checkpoint if i < len(b.stages) else None
    tuned = {k: v for k, v in sides.items() if v is not None}
    for side, chain in ((la, a), (lb, b)):
        if chain is not None and sides[side] is None:
            why = _missing_checkpoint(ctx, chain, i)
            rest = (f"{', '.join(x.upper() for x in tuned)} measured alone" if tuned else "nothing measured")
            comp.notes.append(f"Stage {i + 1} ({a.shown_tasks[i]}): {why}; {rest}.")
            ctx.skip(f"weights ({label}, stage {i + 1}, {side.upper()} side)", f"{why}; {rest}")
    if not tuned:
        return None
    params = {"base": fingerprint([a.base]), "tuned": {k: fingerprint([v]) for k, v in tuned.items()},
              "eps": ctx.config.eps}
    rep, cached = ctx.cache.get(f"weights_{slug(label)}_stage{i + 1}", params,
                                lambda: compare_updates(a.base, tuned, eps=ctx.config.eps, progress=ctx.progress),
                                holds=["sparsity_bf16"])  # an older esft's result lacks it: measured again
    for src, names in rep["unmatched"].items():
        ctx.skip(f"weights ({label}, stage {i + 1}): {len(names)} tensor(s) of {src}",
                 "missing from another checkpoint, so left out of every total: " + ", ".join(names[:5]))
    _stage_rows(comp, rep["total"], f"{i + 1}: {a.shown_tasks[i]}", paper.sequence_stage(a.tasks, i), list(sides))
    return rep, cached


def _missing_checkpoint(ctx: ReportContext, chain: Chain, i: int) -> str:
    """Which side of a comparison has no weights at stage i, and where they were looked for."""
    who = chain.algorithm.upper()
    if i >= len(chain.stages):
        return f"the {who} chain ends before stage {i + 1}"
    return f"the {who} run `{ctx.rel_run(chain.stages[i].run)}` left no checkpoint with weights for this stage"


def _stage_rows(comp: UpdateComparison, tot: dict[str, Any], stage: str, k: int | None, names: list[str]) -> None:
    """One stage's rows of Tables 3, 4 (and 20 when paired), the study's values after the same task last; the
    cells of a side absent from `tot` (no checkpoint) read "missing"."""
    la = names[0]
    if comp.paired:
        ea, gb = tot.get(la), tot.get(names[1])

        def cell(side: dict[str, Any] | None, key: str, show=lambda x: x) -> Any:
            return MISSING if side is None else show(side[key])

        ratio = tot.get(f"norm_ratio:{la}|{names[1]}")
        p3 = paper.TABLE3[k] if k is not None else None
        comp.norms.append([stage, cell(ea, "norm"), cell(gb, "norm"), f"{ratio:.3g}x" if ratio is not None else NA,
                           f"{p3[0]} / {p3[1]} / {p3[2]}x (after {paper.stage_label(k)})" if p3 else NA])
        p4 = paper.TABLE4[k] if k is not None else None
        comp.sparsity.append([stage, MISSING if ea is None else _sparsity(ea), MISSING if gb is None else _sparsity(gb),
                              cell(ea, "stable_rank_mean"), cell(gb, "stable_rank_mean"), _gaussian(ea, gb),
                              f"{pct(p4[0])} / {pct(p4[1])} / {p4[2]} / {p4[3]}" if p4 else NA])
        cos = tot.get(f"cos:{la}|{names[1]}")
        p20 = paper.TABLE20[k] if k is not None else None
        comp.cosines.append([stage, cos if ea is not None and gb is not None else MISSING,
                             f"{p20[0]:.1e} (Qwen) / {p20[1]:.1e} (Llama)" if p20 else NA])
        return
    ea = tot[la]
    if la not in ("es", "grpo"):
        k = None  # mixed chains (grpo->es): the study has no such run
    p3 = paper.TABLE3[k] if k is not None else None
    p4 = paper.TABLE4[k] if k is not None else None
    col = 0 if la == "es" else 1
    comp.norms.append([stage, ea["norm"], f"{p3[col]}" if p3 else NA])
    comp.sparsity.append([stage, _sparsity(ea), ea["stable_rank_mean"], _gaussian(ea),
                          f"{pct(p4[col])} / {p4[2 + col]}" if p4 else NA])


def _sparsity(side: dict[str, Any]) -> str:
    """Table 4's sparsity, and beside it that of the weights rounded to bf16 where it differs (fp32 weights)."""
    exact, bf16 = pct(side["sparsity"]), side.get("sparsity_bf16")
    return exact if bf16 is None or pct(bf16) == exact else f"{exact} (bf16 {pct(bf16)})"


def _gaussian(*sides: dict[str, Any] | None) -> Any:
    """The stable rank of Gaussian matrices of the measured shapes (the same for both sides of a pair)."""
    found = [s["stable_rank_gaussian"] for s in sides if s is not None and s.get("stable_rank_gaussian") is not None]
    return found[0] if found else NA


def family_rows(rep: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """(header, rows) of norm, sparsity and stable rank per matrix family, and the cosine of each pair."""
    labels = rep["labels"]
    head = ["family", "tensors", "entries"]
    for lab in labels:
        head += [f"{lab} norm", f"{lab} sparsity", f"{lab} stable rank"]
    pairs = rep.get("pairs", [])
    head += [f"cos {p}" for p in pairs]
    rows = []
    for fam, v in rep["families"].items():
        row = [fam, v["tensors"], v["numel"]]
        for lab in labels:
            row += [v[lab]["norm"], pct(v[lab]["sparsity"]), v[lab]["stable_rank_mean"]]
        row += [v.get(f"cos:{p}") for p in pairs]
        rows.append(row)
    return head, rows
