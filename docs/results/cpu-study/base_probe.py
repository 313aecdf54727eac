"""Greedy probes of the base model on Countdown variants: accuracy, box rate, constant baseline.

Run: python docs/results/cpu-study/base_probe.py VARIANT ... (appends one row per variant to base-probes.jsonl).
Measured 2026-11-30 on the AMD EPYC (2 threads) under load: greedy, 64 new tokens, the first <= 100 held-out
puzzles of each variant."""
import json, sys, time
from pathlib import Path
from esft.evaluation import evaluate_task
from esft.generation import GenerationConfig
from esft.models import load_model
import re

from esft.tasks import get_task


def safe(name):  # portable file names: + -> p, * -> x, other punctuation -> _
    return re.sub(r"[^A-Za-z0-9._=-]", "_", name.replace("+", "p").replace("*", "x"))

variants = sys.argv[1:]
model, tok = load_model("smollm2-135m")
gen = GenerationConfig(max_new_tokens=64, temperature=0.0, batch_size=32)
out = Path(__file__).resolve().parent  # base-probes.jsonl; per-variant completions in base-probe-samples/
(out / "base-probe-samples").mkdir(exist_ok=True)
for name in variants:
    task = get_task(name)
    examples = task.load("test", 100)
    t0 = time.time()
    s = evaluate_task(model, tok, task, examples, gen, out / f"base-probe-samples/{safe(name)}.jsonl", progress=False)
    recs = [json.loads(l) for l in (out / f"base-probe-samples/{safe(name)}.jsonl").read_text().splitlines()]
    box = sum(r["extracted"] is not None for r in recs) / len(recs)
    row = {"variant": name, "n": s["n"], "accuracy": s["accuracy"], "ci95": s["ci95"], "box_rate": box,
           "format_rate": s["format_rate"], "constant_baseline": s.get("constant_baseline"),
           "constant_ci95": s.get("constant_baseline_ci95"), "constant_answer": s.get("constant_answer"),
           "seconds": round(time.time() - t0, 1)}
    print(json.dumps(row), flush=True)
    with open(out / "base-probes.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")
