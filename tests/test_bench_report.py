"""esft bench's report assembly from given runs, hand-computed: which run each field takes, what it divides,
and the pieces it is built from (timed iteration, naive restore, pure generation, vLLM folding)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from esft import bench
from esft.bench import inference, iterations

from conftest import make_tiny_model
from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from test_bench import small_workload


def run(iteration: float, texts: str = "a", **timings) -> dict:
    t = {"perturb": 2.0, "restore": 0.4, "score": 0.5, "update": 0.3, "generate": iteration - 1.0, **timings}
    return {"timings": {**t, "iteration": iteration}, "prompt_tokens": 300, "generated_tokens": 100,
            "texts": [texts], "lanes": 2}


def test_workload_entry_takes_the_fastest_runs_and_divides_by_hand():
    """The fastest esft iteration (8 s, two lanes) and the fastest naive one (40 s): tokens/s, overhead with and
    without the lane division, speedup = naive / esft."""
    runs = {"esft": [run(10.0, "x"), run(8.0, "a")], "naive": [run(50.0, "b"), run(40.0, "a")]}
    entry, flops, t = bench._workload_entry(runs, [0.5], "per-tensor")
    assert t["iteration"] == 8.0 and flops is None
    assert entry["iteration_s"] == 8.0 and entry["esft_iterations_s"] == [10.0, 8.0]
    assert entry["generated_tokens_per_s"] == 100 / 8 and entry["delivered_tokens_per_s"] == 400 / 8
    assert entry["overhead_fraction"] == round((2.4 / 2 + 0.5 + 0.3) / 8, 4)
    assert entry["overhead_fraction_summed_lanes"] == round((2.4 + 0.5 + 0.3) / 8, 4)
    assert entry["naive_iteration_s"] == 40.0 and entry["speedup_vs_naive"] == 5.0
    assert entry["naive_iterations_s"] == [50.0, 40.0] and entry["naive_timings_s"]["iteration"] == 40.0
    assert entry["member0_outputs_match"] is True  # the fastest of each wrote "a"
    assert bench._workload_entry(runs, [0.5], "table")[0]["member0_outputs_match"] is None


def test_rooflines_take_the_best_reading_not_the_last():
    flops = {"fp32": 2e9, "bf16": 0}
    report = {"workloads": {"w": {"lanes": 1}}}
    bench._rooflines(report, {"fp32": [2.0, 1.0], "bf16": []}, {"w": (flops, {"iteration": 1.0, "generate": 1.0})})
    assert report["matmul_gflops"] == 2.0 and report["matmul_gflops_bf16"] is None
    assert report["best_dtype"] == "fp32" and report["workloads"]["w"]["roofline_ratio"] == 1.0
    report = {"workloads": {"w": {"lanes": 1}}}
    bench._rooflines(report, {"fp32": [2.0], "bf16": [1.0, 4.0]}, {"w": (flops, {"iteration": 1.0, "generate": 1.0})})
    assert report["best_dtype"] == "bf16" and report["matmul_gflops_by_dtype"] == {"fp32": 2.0, "bf16": 4.0}
    assert report["workloads"]["w"]["roofline_ratio"] == 0.5


def test_report_head_records_one_lane_where_members_do_not_run_in_local_lanes():
    model = torch.nn.Linear(2, 2)

    def lanes(**kw):
        return bench._report_head(bench.BenchConfig(parallel_members=3, **kw), model, torch.float32, {})[
            "parallel_members"]

    assert (lanes(), lanes(noise="lowrank"), lanes(workers=2)) == (3, 1, 1)


def test_report_head_records_the_cores_this_process_may_use_beside_the_machines(monkeypatch):
    """cpu_count is the machine's; a container or taskset may give the bench fewer, which its rates depend on."""
    monkeypatch.setattr(bench.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(bench.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    head = bench._report_head(bench.BenchConfig(), torch.nn.Linear(2, 2), torch.float32, {})
    assert (head["cpu_count"], head["usable_cores"]) == (64, 2)


def test_report_head_records_each_workers_threads(monkeypatch):
    """`--workers 2 --threads 1` runs one thread in each worker, two in all, where the report said only threads 1."""
    monkeypatch.setattr(bench.torch, "get_num_threads", lambda: 1)
    model = torch.nn.Linear(2, 2)
    head = bench._report_head(bench.BenchConfig(workers=2), model, torch.float32, {})
    assert (head["threads"], head["workers"], head["worker_threads"]) == (1, 2, 1)
    monkeypatch.setattr(bench.torch, "get_num_threads", lambda: 8)
    assert bench._report_head(bench.BenchConfig(workers=2), model, torch.float32, {})["worker_threads"] == 4
    assert bench._report_head(bench.BenchConfig(), model, torch.float32, {})["worker_threads"] is None


def stub_run_bench(monkeypatch, tokenizer, vllm_generation, **config):
    """run_bench with stand-in iterations (8 s, 400 tokens) and esft pure generation (100 tokens/s)."""
    monkeypatch.setattr(bench, "esft_iteration", lambda *a, **k: run(8.0))
    monkeypatch.setattr(bench, "esft_generation", lambda *a, **k: {
        "engine": "esft", "seconds": 4.0, "delivered_tokens_per_s": 100.0})
    monkeypatch.setattr(bench, "build_workload", lambda name, tok: small_workload(name))
    monkeypatch.setattr(bench, "matmul_gflops", lambda dtype, size=2048: 10.0)
    monkeypatch.setattr(bench, "vllm_available", lambda: True)
    monkeypatch.setattr(inference, "vllm_available", lambda: True)
    monkeypatch.setattr("esft.models.resolve_model_path", lambda name: "/model")
    monkeypatch.setattr(bench, "vllm_generation", vllm_generation)
    cfg = bench.BenchConfig(workloads=["cpu-preset"], naive=False, rollout_dtype="float32", **config)
    return bench.run_bench(cfg, model=make_tiny_model(), tokenizer=tokenizer, log=lambda m: None)


def test_vllm_timing_is_folded_in_and_its_failure_recorded(tokenizer, monkeypatch):
    """iteration 400 / 8 = 50 tokens/s; against vLLM's 200 tokens/s (faster than esft's 100) the ratio is 0.25."""
    fast = {"engine": "vllm", "seconds": 2.0, "delivered_tokens_per_s": 200.0}
    report = stub_run_bench(monkeypatch, tokenizer, lambda *a: {"cpu-preset": fast})
    w = report["workloads"]["cpu-preset"]
    assert "load_avg_1min_end" in report
    assert report["parallel_members"] == {"cpu-preset": w["lanes"]} and w["lanes"] >= 1  # each workload's own
    assert (w["inference_engine"], w["inference_ratio"], w["vllm"]) == ("vllm", 0.25, "timed")

    def broken(*args):
        raise RuntimeError("no engine")

    w = stub_run_bench(monkeypatch, tokenizer, broken)["workloads"]["cpu-preset"]
    assert (w["inference_engine"], w["inference_ratio"], w["vllm"]) == ("esft", 0.5, "failed: no engine")
    w = stub_run_bench(monkeypatch, tokenizer, lambda *a: pytest.fail("--no-vllm"), vllm=False)["workloads"][
        "cpu-preset"]
    assert (w["inference_engine"], w["vllm"]) == ("esft", "installed, not timed (--no-vllm)")


def test_timed_iteration_times_the_update_inside_the_iteration():
    """evaluate takes >= 50 ms, apply(update) >= 50 ms: update is apply's time alone, iteration both."""
    class Executor:
        def evaluate_members(self, members, batch):
            time.sleep(0.05)
            n = len(members)
            return SimpleNamespace(scores=np.arange(n * len(batch), dtype=float).reshape(n, len(batch)),
                                   well_formed=np.zeros((n, len(batch)), bool), timings={"generate": 0.05},
                                   prompt_tokens=7, tokens_generated=3, texts=[["t"]] * n)

    out = iterations.timed_iteration(Executor(), small_workload(), 2, 0, 1.5, lambda update: time.sleep(0.05))
    t = out["timings"]
    assert 0.05 <= t["update"] < 0.09 and t["iteration"] >= t["update"] + 0.05 and t["setup"] == 1.5
    assert (out["prompt_tokens"], out["generated_tokens"], out["zero_update"]) == (7, 3, False)


def test_naive_iteration_restores_every_member_and_applies_the_same_update(tokenizer):
    """Restore by subtraction and the regenerated-noise update end where esft's iteration ends (per-tensor noise:
    the same members, noise and fitness), up to float rounding."""
    work = small_workload()
    ours, naive = make_tiny_model(), make_tiny_model()
    out = bench.esft_iteration(ours, tokenizer, work, population=4, noise="per-tensor", gen_overrides={})
    theirs = bench.naive_iteration(naive, tokenizer, work, population=4)
    assert out["texts"] == theirs["texts"] and not out["zero_update"]
    moved = False
    for (name, a), b in zip(ours.named_parameters(), naive.parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name
        moved |= not torch.equal(a, make_tiny_model().get_parameter(name))
    assert moved


def test_warm_up_members_are_not_the_timed_ones():
    from esft.es.strategy import ES
    from esft.generation import GenerationConfig

    seen = []
    executor = SimpleNamespace(gen_config=GenerationConfig(),
                               evaluate_members=lambda members, batch: seen.extend(members))
    work = small_workload()
    iterations.warm_up(executor, work, lanes=2, seed=0)
    timed = ES(population_size=4, sigma=work.sigma, alpha=work.alpha, seed=0).ask(0)
    assert len(seen) == 2 and not {m.seed for m in seen} & {m.seed for m in timed}


def test_bench_fitness_separates_members_by_one_thousandth():
    result = SimpleNamespace(scores=np.array([[0.2, 0.4], [0.2, 0.4], [1.0, 0.0]]),
                             well_formed=np.zeros((3, 2), bool))
    assert bench.bench_fitness(result, [{}, {}]) == pytest.approx([0.3, 0.301, 0.502], abs=1e-12)


def test_pure_generation_uses_no_more_lanes_than_members_and_counts_every_token(tokenizer):
    torch.set_num_threads(2)
    work = small_workload(min_new=6)
    out = inference.esft_generation(make_tiny_model(), tokenizer, work, population=1, gen_overrides={}, lanes=2)
    assert out["lanes"] == 1 and out["generated_tokens"] == len(work.prompts) * 6
    tokens = out["prompt_tokens"] + out["generated_tokens"]
    assert out["delivered_tokens_per_s"] == pytest.approx(tokens / out["seconds"], rel=2e-3 / out["seconds"] + 1e-3)
    assert out["generated_tokens_per_s"] == pytest.approx(out["generated_tokens"] / out["seconds"],
                                                          rel=2e-3 / out["seconds"] + 1e-3)


def test_pure_generation_splits_the_threads_over_the_lanes(tokenizer, monkeypatch):
    """3 threads over 2 lanes: 2 and 1 (the first lanes take the remainder), then the total is restored."""
    real = torch.set_num_threads
    shares: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: shares.append(n) or real(n))
    real(3)
    inference.esft_generation(make_tiny_model(), tokenizer, small_workload(), population=2, gen_overrides={}, lanes=2)
    assert sorted(shares[:2]) == [1, 2] and shares[2:] == [3]


def test_vllm_delivered_rate_counts_prompt_and_generated_tokens():
    class Recorder:  # stands in for vllm.LLM: 10 ms a call, max_tokens tokens a prompt
        def generate(self, prompts, sampling, use_tqdm):
            time.sleep(0.01)
            return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[0] * sampling["max_tokens"])])
                    for _ in prompts]

    job = {"prompt_ids": [[1, 2, 3, 4]] * 5, "max_new_tokens": 2, "min_new_tokens": 0}
    out = inference.timed_vllm_generation(Recorder(), dict, job, population=3)
    assert (out["prompt_tokens"], out["generated_tokens"]) == (60, 30)
    rel = 1e-3 / out["seconds"] + 1e-3  # seconds are rounded to the millisecond
    assert out["delivered_tokens_per_s"] == pytest.approx(90 / out["seconds"], rel=rel)
    assert out["generated_tokens_per_s"] == pytest.approx(30 / out["seconds"], rel=rel)


