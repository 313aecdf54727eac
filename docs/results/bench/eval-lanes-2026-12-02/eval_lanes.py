"""Held-out evaluation of the centre on one lane (two threads) against two lanes (one thread each, whole generation
batches dealt in turn), same preset, same puzzles, alternated; the completions must be identical.

    python eval_lanes.py [--preset cpu-countdown] [--limit 128] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from esft.es.es_config import preset
from esft.es.trainer import ESTrainer
from esft.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu-countdown")
    ap.add_argument("--limit", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(2)
    trainers = {}
    for lanes in (1, 2):
        config = preset(args.preset, output_dir=f"/tmp/esft-eval-lanes-{lanes}", eval_limit=args.limit,
                        eval_every=0, parallel_members=lanes)
        model, tok = load_model(config.model, dtype=config.dtype, device=config.device)
        trainers[lanes] = ESTrainer(config, model=model, tokenizer=tok, progress=False)
    test = trainers[1].test_set
    assert test == trainers[2].test_set
    texts = {}
    for r in range(args.rounds):
        for lanes in (1, 2):
            t0 = time.perf_counter()
            result = trainers[lanes].executor.evaluate_center(test)
            seconds = time.perf_counter() - t0
            texts[lanes] = result.texts[0]
            print(json.dumps({"round": r, "lanes": lanes, "seconds": round(seconds, 2), "n": len(test),
                              "accuracy": float(result.scores.mean()), "tokens": result.tokens_generated,
                              "generate_s_summed": round(result.timings["generate"], 2)}), flush=True)
        print(json.dumps({"round": r, "identical_completions": texts[1] == texts[2]}), flush=True)


if __name__ == "__main__":
    main()
