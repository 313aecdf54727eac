"""Iteration time of low-rank (EGGROLL) vs full-rank ES at the same population N and batch B.

One ES iteration = evaluate the population (full rank: perturb -> generate B prompts -> restore, member after
member; low rank: one generation over all N x B rows with per-row rank-r terms) + the fp32 update. Both modes
run on the same model, prompts and members, alternating (full, low, full, low, ...) so that load on a shared
machine affects both alike; wall and process-CPU seconds are reported per phase.

    python scripts/bench_lowrank.py --population 4 --batch 4 --max-new-tokens 16 --threads 1

Measured on the 2-core CPU (SmolLM2-135M fp32, BoolQ passages cut to 200 characters, greedy, r = 1, 1 thread,
machine shared, load ~8.5-9.3, so CPU seconds are the figure to compare; wall was ~2.5-3x CPU):
    N=4 B=4, 16 rows per forward:  full 19.5 s CPU / iteration (eval 17.1 incl. perturb+restore, update 2.3);
                                   low rank 11.5 s (eval 11.2, update 0.27)             -> 0.59x
    N=8 B=4, 4 rows per forward:   full 40.3 s (eval 35.8, update 4.5); low rank 27.7 (eval 27.3, update 0.37)
                                                                                        -> 0.69x
    N=4 B=16 (the cpu preset's batch: 400-char passages, 24 tokens, 16 rows per forward):
                                   full 60.3 s (eval 58.0, update 2.3); low rank 49.2 (eval 48.5, update 0.66)
                                                                                        -> 0.82x
Generation costs the same FLOPs in both modes (a CPU is compute-bound, so packing members into one batch saves
little); the saving is the per-member perturb/restore and the update, which no longer regenerate d normals per
member. On a memory-bound accelerator the shared batched pass is where EGGROLL's gain would come from.
`esft bench --workloads cpu-preset --noise lowrank` gives the same workload in the bench's format (wall only).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time

import numpy as np
import torch


def timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="boolq")
    ap.add_argument("--max-passage-chars", type=int, default=200)
    ap.add_argument("--population", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--generation-batch-size", type=int, default=16,
                    help="rows per forward pass, both modes (low rank packs several members into one batch)")
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--sigma", type=float, default=3e-3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lean", action="store_true",
                    help="full rank uses the lean decode step if esft.generation has it (low rank's decode steps "
                         "take the lean step where the model supports it, with its per-row terms added directly)")
    ap.add_argument("--skip-update", action="store_true")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    small = [f"--{k.replace('_', '-')}" for k in ("rank", "population", "batch", "max_new_tokens", "repeats", "threads")
             if getattr(args, k) < 1]
    if small:
        ap.error(f"{', '.join(small)} must be at least 1")
    torch.set_num_threads(args.threads)

    from esft.es.executor import LocalExecutor
    from esft.es.lowrank import LowRankExecutor, LowRankWeights
    from esft.es.noise import MasterWeights
    from esft.es.strategy import ES
    from esft.generation import GenerationConfig
    from esft.models import load_model
    from esft.tasks import get_task

    model, tok = load_model(args.model, dtype="float32", device="cpu")
    model.requires_grad_(False)
    task = get_task(args.task, **({"max_passage_chars": args.max_passage_chars} if args.task == "boolq" else {}))
    batch = task.load("train")[: args.batch]
    gen = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=0.0, batch_size=args.generation_batch_size)
    gen_full = gen
    if "lean" in {f.name for f in dataclasses.fields(GenerationConfig)}:
        gen_full = dataclasses.replace(gen, lean=bool(args.lean))
    strategy = ES(population_size=args.population, sigma=args.sigma, alpha=args.sigma / 2, seed=0)
    members = strategy.ask(0)
    full_w = MasterWeights(model)
    low_w = LowRankWeights(model, rank=args.rank)
    full = LocalExecutor(model, tok, full_w, task, args.sigma, gen_full)
    low = LowRankExecutor(model, tok, low_w, task, args.sigma, gen)

    runs: dict[str, list[dict]] = {"full": [], "lowrank": []}
    for rep in range(args.repeats):
        for name, ex in (("full", full), ("lowrank", low)):
            res, wall, cpu = timed(lambda: ex.evaluate_members(members, batch))
            runs[name].append({"wall_s": wall, "cpu_s": cpu, "timings": res.timings,
                               "tokens_generated": res.tokens_generated, "prompt_tokens": res.prompt_tokens,
                               "accuracy": float(res.scores.mean()), "format_rate": float(res.well_formed.mean())})
            print(f"rep {rep} {name:8s} population eval {wall:7.2f} s wall, {cpu:7.2f} s cpu  "
                  + " ".join(f"{k} {v:.2f}" for k, v in res.timings.items()), flush=True)
    updates = {}
    if not args.skip_update:
        fitness = np.linspace(0.0, 1.0, len(members))
        update = strategy.tell(members, fitness)
        for name, w in (("full", full_w), ("lowrank", low_w)):
            _, wall, cpu = timed(lambda: w.apply(update))
            updates[name] = {"wall_s": wall, "cpu_s": cpu}
            print(f"{name:8s} update {wall:7.2f} s wall, {cpu:7.2f} s cpu", flush=True)
    summary = {}
    for name, rs in runs.items():
        ev = statistics.median(r["wall_s"] for r in rs)
        ev_cpu = statistics.median(r["cpu_s"] for r in rs)
        up = updates.get(name, {"wall_s": 0.0, "cpu_s": 0.0})
        summary[name] = {"eval_wall_s": ev, "eval_cpu_s": ev_cpu, "update_wall_s": up["wall_s"],
                         "update_cpu_s": up["cpu_s"], "iteration_wall_s": ev + up["wall_s"],
                         "iteration_cpu_s": ev_cpu + up["cpu_s"], "tokens_generated": rs[-1]["tokens_generated"]}
    ratio = summary["lowrank"]["iteration_cpu_s"] / summary["full"]["iteration_cpu_s"]
    print(json.dumps(summary, indent=1))
    print(f"low-rank / full-rank iteration CPU time: {ratio:.3f}  (N={args.population}, B={args.batch}, "
          f"r={args.rank}, {args.max_new_tokens} new tokens, {args.threads} thread(s), load "
          f"{os.getloadavg()[0]:.1f})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "summary": summary, "runs": runs, "updates": updates,
                       "num_params_full": full_w.num_params, "num_params_lowrank": low_w.num_params,
                       "frozen_in_lowrank": low_w.frozen, "loadavg": os.getloadavg()}, fh, indent=1)


if __name__ == "__main__":
    main()
