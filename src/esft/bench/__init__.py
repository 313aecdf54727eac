"""`esft bench`: how close an ES iteration gets to this machine's arithmetic limit, and how much faster it is than
the way public ES code does it. One run measures everything on the current machine:

* `matmul_gflops` / `matmul_gflops_bf16` (`matmul_gflops_by_dtype`, `best_dtype`): a 2048^3 matmul in fp32 and,
  where torch's oneDNN has bf16, in bf16 (with bf16 rollouts on a CPU whose oneDNN lacks it, torch's emulated bf16
  at 512^3, `matmul_size_bf16`; no `roofline_ratio_per_dtype` there), with the bench's thread count, best of five,
  measured before the first workload and after each (`matmul_gflops_readings`), the best reading kept: the
  machine's capability, so that a reading taken while other processes held the cores does not inflate the roofline
  ratio;
* `rollout_precision`: the members' rollout dtype (`--rollout-dtype`, auto = bf16 on CPUs with native bf16,
  esft.generation.precision) and why; with bf16, the same iteration with fp32 rollouts too, right before each bf16
  one (`speedup_vs_fp32`: the fastest fp32 over the fastest bf16 iteration; `speedup_vs_fp32_per_repeat`: each
  repeat's back-to-back pair, which this VM's drift between minutes does not reach);
* per workload, pure batched generation of the same prompts, N times, same lanes and dtype (esft.bench.inference),
  by esft's engine right after each esft iteration (side by side; the fastest reported, all in
  `pure_generations_s`) and, where vLLM is installed (its CPU build: scripts/vllm_venv.sh), by vLLM in a spawned
  process with an ES replica's engine settings: `inference_ratio` = the iteration's delivered tokens/s over the
  faster engine's;
* per workload, one full esft ES iteration (`LocalExecutor` perturb -> generate -> score -> restore per member,
  `ES.tell`, `MasterWeights.apply`) and the same iteration done the naive way (perturb in place with noise
  regenerated from the seed, `model.generate` over the batch, restore by regenerating the noise and subtracting
  it, update by regenerating every member's noise again).

The esft iteration runs esft's fast configuration by default (FAST_GENERATION, FAST_NOISE, FAST_PARALLEL_MEMBERS:
shared-prefix and length-bucketed prefill, packed oneDNN linears, the compiled attention kernel, the screened
lm_head, table noise, two members at once on one thread each on decode-heavy, the `cpu` preset's one lane on
cpu-preset; all recorded in the report); `--exact` measures the
bit-exact defaults.

Definitions:

* roofline_ratio = (all executed FLOPs / the best dtype's matmul rate) / iteration_s: the fastest the arithmetic
  the iteration really executed could run at this machine's best measured matmul rate, over the time it took
  (`roofline_ratio_per_dtype` weighs fp32 and bf16 FLOPs at their own rates instead). Executed FLOPs are counted by
  `executed_flops` (prefill of the positions really computed,
  after prefix sharing and with bucket padding; lm_head only where logits were computed; one decode step per live
  row; attention over the attended columns). It cannot exceed 1 unless some kernel runs faster than the 2048^3
  matmul of the same dtype (possible: the oneDNN prefill matmuls reached ~210 GFLOP/s fp32 on a machine where
  the 2048^3 matmul read ~190, so a prefill-bound iteration could come out above 1).
  `executed_gflop` is that FLOP count (GFLOP per iteration), `executed_flops` its fp32 / bf16 split (FLOPs, not
  FLOP/s); generate_roofline_ratio is roofline_ratio (best dtype's rate) over the generation time alone
  (per-member generate times, summed over the lanes, divided by the lanes). `timings_s` holds lane sums for
  perturb, generate and restore (so generate can exceed iteration_s with two lanes), wall time for the rest.
* delivered_tokens_per_s = (prompt + generated tokens) / iteration_s: every token the iteration served, including
  prompt tokens that prefix sharing never computed; generated_tokens_per_s = generated tokens / iteration_s.
  Token counts are unpadded prompt tokens plus generated tokens up to and including eos, summed over the N
  members.
* overhead_fraction = ((perturb + restore) / lanes + score + update) / iteration_s: the share of the iteration's
  wall time spent outside generation (perturb and restore are summed over the lanes, which run them concurrently,
  so they are divided by the lanes as generate_roofline_ratio divides generation; scoring, on the calling thread
  after the lanes, and the update run once).
  With `--workers`, each Ray worker perturbs, scores and restores its members in its own process, and those
  worker-seconds are divided by the workers.
  `overhead_fraction_summed_lanes` keeps the lane sum undivided (its value before 2026-12-01).
  speedup_vs_naive = naive_iteration_s / iteration_s.
* `memory` (with `--memory-rounds N`): N alternated rounds of peak RSS, the `cpu` preset's one ES iteration and
  an evaluation of its batch, each in its own process, and ES over the evaluation per round (esft.bench.memory).
* The memory limit: `memory_read_gbps` is the best streaming read rate measured (`read_gbps`, with the matmuls);
  `decode_read_bytes` what the iteration's decode steps must read at least (`roofline.decode_read_bytes`: each member's
  weights once per step, each row's cached keys and values once per step); `bandwidth_ratio` the time those bytes
  take at that rate over iteration_s; `roofline_ceiling` the highest roofline_ratio the bandwidth leaves (1 when
  the arithmetic, not the memory, is the longer). A decode-heavy iteration on a CPU with fast bf16 matmuls (AMX)
  is memory-bound: its ceiling there was 0.29 (docs/performance.md).

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

Modules: roofline (executed FLOPs, matmul rates, machine facts), workloads (prompts and the pseudo-task),
iterations (esft's and the naive iteration, the output check), options (`BenchConfig`, whose fields are the
command's flags through esft.config, and the `--set` overrides); this one holds the driver.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import torch

from esft.bench.inference import esft_generation, inference_entry, vllm_available, vllm_generation, vllm_job
from esft.bench.iterations import check_outputs, esft_iteration, esft_iteration_parallel, naive_iteration
from esft.bench.roofline import (
    EMULATED_BF16_MATMUL_SIZE, ModelShape, bandwidth_bound, best_dtype_roofline_ratio, bf16_matmul_size, count_params,
    cpu_info, effective_layout, executed_flops, load_average, matmul_gflops, read_gbps, roofline_ratio,
)
from esft.bench.options import FAST_GENERATION, FAST_NOISE, BenchConfig, check_given, parse_overrides
from esft.bench.workloads import (FAST_PARALLEL_MEMBERS, WORKLOADS, PseudoTask, Workload, bench_fitness,
                                  build_workload)
from esft.config import build_config
from esft.es.distributed.factory import machine_cores

__all__ = ["BenchConfig", "EMULATED_BF16_MATMUL_SIZE", "FAST_GENERATION", "FAST_NOISE", "FAST_PARALLEL_MEMBERS",
           "ModelShape", "PseudoTask", "WORKLOADS", "Workload", "bench_fitness", "bench_precision", "bf16_matmul_size",
           "build_workload", "check_outputs", "count_params", "cpu_info",
           "effective_layout", "esft_iteration", "esft_iteration_parallel", "executed_flops", "format_table",
           "load_average", "main", "matmul_gflops", "naive_iteration", "parse_overrides", "roofline_ratio",
           "run_bench"]

# ---- driver -------------------------------------------------------------------------------------------------

def _snapshot(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@torch.no_grad()
def _reset(model, snapshot: dict[str, torch.Tensor]) -> None:
    for n, p in model.named_parameters():
        p.copy_(snapshot[n])


def bench_precision(config: BenchConfig, **resolve: Any) -> Any:
    """The members' RolloutPrecision: `--rollout-dtype` resolved for this CPU where the members run on local lanes;
    fp32 with a low-rank population or Ray workers, the request still recorded as made (`auto`). `resolve`: passed
    to resolve_rollout_dtype (flags, probe: tests)."""
    from esft.generation.precision import RolloutPrecision, resolve_rollout_dtype

    if config.noise != "lowrank" and config.workers == 1:
        return resolve_rollout_dtype(config.rollout_dtype, generation_options=config.generation, **resolve)
    if config.rollout_dtype == "float32":
        return RolloutPrecision("float32", "float32", "requested")
    return RolloutPrecision("float32", config.rollout_dtype, "bf16 rollouts run on local member lanes only (not with "
                            "--noise lowrank or --workers)")


def run_bench(config: BenchConfig, model=None, tokenizer=None, log=print) -> dict[str, Any]:
    """Time `config.workloads` and return the report `esft bench --json` prints. `config.threads` applies for the
    measurement only: the caller's torch thread count is back in place afterwards, whatever happened."""
    before = torch.get_num_threads()
    try:
        if config.threads:
            torch.set_num_threads(int(config.threads))
        return _measure(config, model, tokenizer, log)
    finally:
        torch.set_num_threads(before)


