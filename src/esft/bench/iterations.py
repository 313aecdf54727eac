"""The two ES iterations the benchmark times (esft.bench): esft's (`LocalExecutor`, the low-rank executor, or
Ray replicas) and the naive one public ES code runs, and the check of esft's greedy outputs against
`model.generate`'s."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch

from esft.bench.roofline import ModelShape, decode_read_bytes, effective_layout, executed_flops
from esft.bench.workloads import PseudoTask, Workload, bench_fitness


def esft_iteration(model, tokenizer, work: Workload, population: int, noise: str, gen_overrides: dict,
                   seed: int = 0, rank: int = 1, parallel_members: int = 1,
                   rollout_dtype: torch.dtype | None = None) -> dict[str, Any]:
    """One ES iteration of esft; returns timings, token counts and the completions of member 0. `rollout_dtype`
    bf16: members roll out on bf16 copies (esft.generation.precision), the masters sharing the model's storage."""
    from esft.es.executor import LocalExecutor
    from esft.es.noise import MasterWeights
    from esft.generation import GenerationConfig

    gen = GenerationConfig(max_new_tokens=work.max_new_tokens, min_new_tokens=work.min_new_tokens,
                           batch_size=work.generation_batch_size, temperature=0.0, engine="esft")
    gen = dataclasses.replace(gen, **gen_overrides)
    task = PseudoTask()
    if noise != "lowrank":
        from esft.kernels import load_amx_linear, load_decode_attention, load_param_passes

        # built here, on the calling thread, if they are not yet (as esft.es.build does): a Ctrl-C during a build
        # then stops it at once, where a lane thread's build would first run to its end
        load_param_passes()
        if gen.fused_attention:
            load_decode_attention()
        if rollout_dtype == torch.bfloat16:
            load_amx_linear()
    start = time.perf_counter()
    if noise == "lowrank":  # one batched generation for the whole population (through the HF forward's hooks)
        from esft.es.lowrank import LowRankExecutor, LowRankWeights

        weights = LowRankWeights(model, rank=rank)
        executor = LowRankExecutor(model, tokenizer, weights, task, work.sigma, gen)
        lanes = 1
    else:
        low = rollout_dtype not in (None, torch.float32)
        weights = MasterWeights(model, noise=noise, share_storage=low)
        executor = LocalExecutor(model, tokenizer, weights, task, work.sigma, gen, parallel_members=parallel_members,
                                 rollout_dtype=rollout_dtype if low else None)
        executor.start()
        lanes = executor.lanes_for(population)
        warm_up(executor, work, lanes, seed)
        calls = record_generations(executor)
    setup = time.perf_counter() - start
    try:
        out = {**timed_iteration(executor, work, population, seed, setup, weights.apply), "lanes": lanes}
    finally:
        executor.close()
    if noise != "lowrank":
        out["executed_flops"] = executed(model, tokenizer, work, gen, calls, rollout_dtype)
        out["decode_read_bytes"] = read_bytes(model, tokenizer, work, gen, calls, rollout_dtype)
    return out


def warm_up(executor, work: Workload, lanes: int, seed: int) -> None:
    """One member per lane (as the lanes take members from a shared queue: normally one each), one new token each,
    before the timed iteration (in `setup`): what a training run's second and later iterations find in place. A new
    lane copy's parameters, packed weights and prefill buffers are first touched by its first member; the kernel
    then faults in and zeroes every page (~0.3 GB a bf16 lane), a cost a run pays once, in its first iteration,
    not in the other 29-299. One token is the prefill's: no decode step runs, so the decode step's K/V cache
    (sized for the budget) and its kernels' first calls stay in the timed iteration. Its members are not the
    timed ones, and its generations are not counted (the FLOP recorder is installed after it)."""
    from esft.es.strategy import ES

    members = ES(population_size=2 * lanes, sigma=work.sigma, alpha=work.alpha, seed=seed + 1).ask(0)[::2]
    config = executor.gen_config
    executor.gen_config = dataclasses.replace(config, max_new_tokens=1, min_new_tokens=0)
    try:
        executor.evaluate_members(members[:lanes], [{"messages": p} for p in work.prompts])
    finally:
        executor.gen_config = config


def record_generations(executor) -> list[tuple[list[list[int]] | None, list[int]]]:
    """Make the executor's generate calls note their prompt ids and completion lengths (what `executed_flops`
    needs) in the returned list; lanes append from their threads (list.append is atomic)."""
    calls: list[tuple[list[list[int]] | None, list[int]]] = []
    inner = executor.generate_fn

    def generate_fn(model, tokenizer, prompts, config, **kwargs):
        gens = inner(model, tokenizer, prompts, config, **kwargs)
        calls.append((kwargs.get("prompt_ids"), [len(g.completion_ids) for g in gens]))
        return gens

    executor.generate_fn = generate_fn
    return calls


