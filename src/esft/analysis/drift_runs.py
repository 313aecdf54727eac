"""Drift of the runs under a report's folder against the ES random-walk law (the report's drift section, paper
Figures 6, 9, 10, 11): every ES run's seed log replayed (the series cached under the report's data folder), fitted
with esft.analysis.drift, compared with its GRPO partner's logged drift, drawn, and turned into rows."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from esft.analysis import drift as D
from esft.analysis.report_cache import fingerprint, slug
from esft.analysis.runs import Run, resolve_model
from esft.tables import fmt, iqr, r2

if TYPE_CHECKING:
    from esft.analysis.report_context import ReportContext


@dataclass
class RunDrift:
    """One ES run's drift: the fit (esft.analysis.drift.analyze_series, with a `grpo` entry when compared), the
    GRPO series it was compared with, and its figures as (caption, path)."""

    name: str
    run: Run
    result: dict[str, Any]
    grpo: D.DriftSeries | None
    figures: list[tuple[str, Path]] = field(default_factory=list)


def _grpo_series(ctx: ReportContext, grpo_runs: list[Run]) -> dict[Path, D.DriftSeries]:
    """The logged drift of every GRPO run, per tensor sizes from its base model when that is on disk."""
    from esft.analysis.sources import CheckpointSource

    out = {}
    for g in grpo_runs:
        if g.drift_log is None:
            ctx.skip(f"GRPO drift ({ctx.rel_run(g)})", "the run has no drift.jsonl")
            continue
        numel = None
        base = resolve_model(g.model, g, ctx.root)
        if base is not None:
            shapes = CheckpointSource(base).shapes()
            numel = {k: int(math.prod(v)) for k, v in shapes.items()}
        out[g.path] = D.read_series(g.drift_log, numel)
    return out


def _replayed(ctx: ReportContext, r: Run, name: str) -> tuple[D.DriftSeries, bool]:
    """The ES run's drift series from a replay of its seed log, reused while the seed log is unchanged."""
    params = {"seeds": fingerprint([r.seed_log]), "config": r.config.get("model")}
    cache_path = ctx.out / "data" / f"drift_{slug(str(r.path))[-60:]}.jsonl"
    key = json.dumps(params, default=str)
    meta = cache_path.with_suffix(".params")
    cached = cache_path.exists() and meta.exists() and meta.read_text() == key and not ctx.config.recompute
    if cached:
        return D.read_series(cache_path), True
    ctx.log(f"replaying {name} (one noise regeneration per member per step)")
    model = None
    if ctx.config.device:  # the run's dtype, and noise of its device type (esft.es.replay.load_base)
        from esft.es.replay import load_base

        model, _ = load_base(r.path, device=ctx.config.device, other_type="recorded")
    series = D.es_series(r.path, model=model, progress=ctx.progress)
    meta.unlink(missing_ok=True)  # the series is valid only once its key is written after it (Ctrl-C mid-write)
    series.write(cache_path)
    meta.write_text(key)
    return series, False


def _compare(res: dict[str, Any], series: D.DriftSeries, gs: D.DriftSeries, alpha: float, n: int) -> None:
    res["grpo"] = {"steps": gs.steps[-1] if gs.steps else None, "final_sq": gs.total[-1] if gs.total else None,
                   "ratio_at_matched_step": D.displacement_ratio(series, gs)}
    if gs.per_tensor:
        res["grpo"]["fit"] = {k: v for k, v in D.analyze_series(gs, alpha, n).items()
                              if k in ("total", "families", "kinds")}


