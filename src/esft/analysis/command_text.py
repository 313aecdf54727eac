"""What each `esft analyze` command prints when it is done (esft.analysis.commands): one line per checkpoint,
stage, task or threshold, from the result mapping the command also writes as JSON."""

from __future__ import annotations

import json
from typing import Any

from esft.analysis.constant import LABEL, baseline_text, shown
from esft.analysis.sparsity import target_text
from esft.tables import NA, se_text
from esft.tasks.labels import ACCURACY, MEAN_REWARD, wilson_interval


def format_weights(rep: dict[str, Any]) -> str:
    t = rep["total"]
    lines = []
    for lab in rep["labels"]:
        v = t[lab]
        stable = NA if v["stable_rank_mean"] is None else round(v["stable_rank_mean"], 2)
        lines.append(f"{lab:<8} ||d||_2 {v['norm']:.6g}  sparsity(|d|<={rep['eps']:g}) {100 * v['sparsity']:.2f}%  "
                     f"stable rank (mean attn+MLP) {stable}")
    for p in rep["pairs"]:  # four significant digits, as drift's lines; None: a zero update has no direction
        cos, ratio = ((NA if x is None else f"{x:.4g}") for x in (t["cos:" + p], t["norm_ratio:" + p]))
        a, _, b = p.partition("|")
        lines.append(f"{p}: cosine {cos}, norm ratio ||{a}|| / ||{b}|| {ratio}")
    for src, names in rep.get("unmatched", {}).items():
        lines.append(f"not compared (missing from another checkpoint): {len(names)} tensor(s) of {src}: "
                     f"{', '.join(names[:5])}{' ...' if len(names) > 5 else ''}")
    return "\n".join(lines)


def format_kl(res: dict[str, Any]) -> str:
    if "incremental" not in res:
        return json.dumps(res)[:2000]
    lines = []
    for kind in ("incremental", "cumulative"):
        for t, cells in res[kind].items():
            for s, v in cells.items():
                if "k3_token_mean" in v:
                    lines.append(f"{kind:<11} {t:<10} after {s:<24} k1/token {_se(v, 'k1_token_mean')}  "
                                 f"k3/token {_se(v, 'k3_token_mean')}  exact/token {_se(v, 'exact_token_mean')}  "
                                 f"k3/seq {_se(v, 'k3_seq_mean')}  ({v['n']} seqs, {v['tokens']} tokens)")
                else:
                    lines.append(f"{kind:<11} {t:<10} after {s:<24} median {v.get('median')} "
                                 f"[{v.get('min')}, {v.get('max')}]"
                                 + (f"  median SE over sequences {v['se']:.2g}" if v.get("se") is not None else ""))
    return "\n".join(lines)


def _se(cell: dict[str, Any], key: str) -> str:
    """A KL estimate ± its standard error over the sequences, or the estimate alone where none is known."""
    return se_text(cell.get(key), cell.get(f"{key}_se"))


def format_landscape(res: dict[str, Any]) -> str:
    lines = []
    if "interpolation" in res:
        path = res["interpolation"]
        for t, b in path["barrier"].items():
            what = "mean rewards" if (path.get("score") or {}).get(t) == MEAN_REWARD else "accuracies"
            lines.append(f"interpolation {t}: {what} {_values(path, t, path['accuracy'][t])}"
                         f"  largest drop below the line {b['max_drop']:+.3f} (barrier: {b['barrier']})")
    for lab, d in res["directions"]["directions"].items():
        for t, accs in d["accuracy"].items():
            lines.append(f"{lab} (norm {d['norm']:.4g}) {t}: {_values(res['directions'], t, accs)}")
    lines += [f"{lab}: not swept, its update is zero (no direction to move along)"
              for lab in res["directions"].get("zero", [])]
    holdout = res.get("holdout") or {}
    lines += [line for lab, sweep in holdout.items() for line in _holdout_lines(lab, sweep)]
    constant = constant_lines(res.get("interpolation") or res["directions"])
    constant += [line for sweep in holdout.values() for line in constant_lines(sweep)]
    return "\n".join(lines + list(dict.fromkeys(constant)))  # holdout tasks share one baseline per task