def executed(model, tokenizer, work: Workload, gen, calls, dtype: torch.dtype | None = None) -> dict[str, int]:
    """FLOPs of the recorded generate calls (`executed_flops`), summed; `dtype`: the rollout copies' weights."""
    from esft.generation import encode_prompts

    shape, layout = ModelShape.of(model), effective_layout(model, gen, dtype)
    total = {"fp32": 0, "bf16": 0}
    for ids, lengths in calls:
        ids = ids if ids is not None else encode_prompts(tokenizer, work.prompts)
        counted = executed_flops(shape, ids, lengths, batch_size=gen.batch_size, **layout)
        total = {k: total[k] + counted[k] for k in total}
    return total


def read_bytes(model, tokenizer, work: Workload, gen, calls, dtype: torch.dtype | None = None) -> int:
    """Bytes the recorded generate calls' decode steps must read at least (`decode_read_bytes`), summed. Weights in
    the rollout copies' dtype (the model's without `dtype`); the K/V cache in bf16 where the step computes with bf16
    (the compiled attention's bf16 cache, or bf16 activations), else fp32; the lm_head as the bf16 screen's matrix
    when screened."""
    from esft.generation import encode_prompts

    shape, layout = ModelShape.of(model), effective_layout(model, gen, dtype)
    weight = (model.lm_head.weight.dtype if dtype is None else dtype).itemsize
    cache = 2 if layout["bf16_weights"] or layout["bf16_activations"] else 4
    head = 2 if layout["screened_lm_head"] else weight
    total = 0
    for ids, lengths in calls:
        ids = ids if ids is not None else encode_prompts(tokenizer, work.prompts)
        total += decode_read_bytes(shape, [len(i) for i in ids], lengths, batch_size=gen.batch_size,
                                   weight_bytes=weight, cache_bytes=cache, head_bytes=head)
    return total


def timed_iteration(executor, work: Workload, population: int, seed: int, setup: float, apply) -> dict[str, Any]:
    """ask -> evaluate -> fitness -> tell, then `apply(update)`: the timed part of an esft iteration. Per-member
    timings are summed over members, whichever executor ran them."""
    from esft.es.strategy import ES

    es = ES(population_size=population, sigma=work.sigma, alpha=work.alpha, seed=seed)
    batch = [{"messages": p} for p in work.prompts]
    t0 = time.perf_counter()
    members = es.ask(0)
    result = executor.evaluate_members(members, batch)
    update = es.tell(members, bench_fitness(result, batch))
    t1 = time.perf_counter()
    apply(update)
    t2 = time.perf_counter()
    timings = dict(result.timings)
    timings["update"] = t2 - t1
    timings["iteration"] = t2 - t0
    timings["setup"] = setup
    return {"timings": timings, "prompt_tokens": result.prompt_tokens, "generated_tokens": result.tokens_generated,
            "texts": result.texts, "zero_update": update.is_zero}


def bench_replica_parts(config):
    """ReplicaSpec builder of the Ray workers: the bench's model and its pseudo-task (module level: pickled by
    reference). Loads the compiled kernels too, so that start-up, not the timed iteration, pays for that."""
    from esft.kernels import load_decode_attention, load_param_passes
    from esft.models import load_model

    model, tokenizer = load_model(config.model, dtype="float32", device="cpu")
    load_decode_attention()
    load_param_passes()
    return model, tokenizer, PseudoTask()


def esft_iteration_parallel(model, work: Workload, population: int, noise: str, gen_overrides: dict, workers: int,
                            threads_per_worker: int, model_name: str, seed: int = 0) -> dict[str, Any]:
    """One ES iteration with members spread over `workers` Ray replicas (esft.es.distributed, as `esft train es
    --executor ray`): the same members, noise, fitness and update as `esft_iteration`. Worker start-up (process
    placement, model loading) is set-up, outside the timing, as in a training run where it happens once; the
    iteration ends when every replica has applied the update."""
    import tempfile

    from esft.es.distributed.factory import make_ray_executor
    from esft.es.es_config import ESConfig
    from esft.es.noise import MasterWeights

    options = dict(gen_overrides)
    options["min_new_tokens"] = work.min_new_tokens
    with tempfile.TemporaryDirectory(prefix="esft-bench-") as out:
        cfg = ESConfig(model=model_name, dtype="float32", device="cpu", sigma=work.sigma, alpha=work.alpha,
                       population_size=population, max_new_tokens=work.max_new_tokens,
                       generation_batch_size=work.generation_batch_size, generation_options=options, noise=noise,
                       executor="ray", num_workers=workers, output_dir=out,
                       executor_options={"threads_per_worker": threads_per_worker, "checksum_every": 0})
        start = time.perf_counter()
        weights = MasterWeights(model, noise=noise)
        executor = make_ray_executor(cfg, weights=weights, builder=bench_replica_parts)
        try:
            executor.start()
            setup = time.perf_counter() - start

            def apply(update):
                executor.on_update(update, 1)
                weights.apply(update)
                executor.settle()  # every worker has applied it too (what the executor does before its next call)

            # the workers' timings are summed over them (worker-seconds): bench.overhead_fraction divides them
            return {**timed_iteration(executor, work, population, seed, setup, apply), "workers": workers}
        finally:
            executor.close()