def test_fit_prompt_takes_the_most_words_that_fit_the_target(tokenizer):
    """Words of one token each: some word count lands exactly on the target, and that is the one taken."""
    from esft.bench.workloads import fit_prompt
    from esft.generation import encode_prompts

    for target in (40, 64):
        prompt = fit_prompt(tokenizer, " ".join(["the"] * 200), target)
        longer = [prompt[0], {"role": "user", "content": prompt[1]["content"] + " the"}]
        assert len(encode_prompts(tokenizer, [prompt])[0]) == target < len(encode_prompts(tokenizer, [longer])[0])


def test_esft_iteration_reports_the_lanes_the_executor_really_ran(tokenizer):
    """On one torch thread the executor runs one lane whatever `parallel_members` asks (lanes_for): the report
    divides perturb and restore by that lane count, so it must be the executor's, not the request."""
    assert torch.get_num_threads() == 1
    out = bench.esft_iteration(make_tiny_model(), tokenizer, small_workload(), population=2, noise="table",
                               gen_overrides={}, parallel_members=2)
    assert out["lanes"] == 1


def test_compare_completions_counts_equal_rows_the_references_tokens_and_the_first_difference():
    from esft.bench.iterations import compare_completions

    ref = [[1, 2, 3], [4, 5], [6]]
    assert compare_completions([[1, 2, 3], [4, 5], [6]], ref) == {
        "identical": 3, "completions": 3, "tokens": 6, "first_difference": None}
    # row 1 differs at its second token; row 2 differs too, but only the first differing row is located
    assert compare_completions([[1, 2, 3], [4, 9], [7]], ref)["first_difference"] == {"row": 1, "token": 1}
    # one completion a prefix of the other (an early eos): the difference is at the shorter one's end
    longer = compare_completions([[1, 2, 3, 2], [4, 5], [6]], ref)
    assert longer["first_difference"] == {"row": 0, "token": 3} and longer["identical"] == 2
    assert longer["tokens"] == 6  # the reference's tokens, not ours
    assert compare_completions([[1], [4, 5], [6]], ref)["first_difference"] == {"row": 0, "token": 1}
