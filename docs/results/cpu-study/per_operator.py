"""Per-operator view of a Countdown run's held-out evaluations: which targets (addition / multiplication) it solves
and how often it boxes a multiplication, beside the fixed-operator rules.

    python docs/results/cpu-study/per_operator.py RUN_DIR > RUN_DIR/per_operator.txt

A model that picks its operator without looking at the target cannot beat the best fixed rule in expectation; the
counts show whether the choice follows the target (both operators solved above a blind mix of the same rates).
"""

import glob
import json
import sys
from pathlib import Path

import yaml

from esft.tasks import get_task
from esft.tasks.countdown_variants import fixed_rule_baselines, target_operator
from esft.tasks.labels import wilson_interval

run = Path(sys.argv[1])
config = yaml.safe_load((run / "config.yaml").read_text())
task = get_task(config["task"])
examples = task.load("test", config["eval_limit"])
rules = fixed_rule_baselines(examples)
print(f"task {config['task']}, {len(examples)} held-out puzzles; fixed rules: "
      + ", ".join(f"{op} {100 * v:.1f}%" for op, v in rules.items()))
print("step | accuracy [95% CI] | addition solved | multiplication solved | boxed with *")
for path in sorted(glob.glob(str(run / "samples" / "eval_*.jsonl"))):
    recs = [json.loads(line) for line in open(path)]
    solved = {"+": 0, "*": 0}
    total = {"+": 0, "*": 0}
    for r in recs:
        op = target_operator(examples[r["index"]])
        if op in total:
            total[op] += 1
            solved[op] += r["score"] == 1.0
    hits = sum(r["score"] == 1.0 for r in recs)
    lo, hi = wilson_interval(hits, len(recs))
    times = sum("*" in (r["extracted"] or "") for r in recs)
    step = int(Path(path).stem.split("_")[1])
    print(f"{step} | {100 * hits / len(recs):.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] | {solved['+']}/{total['+']} | "
          f"{solved['*']}/{total['*']} | {times}")
