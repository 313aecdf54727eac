"""Pure batched generation on the bench's prompts (esft.bench `inference_ratio`): what the fastest engine at hand
delivers when it only generates, to hold an ES iteration against.

esft's engine generates the workload's batch `population` times on the unperturbed weights (in the rollout dtype,
on the same lanes and thread split as the ES iteration, so only ES's own work differs: perturb, score, restore,
update). vLLM's CPU build is timed too when it is installed (`vllm_available`); the report records when it is not.
inference_ratio = ES iteration's delivered tokens/s / the fastest engine's delivered tokens/s (prompt + generated
tokens per second, as `delivered_tokens_per_s`).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import threading
import time
from typing import Any

import torch

from esft.bench.workloads import Workload


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _lane_models(model, lanes: int, dtype: torch.dtype | None) -> list:
    """The models the lanes generate with: `model` itself and deep copies, or copies in `dtype` holding its
    weights rounded once (what a bf16 ES lane holds at the centre)."""
    if dtype in (None, torch.float32):
        return [model] + [copy.deepcopy(model) for _ in range(lanes - 1)]
    from esft.es.executor import rollout_replica

    copies = []
    for _ in range(lanes):
        replica = rollout_replica(model, dtype)
        with torch.no_grad():
            for name, p in model.named_parameters():
                replica.get_parameter(name).copy_(p)
        copies.append(replica)
    return copies


def esft_generation(model, tokenizer, work: Workload, population: int, gen_overrides: dict, lanes: int = 1,
                    dtype: torch.dtype | None = None) -> dict[str, Any]:
    """`population` generate calls of the workload's batch with esft's engine, `lanes` at once on one thread
    share each (as `LocalExecutor`); returns seconds and token counts."""
    from esft.generation import GenerationConfig, encode_prompts, generate

    gen = GenerationConfig(max_new_tokens=work.max_new_tokens, min_new_tokens=work.min_new_tokens,
                           batch_size=work.generation_batch_size, temperature=0.0, engine="esft")
    gen = dataclasses.replace(gen, **gen_overrides)
    lanes = max(1, min(lanes, population, torch.get_num_threads()))
    models = _lane_models(model, lanes, dtype)
    ids = encode_prompts(tokenizer, work.prompts)
    total = torch.get_num_threads()
    share = [total // lanes + (1 if k < total % lanes else 0) for k in range(lanes)]
    jobs = list(range(population))
    lock = threading.Lock()
    counts = {"prompt_tokens": 0, "generated_tokens": 0}
    errors: list[BaseException] = []

    def lane(k: int) -> None:
        try:
            torch.get_num_threads()  # a new thread's first ATen call sets its team size from the global default
            torch.set_num_threads(share[k])
            with torch.no_grad():
                while True:
                    with lock:
                        if not jobs:
                            return
                        jobs.pop()
                    gens = generate(models[k], tokenizer, work.prompts, gen, prompt_ids=ids)
                    with lock:
                        counts["prompt_tokens"] += sum(g.prompt_tokens for g in gens)
                        counts["generated_tokens"] += sum(len(g.completion_ids) for g in gens)
        except BaseException as exc:  # re-raised on the calling thread below
            errors.append(exc)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=lane, args=(k,)) for k in range(1, lanes)]
    for t in threads:
        t.start()
    lane(0)
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    torch.set_num_threads(total)
    if errors:
        raise errors[0]
    tokens = counts["prompt_tokens"] + counts["generated_tokens"]
    return {"engine": "esft", "seconds": round(seconds, 3), "lanes": lanes, **counts,
            "delivered_tokens_per_s": round(tokens / seconds, 2),
            "generated_tokens_per_s": round(counts["generated_tokens"] / seconds, 2)}


def inference_entry(esft_gen: dict[str, Any], delivered_tokens_per_s: float) -> dict[str, Any]:
    """The report's pure-generation fields: engines timed, the fastest, and inference_ratio."""
    engines = [esft_gen]
    best = max(engines, key=lambda e: e["delivered_tokens_per_s"])
    return {"inference_ratio": round(delivered_tokens_per_s / best["delivered_tokens_per_s"], 4),
            "inference_engine": best["engine"], "pure_generation": engines,
            "vllm": "timed" if len(engines) > 1 else ("installed, not timed by this bench" if vllm_available()
                                                      else "not installed")}
