"""The report's KL section (paper Figure 2, Tables 11-16): every chain whose base and checkpoints are on disk
measured with esft.analysis.kl, chains of one method, track and task sequence aggregated over their seeds, and the
incremental heatmap."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from esft import paper
from esft.analysis.kl import HEADLINE, aggregate_seeds, kl_stages, matrix, plot_heatmap
from esft.analysis.report_cache import fingerprint, slug
from esft.analysis.weights_report import stage_iterations
from esft.tables import fmt, se_text

if TYPE_CHECKING:
    from esft.analysis.report_context import ReportContext


@dataclass
class KLGroup:
    """KL of the seeds of one method (track) on one task sequence: per-seed tables and their aggregate."""

    algorithm: str
    track: str
    tasks: tuple[str, ...]
    seeds: list[dict[str, Any]]
    aggregate: dict[str, Any]
    chain_seeds: list[int | None] = field(default_factory=list)
    """the seed of each chain behind `seeds` (two chains may share one: runs of one seed in two folders)"""
    iterations: list[int | None] = field(default_factory=list)
    """each ES stage's iterations (from its run's config), for the note beside the study's 100-iteration values"""

    @property
    def over(self) -> str:
        """What the aggregate runs over: "3 seeds", or "2 chains (seeds 0, 0)" where chains share a seed."""
        n = len(self.seeds)
        if len(set(self.chain_seeds)) == n == len(self.chain_seeds):
            return f"{n} seed{'s' if n != 1 else ''}"
        return f"{n} chain{'s' if n != 1 else ''} (seeds {', '.join(str(s) for s in self.chain_seeds)})"

    @property
    def title(self) -> str:
        return f"{self.track.upper()} {'->'.join(self.tasks)}"


def report_kl(ctx: ReportContext) -> tuple[list[KLGroup], Path | None] | None:
    """KL of every chain whose base and checkpoints are on disk, seeds of the same method, track (es@100 vs
    es@300) and task sequence aggregated; the incremental heatmap. None when no chain can be measured."""
    chains = [c for c in ctx.chains if c.base is not None and all(st.checkpoint is not None for st in c.stages)]
    for c in ctx.chains:
        if c.base is None:
            ctx.skip(f"KL ({c.label})", f"base model {c.base_spec!r} is not a folder on disk")
        elif c not in chains:
            gone = [f"{i + 1} ({t}, run `{ctx.rel_run(st.run)}`)"
                    for i, (st, t) in enumerate(zip(c.stages, c.shown_tasks)) if st.checkpoint is None]
            ctx.skip(f"KL ({c.label})", f"no checkpoint with weights for stage {', '.join(gone)}")
    if not chains:
        ctx.skip("KL", "no chain with a base model folder and checkpoints")
        return None
    chains = ctx.evaluable(chains, "KL")
    if not chains:
        return None
    tables: dict[tuple[str, str, tuple[str, ...]], list[dict[str, Any]]] = {}
    seeds: dict[tuple[str, str, tuple[str, ...]], list[int | None]] = {}
    budgets: dict[tuple[str, str, tuple[str, ...]], list[int | None]] = {}
    all_cached = True
    opts = ctx.task_options()
    for c in chains:
        tasks = list(dict.fromkeys(ctx.task_name(t) for t in c.tasks))
        gc_ = ctx.gen_config(c)
        stages = c.checkpoints()
        params = {"base": fingerprint([c.base]), "stages": [(l, fingerprint([p])) for l, p in stages],
                  "tasks": tasks, "limit": ctx.config.limit, "max_new_tokens": gc_.max_new_tokens, "options": opts,
                  **ctx.eval_params()}

        def compute(c=c, stages=stages, tasks=tasks, gc_=gc_):
            if ctx.progress:  # kl_stages' lines name stage and task only: the same for every chain
                print(f"esft report: KL of {c.label}", flush=True)
            return kl_stages(c.base, stages, tasks, ctx.config.limit, gc_, ctx.config.kl_batch_size, opts,
                             loader=lambda spec: ctx.load(c.base, Path(spec)), progress=ctx.progress,
                             balanced=ctx.config.balanced, build=ctx.build_task)

        res, cached = ctx.cache.get(f"kl_{slug(c.label)}", params, compute, holds=[f"{HEADLINE}_se"])
        all_cached = all_cached and cached
        # grouped by the tasks' names (ctx.task_name), which its title, tables and results.json show
        key = (c.algorithm, c.name or c.algorithm, tuple(ctx.task_name(t) for t in c.tasks))
        tables.setdefault(key, []).append(res)
        seeds.setdefault(key, []).append(c.seed)
        budgets.setdefault(key, []).extend(stage_iterations(st) for st in c.stages if c.algorithm == "es")
    groups = [KLGroup(*key, tbs, aggregate_seeds(tbs, HEADLINE), seeds[key], budgets[key])
              for key, tbs in tables.items()]
    # a panel is named by its track alone only where that tells the groups apart: two groups of one track (ES
    # chains of two task sequences) share it, and the second panel would replace the first
    tracks = [g.track for g in groups]
    short = len(groups) <= 2 and len(set(tracks)) == len(tracks)
    panels = {(g.track.upper() if short else g.title):
              (matrix(g.aggregate, "incremental", stat="median"), g.aggregate["tasks"], g.aggregate["stages"])
              for g in groups}
    figure = None
    if panels:
        figure = ctx.plot(all_cached, ctx.fig("kl_heatmap"), lambda: plot_heatmap(
            panels, ctx.fig("kl_heatmap"), title=f"incremental KL ({HEADLINE}, median over seeds)"))
    if len(ctx.chains) and all(len(c.runs) == 1 for c in ctx.chains):
        ctx.skip("KL across stages (Figure 2's columns, Tables 13-16's rows)",
                 "single-stage runs only: incremental and cumulative KL coincide")
    ctx.results["kl"] = {f"{g.track} {'->'.join(g.tasks)}": {"seeds": g.seeds, "aggregate": g.aggregate}
                         for g in groups}
    return groups, figure


