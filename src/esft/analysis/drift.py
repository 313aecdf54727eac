"""Weight drift during training against the ES random-walk law (paper Figures 6, 9, 10, 11).

With z-scored fitness, every ES step adds (alpha/N) sum_n z_n eps_n with sum_n z_n^2 = N, so
E||theta_T - theta_0||^2 = alpha^2 T d / N with no free parameter (d = perturbed parameters, N = population).
Per tensor p with d_p entries the same holds with d_p. This module

* computes the prediction (`predicted_sq_drift`);
* reads squared displacement per step, total and per tensor, from an ES run (replaying `seeds.jsonl` with
  `esft.es.replay.drift`; no checkpoints needed) or from a GRPO run's `drift.jsonl`;
* fits ||dtheta_T||^2 = k T through the origin per tensor: d_eff = k N / alpha^2, rho = d_eff / d_p, and the
  R^2 of that fit; and the R^2 of the theory line itself (no fitted parameter). R^2 is measured against the
  mean of the data (centred), so a curve that saturates (RMSNorm gains) gets a low or negative R^2, as in the paper;
* summarises rho and R^2 per family (median and interquartile range) and draws the figures.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from esft.analysis.canonical import canonical_name, kind_of, layer_of, parse_name, role_of
from esft.tables import short


# ---- pure math ---------------------------------------------------------------------------------------------------

def predicted_sq_drift(alpha: float, steps: float | np.ndarray, d: float, population: int) -> float | np.ndarray:
    """E||theta_T - theta_0||^2 = alpha^2 T d / N for ES with z-scored fitness and independent members."""
    out = float(alpha) ** 2 * np.asarray(steps, dtype=np.float64) * float(d) / float(population)
    return float(out) if out.ndim == 0 else out


def r2_score(y: Sequence[float], prediction: Sequence[float]) -> float:
    """1 - SS_res / SS_tot with SS_tot about the mean of y (may be negative; NaN when y is constant)."""
    y = np.asarray(y, dtype=np.float64)
    p = np.asarray(prediction, dtype=np.float64)
    # a constant y (every step after the first moved nothing) has no R^2; its mean can round off the value itself,
    # which left SS_tot at ~1e-35 and an R^2 of -1e31
    if y.size == 0 or np.all(y == y[0]):
        return math.nan
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - p) ** 2).sum()) / ss_tot


def fit_through_origin(x: Sequence[float], y: Sequence[float]) -> dict[str, float]:
    """Least-squares y = k x with no intercept: k = sum(x y) / sum(x^2), and the (centred) R^2 of that line."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    sxx = float((x * x).sum())
    if sxx == 0.0:
        raise ValueError("fit_through_origin needs a nonzero x")
    k = float((x * y).sum()) / sxx
    return {"slope": k, "r2": r2_score(y, k * x)}


def fit_drift(steps: Sequence[float], sq: Sequence[float], alpha: float, population: int,
              numel: int) -> dict[str, float | None]:
    """Through-origin fit of squared displacement vs step: d_eff = k N / alpha^2, rho = d_eff / numel,
    R^2 of the fit, and R^2 of the theory line alpha^2 T numel / N (no fitted parameter)."""
    f = fit_through_origin(steps, sq)
    d_eff = f["slope"] * population / alpha ** 2
    theory = predicted_sq_drift(alpha, np.asarray(steps, dtype=np.float64), numel, population)
    return {"slope": f["slope"], "d_eff": d_eff, "rho": d_eff / numel if numel else None,
            "r2_fit": _none_if_nan(f["r2"]), "r2_theory": _none_if_nan(r2_score(sq, theory))}


def _none_if_nan(x: float) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


def quartiles(values: Iterable[float | None]) -> dict[str, float | None]:
    v = np.asarray([x for x in values if x is not None and not math.isnan(x)], dtype=np.float64)
    if v.size == 0:
        return {"n": 0, "median": None, "q1": None, "q3": None, "min": None, "max": None}
    q1, med, q3 = np.percentile(v, [25, 50, 75])
    return {"n": int(v.size), "median": float(med), "q1": float(q1), "q3": float(q3),
            "min": float(v.min()), "max": float(v.max())}


# ---- drift series ------------------------------------------------------------------------------------------------

