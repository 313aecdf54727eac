"""Every number that docs/results/es-cpu-demo/README.md quotes, recomputed from the metrics files in this folder.

Run from the repository root: `python docs/results/es-cpu-demo/summarize.py > docs/results/es-cpu-demo/summary.md`.
Inputs: `metrics.jsonl` and `config.yaml` here (the current run), and `earlier/*/` (the same command run with the
earlier CPU presets, copied from the git history of this folder: the folder name is the commit that added them).
Times are the trainer's own timers (`time.*` of each train record, `seconds` of each evaluation); they leave out
model loading and checkpoint writing, so the command's wall time is somewhat longer. Peak RSS is the trainer's
`peak_rss_mb` (getrusage ru_maxrss, MiB) at the last record.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent


def load(folder: Path) -> tuple[list[dict], list[dict], dict]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    config = yaml.safe_load((folder / "config.yaml").read_text())
    return [r for r in rows if r["kind"] == "train"], [r for r in rows if r["kind"] == "eval"], config


def cost(train: list[dict], evals: list[dict]) -> dict:
    totals = [r["time"]["total"] for r in train]
    logged = sum(totals) + sum(e["seconds"] for e in evals)
    # logged seconds up to and including the evaluation at step 14
    to14 = sum(r["time"]["total"] for r in train if r["step"] <= 14) + sum(e["seconds"] for e in evals
                                                                          if e["step"] <= 14)
    split = {k: statistics.mean(r["time"].get(k, 0.0) for r in train)
             for k in ("evaluate", "generate", "perturb", "update", "restore", "score")}
    return {"mean": statistics.mean(totals), "median": statistics.median(totals), "logged": logged, "to14": to14,
            "split": split, "evals": [e["seconds"] for e in evals],
            "rss": max(r.get("peak_rss_mb", 0.0) for r in train + evals)}


def same_results(a: tuple[list, list], b: tuple[list, list]) -> bool:
    """Same fitness summaries, update norms and token counts at every iteration, same held-out results."""
    keys_t = ("step", "fitness", "accuracy", "format_rate", "update_norm", "zero_update", "tokens_generated",
              "prompt_tokens")
    keys_e = ("step", "train_reward", "test_accuracy", "test_format_rate", "test_answer_counts",
              "test_tokens_generated")
    ta, ea = a
    tb, eb = b
    return (len(ta) == len(tb) and len(ea) == len(eb)
            and all({k: x.get(k) for k in keys_t} == {k: y.get(k) for k in keys_t} for x, y in zip(ta, tb))
            and all({k: x.get(k) for k in keys_e} == {k: y.get(k) for k in keys_e} for x, y in zip(ea, eb)))


def main() -> None:
    train, evals, config = load(HERE)
    print("# es-cpu-demo: numbers recomputed from metrics.jsonl")
    print()
    print("Written by `python docs/results/es-cpu-demo/summarize.py` (this folder). Held-out set: the first")
    print(f"{evals[0]['test_n']} BoolQ test questions; best constant answer on them: ../constant_baselines.md.")
    print()
    print("## Held-out evaluations (unperturbed weights)")
    print()
    print("| step | accuracy [95% CI] | boxed rate | accuracy among boxed | answers | train-batch reward | seconds |")
    print("|---|---|---|---|---|---|---|")
    for e in evals:
        lo, hi = e["test_ci95"]
        among = e["test_accuracy_among_well_formed"]
        counts = e["test_answer_counts"]
        ans = f"yes {counts.get('yes', 0)} / no {counts.get('no', 0)} / none {counts.get('None', 0)}"
        print(f"| {e['step']} | {100 * e['test_accuracy']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] | "
              f"{100 * e['test_format_rate']:.1f}% | {'-' if among is None else f'{100 * among:.1f}%'} | {ans} | "
              f"{e['train_reward']:.3f} | {e['seconds']:.1f} |")
    print()
    print("train-batch reward: the unperturbed weights on that step's 16 train prompts, with the 0.1 format bonus.")
    print()
    print("## Train records (population around the weights before the update of that step)")
    print()
    fit = {r["step"]: r["fitness"]["mean"] for r in train}
    best = max(fit, key=fit.get)
    print(f"- mean member fitness: step 1 {fit[1]:.3f}, step 14 {fit[14]:.3f}, step {max(fit)} {fit[max(fit)]:.3f}; "
          f"highest {fit[best]:.3f} at step {best}")
    norms = [r["update_norm"] for r in train if not r["zero_update"]]
    zero = [r["step"] for r in train if r["zero_update"]]
    d, n, alpha = config["_run"]["num_params"], config["population_size"], config["alpha"]
    print(f"- update norms of the {len(norms)} non-zero updates: {min(norms):.4f}-{max(norms):.4f}; "
          f"alpha sqrt(d/N) = {alpha * math.sqrt(d / n):.4f} (d = {d:,}, N = {n}); zero updates at steps {zero}")
    print(f"- per iteration: {statistics.mean(r['prompt_tokens'] for r in train):,.0f} prompt tokens and "
          f"{statistics.mean(r['tokens_generated'] for r in train):,.0f} generated tokens (mean), "
          f"{n * config['batch_size']} completions")
    print()
    print("## Cost (trainer timers; model load and checkpoints not included)")
    print()
    runs = [("current (this folder)", HERE, (train, evals), config)]
    for folder in sorted((HERE / "earlier").iterdir()):
        t, e, c = load(folder)
        runs.append((f"earlier/{folder.name}", folder, (t, e), c))
    print("| run | generation_options | parallel_members | s/iteration mean (median) | population evaluation "
          "| generate (summed over lanes) | perturb | update | restore | held-out evals s | logged s (min) "
          "| logged s to the step-14 eval | peak RSS MiB | same results as current |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, _, (t, e), c in runs:
        k = cost(t, e)
        s = k["split"]
        opts = ", ".join(key for key, v in (c.get("generation_options") or {}).items() if v)
        ev = "-" if not s["evaluate"] else f"{s['evaluate']:.1f}"
        print(f"| {label} | {opts} | {c.get('parallel_members', 1)} | {k['mean']:.1f} ({k['median']:.1f}) | {ev} "
              f"| {s['generate']:.1f} | {s['perturb']:.2f} | {s['update']:.2f} | {s['restore']:.2f} "
              f"| {', '.join(f'{x:.0f}' for x in k['evals'])} | {k['logged']:,.0f} ({k['logged'] / 60:.1f}) "
              f"| {k['to14']:,.0f} ({k['to14'] / 60:.1f} min) | {k['rss']:,.0f} "
              f"| {'yes' if same_results((t, e), (train, evals)) else 'NO'} |")


if __name__ == "__main__":
    main()
