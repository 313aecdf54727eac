"""The report's landscape section (paper Figures 3, 4 and 5) for the first ES-GRPO pair, measured with
esft.analysis.landscape: the interpolation between the final checkpoints, the sweeps along each update and a
random direction from the base model, and the holdout tasks along each update from its final checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from esft.analysis.constant import KEY
from esft.analysis.landscape import (HOLDOUT_FRACTIONS, DeltaDirection, Direction, RandomDirection,
                                     default_magnitudes, direction_sweep, interpolation_path, plot_direction_sweep,
                                     plot_interpolation, prepare_tasks)
from esft.analysis.report_cache import fingerprint

if TYPE_CHECKING:
    from esft.analysis.report_context import ReportContext
    from esft.analysis.runs import Chain


#: why a sweep along a zero update is not shown
ZERO_UPDATE = "its update is zero (the run changed no weight): no direction to move along"


@dataclass
class LandscapeReport:
    """Figures 3-5 from one chain's final checkpoint `a` (and its GRPO partner `b`): results and figure paths."""

    labels: tuple[str, str | None]
    tasks: list[str]
    note: str | None = None
    interpolation: dict[str, Any] | None = None
    interpolation_figure: Path | None = None
    directions: dict[str, Any] = field(default_factory=dict)
    directions_figure: Path | None = None
    holdout: list[tuple[str, dict[str, Any], Path]] = field(default_factory=list)


def _endpoints(ctx: ReportContext) -> tuple[Chain, Chain | None] | None:
    """The first ES-GRPO pair, else (no Figure 3) the side of it that has a final checkpoint, or the first chain
    with one; None, skipped, when there is none or its base model is not on disk."""
    items: list[tuple[Chain, Chain | None]] = []
    if ctx.pairs:
        pair = ctx.pairs[0]
        present = [c for c in (pair.es, pair.grpo) if c.stages[-1].checkpoint is not None]
        if len(present) == 2:
            items = [(pair.es, pair.grpo)]
        else:
            missing = [c for c in (pair.es, pair.grpo) if c.stages[-1].checkpoint is None]
            ctx.skip("interpolation ES <-> GRPO (Figure 3)", "; ".join(
                f"the {c.algorithm.upper()} side ({c.label}) has no final checkpoint with weights" for c in missing)
                + (f"; Figures 4-5 use the {present[0].algorithm.upper()} update alone" if present else ""))
            items = [(present[0], None)] if present else []
    if not items:
        cands = [c for c in ctx.chains if c.base is not None and c.stages[-1].checkpoint is not None]
        items = [(cands[0], None)] if cands else []
        if not ctx.pairs:
            ctx.skip("interpolation ES <-> GRPO (Figure 3)", "needs an ES and a GRPO run from the same base on "
                     "the same tasks")
    if not items:
        ctx.skip("landscape (Figures 3-5)", "no run with a base model folder and a final checkpoint")
        return None
    a, b = items[0]
    if a.base is None:
        ctx.skip("landscape", f"base model {a.base_spec!r} is not on disk")
        return None
    ends = [c for c in (a, b) if c is not None]
    if len(ctx.evaluable(ends, "landscape (Figures 3-5)")) < len(ends):
        return None
    return a, b


