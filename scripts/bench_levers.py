"""Measure the speed levers of issue 9 one at a time (docs/performance.md was written from its output).

    python scripts/bench_levers.py generation --workload cpu-preset --threads 2 --repeats 2
    python scripts/bench_levers.py noise --threads 2

`generation`: one member's generation of an `esft bench` workload under each engine configuration (HF generate,
esft loop over the HF forward, lean step, lean + shared prefix, half batch), wall and CPU seconds, tokens/s,
and whether the completions equal HF generate's. `noise`: perturb / restore / update(N=4) seconds per noise
implementation. Every line carries the 1-minute load average: numbers taken under load are not comparable.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def engine_configs(batch_size: int) -> dict[str, dict]:
    """The generation configurations compared, by name (`batch_size`: the workload's generation batch)."""
    return {
        "hf-generate": dict(engine="hf"),
        "esft-hf-forward": dict(engine="esft", lean=False),
        "esft-lean": dict(engine="esft", lean=True),
        "esft-lean+prefix": dict(engine="esft", lean=True, share_prefix=True),
        "esft-lean+buckets4": dict(engine="esft", lean=True, prefill_buckets=4),
        "esft-lean+prefix+buckets2": dict(engine="esft", lean=True, share_prefix=True, prefill_buckets=2),
        "esft-lean+prefix+buckets4": dict(engine="esft", lean=True, share_prefix=True, prefill_buckets=4),
        "esft-lean-half-batch": dict(engine="esft", lean=True, batch_size=max(1, batch_size // 2)),
    }


def generation(args) -> None:
    from esft import bench
    from esft.generation import GenerationConfig, encode_prompts, generate
    from esft.models import load_model

    model, tok = load_model(args.model, dtype="float32", device="cpu")
    model.requires_grad_(False)
    work = bench.build_workload(args.workload, tok)
    ids = encode_prompts(tok, work.prompts)
    base = dict(max_new_tokens=args.max_new or work.max_new_tokens,
                min_new_tokens=min(work.min_new_tokens, args.max_new or work.min_new_tokens),
                batch_size=work.generation_batch_size, temperature=0.0)
    configs = engine_configs(work.generation_batch_size)
    chosen = args.chosen
    ref = None
    for r in range(args.repeats):
        for name in chosen:
            cfg = GenerationConfig(**{**base, **configs[name]})
            load0 = _load()
            w0, c0 = time.perf_counter(), time.process_time()
            with torch.inference_mode():
                gens = generate(model, tok, work.prompts, cfg, prompt_ids=ids)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            out = [g.completion_ids for g in gens]
            if name == "hf-generate" or ref is None:
                ref = ref or out
            gen_tokens = sum(len(o) for o in out)
            prompt_tokens = sum(len(x) for x in ids)
            print(json.dumps({"workload": args.workload, "config": name, "threads": torch.get_num_threads(),
                              "repeat": r, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                              "generated_tokens": gen_tokens, "prompt_tokens": prompt_tokens,
                              "generated_tok_per_s": round(gen_tokens / wall, 1),
                              "same_as_first": out == ref, "load": [load0, _load()]}), flush=True)


def noise(args) -> None:
    from esft.es.noise import MasterWeights, Update
    from esft.models import load_model

    model, _ = load_model(args.model, dtype="float32", device="cpu")
    model.requires_grad_(False)
    update = Update(seeds=(1, 2, 3, 4), coefficients=(0.5, -0.2, 0.3, -0.6), scale=1e-3)
    variants = [("per-tensor", 1), ("per-tensor", None), ("table", None)]
    for r in range(args.repeats):
        for mode, workers in variants:
            w = MasterWeights(model, noise=mode, workers=workers)
            w.perturb(0, 1, 1e-3)  # warm-up (builds the table once)
            w.restore()
            load0 = _load()
            t0 = time.perf_counter()
            w.perturb(1, 1, 1e-3)
            t1 = time.perf_counter()
            w.restore()
            t2 = time.perf_counter()
            w.apply(update)
            t3 = time.perf_counter()
            print(json.dumps({"noise": mode, "workers": w._n_workers(), "threads": torch.get_num_threads(),
                              "repeat": r, "perturb_s": round(t1 - t0, 3), "restore_s": round(t2 - t1, 3),
                              "update_n4_s": round(t3 - t2, 3), "load": [load0, _load()]}), flush=True)
            w.sync_from_model()


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1. 0 or less would otherwise reach torch's set_num_threads (a traceback),
    run nothing (--repeats 0) or, for --max-new 0, be read as "no cap"."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not accepted; expected an integer >= 1")
    return value


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["generation", "noise"])
    p.add_argument("--workload", default="cpu-preset")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--repeats", type=positive_int, default=1)
    p.add_argument("--configs", default=None, help="comma-separated subset of the generation configurations")
    p.add_argument("--max-new", type=positive_int, default=None,
                   help="cap the workload's completion length (quick looks)")
    args = p.parse_args()
    known = list(engine_configs(1))
    args.chosen = args.configs.split(",") if args.configs else known
    unknown = [name for name in args.chosen if name not in known]
    if unknown:  # before the model loads
        p.error(f"--configs: unknown {', '.join(map(repr, unknown))}; known: {', '.join(known)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    {"generation": generation, "noise": noise}[args.what](args)


if __name__ == "__main__":
    main()
