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
from typing import Any, Callable

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
    share each (as `LocalExecutor`, each lane's calls generating into the same KV cache buffers); returns seconds
    and token counts. Each lane first generates one token of the batch, untimed and uncounted, as the ES
    iteration's lanes do before theirs (esft.bench.iterations.warm_up): a fresh lane copy's first call faults in
    its packed weights and buffers, a cost the ES side does not time. If one lane fails or Ctrl-C reaches the
    calling thread, the other lanes stop at their next decode step and take no further call
    (`esft.generation.cancel_on`, as `LocalExecutor`'s lanes)."""
    from esft.generation import (GenerationCancelled, GenerationConfig, KVBuffers, cancel_on, encode_prompts, generate,
                                 reusing_kv)

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
    stop = threading.Event()
    warm = dataclasses.replace(gen, max_new_tokens=1, min_new_tokens=0)
    started: list[float] = []
    ready = threading.Barrier(lanes, action=lambda: started.append(time.perf_counter()))

    def lane(k: int) -> None:
        try:
            torch.get_num_threads()  # a new thread's first ATen call sets its team size from the global default
            torch.set_num_threads(share[k])
            # each call's KV cache in the previous call's buffers, as an ES lane's members (`LocalExecutor`)
            with torch.no_grad(), cancel_on(stop), reusing_kv(KVBuffers()):
                generate(models[k], tokenizer, work.prompts, warm, prompt_ids=ids)
                ready.wait()  # the clock starts once every lane is warm
                while True:
                    with lock:
                        if not jobs or stop.is_set():
                            return
                        jobs.pop()
                    gens = generate(models[k], tokenizer, work.prompts, gen, prompt_ids=ids)
                    with lock:
                        counts["prompt_tokens"] += sum(g.prompt_tokens for g in gens)
                        counts["generated_tokens"] += sum(len(g.completion_ids) for g in gens)
        except BaseException as exc:  # re-raised on the calling thread below
            errors.append(exc)
            stop.set()  # the other lanes stop at their next decode step
            ready.abort()  # the other lanes stop waiting (after the error is recorded, so it is the one raised)

    threads = [threading.Thread(target=lane, args=(k,)) for k in range(1, lanes)]
    for t in threads:
        t.start()
    lane(0)
    for t in threads:
        t.join()
    end = time.perf_counter()
    torch.set_num_threads(total)
    if errors:  # the cause, not the cancellations it triggered in the other lanes
        raise next((e for e in errors if not isinstance(e, GenerationCancelled)), errors[0])
    seconds = end - started[0]
    tokens = counts["prompt_tokens"] + counts["generated_tokens"]
    return {"engine": "esft", "seconds": round(seconds, 3), "lanes": lanes, **counts,
            "delivered_tokens_per_s": round(tokens / seconds, 2),
            "generated_tokens_per_s": round(counts["generated_tokens"] / seconds, 2)}


def vllm_job(tokenizer, work: Workload) -> dict[str, Any]:
    """What `vllm_generation` needs of a workload: its prompts as token ids (the same chat template esft uses)
    and its token budget."""
    from esft.generation import encode_prompts

    return {"prompt_ids": [list(map(int, p)) for p in encode_prompts(tokenizer, work.prompts)],
            "max_new_tokens": int(work.max_new_tokens), "min_new_tokens": int(work.min_new_tokens)}


def vllm_generation(model_path: str, jobs: dict[str, dict[str, Any]], population: int, dtype: str,
                    threads: int) -> dict[str, dict[str, Any]]:
    """Pure batched generation with vLLM (its CPU build here, or whatever platform it finds) for each workload:
    `population` `LLM.generate` calls of the whole batch, greedy, the workload's budget (`min_tokens` as esft's
    `min_new_tokens`), after one untimed warm-up call on the whole batch (`vllm_warm_up`); engine start-up is not
    timed. The engine runs in a spawned process, because vLLM's CPU worker freezes `torch.set_num_threads` for
    the process that starts it and holds its memory until that process ends. Returns {workload: the same fields
    as `esft_generation`}."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_vllm_child, args=(queue, model_path, jobs, population, dtype, threads))
    proc.start()
    try:
        ok, payload = queue.get()
    except BaseException:
        # Ctrl-C reaches the whole process group, but SIGTERM (esft's KeyboardInterrupt too) only this process:
        # the engine would otherwise generate every workload before the join below returned
        proc.terminate()
        raise
    finally:
        proc.join()
    if not ok:
        raise RuntimeError(f"vLLM generation failed: {payload}")
    return payload


#: decode steps of vLLM's untimed warm-up call: its first prefill of the full batch and first decode steps at the
#: timed batch size, as esft's lanes are warmed on the full batch (their warm-up runs one token, no decode step)
VLLM_WARM_UP_TOKENS = 4


def vllm_warm_up(job: dict[str, Any]) -> dict[str, int]:
    """`SamplingParams` limits of vLLM's warm-up call, which runs on the workload's whole batch: a few tokens, so
    the timed calls find the batch's prefill and decode shapes seen once, as esft's warmed lanes do."""
    tokens = min(VLLM_WARM_UP_TOKENS, int(job["max_new_tokens"]))
    return {"max_tokens": tokens, "min_tokens": min(tokens, int(job["min_new_tokens"]))}


def bench_engine_kwargs(model_path: str, jobs: dict[str, dict[str, Any]], dtype: str, on_cpu: bool,
                        cpu_kv_cache_bytes: int, gpu_share: float | None = None) -> dict[str, Any]:
    """`LLM(...)` arguments of the bench's engine: an ES replica's (esft.es.distributed.vllm_backend), prefix
    caching off included; on a GPU, vLLM's share of it (`gpu_share`: vLLM's default, 0.92, fails where the bench's
    own model holds part of the GPU). The population's calls repeat the same prompts, so a prefix cache would serve
    every call after the first without its prefill, which no ES member can skip (its weights differ from the last
    member's). On the prefill-heavy cpu-preset, two bench runs 20 minutes apart (docs/results/bench, 2026-12-02) had
    vLLM at 8.4 s with the cache and 13.4 s without, while esft's own generation took 8.7 and 10.6 s."""
    longest = max(len(p) + job["max_new_tokens"] for job in jobs.values() for p in job["prompt_ids"])
    kwargs: dict[str, Any] = dict(model=model_path, tokenizer=model_path, dtype=dtype, seed=0, tensor_parallel_size=1,
                                  max_model_len=longest + 8, enforce_eager=on_cpu, enable_prefix_caching=False)
    if on_cpu:
        kwargs["kv_cache_memory_bytes"] = cpu_kv_cache_bytes
    elif gpu_share is not None:
        kwargs["gpu_memory_utilization"] = gpu_share
    return kwargs


def timed_vllm_generation(llm: Any, sampling_params: Callable[..., Any], job: dict[str, Any],
                          population: int) -> dict[str, Any]:
    """One workload on a started engine: an untimed warm-up call on the whole batch, then `population` timed
    calls of it, greedy, token ids only (detokenize off: esft's own pure generation decodes no text either, nor
    do its ES replicas on vLLM). `sampling_params` is vLLM's `SamplingParams`."""
    sampling = sampling_params(n=1, temperature=0.0, max_tokens=job["max_new_tokens"],
                               min_tokens=job["min_new_tokens"], detokenize=False)
    prompts = [{"prompt_token_ids": p} for p in job["prompt_ids"]]
    llm.generate(prompts, sampling_params(n=1, temperature=0.0, detokenize=False, **vllm_warm_up(job)),
                 use_tqdm=False)
    generated = 0
    t0 = time.perf_counter()
    for _ in range(population):
        results = llm.generate(prompts, sampling, use_tqdm=False)
        generated += sum(len(r.outputs[0].token_ids) for r in results)
    seconds = time.perf_counter() - t0
    prompt_tokens = population * sum(len(p) for p in job["prompt_ids"])
    return {"engine": "vllm", "seconds": round(seconds, 3), "prompt_tokens": prompt_tokens,
            "generated_tokens": generated, "delivered_tokens_per_s": round((prompt_tokens + generated) / seconds, 2),
            "generated_tokens_per_s": round(generated / seconds, 2)}


def _vllm_child(queue, model_path: str, jobs: dict[str, dict[str, Any]], population: int, dtype: str,
                threads: int) -> None:
    try:
        import os

        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
        # vLLM logs to stdout unless told otherwise, where `esft bench --json` writes its JSON; read when vLLM is
        # first imported (platform_device_type below)
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        from esft.es.distributed.vllm_backend.vllm_replica import (
            DEFAULT_CPU_KV_CACHE_BYTES,
            gpu_memory_share,
            platform_device_type,
            prepare_cpu_process,
        )

        on_cpu = platform_device_type() == "cpu"
        if on_cpu:
            prepare_cpu_process(threads)
        share = None if on_cpu else gpu_memory_share(*torch.cuda.mem_get_info(), 0)
        from vllm import LLM, SamplingParams

        llm = LLM(**bench_engine_kwargs(model_path, jobs, dtype, on_cpu, DEFAULT_CPU_KV_CACHE_BYTES, share))
        out = {name: timed_vllm_generation(llm, SamplingParams, job, population) | {"dtype": dtype,
                                                                                     "device": platform_device_type()}
               for name, job in jobs.items()}
        queue.put((True, out))
    except BaseException as exc:  # reported to the parent, which raises it
        queue.put((False, f"{type(exc).__name__}: {exc}"))


def inference_entry(esft_gen: dict[str, Any], delivered_tokens_per_s: float,
                    vllm_gen: dict[str, Any] | str | None = None) -> dict[str, Any]:
    """The report's pure-generation fields: engines timed, the fastest, and inference_ratio. `vllm_gen`: vLLM's
    timing of the same workload (`vllm_generation`), or why there is none."""
    engines = [esft_gen] + ([vllm_gen] if isinstance(vllm_gen, dict) else [])
    best = max(engines, key=lambda e: e["delivered_tokens_per_s"])
    if isinstance(vllm_gen, dict):
        status = "timed"
    elif isinstance(vllm_gen, str):
        status = vllm_gen
    else:
        status = "installed, not timed (--no-vllm)" if vllm_available() else "not installed"
    return {"inference_ratio": round(delivered_tokens_per_s / best["delivered_tokens_per_s"], 4),
            "inference_engine": best["engine"], "pure_generation": engines, "vllm": status}