def naive_iteration(model, tokenizer, work: Workload, population: int, seed: int = 0) -> dict[str, Any]:
    """The same iteration as public ES code does it: in-place `param += sigma * eps` with eps regenerated from the
    seed for every use (perturb, restore by subtraction, update), and `model.generate` over the whole batch."""
    from esft.es.executor import PopulationResult
    from esft.es.noise import gaussian, select_parameters
    from esft.es.strategy import ES
    from esft.generation import GenerationConfig, encode_prompts, generate

    gen = GenerationConfig(max_new_tokens=work.max_new_tokens, min_new_tokens=work.min_new_tokens,
                           batch_size=len(work.prompts), temperature=0.0, engine="hf")
    task = PseudoTask()
    batch = [{"messages": p} for p in work.prompts]
    params = select_parameters(model)
    es = ES(population_size=population, sigma=work.sigma, alpha=work.alpha, seed=seed)
    timings = {"perturb": 0.0, "generate": 0.0, "score": 0.0, "restore": 0.0}
    t0 = time.perf_counter()
    members = es.ask(0)
    ids = encode_prompts(tokenizer, work.prompts)
    scores = np.zeros((len(members), len(batch)))
    texts: list[list[str]] = []
    prompt_tokens = generated = 0
    with torch.no_grad():
        for i, (mseed, sign) in enumerate(members):
            t = time.perf_counter()
            for name, p in params.items():
                p.add_(gaussian(mseed, name, p.shape), alpha=sign * work.sigma)
            timings["perturb"] += time.perf_counter() - t
            t = time.perf_counter()
            gens = generate(model, tokenizer, work.prompts, gen, prompt_ids=ids)
            timings["generate"] += time.perf_counter() - t
            t = time.perf_counter()
            texts.append([g.text for g in gens])
            scores[i] = [task.score(g.text, ex) for g, ex in zip(gens, batch)]
            prompt_tokens += sum(g.prompt_tokens for g in gens)
            generated += sum(len(g.completion_ids) for g in gens)
            timings["score"] += time.perf_counter() - t
            t = time.perf_counter()
            for name, p in params.items():
                p.sub_(gaussian(mseed, name, p.shape), alpha=sign * work.sigma)
            timings["restore"] += time.perf_counter() - t
        result = PopulationResult(scores=scores, well_formed=np.zeros_like(scores, dtype=bool), texts=texts)
        update = es.tell(members, bench_fitness(result, batch))
        t1 = time.perf_counter()
        for name, p in params.items():
            for useed, coef in zip(update.seeds, update.coefficients):
                p.add_(gaussian(useed, name, p.shape), alpha=update.scale * coef)
        t2 = time.perf_counter()
    timings["update"] = t2 - t1
    timings["iteration"] = t2 - t0
    return {"timings": timings, "prompt_tokens": prompt_tokens, "generated_tokens": generated, "texts": texts}


def check_outputs(model, tokenizer, work: Workload, gen_overrides: dict) -> dict[str, Any]:
    """Greedy completions of the workload's batch from esft's engine (with `gen_overrides`) and from
    `model.generate`, on the current weights: the "results must not change" check for the fast configuration."""
    from esft.generation import GenerationConfig, encode_prompts, generate

    ids = encode_prompts(tokenizer, work.prompts)
    base = dict(max_new_tokens=work.max_new_tokens, min_new_tokens=work.min_new_tokens,
                batch_size=work.generation_batch_size, temperature=0.0)
    with torch.no_grad():
        ours = generate(model, tokenizer, work.prompts, dataclasses.replace(
            GenerationConfig(engine="esft", **base), **gen_overrides), prompt_ids=ids)
        ref = generate(model, tokenizer, work.prompts, GenerationConfig(engine="hf", **base), prompt_ids=ids)
    return compare_completions([g.completion_ids for g in ours], [g.completion_ids for g in ref])


def compare_completions(ours: list[list[int]], ref: list[list[int]]) -> dict[str, Any]:
    """How many completions (token ids) equal the reference's, the reference's token count, and where the first
    differing row first differs: the first unequal token, or the shorter one's length when one is a prefix of the
    other (None when all are equal)."""
    first_diff = None
    for row, (a, b) in enumerate(zip(ours, ref)):
        if a != b:
            k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            first_diff = {"row": row, "token": k}
            break
    return {"identical": sum(a == b for a, b in zip(ours, ref)), "completions": len(ref),
            "tokens": sum(len(b) for b in ref), "first_difference": first_diff}