def study_cell(group: KLGroup, kind: str, task: str, j: int) -> tuple[str, str] | None:
    """The study's cell beside stage j (0-based) on evaluation task `task`: paper.kl_reference of the task trained
    at that stage, wherever it sits in the study's sequence; a cumulative one (Tables 13, 14) only where the chain
    trained the study's sequence up to that stage (paper.sequence_stage), as for Tables 3, 4 and 20: the study's KL
    from the base after its four tasks is no reference for a single-task BoolQ run's after one."""
    trained = [st.split(":", 1)[-1] for st in group.aggregate["stages"]]
    if kind == "cumulative" and paper.sequence_stage(trained, j) is None:
        return None
    return paper.kl_reference(group.algorithm, kind, task, trained[j])


def paper_cells(group: KLGroup) -> int:
    """How many of the group's cells the study gives a value for (`study_cell`): none for a chain it did not run
    (grpo->es) or tasks it did not train, where no note about its values belongs."""
    agg = group.aggregate
    return sum(study_cell(group, kind, t, j) is not None
               for kind in ("incremental", "cumulative") for t in agg["tasks"] for j in range(len(agg["stages"])))


def kl_rows(group: KLGroup, kind: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of `kind` ("incremental" / "cumulative") KL: evaluation task x stage, median [min, max]
    over seeds ± the (median) standard error over sequences, with the study's cell (`study_cell`); where that
    cell is a mean +- std over seeds (Tables 13, 14), ours of several seeds stands beside it too."""
    agg, n = group.aggregate, len(group.seeds)
    head = ["eval task"] + [f"after {st}" for st in agg["stages"]]
    rows = []
    for t in agg["tasks"]:
        row = [t]
        for j, st in enumerate(agg["stages"]):
            cell = agg[kind][t][st]
            ref = study_cell(group, kind, t, j)
            spread = f" [{fmt(cell['min'])}, {fmt(cell['max'])}]" if n > 1 else ""
            val = se_text(cell["median"], cell.get("se"), spread)
            if ref and ref[1] == "mean" and n > 1:
                val += f"; mean {fmt(cell['mean'])} +- {fmt(cell['std'])}"
            row.append(val + (f" (paper {ref[0]})" if ref else ""))
        rows.append(row)
    return head, rows
