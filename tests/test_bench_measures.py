"""esft bench's derived measures: what each one times and divides (generate_roofline_ratio's rate, the
overhead's parts, the pure generation's warm-up)."""

from __future__ import annotations

import time

import pytest
import torch

from esft import bench
from esft.bench import inference

from conftest import make_tiny_model, record_kv_reuse
from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from test_bench import small_workload


def test_generate_roofline_ratio_weighs_every_flop_at_the_best_dtype_rate_as_roofline_ratio():
    """The committed decode-heavy run h: 10420.55 GFLOP, 55.739 s, 109.364 s of generation over 2 lanes."""
    from esft.bench import _rooflines

    flops = {"fp32": 447919441920, "bf16": 9972630945792}
    t = {"iteration": 55.739, "generate": 109.364}
    report = {"workloads": {"decode-heavy": {"lanes": 2}}}
    _rooflines(report, {"fp32": [171.3], "bf16": [388.33]}, {"decode-heavy": (flops, t)})
    w = report["workloads"]["decode-heavy"]
    best = sum(flops.values()) / 388.33e9
    assert w["roofline_ratio"] == pytest.approx(best / 55.739, abs=1e-4) == pytest.approx(0.4814, abs=1e-4)
    assert w["generate_roofline_ratio"] == pytest.approx(best / (109.364 / 2), abs=1e-4)  # 0.4907, not 0.5175
    per_dtype = flops["fp32"] / 171.3e9 + flops["bf16"] / 388.33e9
    assert w["roofline_ratio_per_dtype"] == pytest.approx(per_dtype / 55.739, abs=1e-4)


def test_overhead_fraction_counts_the_scoring_on_the_calling_thread():
    """Scoring runs once, after the lanes: it is outside generation and is not divided by the lanes."""
    t = {"perturb": 2.0, "restore": 0.4, "score": 0.5, "update": 0.3, "iteration": 10.0}
    assert bench.overhead_fraction(t, 2) == pytest.approx((1.2 + 0.5 + 0.3) / 10)
    assert bench.overhead_fraction(t, 1) == pytest.approx(3.2 / 10)


def test_pure_generation_warms_every_lane_untimed_as_the_es_iteration_does(tokenizer, monkeypatch):
    """Each lane model generates one token of the batch before the clock starts; those calls are neither timed nor
    counted, as the ES iteration's warm-up members are not."""
    import esft.generation

    real = esft.generation.generate
    calls: list[tuple[int, int]] = []

    def generate(model, tok, prompts, config, **kwargs):
        calls.append((id(model), config.max_new_tokens))
        if config.max_new_tokens == 1:
            time.sleep(0.3)  # a cold lane's first call
        return real(model, tok, prompts, config, **kwargs)

    monkeypatch.setattr(esft.generation, "generate", generate)
    torch.set_num_threads(2)
    work = small_workload(min_new=6)
    model = make_tiny_model()
    t0 = time.perf_counter()
    out = inference.esft_generation(model, tokenizer, work, population=3, gen_overrides={}, lanes=2)
    wall = time.perf_counter() - t0
    assert out["lanes"] == 2
    models = {m for m, _ in calls}
    assert len(models) == 2
    for m in models:
        budgets = [b for mm, b in calls if mm == m]
        assert budgets[0] == 1 and all(b == work.max_new_tokens for b in budgets[1:])
    assert sum(b == work.max_new_tokens for _, b in calls) == 3
    assert out["generated_tokens"] == 3 * len(work.prompts) * work.max_new_tokens
    assert out["seconds"] <= wall - 0.3 + 2e-3  # the lanes' concurrent warm-up sleeps are outside the timing


def test_pure_generation_reuses_each_lanes_kv_cache_buffers_as_the_es_lanes_do(tokenizer, monkeypatch):
    """The pure-generation baseline of `inference_ratio` keeps its KV cache buffers from call to call, as an ES
    lane does from member to member, so the ratio does not credit ES with an allocation saving: of three timed
    calls on one lane, the second and third generate into the first one's buffers."""
    reused = record_kv_reuse(monkeypatch)
    work = small_workload(min_new=6)
    out = inference.esft_generation(make_tiny_model(), tokenizer, work, population=3, gen_overrides={}, lanes=1)
    assert out["generated_tokens"] == 3 * len(work.prompts) * work.max_new_tokens
    per_cache = len(reused) // 4  # the warm-up call's cache (one column of room), then the three timed ones
    assert per_cache > 0 and reused == [False] * 2 * per_cache + [True] * 2 * per_cache