@dataclass
class DriftSeries:
    """Squared displacement ||theta_t - theta_0||^2 for t in `steps`, total and per tensor (canonical names)."""

    steps: list[int]
    total: list[float]
    per_tensor: dict[str, list[float]] = field(default_factory=dict)
    numel: dict[str, int] = field(default_factory=dict)
    num_params: int | None = None
    expected: list[float] | None = None
    """ES only: the expectation accumulated from the logged update coefficients (exact for any shaping)."""
    source: str = ""

    def to_records(self) -> list[dict[str, Any]]:
        out = []
        for i, s in enumerate(self.steps):
            rec: dict[str, Any] = {"step": s, "total": self.total[i]}
            if self.expected is not None:
                rec["expected"] = self.expected[i]
            if self.per_tensor:
                rec["per_tensor"] = {n: v[i] for n, v in self.per_tensor.items()}
            out.append(rec)
        return out

    def write(self, path: str | Path) -> Path:
        """JSONL: a header line {"numel", "num_params", "source"} then one line per step; written whole or not at
        all (a series cut by a Ctrl-C would read as a shorter run: read_series skips a torn last line)."""
        from esft.rundir import write_text_atomic

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        head = {"header": True, "numel": self.numel, "num_params": self.num_params, "source": self.source}
        write_text_atomic(path, "".join(json.dumps(rec) + "\n" for rec in [head, *self.to_records()]))
        return path


def canonical_drift_name(name: str) -> str:
    """Canonical name of a stored/parameter name (fused tensors keep their fused role: their per-part split
    would need the weights, which a drift log does not have)."""
    layer, role, leaf = parse_name(name)
    return canonical_name(layer, role, leaf)


