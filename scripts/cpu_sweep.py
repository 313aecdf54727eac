"""ES settings sweep on a CPU task: one `esft train es` run per setting, then one table of every setting tried.

    python scripts/cpu_sweep.py run   GRID.yaml --runs DIR     # runs the settings not finished yet (resumable)
    python scripts/cpu_sweep.py table GRID.yaml --runs DIR --out docs/results/cpu-study/sweep

GRID.yaml: `base:` (ESConfig fields shared by every run) and `settings:` (name -> overrides). A run is finished
when its metrics.jsonl holds the final evaluation; an interrupted one resumes (`--resume`, bit-identical).

The table puts, beside every held-out accuracy and its 95% interval, the base model's accuracy, the best
constant answer of the same examples and, for Countdown, the best *fixed-operator rule* (apply one operator to
the numbers in the order given, the same for every puzzle): a model can learn such a rule, which is a prior, not
the skill of choosing the operations. Per-operator accuracy says which targets the model actually solves.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from esft.tasks import get_task
from esft.tasks.countdown_variants import fixed_rule_baselines, target_operator
from esft.tasks.base import wilson_interval
from esft.tasks.labels import constant_baseline


def run_config(grid: dict, name: str, runs: Path) -> Path:
    config = {**grid["base"], **(grid["settings"][name] or {})}
    path = runs / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def finished(run_dir: Path, iterations: int) -> bool:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return False
    evals = [json.loads(line) for line in metrics.read_text().splitlines() if '"kind":"eval"' in line.replace(" ", "")]
    return any(r.get("step") == iterations for r in evals)


def cmd_run(grid: dict, runs: Path) -> None:
    runs.mkdir(parents=True, exist_ok=True)
    for name in grid["settings"]:
        cfg_path = run_config(grid, name, runs)
        iterations = yaml.safe_load(cfg_path.read_text())["iterations"]
        run_dir = runs / name
        if finished(run_dir, iterations):
            print(f"{name}: finished, skipped", flush=True)
            continue
        argv = ["/usr/bin/time", "-v", "-o", str(runs / f"{name}.time.txt"), "esft", "train", "es",
                "--config", str(cfg_path), "--output-dir", str(run_dir)]
        if (run_dir / "config.yaml").exists():
            argv.append("--resume")
        print(f"{name}: {' '.join(argv[4:])}", flush=True)
        t0 = time.time()
        with open(runs / f"{name}.log", "a") as log:
            rc = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT)
        print(f"{name}: exit {rc} after {time.time() - t0:.0f} s", flush=True)
        if rc:
            sys.exit(rc)


def eval_rows(run_dir: Path) -> list[dict]:
    return [r for r in (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
            if r.get("kind") == "eval"]


def per_operator(run_dir: Path, step: int, examples: list[dict]) -> dict[str, str]:
    """'solved/total' per target operator in the evaluation samples of `step`."""
    path = run_dir / "samples" / f"eval_{step:06d}.jsonl"
    counts: dict[str, list[int]] = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        op = target_operator(examples[rec["index"]])
        c = counts.setdefault(op, [0, 0])
        c[0] += int(rec["score"] == 1.0)
        c[1] += 1
    return {op: f"{s}/{n}" for op, (s, n) in sorted(counts.items())}


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def interval(lo_hi: list[float]) -> str:
    return f"[{pct(lo_hi[0])}, {pct(lo_hi[1])}]"


def cmd_table(grid: dict, runs: Path, out: Path) -> None:
    rows = []
    for name, overrides in grid["settings"].items():
        run_dir = runs / name
        if not (run_dir / "metrics.jsonl").exists():
            continue
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        task = get_task(config["task"])
        evals = eval_rows(run_dir)
        n = evals[0]["test_n"]
        examples = task.load("test", n)
        const = constant_baseline([task.gold_key(x) for x in examples])
        rules = fixed_rule_baselines(examples) if config["task"].startswith("countdown") else {}
        best_op, best_rule = max(rules.items(), key=lambda kv: kv[1]) if rules else ("", float("nan"))
        base, last = evals[0], evals[-1]
        timing = (runs / f"{name}.time.txt")
        wall = next((line.split(": ")[-1] for line in timing.read_text().splitlines() if "Elapsed" in line), "") \
            if timing.exists() else ""
        rows.append({
            "setting": name, "overrides": json.dumps(overrides or {}, sort_keys=True),
            "iterations": last["step"], "n_test": n,
            "base_acc": pct(base["test_accuracy"]), "base_ci95": interval(base["test_ci95"]),
            "final_acc": pct(last["test_accuracy"]), "final_ci95": interval(last["test_ci95"]),
            "curve": " / ".join(f"{r['step']}:{pct(r['test_accuracy'])}" for r in evals),
            "constant_baseline": pct(const["constant_baseline"]),
            "constant_ci95": interval(const["constant_baseline_ci95"]),
            "best_fixed_rule": f"{best_op} {pct(best_rule)}" if rules else "",
            "best_fixed_rule_ci95": interval(wilson_interval(best_rule * n, n)) if rules else "",
            "per_operator_base": json.dumps(per_operator(run_dir, base["step"], examples)) if rules else "",
            "per_operator_final": json.dumps(per_operator(run_dir, last["step"], examples)) if rules else "",
            "format_rate_final": pct(last.get("test_format_rate") if last.get("test_format_rate") is not None
                                     else float("nan")),  # None: the task checks no format
            "wall": wall,
        })
    out.parent.mkdir(parents=True, exist_ok=True)
    if not rows:
        raise SystemExit("no finished run to tabulate")
    with open(out.with_suffix(".csv"), "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["run", "table"])
    parser.add_argument("grid", type=Path)
    parser.add_argument("--runs", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("docs/results/cpu-study/sweep"))
    args = parser.parse_args()
    grid = yaml.safe_load(args.grid.read_text())
    if args.command == "run":
        cmd_run(grid, args.runs)
    else:
        cmd_table(grid, args.runs, args.out)


if __name__ == "__main__":
    main()
