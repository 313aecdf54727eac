"""Per-operator view of Countdown held-out evaluations: which targets (addition / multiplication / subtraction) a
model solves and which operator it boxes, beside the fixed-operator rules of the same puzzles.

    python docs/results/cpu-study/per_operator.py RUN_DIR      # an `esft train es` run (its samples/eval_*.jsonl)
    python docs/results/cpu-study/per_operator.py EXPERIMENT   # every Countdown evaluation of `esft experiment run`

A model that picks its operator without looking at the target cannot beat the best fixed rule in expectation
(esft.tasks.countdown_variants.operator_breakdown); the counts show whether the choice follows the target.
"""

import glob
import json
import sys
from pathlib import Path

import yaml

from esft.evaluation import load_examples
from esft.tasks import get_task
from esft.tasks.countdown_variants import fixed_rule_baselines, operator_breakdown
from esft.tasks.labels import wilson_interval


def line(name, examples, records):
    hits = sum(r["score"] == 1.0 for r in records)
    lo, hi = wilson_interval(hits, len(records))
    ops = operator_breakdown(examples, records)
    cells = [f"{op}: {v['solved']}/{v['puzzles']} solved, {v['boxed']} boxed" for op, v in ops.items() if op != "other"]
    return f"{name} | {100 * hits / len(records):.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] | " + " | ".join(cells)


def header(task_name, examples):
    rules = fixed_rule_baselines(examples)
    return (f"task {task_name}, {len(examples)} held-out puzzles; fixed rules (numbers in the given order): "
            + ", ".join(f"{op} {100 * v:.1f}%" for op, v in rules.items() if v))


def run_dir(run):
    config = yaml.safe_load((run / "config.yaml").read_text())
    task = get_task(config["task"])
    examples = load_examples(task, "test", config["eval_limit"], bool(config.get("eval_balanced")))
    print(header(config["task"], examples))
    print("step | accuracy [95% CI] | per target operator")
    for path in sorted(glob.glob(str(run / "samples" / "eval_*.jsonl"))):
        records = [json.loads(x) for x in open(path)]
        print(line(int(Path(path).stem.split("_")[1]), examples, records))


def experiment(root):
    seen = {}
    for path in sorted(root.glob("**/eval/countdown*.json")):
        if path.name.endswith(".passk.json"):
            continue
        settings = json.loads(path.read_text())["settings"]
        task_name = next(t for t in json.loads((root / "plan.json").read_text())["spec"]["tasks"] +
                         json.loads((root / "plan.json").read_text())["spec"]["evaluation"]["tasks"]
                         if path.name == f"{task_slug(t)}.json")
        if task_name not in seen:
            task = get_task(task_name, **settings.get("task_options", {}))
            seen[task_name] = load_examples(task, "test", settings["limit"], bool(settings.get("balanced")))
            print(f"\n{header(task_name, seen[task_name])}\nstage | accuracy [95% CI] | per target operator")
        records = [json.loads(x) for x in open(path.with_suffix(".jsonl"))]
        print(line(str(path.parent.parent.relative_to(root)), seen[task_name], records))


if __name__ == "__main__":
    from esft.experiments.plan import task_slug

    target = Path(sys.argv[1])
    experiment(target) if (target / "plan.json").exists() else run_dir(target)