def drift_names(names: Iterable[str]) -> dict[str, str]:
    """Stored name -> canonical name, where a name whose canonical form another one took already keeps its stored
    name (as esft.analysis.canonical.canonical_refs does): two towers' `layers.0...` would otherwise merge, one
    tensor's series silently replacing the other's."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for n in dict.fromkeys(names):
        c = canonical_drift_name(n)
        out[n] = n if c in taken else c
        taken.add(out[n])
    return out


_STEP_KEYS = ("step", "global_step", "iteration")
_TOTAL_KEYS = ("total", "sq_total", "total_sq", "sq_norm", "drift_sq", "sq")
_TENSOR_KEYS = ("per_tensor", "tensors", "sq_per_tensor")


def series_from_records(records: Sequence[Mapping[str, Any]], numel: Mapping[str, int] | None = None,
                        source: str = "") -> DriftSeries:
    """A DriftSeries from JSON records: esft.es.replay.drift() output, GRPO `drift.jsonl` lines, or this module's
    cache. Accepts common key spellings (step/global_step; total/sq_total; per_tensor/tensors). Step 0 (all
    zeros) is dropped; a header record may carry `numel`."""
    header = next((r for r in records if r.get("header")), {})
    numel_raw: dict[str, int] = dict(header.get("numel") or {})
    steps, total, expected = [], [], []
    per: dict[str, list[float]] = defaultdict(list)
    num_params = header.get("num_params")
    for r in records:
        if r.get("header"):
            continue
        step = next((r[k] for k in _STEP_KEYS if k in r), None)
        tot = next((r[k] for k in _TOTAL_KEYS if k in r), None)
        if step is None or tot is None:
            continue
        if int(step) == 0:
            continue
        steps.append(int(step))
        total.append(float(tot))
        expected.append(r.get("expected"))
        tensors = next((r[k] for k in _TENSOR_KEYS if k in r and isinstance(r[k], Mapping)), {})
        for n, v in tensors.items():
            per[n].append(float(v))
        if isinstance(r.get("numel"), Mapping):
            numel_raw.update(r["numel"])
        num_params = r.get("num_params", num_params)
    if numel:
        numel_raw.update(numel)
    # canonical names for grouping by family; the per-tensor series must cover every step
    names = drift_names([*per, *numel_raw])
    per_c = {names[n]: v for n, v in per.items() if len(v) == len(steps)}
    numel_c = {names[n]: int(v) for n, v in numel_raw.items()}
    if num_params is None and numel_c:
        num_params = sum(numel_c[n] for n in per_c if n in numel_c) or sum(numel_c.values())
    exp = [float(e) for e in expected] if expected and all(e is not None for e in expected) else None
    return DriftSeries(steps, total, per_c, numel_c, num_params, exp, source)


def read_series(path: str | Path, numel: Mapping[str, int] | None = None) -> DriftSeries:
    from esft.rundir import read_jsonl  # skips a torn last line of a crashed run

    return series_from_records(read_jsonl(Path(path)), numel, str(path))


def es_series(run_dir: str | Path, model: Any = None, upto: int | None = None, per_tensor: bool = True,
              progress: bool = False) -> DriftSeries:
    """Replay an ES run's seed log from its base model (loaded with the run's dtype/device when `model` is None)
    and collect ||theta_t - theta_0||^2 per step. Costs one noise regeneration per member per step."""
    from esft.es import replay

    if model is None:
        model, _ = replay.load_base(run_dir)
    records = []
    it = replay.drift(model, run_dir, upto=upto, per_tensor=per_tensor)
    if progress:
        from tqdm.auto import tqdm

        from esft.es.es_rundir import read_seed_log

        steps = len(read_seed_log(Path(run_dir))) if upto is None else upto  # drift yields steps 1..upto
        it = tqdm(it, desc="replay", unit="step", total=steps, leave=False)
    for rec in it:
        records.append(rec)
    return series_from_records(records, source=f"replay of {run_dir}/seeds.jsonl")


# ---- fits and summaries -----------------------------------------------------------------------------------------

def analyze_series(series: DriftSeries, alpha: float, population: int) -> dict[str, Any]:
    """Total-drift fit and theory R^2, per-tensor fits (rho, R^2), per-family and per-kind summaries."""
    steps = np.asarray(series.steps, dtype=np.float64)
    if steps.size == 0:
        raise ValueError(f"no drift records in {series.source or 'the series'}")
    out: dict[str, Any] = {"alpha": alpha, "population": population, "steps": int(steps.max()),
                           "num_params": series.num_params, "source": series.source}
    if series.num_params:
        out["total"] = fit_drift(steps, series.total, alpha, population, series.num_params)
        pred = predicted_sq_drift(alpha, steps[-1], series.num_params, population)
        out["total"].update({"final_sq": series.total[-1], "predicted_final_sq": pred,
                             "final_ratio": series.total[-1] / pred if pred else None})
    if series.expected is not None:
        # the expectation from the logged coefficients counts only the steps that moved (zero fitness spread
        # makes no update) and any fitness shaping: the law with the run's actual step count
        out["r2_logged_expectation"] = _none_if_nan(r2_score(series.total, series.expected))
        out["final_over_logged_expectation"] = (series.total[-1] / series.expected[-1]
                                                if series.expected[-1] else None)
    rows = []
    for name, sq in series.per_tensor.items():
        n = series.numel.get(name)
        if not n:
            continue
        f = fit_drift(steps, sq, alpha, population, n)
        rows.append({"name": name, "role": role_of(name), "kind": kind_of(name), "layer": layer_of(name),
                     "numel": n, "final_sq": sq[-1], **f})
    out["tensors"] = rows
    out["families"] = _summaries(rows, "role")
    out["kinds"] = _summaries(rows, "kind")
    return out


def _summaries(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[r[key]].append(r)
    return {k: {"n": len(v), "numel": v[0]["numel"] if len({r["numel"] for r in v}) == 1 else None,
                "rho": quartiles(r["rho"] for r in v), "r2_fit": quartiles(r["r2_fit"] for r in v),
                "r2_theory": quartiles(r["r2_theory"] for r in v)} for k, v in groups.items()}


def displacement_ratio(es: DriftSeries, grpo: DriftSeries, step: int | None = None) -> dict[str, Any] | None:
    """||dtheta_ES|| / ||dtheta_GRPO|| at a matched step (default: GRPO's last step, if ES reached it)."""
    if not es.steps or not grpo.steps:
        return None
    step = step or grpo.steps[-1]
    if step not in es.steps or step not in grpo.steps:
        common = sorted(set(es.steps) & set(grpo.steps))
        if not common:
            return None
        step = common[-1]
    e, g = es.total[es.steps.index(step)], grpo.total[grpo.steps.index(step)]
    return {"step": step, "es_sq": e, "grpo_sq": g, "ratio": math.sqrt(e / g) if g > 0 else None}


# ---- figures ---------------------------------------------------------------------------------------------------------

def step_ticks(ax: Any) -> None:
    """Whole-number ticks on a step axis: autoscaled, a two-step run read 1.0, 1.2, ..., 2.0 and a one-step run
    0.945, 0.96, ... (MaxNLocator's integer rule gives up below `min_n_ticks` integers in view, 2 by default)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def plot_total(series: DriftSeries, alpha: float, population: int, path: str | Path,
               grpo: DriftSeries | None = None, title: str = "", method: str = "es") -> Path:
    """Figure 9 / 6A: total squared displacement vs step with the no-parameter prediction; GRPO as an inset.
    Right panel: the same divided by alpha^2 d / N, where the theory is the identity. `method` names the measured
    series ("grpo" for a GRPO run's drift log measured against the ES law)."""
    from esft.analysis.plots import color, pyplot, save

    plt = pyplot()
    steps = np.asarray(series.steps, dtype=np.float64)
    d = series.num_params or 1
    pred = predicted_sq_drift(alpha, steps, d, population)
    fit = fit_drift(steps, series.total, alpha, population, d)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    # a line through one point draws nothing: a run of one step (ES to 1 iteration) shows its points as markers
    dot = {"marker": "o", "ms": 4} if len(steps) == 1 else {}
    gdot = {"marker": "o", "ms": 4} if grpo is not None and len(grpo.steps) == 1 else {}
    ax = axes[0]
    ax.plot(steps, series.total, color=color(method), lw=2, **dot,
            label=f"{method.upper()} (R$^2$ vs theory = {short(fit['r2_theory'])})")
    ax.plot(steps, pred, "k--", lw=1, **dot, label=r"$\alpha^2 T d / N$")
    if series.expected is not None:
        # black dots, spaced, over the measured line: an exact run's expectation lies on it and must still show
        ax.plot(steps, series.expected, ls=(0, (1, 3)), color="black", lw=2, zorder=4, **dot,
                label="expectation from the logged updates")
    ax.set_xlabel("step T")
    ax.set_ylabel(r"$\|\Delta\theta_T\|^2$")
    # the run's name over both panels, wrapped: as the left panel's title a long path ran past the figure's edge
    # and took the place of d, N and alpha
    if title:
        fig.suptitle(textwrap.fill(title, 100), fontsize=9)
    ax.set_title(f"d = {d:.3g}, N = {population}, alpha = {alpha:g}", fontsize=10)
    ax.text(0.03, 0.97, f"free fit: R$^2$ = {short(fit['r2_fit'])}, rho = {short(fit['rho'])}",
            transform=ax.transAxes, va="top", fontsize=8)
    # under the panel: inside it, the legend hid the middle of the prediction line
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=8, frameon=False)
    if grpo is not None and grpo.steps:
        curves = [series.total, pred, *([series.expected] if series.expected is not None else [])]
        inset = ax.inset_axes(inset_place(ax, steps, curves))
        inset.plot(grpo.steps, grpo.total, color=color("grpo"), **gdot)
        inset.set_title("GRPO", fontsize=7)
        inset.tick_params(labelsize=6)
        ratio = displacement_ratio(series, grpo)
        if ratio and ratio["ratio"]:  # under the fit, not in the inset, where it crossed GRPO's line
            ax.text(0.03, 0.91, f"displacement ES/GRPO = {ratio['ratio']:.3g}x at T={ratio['step']}",
                    transform=ax.transAxes, va="top", fontsize=8)
    ax = axes[1]
    unit = alpha ** 2 * d / population
    ax.plot(steps, np.asarray(series.total) / unit, color=color(method), lw=2, **dot, label=method.upper())
    if grpo is not None and grpo.steps:
        gd = grpo.num_params or d
        ax.plot(grpo.steps, np.asarray(grpo.total) / (alpha ** 2 * gd / population), color=color("grpo"), lw=2,
                **gdot, label="GRPO (same scaling)")
    ax.plot(steps, steps, "k--", lw=1, **dot, label="theory (identity)")
    ax.set_xlabel("step T")
    for a in [*axes, *([inset] if grpo is not None and grpo.steps else [])]:
        step_ticks(a)
    ax.set_ylabel(r"$\|\Delta\theta_T\|^2 / (\alpha^2 d / N)$")
    ax.set_title(r"scaled by $\alpha^2 d / N$ (theory: the identity)", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=8, frameon=False)
    return save(fig, path)


#: where the GRPO inset goes: lower right, or, where the ES curves pass there (a drift that rises late), upper left
#: under the panel's two lines of text
INSET_PLACES = ([0.6, 0.12, 0.36, 0.3], [0.1, 0.5, 0.36, 0.3])


def inset_place(ax: Any, steps: Sequence[float], curves: Sequence[Sequence[float]]) -> list[float]:
    """The first of INSET_PLACES (axes fractions) that no curve of the panel crosses, with its current limits; the
    first where every place is crossed."""
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    grid = np.linspace(min(steps), max(steps), 200)
    xs = (grid - x0) / ((x1 - x0) or 1.0)
    for left, bottom, width, height in INSET_PLACES:
        inside = False
        for ys in curves:
            y = (np.interp(grid, steps, np.asarray(ys, dtype=np.float64)) - y0) / ((y1 - y0) or 1.0)
            inside = inside or bool(np.any((xs >= left) & (xs <= left + width) & (y >= bottom)
                                           & (y <= bottom + height)))
        if not inside:
            return [left, bottom, width, height]
    return list(INSET_PLACES[0])


def plot_families(result: Mapping[str, Any], path: str | Path, title: str = "") -> Path:
    """Figure 10: rho and fit R^2 per tensor, by family; matrices left, norm gains right; median and IQR. `title`
    (the run's name, as each drift figure's) heads the figure."""
    from esft.analysis.plots import pyplot, save

    plt = pyplot()
    rows = result["tensors"]
    groups = {"matrices": [f for f in _family_order(rows) if _is_matrix_role(f)],
              "norms": [f for f in _family_order(rows) if kind_of("layers.0." + f) == "norm"]}
    fig, axes = plt.subplots(2, 2, figsize=(11, 6), squeeze=False)
    for col, (group, fams) in enumerate(groups.items()):
        for row_i, key in enumerate(("rho", "r2_fit")):
            ax = axes[row_i][col]
            for x, fam in enumerate(fams):
                vals = [r[key] for r in rows if r["role"] == fam and r[key] is not None]
                if not vals:
                    continue
                jitter = np.linspace(-0.15, 0.15, len(vals)) if len(vals) > 1 else [0.0]
                ax.scatter(x + np.asarray(jitter), vals, s=8, alpha=0.35, color="tab:blue")
                q = quartiles(vals)
                ax.errorbar([x], [q["median"]], yerr=[[q["median"] - q["q1"]], [q["q3"] - q["median"]]],
                            fmt="o", color="k", capsize=3)
            ax.axhline(1.0, color="k" if key == "rho" else "gray", ls="--" if key == "rho" else ":", lw=1)
            if fams and not ax.collections:  # an empty panel would read as a figure drawn wrong
                ax.text(0.5, 0.5, f"no {'rho' if key == 'rho' else 'R$^2$'}: fewer than two distinct values over "
                        "the steps", transform=ax.transAxes, ha="center", fontsize=8)
            ax.set_xticks(range(len(fams)))
            # family names under the bottom panel only (the top one shares its columns)
            ax.set_xticklabels(fams if row_i == 1 else [], rotation=30, ha="right", fontsize=7)
            ax.set_ylabel(r"$\rho = d_{eff}/d$" if key == "rho" else "R$^2$ (fit through origin)")
            if row_i == 0:
                ax.set_title(group)
    # the title says what the black points and the dashed line are, so the figure reads on its own
    fig.suptitle((f"{textwrap.fill(title, 120)}\n" if title else "") + r"drift fit per tensor, by family: points are "
                 r"tensors, black their median and interquartile range; dashed $\rho$ = 1 (the theory), dotted "
                 r"R$^2$ = 1", fontsize=9)
    return save(fig, path)


def plot_tensor_curves(series: DriftSeries, result: Mapping[str, Any], alpha: float, population: int,
                       path: str | Path, families: Sequence[str] | None = None, per_family: int = 6,
                       title: str = "") -> Path:
    """Figure 11: squared displacement of individual tensors vs step, one family per panel, with the
    per-family prediction alpha^2 T d_p / N and the family's median R^2 and rho."""
    from esft.analysis.plots import pyplot, save

    plt = pyplot()
    rows = result["tensors"]
    fams = list(families) if families else _default_curve_families(rows)
    fams = [f for f in fams if any(r["role"] == f for r in rows)] or _family_order(rows)[:4]
    fig, axes = plt.subplots(1, len(fams), figsize=(3.6 * len(fams), 3.4), squeeze=False)
    steps = np.asarray(series.steps, dtype=np.float64)
    cmap = plt.get_cmap("Blues")
    for ax, fam in zip(axes[0], fams):
        members = sorted((r for r in rows if r["role"] == fam), key=lambda r: (r["layer"] is None, r["layer"] or 0))
        pick = members if len(members) <= per_family else [members[int(i)] for i in
                                                            np.linspace(0, len(members) - 1, per_family)]
        for j, r in enumerate(pick):
            ax.plot(steps, series.per_tensor[r["name"]], color=cmap(0.35 + 0.65 * (j + 1) / len(pick)), lw=1.2,
                    label="tensors (darker: deeper layer)" if j == 0 else None)
        numels = sorted({r["numel"] for r in members})
        for i, n in enumerate(numels):
            ax.plot(steps, predicted_sq_drift(alpha, steps, n, population), "k--", lw=1,
                    label=r"$\alpha^2 T d_p / N$" if i == 0 else None)
        s = result["families"].get(fam, {})
        ax.set_title(fam, fontsize=9)
        ax.text(0.03, 0.97, f"median R$^2$ {short(s.get('r2_fit', {}).get('median'))}\n"
                            f"median rho {short(s.get('rho', {}).get('median'))}",
                transform=ax.transAxes, va="top", fontsize=7)
        ax.set_xlabel("step T")
        step_ticks(ax)
    axes[0][0].set_ylabel(r"$\|\Delta\theta_{p,T}\|^2$")
    axes[0][0].legend(fontsize=7, loc="lower right")
    if title:
        fig.suptitle(textwrap.fill(title, 120), fontsize=9)
    fig.tight_layout()  # each panel's own y scale: untightened, its tick labels ran into the panel to its left
    return save(fig, path)


def plot_rho_r2(result: Mapping[str, Any], path: str | Path, title: str = "") -> Path:
    """Figure 6C: effective-dimension ratio rho against fit R^2 for every tensor (matrices vs norm gains)."""
    from esft.analysis.plots import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 4))
    for kind, col in (("attention", "tab:blue"), ("mlp", "tab:purple"), ("norm", "tab:orange"),
                      ("embedding", "tab:green"), ("lm_head", "tab:brown"), ("other", "tab:gray")):
        pts = [(r["rho"], r["r2_fit"]) for r in result["tensors"]
               if r["kind"] == kind and r["rho"] is not None and r["r2_fit"] is not None]
        if pts:
            x, y = zip(*pts)
            ax.scatter(x, y, s=10, alpha=0.6, color=col, label=kind)
    ax.axvline(1.0, color="k", ls="--", lw=1)
    ax.axhline(1.0, color="gray", ls=":", lw=1)
    ax.set_xlabel(r"$\rho = d_{eff} / d_{total}$")
    ax.set_ylabel("R$^2$")
    ax.set_title((f"{textwrap.fill(title, 70)}\n" if title else "")
                 + r"effective dimension ratio $\rho$ and fit R$^2$, one point per tensor", fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    else:  # no tensor has both a rho and a fit (one step, or weights that did not move)
        ax.text(0.5, 0.5, "no tensor has a drift fit", transform=ax.transAxes, ha="center", va="center")
    return save(fig, path)


def _is_matrix_role(role: str) -> bool:
    return kind_of("layers.0." + role) in ("attention", "mlp", "embedding", "lm_head") and not role.endswith(".bias")


def _family_order(rows: list[dict[str, Any]]) -> list[str]:
    seen: list[str] = []
    for r in rows:
        if r["role"] not in seen:
            seen.append(r["role"])
    return seen


def _default_curve_families(rows: list[dict[str, Any]]) -> list[str]:
    # the paper's Figure 11 columns: an attention matrix, the two per-layer norms, the final norm
    present = set(r["role"] for r in rows)
    attn = next((f for f in ("qkv_proj", "q_proj", "v_proj", "o_proj") if f in present), None)
    return [f for f in (attn, "input_layernorm", "post_attention_layernorm", "norm") if f]
