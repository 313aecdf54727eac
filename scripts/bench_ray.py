#!/usr/bin/env python3
"""Wall time of a short ES run: local executor vs the Ray executor with N local workers (same config and seed).

    python scripts/bench_ray.py --workers 2 --iterations 2 --population 4 --batch 4 --new-tokens 8

Prints, per layout: total wall time (model loading and Ray start-up included), seconds per iteration (the
trainer's own `time.total`), generated tokens/s, and whether the final fp32 masters are bit-identical to the
local run's (expected only when the local run uses as many torch threads as each worker: matmul blocking
depends on the thread count). Also prints the load average before and after: other processes on a shared
machine change every number here.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def run(layout: str, args: argparse.Namespace, out: Path) -> dict:
    import torch

    from esft.api import es_trainer
    from esft.es.es_config import preset
    from esft.es.es_rundir import read_seed_log
    from esft.rundir import read_jsonl

    torch.set_num_threads(args.local_threads)
    extra = {}
    if layout == "ray":
        extra = dict(executor="ray", num_workers=args.workers,
                     executor_options={"threads_per_worker": args.worker_threads, "checksum_every": 1})
    cfg = preset("cpu", iterations=args.iterations, population_size=args.population, batch_size=args.batch,
                 max_new_tokens=args.new_tokens, eval_every=0, checkpoint_every=0, output_dir=str(out / layout),
                 **extra)
    t0 = time.perf_counter()
    # es_trainer builds the Ray executor the config asks for (ESTrainer alone refuses executor "ray")
    trainer = es_trainer(cfg, progress=False)
    trainer.train()
    wall = time.perf_counter() - t0
    train = [m for m in read_jsonl(out / layout / "metrics.jsonl") if m.get("kind") == "train"]
    per_it = [m["time"]["total"] for m in train]
    tokens = sum(m["tokens_generated"] for m in train)
    norms = [round(r["update_norm"], 6) for r in read_seed_log(out / layout)]  # 0 = no fitness spread
    return {"layout": layout, "wall_s": round(wall, 1), "s_per_iteration": [round(x, 1) for x in per_it],
            "generated_tokens_per_s": round(tokens / sum(per_it), 1), "update_norms": norms,
            "masters": {k: v.clone() for k, v in trainer.weights.iter_masters()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--worker-threads", type=int, default=1)
    p.add_argument("--local-threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--population", type=int, default=4)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=8)
    args = p.parse_args()
    import torch

    print(f"load average before: {os.getloadavg()}; cores: {os.cpu_count()}", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for layout in ("local", "ray"):
            results.append(run(layout, args, Path(tmp)))
            print(json.dumps({k: v for k, v in results[-1].items() if k != "masters"}),
                  f"load average now: {os.getloadavg()}", flush=True)
    local, ray_ = results
    same = all(torch.equal(local["masters"][k], ray_["masters"][k]) for k in local["masters"])
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    print(json.dumps({"ray_over_local_wall": round(ray_["wall_s"] / local["wall_s"], 2),
                      "ray_over_local_s_per_iteration": round(mean(ray_["s_per_iteration"])
                                                              / mean(local["s_per_iteration"]), 2),
                      "final_masters_bit_identical": same, "local_threads": args.local_threads,
                      "worker_threads": args.worker_threads}))
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
