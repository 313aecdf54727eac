"""esft.bench.roofline and the FLOP total of the recorded generate calls, checked against their definitions
(docs/performance.md, "roofline_ratio"; the esft.bench docstring): the matmul rate, the roofline ratio of FLOPs
that name only one dtype, and the FLOPs of calls whose prompts the executor did not hand over as ids.

Run: PYTHONPATH=src pytest -q tests/test_roofline_mutmutbench.py   (a few seconds)
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from esft import bench
from esft.bench import iterations, roofline
from esft.generation import GenerationConfig, encode_prompts

from conftest import make_tiny_model
from test_bench import small_workload


def fake_clock(monkeypatch, durations):
    """roofline's clock: each timed matmul lasts the next of `durations` seconds; returns the matmul sizes seen."""
    now = [0.0]
    steps = iter(durations)
    readings = iter(range(10**6))

    def perf_counter():  # readings alternate: the start of a timed matmul, then its end
        if next(readings) % 2:
            now[0] += next(steps)
        return now[0]

    shapes = []

    def randn(*shape, dtype):
        shapes.append((shape, dtype))
        return torch.zeros(1)

    matmuls = []
    fake_torch = SimpleNamespace(randn=randn, matmul=lambda a, b: matmuls.append(1))
    monkeypatch.setattr(roofline, "time", SimpleNamespace(perf_counter=perf_counter))
    monkeypatch.setattr(roofline, "torch", fake_torch)
    return shapes, matmuls


def test_matmul_rate_is_two_size_cubed_flops_over_the_fastest_rep(monkeypatch):
    """2 x size^3 FLOPs (one multiply-add per output element and inner index) over the best of `reps` timings."""
    shapes, matmuls = fake_clock(monkeypatch, [0.5, 0.25, 2.0])
    rate = roofline.matmul_gflops(torch.bfloat16, size=100, reps=3)
    assert rate == pytest.approx(2 * 100**3 / 0.25 / 1e9)
    assert shapes == [((100, 100), torch.bfloat16)] * 2
    assert len(matmuls) == 1 + 3  # one untimed warm-up, then the timed reps


def test_matmul_rate_defaults_to_the_best_of_five_2048_cubed_matmuls(monkeypatch):
    """The report's `matmul_gflops` is "a 2048^3 matmul ... best of five" (esft.bench docstring)."""
    shapes, matmuls = fake_clock(monkeypatch, [1.0, 1.0, 1.0, 1.0, 0.5])
    rate = roofline.matmul_gflops()
    assert shapes == [((2048, 2048), torch.float32)] * 2 and len(matmuls) == 1 + 5
    assert rate == pytest.approx(2 * 2048**3 / 0.5 / 1e9)


def test_roofline_ratio_of_fp32_flops_needs_no_bf16_entry_nor_rate():
    """FLOPs that name only fp32 (no "bf16" key) are all weighed at the fp32 rate; no bf16 rate is asked for."""
    assert bench.roofline_ratio({"fp32": 4e9}, 2.0, 10.0) == pytest.approx(0.2)
    assert bench.roofline_ratio({"fp32": 4e9}, 2.0, 10.0, None) == pytest.approx(0.2)


def test_executed_counts_the_workloads_prompts_when_a_call_recorded_no_ids(tokenizer):
    """An executor that encodes no prompt ids of its own (LocalExecutor without a tokenizer-side encoder) records
    None: the FLOPs are those of the workload's prompts as the engine encodes them, as if the ids were recorded."""
    model = make_tiny_model()
    work = small_workload()
    gen = GenerationConfig(max_new_tokens=6, batch_size=3, engine="esft", share_prefix=True)
    ids = encode_prompts(tokenizer, work.prompts)
    lengths = [3, 1, 6, 2, 4]
    direct = bench.executed_flops(bench.ModelShape.of(model), ids, lengths, batch_size=3,
                                  **bench.effective_layout(model, gen))
    both = iterations.executed(model, tokenizer, work, gen, [(None, lengths), (ids, lengths)])
    assert both == {"fp32": 2 * direct["fp32"], "bf16": 2 * direct["bf16"]} and direct["fp32"] > 0
