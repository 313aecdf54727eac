"""esft bench's memory limit: the bytes a decode step must read (`decode_read_bytes`), the streaming read rate
(`read_gbps`) and where an iteration stands against both limits (`bandwidth_bound`, in the report)."""

from __future__ import annotations

import pytest
import torch

from esft import bench
from esft.bench.roofline import ModelShape, bandwidth_bound, decode_read_bytes, read_gbps

from conftest import make_tiny_model
from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from test_bench import small_workload

SHAPE = ModelShape(layers=2, hidden=4, intermediate=8, heads=2, kv_heads=1, head_dim=2, vocab=10)


def test_decode_read_bytes_counts_weights_per_batch_step_and_each_rows_cache_per_step():
    # layer weights: 4 * (2*4 + 2*2) + 3 * 4 * 8 = 144 per layer; a step reads 2 layers + the 10 x 4 head
    assert SHAPE.layer_weights == 144
    step = 2 * 144 * 2 + 10 * 4 * 2  # bf16 weights and head
    pair = 2 * 2 * 1 * 2 * 4  # k and v, 2 layers, 1 kv head, head_dim 2, fp32 cache
    # rows (prompt 3, 3 tokens: 2 steps) and (prompt 5, 1 token: no step); one batch steps twice
    pairs = 2 * 3 + 3  # step k attends the prompt and k new tokens
    got = decode_read_bytes(SHAPE, [3, 5], [3, 1], batch_size=2, weight_bytes=2, cache_bytes=4, head_bytes=2)
    assert got == 2 * step + pairs * pair
    # one row per batch: each batch steps for its own row only (the 1-token row takes no step)
    assert decode_read_bytes(SHAPE, [3, 5], [3, 1], batch_size=1, weight_bytes=2, cache_bytes=4,
                             head_bytes=2) == 2 * step + pairs * pair
    # two rows that both generate: batched, the weights are read once per step for both
    both = decode_read_bytes(SHAPE, [3, 3], [3, 3], batch_size=2, weight_bytes=2, cache_bytes=4, head_bytes=2)
    apart = decode_read_bytes(SHAPE, [3, 3], [3, 3], batch_size=1, weight_bytes=2, cache_bytes=4, head_bytes=2)
    assert both == 2 * step + 2 * pairs * pair and apart == 4 * step + 2 * pairs * pair


def test_decode_read_bytes_batches_rows_by_prompt_length_longest_first():
    # lengths 9, 1, 8, 2 with steps 0, 5, 0, 5: sorted 9, 8 | 2, 1, so the two 5-step rows share a batch
    kw = dict(batch_size=2, weight_bytes=1, cache_bytes=0, head_bytes=0)
    assert decode_read_bytes(SHAPE, [9, 1, 8, 2], [1, 6, 1, 6], **kw) == 5 * 2 * 144


def test_decode_read_bytes_refuses_mismatched_lengths():
    with pytest.raises(ValueError, match="2 prompts but 1"):
        decode_read_bytes(SHAPE, [3, 3], [2], batch_size=2, weight_bytes=2, cache_bytes=2, head_bytes=2)


def test_bandwidth_bound_is_the_compute_time_over_the_longer_limit():
    flops = {"fp32": 2e9, "bf16": 8e9}  # 10 GFLOP at 100 GFLOP/s: 0.1 s
    memory_bound = bandwidth_bound(flops, 4e9, 2.0, best_gflops=100.0, gbps=10.0)  # 0.4 s of reading
    assert memory_bound["bandwidth_ratio"] == pytest.approx(0.4 / 2.0)
    assert memory_bound["roofline_ceiling"] == pytest.approx(0.1 / 0.4)
    compute_bound = bandwidth_bound(flops, 0.5e9, 2.0, best_gflops=100.0, gbps=10.0)
    assert compute_bound["roofline_ceiling"] == 1.0
    assert bandwidth_bound({}, 0, 1.0, best_gflops=1.0, gbps=1.0)["roofline_ceiling"] == 1.0


def test_read_gbps_is_the_tensors_bytes_over_the_fastest_timed_sum(monkeypatch):
    from esft.bench import roofline

    ticks = iter([0.0, 0.5, 1.0, 1.25, 2.0, 2.75])  # three timed sums: 0.5 s, 0.25 s, 0.75 s
    monkeypatch.setattr(roofline.time, "perf_counter", lambda: next(ticks))
    assert read_gbps(nbytes=1 << 24, reps=3) == pytest.approx((1 << 24) / 0.25 / 1e9)