def _measure(config: BenchConfig, model, tokenizer, log) -> dict[str, Any]:
    if model is None:
        from esft.models import load_model

        model, tokenizer = load_model(config.model, dtype="float32", device="cpu")
    model.eval()
    model.requires_grad_(False)
    dtype = next(model.parameters()).dtype
    log(f"threads {torch.get_num_threads()}, load {load_average()}: measuring matmul ...")
    precision = bench_precision(config)
    if precision.warning is not None:  # bf16 asked for on a CPU that emulates it
        import warnings

        warnings.warn(precision.warning, stacklevel=2)
    readings: dict[str, list[float]] = {"fp32": [], "bf16": []}
    reads: list[float] = []  # GB/s, measured with the matmuls: the memory limit (`bandwidth_bound`)
    from esft.generation.packed import onednn_bf16

    bf16_size = bf16_matmul_size(onednn_bf16(), precision.dtype == "bfloat16")

    def measure() -> None:  # every dtype the machine offers: the roofline takes the best
        readings["fp32"].append(round(matmul_gflops(dtype), 2))
        if bf16_size is not None:
            readings["bf16"].append(round(matmul_gflops(torch.bfloat16, size=bf16_size), 2))
        reads.append(round(read_gbps(), 2))

    measure()
    timed: dict[str, tuple[dict[str, int], dict[str, float]]] = {}  # workload -> executed FLOPs, unrounded timings
    report = _report_head(config, model, dtype, readings)
    report.update(rollout_precision=precision.record(), memory_read_gbps_readings=reads)
    report["matmul_size_bf16"] = bf16_size
    rollout = precision.torch_dtype if precision.dtype != "float32" else None
    snapshot = _snapshot(model)
    # Write every parameter once before timing anything: a checkpoint loaded through safetensors is memory-mapped,
    # and the first write to each page is a copy-on-write page fault (~0.8 s for 540 MB here) that would land in
    # whichever iteration perturbs first. A training run pays it once, at its first perturbation.
    _reset(model, snapshot)
    pures: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}  # workload -> esft's pure generation, vLLM's job
    for name in config.workloads:
        work = build_workload(name, tokenizer)
        check = None
        if config.check_outputs:
            log(f"{name}: checking greedy outputs against model.generate ...")
            check = check_outputs(model, tokenizer, work, config.generation)
        loads = [load_average()]
        runs = _iterations(config, model, tokenizer, name, work, snapshot, loads, log, rollout)
        entry, flops, timings = _workload_entry(runs, loads, config.noise)
        if flops is not None:
            timed[name] = (flops, timings)
        if check is not None:
            entry["outputs_vs_hf_generate"] = check
        if runs["fp32"]:
            fp32_each = [x["timings"]["iteration"] for x in runs["fp32"]]
            entry["fp32_rollout_iteration_s"] = round(min(fp32_each), 3)
            entry["speedup_vs_fp32"] = round(min(fp32_each) / timings["iteration"], 3)
            entry["fp32_rollout_iterations_s"] = [round(t, 3) for t in fp32_each]
            # each repeat's fp32 iteration over the esft iteration that ran right after it
            entry["speedup_vs_fp32_per_repeat"] = [round(f / x["timings"]["iteration"], 3)
                                                   for f, x in zip(fp32_each, runs["esft"])]
        if runs["pure"]:
            pure = min(runs["pure"], key=lambda x: x["seconds"])  # the fastest, as for the iterations
            entry.update(inference_entry(pure, entry["delivered_tokens_per_s"]))
            entry["pure_generations_s"] = [x["seconds"] for x in runs["pure"]]
            pures[name] = (pure, vllm_job(tokenizer, work))
        report["workloads"][name] = entry
        log(f"{name}: measuring matmul again (load {load_average()}) ...")
        measure()
    if pures and config.vllm and vllm_available():
        _time_vllm(config, report, pures, precision.dtype if rollout is not None else str(dtype).replace("torch.", ""),
                   log)
    _rooflines(report, readings, timed)
    if report["parallel_members"] is None:  # each workload ran its own lanes: say which
        report["parallel_members"] = {name: entry.get("lanes") for name, entry in report["workloads"].items()}
    report.update(kernel_statuses())
    report["load_avg_1min_end"] = load_average()
    if config.memory_rounds:
        from esft.bench.memory import measure_memory

        report["memory"] = measure_memory(config.model, config.memory_rounds, log)
    return report