def _figures(ctx: ReportContext, name: str, series: D.DriftSeries, res: dict[str, Any], gs: D.DriftSeries | None,
             alpha: float, n: int, cached: bool) -> list[tuple[str, Path]]:
    figs = {"total": ctx.fig(f"drift_total_{slug(name)}"), "families": ctx.fig(f"drift_families_{slug(name)}"),
            "curves": ctx.fig(f"drift_tensors_{slug(name)}"), "rho_r2": ctx.fig(f"drift_rho_r2_{slug(name)}")}
    ctx.plot(cached, figs["total"], lambda: D.plot_total(series, alpha, n, figs["total"], grpo=gs, title=name))
    if not res["tensors"]:
        return [("total drift (Figure 9 / 6A)", figs["total"])]
    # each figure names its run, as the total's does: the report shows six of each for a study of two seeds
    ctx.plot(cached, figs["families"], lambda: D.plot_families(res, figs["families"], title=name))
    ctx.plot(cached, figs["curves"], lambda: D.plot_tensor_curves(series, res, alpha, n, figs["curves"], title=name))
    ctx.plot(cached, figs["rho_r2"], lambda: D.plot_rho_r2(res, figs["rho_r2"], title=name))
    return [("total drift (Figure 9 / 6A)", figs["total"]), ("rho and R^2 per family (Figure 10)", figs["families"]),
            ("per-tensor drift (Figure 11)", figs["curves"]), ("rho vs R^2 (Figure 6C)", figs["rho_r2"])]


def report_drift(ctx: ReportContext) -> tuple[list[RunDrift], list[tuple[str, D.DriftSeries]]]:
    """Every ES run's drift (with its GRPO partner's, if any), and the GRPO runs shown alone when there is no ES
    run, as (name, series)."""
    es_runs = [r for r in ctx.runs if r.algorithm == "es"]
    grpo_runs = [r for r in ctx.runs if r.algorithm == "grpo"]
    if not es_runs:
        ctx.skip("ES drift (Figures 6, 9-11)", "no ES run")
    grpo_series = _grpo_series(ctx, grpo_runs)
    partner = {p.es.runs[i].path: p.grpo.runs[i] for p in ctx.pairs
               for i in range(min(len(p.es.runs), len(p.grpo.runs)))}
    out: list[RunDrift] = []
    results: dict[str, Any] = {}
    for r in es_runs:
        name = ctx.rel_run(r)
        if r.seed_log is None:
            ctx.skip(f"ES drift ({name})", "no seeds.jsonl to replay")
            continue
        alpha, n = r.hyper("alpha"), r.hyper("population_size")
        if alpha is None or n is None:
            ctx.skip(f"ES drift ({name})", "config.yaml lacks alpha or population_size")
            continue
        series, cached = _replayed(ctx, r, name)
        res = D.analyze_series(series, float(alpha), int(n))
        g = partner.get(r.path)
        gs = grpo_series.get(g.path) if g is not None else None
        compared = g.path if gs is not None else None
        if gs is None and len(grpo_series) == 1 and not ctx.pairs:
            only = next(iter(grpo_series))
            # a GRPO stage that went on from this ES run's weights (an es->grpo chain) is no comparison with it
            if not any({r.path, only} <= {x.path for x in c.runs} for c in ctx.chains):
                compared, gs = only, grpo_series[only]
        if gs is not None:
            _compare(res, series, gs, float(alpha), int(n))
            # a reader takes an ES/GRPO ratio for a like-for-like one: say which run it is and whether it is a pair
            res["grpo"]["run"] = ctx.rel_run(next(x for x in grpo_runs if x.path == compared))
            res["grpo"]["paired"] = g is not None
            if g is None:
                res["grpo"]["unpaired"] = _why_unpaired(ctx, r.path, compared)
        results[name] = {k: v for k, v in res.items() if k != "tensors"}
        results[name]["tensors"] = res["tensors"]
        out.append(RunDrift(name, r, res, gs))
        out[-1].figures = _figures(ctx, name, series, res, gs, float(alpha), int(n), cached)
    # without ES runs there is nothing to pair with: every GRPO run's drift stands alone
    grpo_only = [(ctx.rel_run(g), grpo_series[g.path]) for g in grpo_runs if g.path in grpo_series and not es_runs]
    ctx.results["drift"] = results
    return out, grpo_only