def test_rooflines_report_the_memory_limit_from_the_best_read_rate():
    flops = {"fp32": 0, "bf16": 10_420_550_000_000}
    report = {"memory_read_gbps_readings": [20.0, 28.2],
              "workloads": {"decode-heavy": {"lanes": 2, "decode_read_bytes": 506_000_000_000}}}
    bench._rooflines(report, {"fp32": [378.7], "bf16": [2459.3]}, {"decode-heavy": (flops, {"iteration": 42.0,
                                                                                          "generate": 81.7})})
    w = report["workloads"]["decode-heavy"]
    assert report["memory_read_gbps"] == 28.2
    floor = 506e9 / 28.2e9
    assert w["bandwidth_ratio"] == pytest.approx(floor / 42.0, abs=1e-4)
    assert w["roofline_ceiling"] == pytest.approx(flops["bf16"] / 2459.3e9 / floor, abs=1e-4)
    assert w["roofline_ratio"] <= w["roofline_ceiling"]


def test_the_bench_report_carries_the_decode_bytes_of_its_recorded_generations(tokenizer, monkeypatch):
    from esft.bench import iterations

    monkeypatch.setattr(bench, "build_workload", lambda name, tok: small_workload(name))
    monkeypatch.setattr(bench, "matmul_gflops", lambda dtype, size=2048: 10.0)
    monkeypatch.setattr(bench, "read_gbps", lambda: 5.0)
    seen: list[int] = []
    real = iterations.read_bytes

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(iterations, "read_bytes", spy)
    cfg = bench.BenchConfig(workloads=["decode-heavy"], population=2, noise="per-tensor", generation={"lean": True},
                            naive=False, inference=False, vllm=False)
    report = bench.run_bench(cfg, model=make_tiny_model(), tokenizer=tokenizer, log=lambda *a: None)
    w = report["workloads"]["decode-heavy"]
    assert report["memory_read_gbps"] == 5.0 and report["memory_read_gbps_readings"] == [5.0, 5.0]
    assert w["decode_read_bytes"] == seen[-1] > 0
    assert w["bandwidth_ratio"] == pytest.approx(w["decode_read_bytes"] / 5e9 / w["iteration_s"], rel=1e-2)
    assert 0 < w["roofline_ceiling"] <= 1.0
    assert (f"decode-heavy: decode reads at least {w['decode_read_bytes'] / 1e9:.1f} GB, "
            f"{w['bandwidth_ratio']:.3f} of the iteration at 5.0 GB/s") in bench.format_table(report)


@pytest.mark.parametrize("layout, dtype, sizes", [
    ({"bf16_weights": False, "bf16_activations": False, "screened_lm_head": False}, None, (4, 4, 4)),
    ({"bf16_weights": False, "bf16_activations": False, "screened_lm_head": True}, None, (4, 4, 2)),
    ({"bf16_weights": True, "bf16_activations": False, "screened_lm_head": True}, torch.bfloat16, (2, 2, 2)),
    ({"bf16_weights": False, "bf16_activations": True, "screened_lm_head": False}, torch.bfloat16, (2, 2, 2)),
])
def test_read_bytes_takes_each_dtype_from_what_the_engine_runs(tokenizer, monkeypatch, layout, dtype, sizes):
    """Weights in the rollout copies' dtype, the K/V cache in bf16 only where the step computes in bf16, the lm_head
    as the screen's bf16 matrix where screened (`esft.bench.roofline.effective_layout` says which)."""
    from esft.bench import iterations
    from esft.generation import GenerationConfig, encode_prompts

    model, work = make_tiny_model(), small_workload()
    monkeypatch.setattr(iterations, "effective_layout", lambda m, g, d=None: layout)
    gen = GenerationConfig(max_new_tokens=6, batch_size=3)
    ids = encode_prompts(tokenizer, work.prompts)
    lengths = [6, 2, 4, 1, 6]
    weight, cache, head = sizes
    want = decode_read_bytes(ModelShape.of(model), [len(i) for i in ids], lengths, batch_size=3,
                             weight_bytes=weight, cache_bytes=cache, head_bytes=head)
    # a call without its prompt ids re-encodes the workload's prompts
    assert iterations.read_bytes(model, tokenizer, work, gen, [(ids, lengths), (None, lengths)], dtype) == 2 * want
