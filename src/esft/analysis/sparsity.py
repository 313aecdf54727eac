"""Functional sparsity: how much of an update is needed for its accuracy (Ba et al.).

Keep only the update coordinates with |d| > tau, revert the others to the base weights, and re-evaluate, over a
sweep of tau. The reported sparsity at tau is the fraction of reverted coordinates, |d| <= tau (so at tau = 1e-5
it is the sparsity of paper Table 4). Thresholds can be given directly or chosen to hit target sparsities
from a streamed log-histogram of |d|; the sparsity actually reached is always measured exactly, and shown beside
the targets asked for (a target of 90% can land at 100% when most entries of the update are exact zeros). Each
sweep records its tasks' constant-answer baselines of the same examples (esft.analysis.constant).

`report_sparsity` is the report's section (esft.analysis.report_builder): one sweep per method and task
sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
import torch

from esft import paper
from esft.analysis.barrier import path_score_names
from esft.analysis.constant import KEY, LABEL, baseline_text, draw_baseline, shown, task_baselines
from esft.analysis.landscape import DeltaDirection, Direction, accuracy, prepare_tasks, set_weights
from esft.analysis.report_cache import fingerprint, slug
from esft.analysis.score_text import interval_notes, interval_text
from esft.analysis.sources import DEFAULT_CHUNK_ELEMS, aligned_refs, as_source, iter_chunks
from esft.figure_marks import bars_label, interval_bars
from esft.tables import NA, fmt, pct
from esft.tasks.labels import ACCURACY, MEAN_REWARD, score_name

if TYPE_CHECKING:
    from esft.analysis.report_context import ReportContext

DEFAULT_TARGETS = (0.0, 0.5, 0.75, 0.9, 0.97, 0.99)
#: the targets `esft analyze sparsity` and `esft report` sweep by default: the study's level among them
SWEEP_TARGETS = (0.0, 0.5, paper.FUNCTIONAL_SPARSITY_LEVEL, 0.9, 0.99)


def threshold_update(delta: torch.Tensor, tau: float) -> torch.Tensor:
    """delta with every entry |d| <= tau set to zero (those coordinates revert to the base); compared in float64,
    as `sparsity_at` counts (torch would round tau to a bf16/fp16 delta's dtype)."""
    return torch.where(delta.abs().to(torch.float64) > tau, delta, torch.zeros_like(delta))


def sparsity_at(base: Any, tuned: Any, taus: Sequence[float], chunk_elems: int = DEFAULT_CHUNK_ELEMS) -> list[float]:
    """Exact fraction of update entries with |d| <= tau, for each tau, in one streamed pass."""
    sb, st = as_source(base), as_source(tuned)
    rows, _ = aligned_refs([sb, st])
    taus_t = torch.tensor([float(t) for t in taus], dtype=torch.float64)
    small = torch.zeros(len(taus), dtype=torch.float64)
    total = 0
    for _, refs in rows:
        for b, t in iter_chunks([sb, st], refs, chunk_elems):
            a = (t - b).abs().flatten()
            # sort once per chunk, then count entries <= each tau by binary search
            s, _ = torch.sort(a)
            small += torch.searchsorted(s, taus_t, right=True).to(torch.float64)
            total += a.numel()
    _check_shared(total)
    return (small / total).tolist()


def _check_shared(total: int) -> None:
    """A base and a tuned model with no weight in common (another architecture, a wrong folder) have no update to
    measure: a sparsity of 0 or a threshold at the top of the histogram would pass for one."""
    if total == 0:
        raise ValueError("the base and the tuned weights have no tensor in common (same names and shapes): no "
                         "update to measure")


def abs_histogram(base: Any, tuned: Any, edges: np.ndarray,
                  chunk_elems: int = DEFAULT_CHUNK_ELEMS) -> tuple[np.ndarray, int, int]:
    """Counts of |d| in bins [edges[i], edges[i+1]); returns (counts, entries below edges[0] (exact zeros
    included), total entries). Values >= edges[-1] land in the last bin."""
    sb, st = as_source(base), as_source(tuned)
    rows, _ = aligned_refs([sb, st])
    e = torch.tensor(edges, dtype=torch.float64)
    counts = torch.zeros(len(edges) - 1, dtype=torch.float64)
    below = total = 0
    for _, refs in rows:
        for b, t in iter_chunks([sb, st], refs, chunk_elems):
            a = (t - b).abs().flatten()
            total += a.numel()
            low = a < e[0]
            below += int(low.sum())
            idx = (torch.bucketize(a[~low], e, right=True) - 1).clamp(0, len(edges) - 2)
            counts += torch.bincount(idx, minlength=len(edges) - 1).to(torch.float64)
    _check_shared(total)
    return counts.numpy(), below, total


def taus_for_sparsity(base: Any, tuned: Any, targets: Sequence[float] = DEFAULT_TARGETS, bins: int = 4000,
                      lo: float = 1e-12, hi: float = 1e3) -> list[float]:
    """Thresholds whose sparsity is (up to the histogram resolution, one bin: ~0.9% in tau) each target fraction.
    Target 0 gives tau = 0 (the full update, exact zeros excepted)."""
    edges = np.geomspace(lo, hi, bins + 1)
    counts, below, total = abs_histogram(base, tuned, edges)
    cum = (below + np.cumsum(counts)) / max(1, total)  # fraction <= edges[i+1] (approximately)
    taus = []
    for q in targets:
        if q <= 0:
            taus.append(0.0)
            continue
        i = int(np.searchsorted(cum, q, side="left"))
        taus.append(float(edges[min(i + 1, len(edges) - 1)]))
    return taus


class ThresholdedDelta(Direction):
    """tuned - base with entries |d| <= tau zeroed."""

    def __init__(self, delta: DeltaDirection, tau: float):
        self.delta, self.tau = delta, float(tau)
        self.label = f"tau={tau:g}"

    def bind(self, model):
        self.delta.bind(model)
        return self

    def tensor(self, name: str):
        t = self.delta.tensor(name)
        return None if t is None else threshold_update(t, self.tau)

    def tensor_norms(self) -> dict[str, float]:
        return {n: float(self.tensor(n).norm()) for n in self.delta.tensor_norms()}


def sparsity_sweep(model, tokenizer, base: Any, tuned: Any, tasks: Mapping[str, tuple[Any, list]], gen_config,
                   taus: Sequence[float] | None = None, targets: Sequence[float] = DEFAULT_TARGETS,
                   progress: bool = False) -> dict[str, Any]:
    """Accuracy of base + threshold(tuned - base, tau) for each tau (from `targets` when `taus` is None), next
    to the exact sparsity reached and the targets that chose it ("targets"; none for a threshold given); the
    base model's accuracy is included as the fully reverted end point, and each task's constant-answer baseline."""
    asked: dict[float, list[float]] = {}
    if taus is None:
        taus = taus_for_sparsity(base, tuned, targets)
        for q, tau in zip(targets, taus):
            asked.setdefault(float(tau), []).append(float(q))
    taus = sorted(set(float(t) for t in taus))
    sp = sparsity_at(base, tuned, taus)
    delta = DeltaDirection(base, tuned, "update").bind(model)
    rows = []
    scores: dict[str, list[list[float] | None]] = {n: [] for n in tasks}

    def evaluate() -> dict[str, float]:
        got: dict[str, list[float]] = {}
        acc = accuracy(model, tokenizer, tasks, gen_config, scores_out=got, progress=progress)
        for n in tasks:
            scores[n].append(got.get(n))
        return acc

    for tau, s in zip(taus, sp):
        if rows and s == rows[-1]["sparsity"]:
            rows[-1]["targets"] += asked.get(tau, [])  # the same coordinates kept: the same model, evaluated once
            continue
        set_weights(model, base, [(1.0, ThresholdedDelta(delta, tau).bind(model))])
        acc = evaluate()
        rows.append({"tau": tau, "sparsity": s, "targets": list(asked.get(tau, [])), "accuracy": acc})
        if progress:
            print(f"tau={tau:.3g} sparsity={s:.4f} " + " ".join(f"{n}={v:.3f}" for n, v in acc.items()), flush=True)
    set_weights(model, base)
    base_acc = evaluate()
    means = {n: [*(r["accuracy"][n] for r in rows), base_acc[n]] for n in tasks}
    return {"rows": rows, "base_accuracy": base_acc, "n": {n: len(tasks[n][1]) for n in tasks},
            "update_norm": delta.norm, "score": path_score_names(scores, means), KEY: task_baselines(tasks)}


def plot_sparsity_sweep(results: Mapping[str, Mapping[str, Any]], path: str | Path) -> Path:
    """Accuracy vs sparsity of the kept update, one line per method in the panel of each task it evaluated; base
    accuracy dash-dotted in its colour, each task's best constant answer dotted grey. A result's "algorithm" (a
    report's sweeps are keyed by track name, e.g. "es@100") picks its colour, else its label. Each accuracy
    carries its 95% Wilson interval over the sweep's n examples; the legend sits under the panel."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    from esft.analysis.plots import accuracy_axis, color, pyplot, save, say_empty

    plt = pyplot()
    tasks = sorted({t for r in results.values() for row in r["rows"] for t in row["accuracy"]})
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(4 * max(1, len(tasks)), 3.3), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        bases = False
        drawn = 0
        counts: set[int] = set()
        for label, r in results.items():
            if not all(t in row["accuracy"] for row in r["rows"]):  # a run of another task sequence
                continue
            col = color(r.get("algorithm") or label)
            xs = [row["sparsity"] for row in r["rows"]]
            ys = [row["accuracy"][t] for row in r["rows"]]
            # each later line's marks smaller and thinner: a point at (nearly) another's place still shows
            ax.plot(xs, ys, color=col, label=label, marker="os^D"[drawn % 4], ms=max(3, 8 - 2 * drawn),
                    lw=max(0.8, 2.5 - 0.7 * drawn), zorder=3 + drawn)
            count = (r.get("n") or {}).get(t)
            if count and (r.get("score") or {}).get(t, ACCURACY) == ACCURACY:
                interval_bars(ax, xs, ys, count, col, label=None if count in counts else bars_label(count))
                counts.add(count)
            drawn += 1
            if t in r.get("base_accuracy", {}):
                ax.axhline(r["base_accuracy"][t], color=col, ls="-.", lw=1)
                bases = True
        constants = {baseline_text(b): b for r in results.values()
                     if (b := shown(r, {t: (r.get("score") or {}).get(t, ACCURACY)}).get(t))}
        for b in constants.values():  # one line for sweeps of the same examples
            draw_baseline(ax, b)
        # a few ticks: sparsities a few 1e-4 apart got seven 6-digit labels, printed over each other
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
        ax.set_xlabel(r"sparsity (fraction of $|\Delta\theta_i| \leq \tau$ reverted)")
        accuracy_axis(ax, MEAN_REWARD if any((r.get("score") or {}).get(t) == MEAN_REWARD for r in results.values())
                      else ACCURACY)
        ax.set_title(t, fontsize=9)
        handles, names = ax.get_legend_handles_labels()
        if bases:  # one entry for them, each in its method's colour; dash-dot, as the constant answer is grey dotted
            handles.append(Line2D([], [], color="black", ls="-.", lw=1))
            names.append("base model (dash-dot, method's colour)")
        # under the panel: inside it, the entries (a line per sweep, the base, the constant answer) hid the points
        ax.legend(handles, names, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    if not tasks:
        say_empty(axes[0][0], "no sparsity level evaluated")
    return save(fig, path)



# ---- the report's section ------------------------------------------------------------------------------------------

@dataclass
class SparsitySweep:
    """One chain's sweep: its label, the tasks it evaluated and the result of `sparsity_sweep`."""

    label: str
    tasks: list[str]
    result: dict[str, Any]


def report_sparsity(ctx: ReportContext) -> tuple[list[SparsitySweep], Path] | None:
    """The sweep of the first seed of every method and task sequence with a final checkpoint, and the figure of
    all of them; None when no chain has one."""
    opts = ctx.task_options()
    chains = [c for c in ctx.chains if c.base is not None and c.stages[-1].checkpoint is not None]
    for c in ctx.chains:
        if c.base is None or c.stages[-1].checkpoint is None:
            ctx.skip(f"functional sparsity ({c.label})", "no base model folder on disk" if c.base is None else
                     "its last stage has no checkpoint with weights")
    seen: set[tuple] = set()
    todo = []
    for c in chains:  # one per algorithm and task sequence (the first seed)
        key = (c.name or c.algorithm, tuple(c.tasks))
        if key not in seen:
            seen.add(key)
            todo.append(c)
    if not todo:
        ctx.skip("functional sparsity", "no run with a base model folder and a final checkpoint")
        return None
    todo = ctx.evaluable(todo, "functional sparsity")
    if not todo:
        return None
    results, sweeps, all_cached, loaded = {}, [], True, []
    targets, limit = ctx.config.sparsity_targets, ctx.config.limit
    for c in todo:
        gc = ctx.gen_config(c)
        tasks = list(dict.fromkeys(ctx.task_name(t) for t in c.tasks))
        fin = c.stages[-1].checkpoint
        params = {"base": fingerprint([c.base]), "tuned": fingerprint([fin]), "limit": limit,
                  "max_new_tokens": gc.max_new_tokens, "targets": targets, "options": opts, **ctx.eval_params()}

        def compute(c=c, fin=fin, gc=gc, tasks=tasks):
            if not loaded or loaded[0] != c.base:  # one model at a time, loaded again for another base
                loaded[:] = [c.base, *ctx.load(c.base)]
            return sparsity_sweep(loaded[1], loaded[2], c.base, fin, prepare_tasks(tasks, limit, task_options=opts,
                                                                                balanced=ctx.config.balanced,
                                                                                build=ctx.build_task),
                                  gc, targets=targets, progress=ctx.progress)

        res, cached = ctx.cache.get(f"sparsity_{slug(c.label)}", params, compute, holds=[KEY])
        all_cached = all_cached and cached
        label = c.name or c.algorithm
        results[label if label not in results else c.label] = {**res, "algorithm": c.algorithm}
        sweeps.append(SparsitySweep(c.label, tasks, res))
    figure = ctx.plot(all_cached, ctx.fig("functional_sparsity"),
                      lambda: plot_sparsity_sweep(results, ctx.fig("functional_sparsity")))
    ctx.results["sparsity"] = results
    return sweeps, figure


def _score_names(sweep: SparsitySweep) -> list[str]:
    """ACCURACY or MEAN_REWARD per task of the sweep: as its result recorded it from the per-example scores, else
    (a result computed before it recorded them) from every value of the table."""
    res = sweep.result
    return [(res.get("score") or {}).get(t) or score_name([*(r["accuracy"][t] for r in res["rows"]),
                                                           res["base_accuracy"][t]]) for t in sweep.tasks]


def sweep_table_header(sweep: SparsitySweep) -> list[str]:
    """The columns of `sweep_table_rows`: each task's named "acc" or "mean reward"."""
    return ["tau", "target sparsity", "sparsity reached"] + [f"{t} {'acc' if name == ACCURACY else name}"
                                                             for t, name in zip(sweep.tasks, _score_names(sweep))]


def sweep_table_notes(sweep: SparsitySweep) -> list[str]:
    """The caption under `sweep_table_rows`: what its accuracies' brackets are."""
    return interval_notes(sweep.result, dict(zip(sweep.tasks, _score_names(sweep))))


def target_text(row: dict[str, Any]) -> str:
    """The target sparsities that chose a row's threshold (several when their thresholds keep the same entries);
    "(tau given)" for a threshold given directly, n/a for a result computed before results recorded them."""
    if "targets" not in row:
        return NA
    return ", ".join(pct(q) for q in row["targets"]) or "(tau given)"


def sweep_table_rows(sweep: SparsitySweep) -> list[list[Any]]:
    """Per threshold: tau, the target sparsities asked for, the sparsity reached, the accuracy per task (with its
    95% Wilson interval over the result's n examples: `sweep_table_notes`); then the
    base model (all reverted) and, when some task is an accuracy, its best constant answer of the same examples
    (n/a for a mean reward or a result that recorded none). A task's column is a mean reward rather than a
    percentage when its scores leave [0, 1] (esft.analysis.score_text)."""
    res, tasks, names = sweep.result, sweep.tasks, _score_names(sweep)
    cell = [interval_text(name, (res.get("n") or {}).get(t)) for name, t in zip(names, tasks)]
    rows = [[fmt(r["tau"]), target_text(r), pct(r["sparsity"])] + [s(r["accuracy"][t]) for s, t in zip(cell, tasks)]
            for r in res["rows"]]
    rows.append(["base (all reverted)", "", "100%"] + [s(res["base_accuracy"][t]) for s, t in zip(cell, tasks)])
    if ACCURACY in names:
        constant = shown(res, dict(zip(tasks, names)))
        rows.append([LABEL, "", ""] + [baseline_text(constant[t]) for t in tasks])
    return rows