def kernel_statuses() -> dict[str, str | None]:
    """What the bench really ran. Without the attention kernel (no compiler, a failed build) the lean engine drops
    fused_attention and the screened lm_head with a warning on stderr, while generation_overrides still asks for
    them; without the masters' passes (esft.es.param_writes) the torch ops give the same bits, not the same time;
    without the AMX linear (no AMX, a failed build) bf16 linears run on oneDNN."""
    from esft.kernels import kernel_status

    return {"decode_attention_kernel": kernel_status("decode_attention"),
            "param_passes_kernel": kernel_status("param_passes"), "amx_linear_kernel": kernel_status("amx_linear")}


def _time_vllm(config: "BenchConfig", report: dict[str, Any], pures: dict[str, tuple[dict, dict]], dtype: str,
               log) -> None:
    """vLLM's pure generation of every workload (one engine, in a spawned process), folded into each entry's
    inference fields; a failure is recorded, not raised (the esft measurements stand on their own)."""
    from esft.models import resolve_model_path

    log(f"vllm: pure generation of {', '.join(pures)} in {dtype} (load {load_average()}; engine start-up is not "
        "timed) ...")
    try:
        timings: dict[str, Any] = vllm_generation(resolve_model_path(config.model),
                                                  {name: job for name, (_, job) in pures.items()},
                                                  config.population, dtype, torch.get_num_threads())
    except Exception as exc:
        timings = {name: f"failed: {exc}" for name in pures}
    for name, (pure, _) in pures.items():
        entry = report["workloads"][name]
        entry.update(inference_entry(pure, entry["delivered_tokens_per_s"], timings[name]))


