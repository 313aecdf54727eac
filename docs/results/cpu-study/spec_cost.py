"""Wall time of an `esft experiment run` folder, from its own records: each training run's measured seconds (the
sum of its logged step times, counted once when budgets share a run) and each stage's evaluation seconds.

    python docs/results/cpu-study/spec_cost.py runs/cpu-study

Model loading and checkpoint writing between steps are not in these records; the `/usr/bin/time -v` outputs of the
command (time*.txt beside the results) give its real wall time and peak resident memory.
"""

import glob
import json
import sys
from pathlib import Path


def main(root: str) -> None:
    root_path = Path(root)
    runs: dict[str, tuple[str, float, int]] = {}  # run_dir -> (algorithm, train seconds, steps)
    evals: list[tuple[str, float]] = []
    for f in sorted(glob.glob(f"{root}/**/result.json", recursive=True)):
        rec = json.loads(Path(f).read_text())
        evals.append((rec["key"], float(rec.get("seconds", {}).get("eval", 0.0))))
        for step in rec.get("steps", []):
            acc = step.get("accounting", {})
            seconds, steps = float(acc.get("train_seconds") or 0.0), int(acc.get("steps") or 0)
            prior = runs.get(step["run_dir"])
            if prior is None or seconds > prior[1]:
                runs[step["run_dir"]] = (step["algorithm"], seconds, steps)
    print("| training run | algorithm | steps | seconds |")
    print("|---|---|---|---|")
    for run_dir, (algo, seconds, steps) in sorted(runs.items()):
        print(f"| {run_dir} | {algo} | {steps} | {seconds:.0f} |")
    print()
    print("| stage | evaluation seconds |")
    print("|---|---|")
    for key, seconds in evals:
        print(f"| {key} | {seconds:.0f} |")
    train = sum(s for _, s, _ in runs.values())
    by_algo: dict[str, float] = {}
    for algo, seconds, _ in runs.values():
        by_algo[algo] = by_algo.get(algo, 0.0) + seconds
    ev = sum(s for _, s in evals)
    print()
    print(f"training {train:.0f} s ({', '.join(f'{a} {s:.0f} s' for a, s in sorted(by_algo.items()))}), "
          f"evaluation {ev:.0f} s, total {train + ev:.0f} s = {(train + ev) / 3600:.2f} h "
          f"({len(runs)} training runs, {len(evals)} stages)")
    base = root_path / "base" / "result.json"
    if not base.exists():
        print("(the base stage has no result.json yet)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/cpu-study")