def _why_unpaired(ctx: ReportContext, es: Path, grpo: Path) -> str:
    """What keeps the ES run at `es` and the GRPO run at `grpo` from pairing (esft.analysis.runs.build_pairs)."""
    ce, cg = (next((c for c in ctx.chains if path in {x.path for x in c.runs}), None) for path in (es, grpo))
    if ce is None or cg is None or ce.base is None or cg.base is None:
        # runs pair by their base model's folder: a hub id or a path not on this machine has none to compare
        return "a base model not found on disk here"
    return "another base model" if ce.base != cg.base else "another task sequence"


def drift_notes(r: Run) -> list[str]:
    """Settings of the run under which the random-walk law does not hold as stated."""
    notes = []
    if r.config.get("optimizer", "sgd") != "sgd":
        notes.append("the run used Adam: the random-walk law does not apply to its steps")
    if r.config.get("antithetic"):
        notes.append("antithetic sampling: members are not independent, the law's N differs")
    if r.config.get("fitness_shaping", "zscore") != "zscore":
        notes.append(f"fitness shaping {r.config.get('fitness_shaping')}: sum z^2 != N, compare with the "
                     "logged expectation instead")
    zero = sum(1 for m in r.metrics if m.get("kind") == "train" and m.get("zero_update"))
    if zero:
        notes.append(f"{zero} step{'s' if zero > 1 else ''} had zero fitness spread and made no update")
    return notes


def law_rows(res: dict[str, Any], compared: bool) -> list[list[Any]]:
    """(quantity, value) rows: the measured total drift against the law, and against GRPO when `compared`."""
    t = res.get("total", {})
    rows = [["steps T", res["steps"]], ["d (perturbed parameters)", res.get("num_params")],
            ["alpha / N", f"{res['alpha']:g} / {res['population']}"],
            ["final ||dtheta||^2", t.get("final_sq")], ["predicted alpha^2 T d / N", t.get("predicted_final_sq")],
            ["measured / predicted", t.get("final_ratio")],
            ["R^2 of the theory line (no fitted parameter)", r2(t.get("r2_theory"))],
            ["R^2 vs expectation from the logged coefficients", r2(res.get("r2_logged_expectation"))],
            ["measured / that expectation (steps that moved)", res.get("final_over_logged_expectation")],
            ["free fit through origin: rho = d_eff / d", t.get("rho")], ["free fit R^2", r2(t.get("r2_fit"))]]
    if compared and res.get("grpo"):
        ratio = res["grpo"].get("ratio_at_matched_step") or {}
        if "run" in res["grpo"]:
            pair = ("its pair" if res["grpo"].get("paired") else "not a pair: the only GRPO run here, of "
                    + res["grpo"].get("unpaired", "another base model or task sequence"))
            rows.append(["GRPO run compared", f"{res['grpo']['run']} ({pair})"])
        rows.append(["GRPO final ||dtheta||^2", res["grpo"].get("final_sq")])
        rows.append([f"ES/GRPO displacement at matched step {ratio.get('step', '?')}", ratio.get("ratio")])
    return rows


def family_rows(res: dict[str, Any]) -> list[list[Any]]:
    """Per family: tensors, entries each, rho and fit R^2 (median [IQR]), median theory R^2."""
    return [[fam, v["n"], v["numel"], iqr(v["rho"]), iqr(v["r2_fit"]), fmt(v["r2_theory"]["median"])]
            for fam, v in res["families"].items()]


def grpo_family_rows(res: dict[str, Any]) -> list[list[Any]]:
    """The GRPO run's per-family fit in the units of the ES law, when it was compared per tensor."""
    families = res.get("grpo", {}).get("fit", {}).get("families") or {}
    return [[fam, v["n"], iqr(v["rho"]), iqr(v["r2_fit"])] for fam, v in families.items()]
