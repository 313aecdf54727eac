"""What bf16 rollouts do to ES's signal: the same populations scored with fp32 and with bf16 rollouts.

    python scripts/rollout_precision.py --preset cpu --iterations 3 --out docs/results/bench/rollout-precision-cpu.json

For iterations 0..k-1 of the preset's run (its seed, batches and member seeds, at the base weights), every member
is evaluated twice on the same batch: fp32 rollouts (the exact mode) and bf16 rollouts (weights
round(master + sigma * eps), esft.generation.precision). Reported per iteration: each member's fitness both ways,
Spearman's rank correlation of the two (esft.es.strategy.rank_correlation), the share of completions that are
identical, and the cosine between the two ES update directions (the shaped fitness weights, which is what the
update is made of). Also the generation time of both, side by side in one process (a ratio, not a speed claim
on a loaded machine: the load average is recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from esft.bench import cpu_info
from esft.es.build import fitness_rule, generation_config, make_strategy
from esft.es.es_config import preset
from esft.es.executor import LocalExecutor
from esft.es.noise import MasterWeights
from esft.es.strategy import rank_correlation
from esft.generation.precision import cpu_flags, native_bf16_flags
from esft.models import load_model
from esft.tasks import get_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    config = preset(args.preset)
    model, tokenizer = load_model(config.model, dtype="float32", device="cpu")
    model.requires_grad_(False)
    task = get_task(config.task, **config.task_kwargs())
    train = task.load("train")
    strategy = make_strategy(config)
    rule = fitness_rule(config)
    rule.bind(len(train), config.seed)
    gen = generation_config(config)
    weights = MasterWeights(model, include=config.include or None, exclude=config.exclude or None,
                            noise=config.noise)
    executors = {
        "float32": LocalExecutor(model, tokenizer, weights, task, strategy, gen,
                                 parallel_members=config.parallel_members),
        "bfloat16": LocalExecutor(model, tokenizer, weights, task, strategy, gen,
                                  parallel_members=config.parallel_members, rollout_dtype=torch.bfloat16),
    }
    for ex in executors.values():
        ex.start()
    rows = []
    for t in range(args.iterations):
        batch = [train[i] for i in rule.sample_batch(config.seed, t, len(train), config.batch_size)]
        members = strategy.ask(t)
        out: dict = {"iteration": t, "load_avg_1min": round(os.getloadavg()[0], 2)}
        results = {}
        for name, ex in executors.items():
            t0 = time.perf_counter()
            results[name] = ex.evaluate_members(members, batch)
            out[f"{name}_seconds"] = round(time.perf_counter() - t0, 2)
            out[f"{name}_fitness"] = [round(float(f), 4) for f in rule(results[name], batch)]
        a, b = (np.asarray(out[f"{n}_fitness"]) for n in executors)
        out["rank_correlation"] = round(rank_correlation(a, b), 4)
        sa, sb = strategy.shape(a), strategy.shape(b)
        norm = float(np.linalg.norm(sa) * np.linalg.norm(sb))
        out["update_weights_cosine"] = round(float(sa @ sb) / norm, 4) if norm > 0 else None
        texts = [(x, y) for ra, rb in zip(results["float32"].texts, results["bfloat16"].texts) for x, y in zip(ra, rb)]
        out["identical_completions"] = round(sum(x == y for x, y in texts) / len(texts), 4)
        out["same_scores"] = round(float((results["float32"].scores == results["bfloat16"].scores).mean()), 4)
        rows.append(out)
        print(json.dumps(out), flush=True)
    for ex in executors.values():
        ex.close()
    rho = [r["rank_correlation"] for r in rows if r["rank_correlation"] == r["rank_correlation"]]
    report = {"preset": args.preset, "population_size": config.population_size, "batch_size": config.batch_size,
              "max_new_tokens": config.max_new_tokens, "task": config.task, "noise": config.noise,
              "sigma": config.sigma, "generation_options": config.generation_options,
              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpu": cpu_info(),
              "cpu_native_bf16_flags": native_bf16_flags(cpu_flags()),
              "torch": torch.__version__, "threads": torch.get_num_threads(),
              "mean_rank_correlation": round(float(np.mean(rho)), 4) if rho else None,
              "mean_identical_completions": round(float(np.mean([r["identical_completions"] for r in rows])), 4),
              "mean_update_weights_cosine": round(float(np.mean([r["update_weights_cosine"] for r in rows
                                                                 if r["update_weights_cosine"] is not None])), 4),
              "generation_seconds": {n: round(sum(r[f"{n}_seconds"] for r in rows), 2) for n in executors},
              "iterations": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
