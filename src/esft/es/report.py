"""Summaries and the learning-curve figure of an ES run, read from its run directory only.

    from esft.es.report import summarize, plot_run
    summarize("runs/es-demo")                 # seconds/iteration, time split, peak RSS, first/last evaluation
    plot_run("runs/es-demo", "curve.png")     # train fitness (mean, min-max band) and held-out accuracy (95% CI)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from esft import rundir


def _split(run_dir: str | Path) -> tuple[list[dict], list[dict]]:
    metrics = rundir.read_jsonl(Path(run_dir) / "metrics.jsonl")
    return [m for m in metrics if m.get("kind") == "train"], [m for m in metrics if m.get("kind") == "eval"]


def summarize(run_dir: str | Path) -> dict[str, Any]:
    """Means over logged iterations: seconds per iteration and its split, tokens/s; peak RSS; evaluations."""
    train, evals = _split(run_dir)
    out: dict[str, Any] = {"iterations": len(train), "evaluations": len(evals)}
    if train:
        keys = sorted({k for m in train for k in m["time"]})
        split = {k: float(np.mean([m["time"].get(k, 0.0) for m in train])) for k in keys}
        total = split.get("total", 0.0) or 1e-9
        out.update({
            "seconds_per_iteration": split.get("total"),
            "time_split_s": split,
            # "evaluate" spans perturb, generate, score and restore; it is not one more part of the split
            "time_split_fraction": {k: v / total for k, v in split.items() if k not in ("total", "evaluate")},
            "generated_tokens_per_s": float(np.mean([m["generated_tokens_per_s"] for m in train])),
            "zero_updates": sum(bool(m.get("zero_update")) for m in train),
            "fitness_mean_first": train[0]["fitness"]["mean"], "fitness_mean_last": train[-1]["fitness"]["mean"],
            "format_rate_first": train[0]["format_rate"], "format_rate_last": train[-1]["format_rate"],
        })
    rss = [m["peak_rss_mb"] for m in train + evals if "peak_rss_mb" in m]
    if rss:
        out["peak_rss_mb"] = max(rss)
    if evals:
        keep = ("step", "test_accuracy", "test_ci95", "test_format_rate", "test_accuracy_among_well_formed",
                "train_reward")
        out["eval_first"] = {k: evals[0].get(k) for k in keep}
        out["eval_last"] = {k: evals[-1].get(k) for k in keep}
    return out


def plot_run(run_dir: str | Path, path: str | Path | None = None) -> Path:
    """Two panels: train fitness per iteration (mean and min-max band) and held-out accuracy with its 95% CI."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    path = Path(path) if path else run_dir / "curve.png"
    train, evals = _split(run_dir)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    if train:
        steps = [m["step"] for m in train]
        ax1.plot(steps, [m["fitness"]["mean"] for m in train], marker="o", label="fitness mean")
        ax1.fill_between(steps, [m["fitness"]["min"] for m in train], [m["fitness"]["max"] for m in train],
                         alpha=0.25, label="min-max over members")
        ax1.plot(steps, [m["format_rate"] for m in train], ls="--", label="format rate")
    ax1.set_xlabel("iteration (updates applied)")
    ax1.set_title("train batch (perturbed members)")
    ax1.legend(fontsize=8)
    ev = [e for e in evals if "test_accuracy" in e]
    if ev:
        steps = [e["step"] for e in ev]
        acc = np.array([e["test_accuracy"] for e in ev])
        lo = acc - np.array([e["test_ci95"][0] for e in ev])
        hi = np.array([e["test_ci95"][1] for e in ev]) - acc
        ax2.errorbar(steps, acc, yerr=[lo, hi], marker="o", capsize=3, label=f"held-out accuracy (n={ev[0]['test_n']})")
        ax2.plot(steps, [e["test_format_rate"] for e in ev], ls="--", marker="x", label="held-out format rate")
    ax2.set_xlabel("iteration (updates applied)")
    ax2.set_title("unperturbed model")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    """python -m esft.es.report RUN_DIR [PNG]: print the summary as JSON and write the figure."""
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(main.__doc__)
        return 2
    print(json.dumps(summarize(args[0]), indent=2))
    print(f"wrote {plot_run(args[0], args[1] if len(args) > 1 else None)}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
