"""`esft bench`: how close an ES iteration gets to this machine's arithmetic limit, and how much faster it is than
the way public ES code does it. One run measures everything on the current machine:

* `matmul_gflops`: a 2048^3 matmul in the model's dtype with the bench's thread count, best of five, measured
  before the first workload and after each (`matmul_gflops_readings`), the best reading kept: the machine's
  capability, so that a reading taken while other processes held the cores does not inflate the roofline ratio;
  `matmul_gflops_bf16` likewise in bf16 when the screened lm_head runs its bf16 matmul;
* per workload, one full esft ES iteration (`LocalExecutor` perturb -> generate -> score -> restore per member,
  `ES.tell`, `MasterWeights.apply`) and the same iteration done the naive way (perturb in place with noise
  regenerated from the seed, `model.generate` over the batch, restore by regenerating the noise and subtracting
  it, update by regenerating every member's noise again).

The esft iteration runs esft's fast configuration by default (FAST_GENERATION, FAST_NOISE, FAST_PARALLEL_MEMBERS:
shared-prefix and length-bucketed prefill, packed oneDNN linears, the compiled attention kernel, the screened
lm_head, table noise, two members at once on one thread each; all recorded in the report); `--exact` measures the
bit-exact defaults.

Definitions:

* roofline_ratio = (executed fp32 FLOPs / matmul_gflops + executed bf16 FLOPs / matmul_gflops_bf16) / iteration_s:
  the fastest the arithmetic the iteration really executed could run at this machine's measured matmul rates,
  over the time it took. Executed FLOPs are counted by `executed_flops` (prefill of the positions really computed,
  after prefix sharing and with bucket padding; lm_head only where logits were computed; one decode step per live
  row; attention over the attended columns). It cannot exceed 1 unless some kernel runs faster than the 2048^3
  matmul of the same dtype (possible: the oneDNN prefill matmuls reached ~210 GFLOP/s fp32 on a machine where
  the 2048^3 matmul read ~190, so a prefill-bound iteration could come out above 1).
  `executed_gflop` is that FLOP count, `executed_flops` its fp32 / bf16 split; generate_roofline_ratio is the same
  over the generation time alone (per-member generate times, summed over the lanes, divided by the lanes).
* delivered_tokens_per_s = (prompt + generated tokens) / iteration_s: every token the iteration served, including
  prompt tokens that prefix sharing never computed; generated_tokens_per_s = generated tokens / iteration_s.
  Token counts are unpadded prompt tokens plus generated tokens up to and including eos, summed over the N
  members.
* overhead_fraction = (perturb + restore + update) / iteration_s; speedup_vs_naive = naive_iteration_s /
  iteration_s.

Workloads:

* `decode-heavy`: 32 chat prompts of 60-64 tokens (BoolQ passages cut to length), 256 new tokens, N 4. eos is
  suppressed for the first 256 tokens in both engines (`min_new_tokens`), so every completion has full length and
  both engines process exactly the same tokens.
* `cpu-preset`: the ES `cpu` preset's batch (16 BoolQ prompts, passages cut to 400 characters, ~200 tokens),
  completion budget (24 tokens, eos allowed) and generation batch size, N 4.

The fitness is a deterministic pseudo-score of each completion's text (not the task's 0/1 score) plus a tiny
member-dependent term, so that the update is never all-zero and its cost is always measured. Timings mean
nothing on a loaded machine: the 1-minute load average is recorded beside each workload. Low-rank populations and
Ray workers report no executed FLOPs (their completions' lengths per row are not seen here), so no roofline ratio.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from esft.config import FAST_CPU_GENERATION

WORKLOADS = ("decode-heavy", "cpu-preset")

#: esft's fast configuration, measured by default: esft.config.FAST_CPU_GENERATION (shared-prefix and
#: length-bucketed prefill, oneDNN packed linears, the compiled attention kernel) and noise from the shared table.
#: `--exact` measures the bit-exact defaults instead (per-tensor noise, plain prefill, torch ops: outputs
#: bit-identical to model.generate's arithmetic).
FAST_GENERATION: dict[str, Any] = dict(FAST_CPU_GENERATION)
FAST_NOISE = "table"
FAST_PARALLEL_MEMBERS = 2


@dataclass
class BenchConfig:
    """What `esft bench` runs."""

    model: str = "smollm2-135m"
    workloads: list[str] = field(default_factory=lambda: list(WORKLOADS))
    repeats: int = 1
    """esft and naive iterations per workload; the fastest of each is reported (the rest are in `runs`)"""
    threads: int | None = None
    """torch intra-op threads (None = torch's default)"""
    population: int = 4
    """N (the acceptance numbers use 4)"""
    noise: str = FAST_NOISE
    """esft noise mode for the esft iteration (`MasterWeights` noise modes, "per-tensor" being the ES default, or
    "lowrank": EGGROLL populations, all members in one batched generation, esft.es.lowrank)"""
    rank: int = 1
    """rank r of the "lowrank" noise"""
    naive: bool = True
    """also time the naive iteration (needed for speedup_vs_naive)"""
    generation: dict[str, Any] = field(default_factory=lambda: dict(FAST_GENERATION))
    """overrides of `GenerationConfig` fields for the esft engine (default FAST_GENERATION; lever experiments)"""
    parallel_members: int = FAST_PARALLEL_MEMBERS
    """members the local executor evaluates at once, one thread each (`ESConfig.parallel_members`); the lanes'
    model copies are made before the timed iteration, as a training run makes them once"""
    workers: int = 1
    """members evaluated in parallel, each by its own model replica in a Ray worker process with
    `threads // workers` torch threads (esft's `--executor ray`); 1 = the local executor in this process"""
    seed: int = 0
    check_outputs: bool = False
    """also generate each workload's batch once with esft's engine (these generation options) and once with
    `model.generate`, on the unperturbed model, and report how many greedy completions are identical"""


@dataclass
class Workload:
    name: str
    prompts: list  # chat messages
    max_new_tokens: int
    min_new_tokens: int
    generation_batch_size: int
    sigma: float
    alpha: float


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # pragma: no cover - platforms without getloadavg
        return None


def matmul_gflops(dtype: torch.dtype = torch.float32, size: int = 2048, reps: int = 5) -> float:
    """Best-of-`reps` GFLOP/s of a size^3 matmul (with the current torch thread setting)."""
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * size**3 / best / 1e9


# ---- executed work -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelShape:
    """The matmul dimensions of a Llama-family decoder, all that `executed_flops` needs."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def of(cls, model) -> ModelShape:
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cls(layers=cfg.num_hidden_layers, hidden=cfg.hidden_size, intermediate=cfg.intermediate_size,
                   heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads, head_dim=head_dim,
                   vocab=model.lm_head.weight.shape[0])

    @property
    def layer_weights(self) -> int:
        """Weights one position multiplies by in one layer: q, k, v, o and gate, up, down."""
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        return self.hidden * (2 * q + 2 * kv) + 3 * self.hidden * self.intermediate


def executed_flops(shape: ModelShape, prompts: Sequence[Sequence[int]], completion_lengths: Sequence[int], *,
                   batch_size: int, share_prefix: bool = False, prefill_buckets: int = 1,
                   screened_lm_head: bool = False, bucket_tokens: int | None = None,
                   min_prefix: int | None = None) -> dict[str, int]:
    """Matmul FLOPs that one `esft.generation.generate` call of esft's lean engine executes on `prompts` (token
    ids) when it generates `completion_lengths[i]` tokens (eos included) for prompt i. The layout is the
    engine's: rows sorted by length, longest first, in batches of `batch_size`; per batch, with `share_prefix`,
    the common prefix (capped so every row keeps one token, unused below `min_prefix` tokens) prefilled once at
    batch 1, and the remainders in up to `prefill_buckets` groups (`esft.lean.length_buckets`, each group padded to
    its longest). Counted, as 2 FLOPs per multiply-add:

    * linear layers (q, k, v, o, gate, up, down): every position a forward computes, the bucket's padding
      included, the shared prefix once per batch;
    * lm_head: one position per prefill forward row (the prefix forward's included), one per decode step;
    * decode: a row that generates c tokens runs c - 1 steps (it leaves the batch once it emits eos);
    * attention (q.k and the weighted sum of v, every head): per unmasked (query, key) pair only, each token
      attending itself and its row's earlier tokens; masked columns are not counted, whatever a kernel does
      with them.

    Not counted: embedding lookups, norms, rotary, activations, softmax (no matmul), and the screened lm_head's
    fp32 logits of its few candidate tokens. With `screened_lm_head` the decode steps' lm_head is counted as bf16
    (the screen's full-vocabulary matmul); everything else is fp32. Returns the position counts and the FLOPs:
    {"prefill_positions", "prefill_logit_rows", "decode_rows", "attention_pairs", "fp32", "bf16"}."""
    from esft.generation.prefill import PREFILL_BUCKET_TOKENS, common_prefix, layout_prefill, length_buckets

    if bucket_tokens is None:
        bucket_tokens = PREFILL_BUCKET_TOKENS
    if min_prefix is None:
        import inspect

        min_prefix = inspect.signature(layout_prefill).parameters["min_prefix"].default
    if len(prompts) != len(completion_lengths):
        raise ValueError(f"{len(prompts)} prompts but {len(completion_lengths)} completion lengths")
    positions = logit_rows = pairs = 0
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]), reverse=True)
    for start in range(0, len(order), batch_size):
        rows = [list(prompts[i]) for i in order[start:start + batch_size]]
        lengths = [len(r) for r in rows]
        p = min(common_prefix(rows), min(lengths) - 1) if share_prefix and len(rows) > 1 else 0
        if p < min_prefix:
            p = 0
        if p:
            positions += p
            logit_rows += 1
            pairs += p * (p + 1) // 2
        rest = [n - p for n in lengths]
        groups = length_buckets(rest, prefill_buckets, bucket_tokens) if prefill_buckets > 1 else [range(len(rows))]
        for group in groups:
            positions += len(group) * max(rest[r] for r in group)
            logit_rows += len(group)
        pairs += sum(s * p + s * (s + 1) // 2 for s in rest)
    decode_rows = 0
    for prompt, c in zip(prompts, completion_lengths):
        steps = max(int(c) - 1, 0)
        decode_rows += steps
        pairs += steps * len(prompt) + steps * (steps + 1) // 2  # step k attends the prompt and k new tokens
    linear = 2 * shape.layers * shape.layer_weights * (positions + decode_rows)
    attention = 4 * shape.layers * shape.heads * shape.head_dim * pairs
    head = 2 * shape.hidden * shape.vocab
    fp32 = linear + attention + head * logit_rows
    bf16 = 0
    if screened_lm_head:
        bf16 = head * decode_rows
    else:
        fp32 += head * decode_rows
    return {"prefill_positions": positions, "prefill_logit_rows": logit_rows, "decode_rows": decode_rows,
            "attention_pairs": pairs, "fp32": fp32, "bf16": bf16}


def roofline_ratio(flops: dict[str, float], seconds: float, gflops: float, gflops_bf16: float | None = None) -> float:
    """The shortest time `flops` ({"fp32": ..., "bf16": ...}) could take at the measured matmul rates (GFLOP/s),
    over the `seconds` they took: 1 means the work ran as fast as a 2048^3 matmul of its dtype."""
    ideal = flops.get("fp32", 0) / (gflops * 1e9)
    if flops.get("bf16", 0):
        if not gflops_bf16:
            raise ValueError("bf16 FLOPs need the measured bf16 matmul rate")
        ideal += flops["bf16"] / (gflops_bf16 * 1e9)
    return ideal / seconds


def effective_layout(model, gen) -> dict[str, Any]:
    """The prefill layout and lm_head `esft.generation.generate(model, ..., gen)` really runs (`executed_flops`
    options): the options the lean engine would drop on this model or machine (with a warning there) are off."""
    from esft.generation.lean_step import fused_attention_reason, unsupported_reason
    from esft.generation.packed import packed_linear_reason, screen_lm_head_reason

    lean = gen.engine == "esft" and bool(gen.lean) and unsupported_reason(model) is None
    dtype = model.lm_head.weight.dtype
    packed = lean and bool(gen.packed_linear) and packed_linear_reason(dtype) is None
    fused = lean and bool(gen.fused_attention) and fused_attention_reason(dtype) is None
    screened = (lean and bool(gen.screened_lm_head) and gen.temperature == 0
                and screen_lm_head_reason(model, packed, fused) is None)
    return {"share_prefix": lean and bool(gen.share_prefix),
            "prefill_buckets": int(gen.prefill_buckets or 1) if lean else 1,
            "screened_lm_head": screened}


def cpu_info() -> dict[str, Any]:
    """CPU model name and feature flags (Linux /proc/cpuinfo), and torch's CPU kernel capability."""
    model = flags = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model is None:
                    model = value.strip()
                elif key.strip() == "flags" and flags is None:
                    flags = value.split()
    except OSError:  # pragma: no cover - not Linux
        pass
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: None)()
    return {"model": model, "flags": flags, "torch_capability": capability}


# ---- workloads ----------------------------------------------------------------------------------------------

DECODE_SYSTEM = "You are a helpful assistant."


def _fit_prompt(tokenizer, passage: str, target: int) -> list[dict[str, str]]:
    """A chat prompt whose templated length is as close to `target` tokens as the passage's words allow."""
    from esft.generation import encode_prompts

    words = passage.split()

    def make(k: int) -> list[dict[str, str]]:
        return [{"role": "system", "content": DECODE_SYSTEM},
                {"role": "user", "content": "Explain this passage in detail:\n" + " ".join(words[:k])}]

    lo, hi = 1, len(words)
    while lo < hi:  # largest k with length <= target
        mid = (lo + hi + 1) // 2
        if len(encode_prompts(tokenizer, [make(mid)])[0]) <= target:
            lo = mid
        else:
            hi = mid - 1
    return make(lo)


def build_workload(name: str, tokenizer) -> Workload:
    from esft.es.es_config import PRESETS
    from esft.tasks.boolq import BoolQTask

    cpu = PRESETS["cpu"]
    if name == "decode-heavy":
        from esft.generation import encode_prompts

        prompts = []
        for ex in BoolQTask().load("train_pool"):  # the first 32 passages long enough for 60-64 tokens
            p = _fit_prompt(tokenizer, ex["passage"], 64)
            if len(encode_prompts(tokenizer, [p])[0]) >= 60:
                prompts.append(p)
            if len(prompts) == 32:
                break
        return Workload(name, prompts, max_new_tokens=256, min_new_tokens=256, generation_batch_size=32,
                        sigma=cpu["sigma"], alpha=cpu["alpha"])
    if name == "cpu-preset":
        from esft.es.build import sample_batch

        task = BoolQTask(max_passage_chars=cpu["max_passage_chars"])
        train = task.load("train")
        idx = sample_batch(42, 0, len(train), cpu["batch_size"])
        prompts = [task.prompt(train[i]) for i in idx]
        return Workload(name, prompts, max_new_tokens=cpu["max_new_tokens"], min_new_tokens=0,
                        generation_batch_size=cpu["generation_batch_size"], sigma=cpu["sigma"], alpha=cpu["alpha"])
    raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")


class PseudoTask:
    """Task stand-in: the prompts as given, a deterministic text-dependent score (so fitness varies and the
    update is real), nothing well-formed."""

    def prompt(self, example: dict) -> list:
        return example["messages"]

    def score(self, completion: str, example: dict) -> float:
        return (zlib.crc32(completion.encode()) % 1000) / 999.0

    def is_well_formed(self, completion: str, example: dict) -> bool:
        return False


def bench_fitness(result, batch) -> np.ndarray:
    """Mean pseudo-score plus 1e-3 x member index: members that happen to write identical completions still get
    distinct fitness, so the update is never all-zero and its cost is always part of the iteration."""
    from esft.es.fitness import MeanReward

    fitness = MeanReward()(result, batch)
    return fitness + 1e-3 * np.arange(len(fitness))


# ---- the two iterations -------------------------------------------------------------------------------------

def esft_iteration(model, tokenizer, work: Workload, population: int, noise: str, gen_overrides: dict,
                   seed: int = 0, rank: int = 1, parallel_members: int = 1) -> dict[str, Any]:
    """One ES iteration of esft; returns timings, token counts and the completions of member 0."""
    from esft.es.executor import LocalExecutor
    from esft.es.noise import MasterWeights
    from esft.generation import GenerationConfig

    gen = GenerationConfig(max_new_tokens=work.max_new_tokens, min_new_tokens=work.min_new_tokens,
                           batch_size=work.generation_batch_size, temperature=0.0, engine="esft")
    gen = dataclasses.replace(gen, **gen_overrides)
    task = PseudoTask()
    start = time.perf_counter()
    if noise == "lowrank":  # one batched generation for the whole population (through the HF forward's hooks)
        from esft.es.lowrank import LowRankExecutor, LowRankWeights

        weights = LowRankWeights(model, rank=rank)
        executor = LowRankExecutor(model, tokenizer, weights, task, work.sigma, gen)
        lanes = 1
    else:
        weights = MasterWeights(model, noise=noise)
        executor = LocalExecutor(model, tokenizer, weights, task, work.sigma, gen, parallel_members=parallel_members)
        executor.start()
        lanes = executor.lanes_for(population)
        calls = _record_generations(executor)
    setup = time.perf_counter() - start
    try:
        out = {**_timed_iteration(executor, work, population, seed, setup, weights.apply), "lanes": lanes}
    finally:
        executor.close()
    if noise != "lowrank":
        out["executed_flops"] = _executed(model, tokenizer, work, gen, calls)
    return out


def _record_generations(executor) -> list[tuple[list[list[int]] | None, list[int]]]:
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


def _executed(model, tokenizer, work: Workload, gen, calls) -> dict[str, int]:
    """FLOPs of the recorded generate calls (`executed_flops`), summed."""
    from esft.generation import encode_prompts

    shape, layout = ModelShape.of(model), effective_layout(model, gen)
    total = {"fp32": 0, "bf16": 0}
    for ids, lengths in calls:
        ids = ids if ids is not None else encode_prompts(tokenizer, work.prompts)
        counted = executed_flops(shape, ids, lengths, batch_size=gen.batch_size, **layout)
        total = {k: total[k] + counted[k] for k in total}
    return total


def _timed_iteration(executor, work: Workload, population: int, seed: int, setup: float, apply) -> dict[str, Any]:
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


def _bench_replica_parts(config):
    """ReplicaSpec builder of the Ray workers: the bench's model and its pseudo-task (module level: pickled by
    reference). Loads the compiled kernels too, so that start-up, not the timed iteration, pays for that."""
    from esft.kernels import load_decode_attention
    from esft.models import load_model

    model, tokenizer = load_model(config.model, dtype="float32", device="cpu")
    load_decode_attention()
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
        executor = make_ray_executor(cfg, weights=weights, builder=_bench_replica_parts)
        try:
            executor.start()
            setup = time.perf_counter() - start

            def apply(update):
                executor.on_update(update, 1)
                weights.apply(update)
                executor._settle()  # every worker has applied it too (what the executor does before its next call)

            return _timed_iteration(executor, work, population, seed, setup, apply)
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
    same = [a.completion_ids == b.completion_ids for a, b in zip(ours, ref)]
    first_diff = None
    for row, (a, b) in enumerate(zip(ours, ref)):
        if a.completion_ids != b.completion_ids:
            k = next((i for i, (x, y) in enumerate(zip(a.completion_ids, b.completion_ids)) if x != y),
                     min(len(a.completion_ids), len(b.completion_ids)))
            first_diff = {"row": row, "token": k}
            break
    return {"identical": int(sum(same)), "completions": len(same),
            "tokens": int(sum(len(g.completion_ids) for g in ref)), "first_difference": first_diff}


# ---- driver -------------------------------------------------------------------------------------------------

def count_params(model) -> int:
    """Parameters a forward pass multiplies by (tied embedding / lm_head counted once, as in 134.5M)."""
    return sum(p.numel() for p in model.parameters())


def _snapshot(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@torch.no_grad()
def _reset(model, snapshot: dict[str, torch.Tensor]) -> None:
    for n, p in model.named_parameters():
        p.copy_(snapshot[n])


def run_bench(config: BenchConfig, model=None, tokenizer=None, log=print) -> dict[str, Any]:
    if config.threads:
        torch.set_num_threads(int(config.threads))
    if model is None:
        from esft.models import load_model

        model, tokenizer = load_model(config.model, dtype="float32", device="cpu")
    model.eval()
    model.requires_grad_(False)
    dtype = next(model.parameters()).dtype
    params = count_params(model)
    log(f"threads {torch.get_num_threads()}, load {load_average()}: measuring matmul ...")
    from esft.generation import GenerationConfig

    # the screened lm_head's full-vocabulary matmul runs in bf16: its FLOPs are weighed at the bf16 rate
    screened = effective_layout(model, dataclasses.replace(GenerationConfig(temperature=0.0, engine="esft"),
                                                           **config.generation))["screened_lm_head"]
    counted = config.noise != "lowrank" and config.workers == 1  # where executed FLOPs are known (module doc)
    readings: dict[str, list[float]] = {"fp32": [], "bf16": []}

    def measure() -> None:
        readings["fp32"].append(round(matmul_gflops(dtype), 2))
        if screened and counted:
            readings["bf16"].append(round(matmul_gflops(torch.bfloat16), 2))

    measure()
    timed: dict[str, tuple[dict[str, int], dict[str, float]]] = {}  # workload -> executed FLOPs, unrounded timings
    report: dict[str, Any] = {"matmul_gflops": None, "matmul_gflops_bf16": None, "matmul_gflops_readings": readings,
                              "workloads": {},
                              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpu": cpu_info(),
                              "threads": torch.get_num_threads(), "dtype": str(dtype).replace("torch.", ""),
                              "params": params, "model": config.model, "noise": config.noise,
                              "torch": torch.__version__, "cpu_count": os.cpu_count(),
                              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                              "population": config.population, "generation_overrides": dict(config.generation),
                              "workers": config.workers,
                              "parallel_members": 1 if config.noise == "lowrank" or config.workers > 1
                              else config.parallel_members}
    snapshot = _snapshot(model)
    # Write every parameter once before timing anything: a checkpoint loaded through safetensors is memory-mapped,
    # and the first write to each page is a copy-on-write page fault (~0.8 s for 540 MB here) that would land in
    # whichever iteration perturbs first. A training run pays it once, at its first perturbation.
    _reset(model, snapshot)
    for name in config.workloads:
        work = build_workload(name, tokenizer)
        check = None
        if config.check_outputs:
            log(f"{name}: checking greedy outputs against model.generate ...")
            check = check_outputs(model, tokenizer, work, config.generation)
        loads = [load_average()]
        runs: dict[str, list[dict]] = {"esft": [], "naive": []}
        for r in range(config.repeats):
            log(f"{name}: esft iteration {r + 1}/{config.repeats} (load {load_average()}) ...")
            if config.workers > 1 and config.noise == "lowrank":
                raise ValueError("--workers: a low-rank population is one batched generation in one process")
            if config.workers > 1:
                runs["esft"].append(esft_iteration_parallel(
                    model, work, config.population, config.noise, config.generation, config.workers,
                    max(1, torch.get_num_threads() // config.workers), config.model, config.seed))
            else:
                runs["esft"].append(esft_iteration(
                    model, tokenizer, work, config.population, config.noise, config.generation, config.seed,
                    config.rank, 1 if config.noise == "lowrank" else config.parallel_members))
            _reset(model, snapshot)
            loads.append(load_average())
            if config.naive:
                log(f"{name}: naive iteration {r + 1}/{config.repeats} (load {load_average()}) ...")
                runs["naive"].append(naive_iteration(model, tokenizer, work, config.population, config.seed))
                _reset(model, snapshot)
                loads.append(load_average())
        best = min(runs["esft"], key=lambda x: x["timings"]["iteration"])
        t = best["timings"]
        it = t["iteration"]
        tokens = best["prompt_tokens"] + best["generated_tokens"]
        flops = best.get("executed_flops")
        if flops is not None:
            timed[name] = (flops, t)
        entry: dict[str, Any] = {
            "roofline_ratio": None,  # below, once every matmul reading is in
            "generated_tokens_per_s": round(best["generated_tokens"] / it, 2),
            "delivered_tokens_per_s": round(tokens / it, 2),
            "executed_gflop": None if flops is None else round(sum(flops.values()) / 1e9, 3),
            "executed_flops": flops,
            "iteration_s": round(it, 3),
            "naive_iteration_s": None,
            "speedup_vs_naive": None,
            "overhead_fraction": round((t["perturb"] + t["restore"] + t["update"]) / it, 4),
            "prompt_tokens": best["prompt_tokens"],
            "generated_tokens": best["generated_tokens"],
            "generate_roofline_ratio": None,
            "timings_s": {k: round(v, 3) for k, v in t.items()},
            "esft_iterations_s": [round(x["timings"]["iteration"], 3) for x in runs["esft"]],
            "lanes": best.get("lanes", 1),
            "load_avg_1min": loads,
        }
        if runs["naive"]:
            nb = min(runs["naive"], key=lambda x: x["timings"]["iteration"])
            entry["naive_iteration_s"] = round(nb["timings"]["iteration"], 3)
            entry["speedup_vs_naive"] = round(nb["timings"]["iteration"] / it, 3)
            entry["naive_timings_s"] = {k: round(v, 3) for k, v in nb["timings"].items()}
            entry["naive_iterations_s"] = [round(x["timings"]["iteration"], 3) for x in runs["naive"]]
            entry["naive_generated_tokens"] = nb["generated_tokens"]
            # with per-tensor noise member 0 sees identical weights in both (later naive members carry the naive
            # restore-by-subtraction error); other noise modes perturb differently, so no comparison
            entry["member0_outputs_match"] = (best["texts"][0] == nb["texts"][0]
                                              if config.noise == "per-tensor" else None)
        if check is not None:
            entry["outputs_vs_hf_generate"] = check
        report["workloads"][name] = entry
        log(f"{name}: measuring matmul again (load {load_average()}) ...")
        measure()
    gflops = report["matmul_gflops"] = max(readings["fp32"])
    gflops_bf16 = report["matmul_gflops_bf16"] = max(readings["bf16"]) if readings["bf16"] else None
    for name, (flops, t) in timed.items():
        entry = report["workloads"][name]
        entry["roofline_ratio"] = round(roofline_ratio(flops, t["iteration"], gflops, gflops_bf16), 4)
        # per-member generate times are summed over the lanes, each lane having 1/lanes of the threads
        entry["generate_roofline_ratio"] = round(
            roofline_ratio(flops, t["generate"] / entry["lanes"], gflops, gflops_bf16), 4)
    report["load_avg_1min_end"] = load_average()
    return report


def format_table(report: dict[str, Any]) -> str:
    bf16 = report.get("matmul_gflops_bf16")
    head = (f"matmul {report['matmul_gflops']:.1f} GFLOP/s ({report['dtype']}, {report['threads']} threads)"
            + (f", bf16 {bf16:.1f}" if bf16 else "") + "; "
            f"{report['params'] / 1e6:.1f}M params; N {report['population']}; noise {report['noise']}; "
            f"generation {report['generation_overrides'] or 'defaults'}")
    cols = ("workload", "roofline", "GFLOP", "gen tok/s", "tok/s", "iter s", "naive s", "speedup", "overhead",
            "load")
    rows = [cols]
    for name, w in report["workloads"].items():
        def f(v, fmt):
            return "-" if v is None else format(v, fmt)

        rows.append((name, f(w["roofline_ratio"], ".3f"), f(w.get("executed_gflop"), ".1f"),
                     f(w["generated_tokens_per_s"], ".1f"), f(w.get("delivered_tokens_per_s"), ".1f"),
                     f(w["iteration_s"], ".1f"), f(w["naive_iteration_s"], ".1f"), f(w["speedup_vs_naive"], ".2f"),
                     f(w["overhead_fraction"], ".3f"), "/".join(str(x) for x in w["load_avg_1min"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = [head, "roofline: executed FLOPs at the measured matmul rate(s) / iteration time; GFLOP: executed per "
             "iteration; tok/s: prompt + generated tokens delivered per second", ""]
    for k, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    for name, w in report["workloads"].items():
        if (check := w.get("outputs_vs_hf_generate")) is not None:
            lines.append(f"{name}: {check['identical']}/{check['completions']} greedy completions identical to "
                         f"model.generate's ({check['tokens']} tokens)")
    return "\n".join(lines)


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """`key=value` pairs for GenerationConfig (values parsed as YAML scalars: true, 64, 0.5, hf)."""
    import yaml

    from esft.generation import GenerationConfig

    names = {f.name for f in dataclasses.fields(GenerationConfig)}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in names:
            raise ValueError(f"--set expects KEY=VALUE with KEY a GenerationConfig field ({', '.join(sorted(names))})")
        out[key] = yaml.safe_load(value)
    return out


def main(args) -> int:
    import sys

    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    for w in workloads:
        if w not in WORKLOADS:
            raise ValueError(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    exact = getattr(args, "exact", False)
    generation = {} if exact else dict(FAST_GENERATION)
    generation.update(parse_overrides(args.set or []))
    noise = args.noise or ("per-tensor" if exact else FAST_NOISE)
    lanes = getattr(args, "parallel_members", None)
    lanes = (1 if exact else FAST_PARALLEL_MEMBERS) if lanes is None else int(lanes)
    if lanes < 1:
        raise ValueError(f"--parallel-members must be >= 1, got {lanes}")
    config = BenchConfig(model=args.model, workloads=workloads, repeats=args.repeats, threads=args.threads,
                         population=args.population, noise=noise, rank=getattr(args, "rank", 1),
                         naive=not args.no_naive, generation=generation,
                         check_outputs=getattr(args, "check_outputs", False), workers=args.workers,
                         parallel_members=lanes)
    log = (lambda msg: print(msg, file=sys.stderr, flush=True))
    report = run_bench(config, log=log)
    if args.json:
        print(json.dumps(report))
    else:
        print(format_table(report))
    return 0