class _Endpoints:
    """Figures 3-5 between the final checkpoints `fa` (of chain `a`) and `fb` (of its partner, or None): each
    result through the report's cache, the working model loaded once, on first need."""

    def __init__(self, ctx: ReportContext, a: Chain, b: Chain | None):
        self.ctx, self.base, self.gc = ctx, a.base, ctx.gen_config(a)
        self.opts = ctx.task_options()
        self.tasks, self.n = list(dict.fromkeys(ctx.task_name(t) for t in a.tasks)), ctx.config.limit
        self.fa, self.fb = a.stages[-1].checkpoint, (b.stages[-1].checkpoint if b is not None else None)
        self.la, self.lb = a.algorithm, (b.algorithm if b is not None else None)
        self.common = {"base": fingerprint([a.base]), "a": fingerprint([self.fa]), "b": fingerprint([self.fb]),
                       "limit": self.n, "max_new_tokens": self.gc.max_new_tokens, "options": self.opts,
                       **ctx.eval_params()}
        self.loaded: tuple[Any, Any] | None = None

    def model(self) -> tuple[Any, Any]:
        if self.loaded is None:
            self.loaded = self.ctx.load(self.base)
        return self.loaded

    def prepared(self, names: Sequence[str]) -> dict[str, tuple[Any, list]]:
        return prepare_tasks(names, self.n, task_options=self.opts, balanced=self.ctx.config.balanced,
                             build=self.ctx.build_task)

    def figure3(self, out: LandscapeReport) -> None:
        points = self.ctx.config.interpolation_points
        ts = [i / (points - 1) for i in range(points)]

        def interp():
            m, t = self.model()
            return interpolation_path(m, t, self.fa, self.fb, ts, self.prepared(self.tasks), self.gc,
                                      progress=self.ctx.progress)

        res, cached = self.ctx.cache.get("landscape_interpolation", {**self.common, "ts": ts, "tasks": self.tasks},
                                         interp, holds=[KEY, "z_crit"])  # z_crit: the paired barrier test
        path = self.ctx.fig("landscape_interpolation")
        out.interpolation = res
        out.interpolation_figure = self.ctx.plot(cached, path, lambda: plot_interpolation(
            res, path, labels=(self.la.upper(), self.lb.upper())))

    def figure4(self, out: LandscapeReport) -> None:
        def sweep():
            m, t = self.model()
            updates: list[Direction] = [DeltaDirection(self.base, self.fa, self.la.upper())]
            if self.fb is not None:
                updates.append(DeltaDirection(self.base, self.fb, self.lb.upper()))
            for d in updates:
                d.bind(m)
            moved = [d for d in updates if d.norm > 0]  # a zero update has no direction: the base model repeated
            mags = default_magnitudes([d.norm for d in moved], self.ctx.config.magnitude_points)
            if moved:  # norm-matched tensor by tensor to the first update that moved
                moved.append(RandomDirection(moved[0], seed=0, label=f"random (per-tensor norms of {moved[0].label})"
                                             ).bind(m))
            return {**direction_sweep(m, t, self.base, moved, mags, self.prepared(self.tasks), self.gc,
                                      progress=self.ctx.progress), "zero": [d.label for d in updates if d not in moved]}

        res, cached = self.ctx.cache.get("landscape_directions", {
            **self.common, "tasks": self.tasks, "points": self.ctx.config.magnitude_points}, sweep, holds=[KEY],
            accept=lambda r: "zero" in r or no_zero_direction(r))
        for label in res.get("zero", []):
            self.ctx.skip(f"Figure 4 along {label}", ZERO_UPDATE)
        out.directions = res
        if res["directions"]:
            path = self.ctx.fig("landscape_directions")
            out.directions_figure = self.ctx.plot(cached, path, lambda: plot_direction_sweep(
                res, path, title="from the base model"))

    def figure5(self, out: LandscapeReport, hold: list[str]) -> dict[str, Any]:
        def holdout():
            m, t = self.model()
            results, prepared = {}, self.prepared(hold)
            for lab, fin in ((self.la, self.fa), (self.lb, self.fb)):
                if fin is None:
                    continue
                d = DeltaDirection(self.base, fin, lab.upper()).bind(m)
                if not d.norm > 0:
                    continue  # named below
                mags = [0.0] + [f * d.norm for f in HOLDOUT_FRACTIONS]
                results[lab] = direction_sweep(m, t, fin, [d], mags, prepared, self.gc, progress=self.ctx.progress)
            return results

        params = {**self.common, "holdout": hold}
        res5, cached = self.ctx.cache.get("landscape_holdout", params, holdout, holds=[KEY],
                                          accept=lambda r: all(no_zero_direction(sweep) for sweep in r.values()))
        for lab, fin in ((self.la, self.fa), (self.lb, self.fb)):
            if fin is not None and lab not in res5:
                self.ctx.skip(f"Figure 5 along {lab.upper()}", ZERO_UPDATE)
        for lab, r5 in res5.items():
            path = self.ctx.fig(f"landscape_holdout_{lab}")
            self.ctx.plot(cached, path, lambda r5=r5, lab=lab, path=path: plot_direction_sweep(
                r5, path, title=f"holdout tasks from the final {lab.upper()} checkpoint"))
            out.holdout.append((lab, r5, path))
        return res5


def no_zero_direction(sweep: dict[str, Any]) -> bool:
    """Whether a direction sweep holds no zero-norm direction: an older esft swept a zero update (the base model
    repeated) and norm-matched the random direction to it, a result computed again rather than shown."""
    return all(d.get("norm", 0) > 0 for d in sweep.get("directions", {}).values())


def report_landscape(ctx: ReportContext) -> LandscapeReport | None:
    """Figure 3 (the ES-GRPO path), Figure 4 (from the base along each update and a norm-matched random
    direction) and Figure 5 (holdout tasks from each final checkpoint); None when no chain supports them."""
    ends = _endpoints(ctx)
    if ends is None:
        return None
    e = _Endpoints(ctx, *ends)
    out = LandscapeReport((e.la, e.lb), e.tasks)
    if len(ctx.pairs) > 1:
        out.note = f"(Computed for the first of {len(ctx.pairs)} pairs: {ctx.pairs[0].label}.)"
    results: dict[str, Any] = {}
    if ends[1] is not None:
        e.figure3(out)
        results["interpolation"] = out.interpolation
    e.figure4(out)
    results["directions"] = out.directions
    hold = [t for t in ctx.config.holdout_tasks if t]
    if hold:
        results["holdout"] = e.figure5(out, hold)
    else:
        ctx.skip("Figure 5", "no holdout tasks given")
    ctx.results["landscape"] = results
    return out
