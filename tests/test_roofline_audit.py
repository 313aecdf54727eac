"""esft.bench's arithmetic pinned by hand: `executed_flops` at the layout's edges (prefix cap, minimum prefix, bf16
weights), the options `effective_layout` hands it, the roofline rates taken from the readings, and the report
entry's ratios (fastest runs, speedup, tokens per second).

Run: PYTHONPATH=src pytest -q tests/test_roofline_audit.py   (a few seconds)
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from esft import bench
from esft.bench import _rooflines, _workload_entry
from esft.generation import GenerationConfig

from conftest import make_tiny_model
from test_bench import COMPLETIONS, PREFIX, PROMPTS, two_layer_shape

# two_layer_shape: 2304 FLOPs per computed position, 64 per attended (query, key) pair, 160 per logit row


def flops(prompts, completions, **options) -> dict[str, int]:
    return bench.executed_flops(two_layer_shape(), prompts, completions, **{"batch_size": len(prompts), **options})


def test_shared_prefix_leaves_every_row_one_own_token():
    # the short prompt is the whole common prefix (10 tokens): only 9 are shared, so its last token's logits exist
    # prefix 9 positions (45 pairs, 1 logit row); remainders 3 and 1 padded to 3: 6 positions, 2 logit rows,
    # pairs 3 x 9 + 6 = 33 and 9 + 1 = 10; no decode step (one token each)
    counted = flops([PREFIX + [1, 2], PREFIX], [1, 1], share_prefix=True)
    assert counted == {"prefill_positions": 15, "prefill_logit_rows": 3, "decode_rows": 0, "attention_pairs": 88,
                       "fp32": 15 * 2304 + 88 * 64 + 3 * 160, "bf16": 0}


def test_a_prefix_of_min_prefix_tokens_is_shared_and_a_shorter_one_is_not():
    # layout_prefill's default min_prefix is 8: a common prefix of exactly 8 tokens is shared
    # prefix 8 positions (36 pairs), remainders 2 and 1 padded to 2 (pairs 2 x 8 + 3 and 8 + 1): 12 positions
    eight = flops([PREFIX[:8] + [1, 2], PREFIX[:8] + [3]], [1, 1], share_prefix=True)
    assert (eight["prefill_positions"], eight["prefill_logit_rows"], eight["attention_pairs"]) == (12, 3, 64)
    # 7 shared tokens are not worth a forward: one plain prefill of 2 x 10 positions, pairs 55 + 36
    seven = flops([PREFIX[:7] + [1, 2, 3], PREFIX[:7] + [4]], [1, 1], share_prefix=True)
    assert (seven["prefill_positions"], seven["prefill_logit_rows"], seven["attention_pairs"]) == (20, 2, 91)
    # an explicit min_prefix above the prefix turns the sharing off
    assert flops([PREFIX[:8] + [1, 2], PREFIX[:8] + [3]], [1, 1], share_prefix=True,
                 min_prefix=9)["prefill_positions"] == 20


@pytest.mark.parametrize("screened", [False, True])
def test_bf16_weights_put_every_linear_and_lm_head_row_in_bf16_and_only_attention_in_fp32(screened):
    # test_bench's shared-prefix case: 25 prefill positions + 4 decode rows, 217 pairs, 4 prefill + 4 decode
    # logit rows; the screen changes nothing once every lm_head row is bf16 already
    counted = bench.executed_flops(two_layer_shape(), PROMPTS, COMPLETIONS, batch_size=3, share_prefix=True,
                                   bf16_weights=True, screened_lm_head=screened)
    assert counted["fp32"] == 217 * 64
    assert counted["bf16"] == 29 * 2304 + 8 * 160
    no_prefix_row = bench.executed_flops(two_layer_shape(), PROMPTS, COMPLETIONS, batch_size=3, share_prefix=True,
                                         bf16_weights=True, prefix_logit_row=False)
    assert no_prefix_row["bf16"] == 29 * 2304 + 7 * 160 and no_prefix_row["fp32"] == 217 * 64


def test_bf16_activations_make_every_matmul_bf16():
    # bf16 weights off the packed path: linears, lm_head rows and attention all run in bf16
    counted = bench.executed_flops(two_layer_shape(), PROMPTS, COMPLETIONS, batch_size=3, share_prefix=True,
                                   bf16_activations=True)
    assert counted["fp32"] == 0 and counted["bf16"] == 29 * 2304 + 217 * 64 + 8 * 160


def test_model_shape_falls_back_to_hidden_over_query_heads_without_a_head_dim():
    # configs without head_dim (older Qwen2 / Llama ones): the query heads split the hidden size, not the kv heads
    cfg = SimpleNamespace(num_hidden_layers=2, hidden_size=8, intermediate_size=16, num_attention_heads=2,
                          num_key_value_heads=1)
    model = SimpleNamespace(config=cfg, lm_head=SimpleNamespace(weight=torch.zeros(10, 8)))
    assert bench.ModelShape.of(model) == two_layer_shape()


def test_effective_layout_keeps_only_what_the_lean_engine_runs():
    model = make_tiny_model()
    base = GenerationConfig(engine="esft", temperature=0.0)
    # not lean: the HF step, plain prefill whatever the options say
    off = bench.effective_layout(model, dataclasses.replace(base, lean=False, share_prefix=True, prefill_buckets=3))
    assert off == {"share_prefix": False, "prefill_buckets": 1, "screened_lm_head": False, "bf16_weights": False,
                   "bf16_activations": False, "prefix_logit_row": True}
    on = bench.effective_layout(model, dataclasses.replace(base, share_prefix=True, prefill_buckets=3))
    assert (on["share_prefix"], on["prefill_buckets"]) == (True, 3)
    fast = dataclasses.replace(base, **bench.FAST_GENERATION)
    if bench.effective_layout(model, fast)["screened_lm_head"]:  # where the screen runs (native bf16)
        # the screen is greedy only: sampling computes the full fp32 logits
        assert not bench.effective_layout(model, dataclasses.replace(fast, temperature=0.7))["screened_lm_head"]


def test_effective_layout_bf16_weights_need_both_packed_linears_and_the_fused_kernel():
    from esft.generation.lean_step import fused_attention_reason
    from esft.generation.packed import packed_linear_reason

    if packed_linear_reason(torch.bfloat16) is not None or fused_attention_reason(torch.bfloat16) is not None:
        pytest.skip("no bf16 packed linears or no attention kernel here")
    model = make_tiny_model()
    gen = GenerationConfig(engine="esft", temperature=0.0, packed_linear=True, fused_attention=True)
    both = bench.effective_layout(model, gen, torch.bfloat16)
    assert both["bf16_weights"] and not both["prefix_logit_row"]
    # bf16 with only one of the two: the lean engine drops both (esft.generation.lean), so no packed bf16 linears
    packed_only = bench.effective_layout(model, dataclasses.replace(gen, fused_attention=False), torch.bfloat16)
    assert packed_only["prefix_logit_row"]
    # off the packed path the step computes in bf16 (LeanModel's activation dtype is the weights'): all bf16
    assert not packed_only["bf16_weights"] and packed_only["bf16_activations"]
    assert not both["bf16_activations"]
    assert not bench.effective_layout(model, dataclasses.replace(gen, packed_linear=False))["bf16_activations"]


def test_rooflines_take_the_best_reading_of_each_dtype_and_name_the_faster_dtype():
    # readings taken before and after each workload: the best is the machine's capability, whatever came last
    report = {"workloads": {"w": {"lanes": 1}}}
    flops = {"fp32": 4e9, "bf16": 0}
    _rooflines(report, {"fp32": [20.0, 10.0], "bf16": []}, {"w": (flops, {"iteration": 2.0, "generate": 1.0})})
    assert report["matmul_gflops"] == 20.0 and report["matmul_gflops_bf16"] is None
    assert report["best_dtype"] == "fp32"
    assert report["workloads"]["w"]["roofline_ratio"] == pytest.approx(4 / 20 / 2.0)
    report = {"workloads": {}}
    _rooflines(report, {"fp32": [20.0], "bf16": [15.0, 40.0]}, {})
    assert report["best_dtype"] == "bf16" and report["matmul_gflops_by_dtype"] == {"fp32": 20.0, "bf16": 40.0}


def run(iteration: float, generated: int = 60, texts=("a",), **extra) -> dict:
    timings = {"perturb": 0.2, "generate": iteration - 0.5, "restore": 0.2, "update": 0.1, "iteration": iteration}
    return {"timings": timings, "prompt_tokens": 100, "generated_tokens": generated, "texts": list(texts), **extra}


def test_workload_entry_reports_the_fastest_runs_and_their_ratios():
    esft_runs = [run(4.0, generated=60), run(2.0, generated=40, lanes=2, executed_flops={"fp32": 3e9, "bf16": 1e9}),
                 run(3.0)]
    naive_runs = [run(9.0, texts=["b"]), run(8.0, texts=["a"]), run(10.0)]
    entry, counted, timings = _workload_entry({"esft": esft_runs, "naive": naive_runs}, [0.5], "per-tensor")
    assert timings is esft_runs[1]["timings"] and counted == {"fp32": 3e9, "bf16": 1e9}
    assert entry["iteration_s"] == 2.0 and entry["lanes"] == 2 and entry["executed_gflop"] == 4.0
    assert entry["generated_tokens_per_s"] == 20.0  # 40 generated / 2 s
    assert entry["delivered_tokens_per_s"] == 70.0  # (100 prompt + 40 generated) / 2 s
    assert entry["naive_iteration_s"] == 8.0 and entry["speedup_vs_naive"] == 4.0  # fastest naive / fastest esft
    assert entry["member0_outputs_match"]  # compared with the fastest naive run's texts
    # (0.2 + 0.2) / 2 lanes + 0.1 update over 2 s; undivided (0.4 + 0.1) / 2
    assert entry["overhead_fraction"] == 0.15 and entry["overhead_fraction_summed_lanes"] == 0.25
    assert entry["esft_iterations_s"] == [4.0, 2.0, 3.0] and entry["naive_iterations_s"] == [9.0, 8.0, 10.0]


def test_bench_fitness_separates_members_with_identical_completions():
    from esft.es.executor import PopulationResult

    scores = np.full((3, 2), 0.5)
    result = PopulationResult(scores=scores, well_formed=np.zeros_like(scores, dtype=bool), texts=[["x"] * 2] * 3)
    fitness = bench.bench_fitness(result, [{}, {}])
    assert fitness == pytest.approx([0.5, 0.501, 0.502])  # never an all-equal (zero) update


def test_fit_prompt_takes_the_most_words_within_the_target(tokenizer):
    from esft.bench.workloads import DECODE_SYSTEM, fit_prompt
    from esft.generation import encode_prompts

    words = [f"word{i}" for i in range(80)]

    def length(k: int) -> int:
        prompt = [{"role": "system", "content": DECODE_SYSTEM},
                  {"role": "user", "content": "Explain this passage in detail:\n" + " ".join(words[:k])}]
        return len(encode_prompts(tokenizer, [prompt])[0])

    for target in (length(30), length(30) + 1):  # a length a cut reaches exactly: that cut, not the one before
        fitted = fit_prompt(tokenizer, " ".join(words), target)
        k = len(fitted[1]["content"].split("\n", 1)[1].split())
        assert length(k) <= target < length(k + 1)  # one more word would not fit


def test_timed_iteration_counts_the_update_in_the_iteration():
    import time

    from esft.bench.iterations import timed_iteration
    from esft.es.executor import PopulationResult

    class Executor:  # answers every member at once, 0.01 s of generation recorded
        def evaluate_members(self, members, batch):
            scores = np.arange(len(members) * len(batch), dtype=float).reshape(len(members), len(batch))
            return PopulationResult(scores=scores, well_formed=np.zeros_like(scores, dtype=bool),
                                    texts=[["x"] * len(batch) for _ in members], timings={"generate": 0.01})

    def apply(update):  # a slow update: the iteration ends once it is applied
        time.sleep(0.2)

    work = SimpleNamespace(sigma=1e-2, alpha=1e-3, prompts=[[{"role": "user", "content": "hi"}]] * 2)
    out = timed_iteration(Executor(), work, population=2, seed=0, setup=1.5, apply=apply)
    t = out["timings"]
    assert t["update"] >= 0.2 and t["iteration"] >= t["update"] and t["setup"] == 1.5 and t["generate"] == 0.01