def _holdout_lines(checkpoint: str, sweep: dict[str, Any]) -> list[str]:
    """Figure 5: `holdout from the ES checkpoint along ES (norm 2, at 0, 0.25, 0.5, 1 of it) mmlu: 0.300 [...];
    ...`, the scores at each distance along the checkpoint's own update, as fractions of its norm."""
    lines = []
    for lab, d in sweep["directions"].items():
        at = ", ".join(f"{m / d['norm']:.3g}" if d["norm"] else f"{m:.4g}" for m in sweep["magnitudes"])
        for t, accs in d["accuracy"].items():
            lines.append(f"holdout from the {checkpoint} checkpoint along {lab} (norm {d['norm']:.4g}, at {at} of "
                         f"it) {t}: {_values(sweep, t, accs)}")
    return lines


def _values(res: dict[str, Any], task: str, values: list[float]) -> str:
    """A path's or sweep's scores of `task`: accuracies as `0.500 [0.150, 0.850]; 0.250 [...]`, each with its 95%
    Wilson interval over the result's n examples; mean rewards (or a result without n) as a list of numbers."""
    if not _interval(res, task, 0.0):
        return str([round(x, 3) for x in values])
    return "; ".join(f"{x:.3f}{_interval(res, task, x)}" for x in values)


def constant_lines(res: dict[str, Any]) -> list[str]:
    """`best constant answer boolq: 'yes' 62.5% [30.6, 86.3]` per accuracy task of a result that recorded one
    (esft.analysis.constant); none for a mean reward."""
    names = {t: (res.get("score") or {}).get(t, ACCURACY) for t in res.get("n", {})}
    return [f"{LABEL} {t}: {baseline_text(b)}" for t, b in shown(res, names).items() if b]


def format_sparsity(res: dict[str, Any]) -> str:
    def cells(accuracy: dict[str, float]) -> str:
        return "  ".join(f"{t} {a:.3f}{_interval(res, t, a)}" for t, a in accuracy.items())

    lines = [f"tau {r['tau']:<10.4g} target {target_text(r):<8} sparsity {100 * r['sparsity']:6.2f}%  "
             + cells(r["accuracy"]) for r in res["rows"]]
    lines.append("base (all reverted)            " + cells(res["base_accuracy"]))
    return "\n".join(lines + constant_lines(res))


def _interval(res: dict[str, Any], task: str, accuracy: float) -> str:
    """` [0.000, 0.658]`: the 95% Wilson interval of an accuracy over the result's n examples of `task` (a share
    of n examples, as the baseline's beside it); '' for a mean reward, whose spread the result does not keep."""
    n = (res.get("n") or {}).get(task)
    if not n or (res.get("score") or {}).get(task, ACCURACY) != ACCURACY:
        return ""
    lo, hi = wilson_interval(accuracy * n, int(n))
    return f" [{lo:.3f}, {hi:.3f}]"


def format_drift(res: dict[str, Any]) -> str:
    def g(x: Any) -> str:  # four significant digits (drift.json keeps the full values); n/a, not Python's None
        return f"{x:.4g}" if isinstance(x, (int, float)) else NA if x is None else str(x)

    t = res.get("total", {})
    lines = [f"T={res['steps']} d={res['num_params']} alpha={res['alpha']:g} N={res['population']}: "
             f"R^2(theory)={g(t.get('r2_theory'))}, fit rho={g(t.get('rho'))}, fit R^2={g(t.get('r2_fit'))}, "
             f"measured/predicted={g(t.get('final_ratio'))}"]
    for fam, v in res["families"].items():
        lines.append(f"  {fam:<28} n={v['n']:<3} rho median {g(v['rho']['median'])}  "
                     f"R^2 median {g(v['r2_fit']['median'])}")
    matched = res.get("grpo_ratio_at_matched_step")  # with --grpo-run
    if matched:
        lines.append(f"||dtheta_ES|| / ||dtheta_GRPO|| at step {matched['step']}: {g(matched['ratio'])}")
    elif "grpo_ratio_at_matched_step" in res:
        lines.append("||dtheta_ES|| / ||dtheta_GRPO||: n/a (the two runs share no logged step)")
    return "\n".join(lines)