def _report_head(config: BenchConfig, model, dtype: torch.dtype, readings: dict[str, list[float]]) -> dict[str, Any]:
    """The report's machine, model and configuration fields; `workloads` to fill, the matmul rates to come."""
    return {"matmul_gflops": None, "matmul_gflops_bf16": None, "matmul_gflops_readings": readings,
            "workloads": {},
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpu": cpu_info(),
            "threads": torch.get_num_threads(), "dtype": str(dtype).replace("torch.", ""),
            "params": count_params(model), "model": config.model, "noise": config.noise,
            "rank": config.rank if config.noise == "lowrank" else None,
            # the machine's cores, and those this process may run on (a container's or taskset's share of them)
            "torch": torch.__version__, "cpu_count": os.cpu_count(), "usable_cores": machine_cores(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "population": config.population, "generation_overrides": dict(config.generation),
            # each worker's own torch threads: with --threads below the workers, the workers together use more
            "workers": config.workers, "worker_threads": worker_threads(config.workers) if config.workers > 1 else None,
            "parallel_members": 1 if config.noise == "lowrank" or config.workers > 1 else config.parallel_members}


def _iterations(config: BenchConfig, model, tokenizer, name: str, work: Workload,
                snapshot: dict[str, torch.Tensor], loads: list[float | None], log,
                rollout: torch.dtype | None = None) -> dict[str, list[dict]]:
    """`repeats` esft iterations (and naive ones, and fp32-rollout ones when `rollout` is bf16), each from the
    same weights; the load average after each. Each esft iteration sits between the two runs it is compared with,
    so that they meet the same machine state (this VM's speed drifts by 10-30% within minutes): the fp32-rollout
    iteration right before it (`speedup_vs_fp32`) and, with `inference`, esft's pure generation of the same prompts
    right after it (`inference_ratio`; measured minutes apart, after the naive iteration, it read 0.83, 0.85 and
    1.05 in three runs on one idle machine)."""
    runs: dict[str, list[dict]] = {"esft": [], "naive": [], "fp32": [], "pure": []}
    for r in range(config.repeats):
        if config.workers > 1 and config.noise == "lowrank":
            raise ValueError("--workers: a low-rank population is one batched generation in one process")
        if config.workers > 1:
            log(f"{name}: esft iteration {r + 1}/{config.repeats} (load {load_average()}) ...")
            runs["esft"].append(esft_iteration_parallel(
                model, work, config.population, config.noise, config.generation, config.workers,
                worker_threads(config.workers), config.model, config.seed))
            _reset(model, snapshot)  # the update moved the weights
        else:
            lanes = 1 if config.noise == "lowrank" else config.parallel_members or work.parallel_members
            if rollout is not None and config.compare_fp32:  # just before the esft iteration it is compared with
                log(f"{name}: esft iteration with fp32 rollouts {r + 1}/{config.repeats} "
                    f"(load {load_average()}) ...")
                runs["fp32"].append(esft_iteration(
                    model, tokenizer, work, config.population, config.noise, config.generation, config.seed,
                    config.rank, lanes))
                _reset(model, snapshot)
            log(f"{name}: esft iteration {r + 1}/{config.repeats} (load {load_average()}) ...")
            runs["esft"].append(esft_iteration(
                model, tokenizer, work, config.population, config.noise, config.generation, config.seed,
                config.rank, lanes, rollout))
            _reset(model, snapshot)  # the update moved the weights
            if config.inference and config.noise != "lowrank":
                log(f"{name}: pure generation {r + 1}/{config.repeats} (load {load_average()}) ...")
                runs["pure"].append(esft_generation(model, tokenizer, work, config.population, config.generation,
                                                    runs["esft"][-1]["lanes"], rollout))
        loads.append(load_average())
        if config.naive:
            log(f"{name}: naive iteration {r + 1}/{config.repeats} (load {load_average()}) ...")
            runs["naive"].append(naive_iteration(model, tokenizer, work, config.population, config.seed))
            _reset(model, snapshot)
            loads.append(load_average())
    return runs


def worker_threads(workers: int) -> int:
    """The torch threads of each Ray worker: this process's threads shared among them, at least one each."""
    return max(1, torch.get_num_threads() // workers)


def overhead_fraction(timings: dict[str, float], lanes: int, workers: int = 1) -> float:
    """The iteration's share of wall time outside generation: ((perturb + restore) / lanes + score + update) /
    iteration, perturb and restore being summed over `lanes` concurrent lanes; scoring runs on the calling thread
    after the lanes (esft.es.executor), so it counts in full (see the module docstring). Ray `workers` perturb,
    score and restore their members concurrently, each in its own process, and their timings are summed over the
    workers (worker-seconds): all three are divided by the workers."""
    t, w = timings, max(1, int(workers))
    return ((t["perturb"] + t["restore"]) / max(1, int(lanes)) / w + t.get("score", 0.0) / w + t["update"]
            ) / t["iteration"]


def _workload_entry(runs: dict[str, list[dict]], loads: list[float | None], noise: str
                    ) -> tuple[dict[str, Any], dict[str, int] | None, dict[str, float]]:
    """The workload's report entry from its fastest iterations (roofline ratios once the matmul rates are in),
    its executed FLOPs and the fastest esft iteration's unrounded timings."""
    best = min(runs["esft"], key=lambda x: x["timings"]["iteration"])
    t = best["timings"]
    it = t["iteration"]
    tokens = best["prompt_tokens"] + best["generated_tokens"]
    flops = best.get("executed_flops")
    entry: dict[str, Any] = {
        "roofline_ratio": None,  # below, once every matmul reading is in
        "generated_tokens_per_s": round(best["generated_tokens"] / it, 2),
        "delivered_tokens_per_s": round(tokens / it, 2),
        "executed_gflop": None if flops is None else round(sum(flops.values()) / 1e9, 3),
        "executed_flops": flops,
        "decode_read_bytes": best.get("decode_read_bytes"),
        "iteration_s": round(it, 3),
        "naive_iteration_s": None,
        "speedup_vs_naive": None,
        "overhead_fraction": round(overhead_fraction(t, best.get("lanes", 1), best.get("workers", 1)), 4),
        "overhead_fraction_summed_lanes": round(overhead_fraction(t, 1), 4),
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
        entry["member0_outputs_match"] = best["texts"][0] == nb["texts"][0] if noise == "per-tensor" else None
    return entry, flops, t


def _rooflines(report: dict[str, Any], readings: dict[str, list[float]],
               timed: dict[str, tuple[dict[str, int], dict[str, float]]]) -> None:
    """The best matmul readings, and each workload's roofline ratios at those rates."""
    gflops = report["matmul_gflops"] = max(readings["fp32"])
    gflops_bf16 = report["matmul_gflops_bf16"] = max(readings["bf16"]) if readings["bf16"] else None
    rates = {"fp32": gflops, "bf16": gflops_bf16}
    report["matmul_gflops_by_dtype"] = rates
    report["best_dtype"] = max((k for k in rates if rates[k]), key=lambda k: rates[k])
    reads = report.get("memory_read_gbps_readings")
    report["memory_read_gbps"] = max(reads) if reads else None
    for name, (flops, t) in timed.items():
        entry = report["workloads"][name]
        # executed FLOPs at the best rate this CPU offers in any dtype (the headline), and at each dtype's own
        entry["roofline_ratio"] = round(best_dtype_roofline_ratio(flops, t["iteration"], rates), 4)
        # not at an emulated bf16 rate, which depends on the product's shape (esft.bench.roofline.bf16_matmul_size)
        emulated = report.get("matmul_size_bf16") == EMULATED_BF16_MATMUL_SIZE
        entry["roofline_ratio_per_dtype"] = (None if emulated else
                                             round(roofline_ratio(flops, t["iteration"], gflops, gflops_bf16), 4))
        # per-member generate times are summed over the lanes, each lane having 1/lanes of the threads
        entry["generate_roofline_ratio"] = round(
            best_dtype_roofline_ratio(flops, t["generate"] / entry["lanes"], rates), 4)
        if entry.get("decode_read_bytes") is not None and report["memory_read_gbps"]:
            bound = bandwidth_bound(flops, entry["decode_read_bytes"], t["iteration"],
                                    rates[report["best_dtype"]], report["memory_read_gbps"])
            entry.update({k: round(v, 4) for k, v in bound.items()})


def format_table(report: dict[str, Any]) -> str:
    bf16 = report.get("matmul_gflops_bf16")
    kernel = report.get("decode_attention_kernel")
    head = (f"matmul {report['matmul_gflops']:.1f} GFLOP/s ({report['dtype']}, {report['threads']} threads)"
            + (f", bf16 {bf16:.1f}" if bf16 else "") + "; "
            f"{report['params'] / 1e6:.1f}M params; N {report['population']}; noise {report['noise']}"
            + (f" (rank {report['rank']})" if report.get("rank") else "") + "; "
            f"generation {report['generation_overrides'] or 'defaults'}"
            + (f" (attention kernel not used: {kernel})" if kernel not in (None, "loaded") else "") + "; rollouts "
            f"{(report.get('rollout_precision') or {}).get('rollout_dtype', 'float32')}; "
            f"CPU {(report.get('cpu') or {}).get('model')}")
    cols = ("workload", "roofline", "GFLOP", "gen tok/s", "tok/s", "iter s", "naive s", "speedup", "overhead",
            "vs fp32", "inference", "load")
    rows = [cols]
    for name, w in report["workloads"].items():
        def f(v, fmt):
            return "-" if v is None else format(v, fmt)

        rows.append((name, f(w["roofline_ratio"], ".3f"), f(w.get("executed_gflop"), ".1f"),
                     f(w["generated_tokens_per_s"], ".1f"), f(w.get("delivered_tokens_per_s"), ".1f"),
                     f(w["iteration_s"], ".1f"), f(w["naive_iteration_s"], ".1f"), f(w["speedup_vs_naive"], ".2f"),
                     f(w["overhead_fraction"], ".3f"), f(w.get("speedup_vs_fp32"), ".2f"),
                     f(w.get("inference_ratio"), ".3f"), "/".join(str(x) for x in w["load_avg_1min"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = [head, "roofline: executed FLOPs at the measured matmul rate(s) / iteration time; GFLOP: executed per "
             "iteration; tok/s: prompt + generated tokens delivered per second", ""]
    for k, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    for name, w in report["workloads"].items():
        if w.get("pure_generation"):
            engines = ", ".join(f"{e['engine']} {e['seconds']:.1f} s" for e in w["pure_generation"])
            lines.append(f"{name}: pure generation of the same prompts: {engines} (vLLM: {w['vllm']}); "
                         f"inference ratio against {w['inference_engine']}")
        if w.get("roofline_ceiling") is not None:
            lines.append(f"{name}: decode reads at least {w['decode_read_bytes'] / 1e9:.1f} GB, "
                         f"{w['bandwidth_ratio']:.3f} of the iteration at {report['memory_read_gbps']:.1f} GB/s; "
                         f"the highest roofline that bandwidth leaves: {w['roofline_ceiling']:.3f}")
        if len(pairs := w.get("speedup_vs_fp32_per_repeat") or []) > 1:
            lines.append(f"{name}: fp32-rollout iteration over the bf16 one right after it, per repeat: "
                         + ", ".join(f"{x:.2f}" for x in pairs))
        if (check := w.get("outputs_vs_hf_generate")) is not None:
            lines.append(f"{name}: {check['identical']}/{check['completions']} greedy completions identical to "
                         f"model.generate's ({check['tokens']} tokens)")
    if (memory := report.get("memory")) is not None and "error" in memory:
        lines.append(f"peak RSS not measured: {memory['error']}")
    elif memory is not None:
        peaks = ", ".join(f"{r['es_peak_rss_kb'] / 2**20:.2f} / {r['eval_peak_rss_kb'] / 2**20:.2f} GiB"
                          for r in memory["rounds"])
        lines.append(f"peak RSS, `{memory['es_command']}` / `{memory['eval_command']}` per round: {peaks}; ES over "
                     f"the evaluation {memory['ratio_min']:.2f}-{memory['ratio_max']:.2f}x (median "
                     f"{memory['ratio_median']:.2f}x)")
    return "\n".join(lines)


def main(args) -> int:
    """`esft bench`: `args` holds BenchConfig's fields (their flags), `set` (KEY=VALUE generation overrides) and
    `json`."""
    import sys

    names = {f.name for f in dataclasses.fields(BenchConfig)}
    given = {k: v for k, v in vars(args).items() if k in names}  # the flags typed: the parser sets no default
    config = build_config(BenchConfig, None, None, None, given, check=BenchConfig.check)
    check_given(config, given)
    if config.threads and config.threads > machine_cores():  # allowed (an experiment), but never silently
        import warnings

        warnings.warn(f"--threads {config.threads} is more than the {machine_cores()} cores this process may run on: "
                      "threads share cores, so the matmul rates and the timings measure that oversubscription",
                      stacklevel=2)
    config.generation.update(parse_overrides(args.set or []))
    if config.workers > 1 and "batch_size" in config.generation:  # else refused by the replicas' ESConfig, later
        raise ValueError("--set batch_size: not with --workers (the Ray replicas generate in the workload's batches, "
                         "their ESConfig.generation_batch_size)")
    log = (lambda msg: print(msg, file=sys.stderr, flush=True))
    report = run_bench(config, log=log)
    if args.json:
        print(json.dumps(report))
    else:
        print(format_table(report))
    return 0
