"""`esft bench` plumbing on the tiny model (the real measurements are `esft bench` itself). Run:
`pytest tests/test_bench.py -q`."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import threading

import pytest
import torch

from esft import bench
from esft.generation import lean
from esft.generation import GenerationConfig, encode_prompts, eos_token_ids, generate

from conftest import make_tiny_model

REQUIRED = {"roofline_ratio", "generated_tokens_per_s", "delivered_tokens_per_s", "executed_gflop", "iteration_s",
            "naive_iteration_s", "speedup_vs_naive", "overhead_fraction"}


pytestmark = pytest.mark.usefixtures("one_thread")


def small_workload(name: str = "small", min_new: int = 6) -> bench.Workload:
    prompts = [[{"role": "user", "content": f"Tell me about the number {i} and its friends."}] for i in range(5)]
    return bench.Workload(name, prompts, max_new_tokens=6, min_new_tokens=min_new, generation_batch_size=3,
                          sigma=1e-2, alpha=1e-3)


def varied_prompts(n: int = 7) -> list:
    """Chat prompts sharing the template's system-prompt prefix, of different lengths (so buckets pad)."""
    return [[{"role": "user", "content": f"Tell me about the number {i}" + " and its friends" * (3 * i)}]
            for i in range(n)]


def finish_rows_early(monkeypatch, eos: int, every: int = 3) -> None:
    """Every `every`-th next-token pick (sampled or screened) makes the first live row emit eos, so rows stop
    at different steps and are dropped mid-batch (the tiny random model never emits eos by itself)."""
    from esft.generation import loop as generation

    calls = itertools.count()
    real_sample, real_greedy = generation.sample_next, lean.ScreenedLogits.greedy

    def forced(tokens: torch.Tensor) -> torch.Tensor:
        if next(calls) % every == every - 1:
            tokens = tokens.clone()
            tokens[0] = eos
        return tokens

    monkeypatch.setattr(generation, "sample_next", lambda *args, **kwargs: forced(real_sample(*args, **kwargs)))
    monkeypatch.setattr(lean.ScreenedLogits, "greedy", lambda self: forced(real_greedy(self)))


class EngineCounter:
    """FLOPs counted from the lean engine's own calls (every prefill forward's input and mask, every decode step's
    live rows and attended cache columns), independently of `bench.executed_flops`: per computed position the
    weights of the layers' nn.Linear modules, per attended (query, key) pair 4 x heads x head_dim per layer, per
    logit row the lm_head's weight; the decode lm_head counted as bf16 where the step ran the screen."""

    def __init__(self, model, monkeypatch):
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        per_position = 2 * sum(m.weight.numel() for m in model.model.layers.modules()
                               if isinstance(m, torch.nn.Linear))
        per_pair = 4 * cfg.num_attention_heads * head_dim * cfg.num_hidden_layers
        per_logit = 2 * model.lm_head.weight.numel()
        self.flops = {"fp32": 0, "bf16": 0}
        self.calls = {"prefill": 0, "decode": 0, "head": 0}
        lock = threading.Lock()

        def add(kind: str, call: str, flops: int) -> None:
            with lock:
                self.flops[kind] += flops
                self.calls[call] += 1

        real_layout, real_step = lean.layout_prefill, lean.decode_step

        def kinds(lean_model) -> tuple[str, str]:
            """(linears, attention) dtypes: bf16 weights multiply in bf16; the attention is bf16 only where the
            activations are too (bf16 weights off the packed path, e.g. where oneDNN has no bf16 matmul)."""
            bf16_acts = lean_model.activation_dtype == torch.bfloat16
            return ("bf16" if lean_model.low_precision or bf16_acts else "fp32", "bf16" if bf16_acts else "fp32")

        @functools.wraps(real_layout)  # keeps its signature (the bench reads its defaults)
        def layout(model, lean_model, input_ids, attention_mask, prefill, *args, **kwargs):
            low, attn = kinds(lean_model)
            head = kwargs.get("head")  # given: the prefill returns hidden states, logits come from head calls

            def counted(model, ids, mask, positions, cache=None):
                b, t = ids.shape
                past = mask.shape[1] - t
                own, before = mask[:, past:].sum(-1), mask[:, :past].sum(-1)
                pairs = int((own * before + own * (own + 1) // 2).sum())
                add(low, "prefill", b * t * per_position + (0 if head is not None else b * per_logit))
                add(attn, "prefill", pairs * per_pair)
                return prefill(model, ids, mask, positions, cache)

            def counted_head(hidden):
                add(low, "head", sum(h.shape[0] for h in hidden) * per_logit)
                return head(hidden)

            if head is not None:
                kwargs["head"] = counted_head
            return real_layout(model, lean_model, input_ids, attention_mask, counted, *args, **kwargs)

        @functools.wraps(real_step)
        def step(lean_model, cache, token, position, cos, sin, suppress=None):
            n = cache.rows
            pairs = int(cache.mask[:n, :cache.length].sum()) + n  # each row's unmasked columns plus its new one
            low, attn = kinds(lean_model)
            add(low, "decode", n * per_position)
            add(attn, "decode", pairs * per_pair)
            screened = lean_model.screen is not None and suppress is not None
            add("bf16" if screened else low, "decode", n * per_logit)
            return real_step(lean_model, cache, token, position, cos, sin, suppress)

        monkeypatch.setattr(lean, "layout_prefill", layout)
        monkeypatch.setattr(lean, "decode_step", step)


# A 2-layer model small enough to count by hand: per computed position 2 x 576 weights x 2 layers = 2304 FLOPs
# (q 8x8, k 8x4, v 8x4, o 8x8, gate/up/down 3 x 8x16), per attended (query, key) pair 4 x 2 heads x 4 x 2 layers
# = 64, per logit row 2 x 8 x 10 = 160.
def two_layer_shape() -> "bench.ModelShape":
    return bench.ModelShape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=10)


PREFIX = list(range(100, 110))  # 10 tokens every prompt starts with
PROMPTS = [PREFIX + [1, 2, 3, 4, 5], PREFIX + [6, 7], PREFIX + [8]]  # lengths 15, 12, 11
COMPLETIONS = [4, 1, 2]  # tokens generated per prompt (eos included)
# decode: a row with c tokens runs c - 1 steps, its k-th attending its n prompt tokens + k: 4 row-steps,
# pairs (16 + 17 + 18) + 0 + 12 = 63


@pytest.mark.parametrize("options, expected", [
    # prefix forward 1 x 10 positions (1 logit row, 55 pairs), remainders 5, 2, 1 padded to 5: 3 x 5 positions
    # (3 logit rows; pairs 5x10+15, 2x10+3, 1x10+1 = 99): positions 25 + 4 decode = 29, pairs 154 + 63 = 217,
    # logit rows 4 + 4 = 8: 29 x 2304 + 217 x 64 + 8 x 160
    ({"share_prefix": True}, {"prefill_positions": 25, "prefill_logit_rows": 4, "decode_rows": 4,
                              "attention_pairs": 217, "fp32": 66816 + 13888 + 1280, "bf16": 0}),
    # as above, remainders in two buckets (bucket cost 0): {5} and {2, 1}, 5 + 2 x 2 positions instead of 15
    ({"share_prefix": True, "prefill_buckets": 2, "bucket_tokens": 0},
     {"prefill_positions": 19, "prefill_logit_rows": 4, "decode_rows": 4, "attention_pairs": 217,
      "fp32": 23 * 2304 + 13888 + 1280, "bf16": 0}),
    # the screened decode lm_head runs in bf16: 4 decode logit rows x 160 move from fp32 to bf16
    ({"share_prefix": True, "screened_lm_head": True},
     {"prefill_positions": 25, "prefill_logit_rows": 4, "decode_rows": 4, "attention_pairs": 217,
      "fp32": 66816 + 13888 + 640, "bf16": 640}),
    # the packed lean prefill projects no prefix row: one fp32 logit row (160) fewer
    ({"share_prefix": True, "prefix_logit_row": False},
     {"prefill_positions": 25, "prefill_logit_rows": 3, "decode_rows": 4, "attention_pairs": 217,
      "fp32": 66816 + 13888 + 1120, "bf16": 0}),
    # no sharing: one forward of 3 x 15 positions, 3 logit rows, pairs 120 + 78 + 66 = 264
    ({}, {"prefill_positions": 45, "prefill_logit_rows": 3, "decode_rows": 4, "attention_pairs": 327,
          "fp32": 49 * 2304 + 327 * 64 + 7 * 160, "bf16": 0}),
    # batches of 2 (longest first): {15, 12} share the prefix (1 x 10 + 2 x 5 positions, pairs 55 + 65 + 23),
    # {11} alone cannot (1 x 11, pairs 66): positions 31, pairs 209 + 63 = 272
    ({"share_prefix": True, "batch_size": 2},
     {"prefill_positions": 31, "prefill_logit_rows": 4, "decode_rows": 4, "attention_pairs": 272,
      "fp32": 35 * 2304 + 272 * 64 + 1280, "bf16": 0}),
])
def test_executed_flops_hand_computed(options, expected):
    shape = two_layer_shape()
    assert shape.layer_weights == 576
    assert bench.executed_flops(shape, PROMPTS, COMPLETIONS, **{"batch_size": 3, **options}) == expected


def test_model_shape_counts_the_model_weights():
    model = make_tiny_model()
    shape = bench.ModelShape.of(model)
    linear = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    assert shape.layers * shape.layer_weights == linear
    assert shape.hidden * shape.vocab == model.lm_head.weight.numel()


def test_roofline_ratio_hand_computed():
    # 4 GFLOP at 10 GFLOP/s take 0.4 s at best: done in 2 s, the ratio is 0.2
    assert bench.roofline_ratio({"fp32": 4e9, "bf16": 0}, 2.0, 10.0) == pytest.approx(0.2)
    # 2 GFLOP fp32 at 10 (0.2 s) + 8 GFLOP bf16 at 40 (0.2 s): 0.4 s at best, done in 0.8 s
    assert bench.roofline_ratio({"fp32": 2e9, "bf16": 8e9}, 0.8, 10.0, 40.0) == pytest.approx(0.5)
    with pytest.raises(ValueError):  # bf16 work needs a bf16 rate
        bench.roofline_ratio({"fp32": 2e9, "bf16": 8e9}, 0.8, 10.0)


@pytest.mark.parametrize("fast", [False, True])
def test_executed_flops_match_the_engines_calls(tokenizer, monkeypatch, fast):
    """What the bench counts for a generate call equals what the lean engine was seen to execute: prefix and
    buckets, logit rows, rows dropped as they finish, and (fast, where the CPU has native bf16) the screen."""
    prompts = varied_prompts()
    model = make_tiny_model()
    finish_rows_early(monkeypatch, eos_token_ids(model, tokenizer)[0])
    options = dict(bench.FAST_GENERATION) if fast else {"share_prefix": True, "prefill_buckets": 3}
    gen = GenerationConfig(max_new_tokens=8, batch_size=4, engine="esft", **options)
    ids = encode_prompts(tokenizer, prompts)
    counter = EngineCounter(model, monkeypatch)
    gens = generate(model, tokenizer, prompts, gen, prompt_ids=ids)
    lengths = [len(g.completion_ids) for g in gens]
    assert len(set(lengths)) > 1 and counter.calls["prefill"] > 2  # rows finished early; prefix + buckets ran
    layout = bench.effective_layout(model, gen)
    assert layout["screened_lm_head"] == (fast and lean.bf16_matmul_is_native())
    counted = bench.executed_flops(bench.ModelShape.of(model), ids, lengths, batch_size=gen.batch_size, **layout)
    assert {k: counted[k] for k in ("fp32", "bf16")} == counter.flops
    assert (counter.flops["bf16"] > 0) == layout["screened_lm_head"]
    assert (counter.calls["head"] > 0) == (not layout["prefix_logit_row"])  # packed: logits after the layout


def test_workloads_have_the_specified_shapes(tokenizer):
    dh = bench.build_workload("decode-heavy", tokenizer)
    lengths = [len(x) for x in encode_prompts(tokenizer, dh.prompts)]
    assert len(lengths) == 32 and all(60 <= n <= 64 for n in lengths), lengths
    assert (dh.max_new_tokens, dh.min_new_tokens, dh.generation_batch_size) == (256, 256, 32)
    cp = bench.build_workload("cpu-preset", tokenizer)
    from esft.es.es_config import PRESETS

    assert len(cp.prompts) == PRESETS["cpu"]["batch_size"] and cp.max_new_tokens == PRESETS["cpu"]["max_new_tokens"]
    assert cp.min_new_tokens == 0
    with pytest.raises(ValueError):
        bench.build_workload("nope", tokenizer)


def test_esft_and_naive_iterations_do_the_same_work(tokenizer):
    model = make_tiny_model()
    before = {n: p.clone() for n, p in model.named_parameters()}
    work = small_workload()
    ours = bench.esft_iteration(model, tokenizer, work, population=2, noise="per-tensor", gen_overrides={})
    assert not ours["zero_update"]
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())  # the update was applied
    bench._reset(model, before)
    naive = bench.naive_iteration(model, tokenizer, work, population=2)
    assert ours["generated_tokens"] == naive["generated_tokens"] == 2 * 5 * 6  # min_new_tokens forces full length
    assert ours["prompt_tokens"] == naive["prompt_tokens"]
    assert ours["texts"][0] == naive["texts"][0]
    for t in (ours["timings"], naive["timings"]):
        assert {"perturb", "generate", "restore", "update", "iteration"} <= set(t)


def test_esft_iteration_in_parallel_lanes_does_the_same_work(tokenizer):
    """The bench's default layout (two members at once, one thread each) gives the one-at-a-time completions and
    update; the lanes' model copies are made before the timed part."""
    work = small_workload()
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        runs = []
        for lanes in (1, 2):
            model = make_tiny_model()
            out = bench.esft_iteration(model, tokenizer, work, population=3, noise="table", gen_overrides={},
                                       parallel_members=lanes)
            runs.append((out, {n: p.clone() for n, p in model.named_parameters()}))
    finally:
        torch.set_num_threads(previous)
    (one, w1), (two, w2) = runs
    assert (one["lanes"], two["lanes"]) == (1, 2)  # the second iteration really ran two members at once
    assert one["texts"] == two["texts"] and one["generated_tokens"] == two["generated_tokens"] == 3 * 5 * 6
    assert all(torch.equal(w1[n], w2[n]) for n in w1)
    assert one["executed_flops"] == two["executed_flops"] and one["executed_flops"]["fp32"] > 0  # both lanes seen
    assert bench.BenchConfig().parallel_members is None and bench.BenchConfig(exact=True).parallel_members == 1


def test_warm_up_runs_one_member_per_lane_for_one_token_and_restores_the_generation_config():
    from esft.bench.iterations import warm_up

    class Recorder:
        def __init__(self):
            self.gen_config = bench_gen = GenerationConfig(max_new_tokens=24, min_new_tokens=8)
            self.original = bench_gen
            self.calls = []

        def evaluate_members(self, members, batch):
            self.calls.append((list(members), len(batch), self.gen_config.max_new_tokens,
                               self.gen_config.min_new_tokens))

    work = small_workload()
    ex = Recorder()
    warm_up(ex, work, lanes=2, seed=0)
    (members, rows, budget, forced), = ex.calls
    assert len(members) == 2 and len({m.seed for m in members}) == 2 and rows == len(work.prompts)
    assert (budget, forced) == (1, 0)
    assert ex.gen_config is ex.original  # the timed iteration generates with the workload's own settings


def test_run_bench_report_shape(tokenizer, monkeypatch):
    model = make_tiny_model()
    monkeypatch.setattr(bench, "build_workload", lambda name, tok: small_workload(name))
    monkeypatch.setattr(bench, "matmul_gflops", lambda dtype, size=2048: 10.0)
    assert bench.BenchConfig().noise == "table" and bench.BenchConfig().generation == bench.FAST_GENERATION
    cfg = bench.BenchConfig(workloads=["decode-heavy", "cpu-preset"], population=2, repeats=2, noise="per-tensor",
                            generation={"lean": True}, vllm=False)  # no vLLM engine spawned where it is installed
    logged: list[str] = []
    report = bench.run_bench(cfg, model=model, tokenizer=tokenizer, log=logged.append)
    json.dumps(report)
    assert set(report["workloads"]) == {"decode-heavy", "cpu-preset"}
    # each esft iteration is followed at once by the pure generation it is held against (side by side)
    steps = [m.split(" (")[0] for m in logged if "iteration" in m or "pure generation" in m]
    for name in ("decode-heavy", "cpu-preset"):
        ours = [m for m in steps if m.startswith(name)]
        assert ours == [f"{name}: {what} {r}/2" for r in (1, 2)
                        for what in ("esft iteration", "pure generation", "naive iteration")]
    for w in report["workloads"].values():
        assert REQUIRED <= set(w)
        assert all(isinstance(w[k], float) for k in REQUIRED)
        assert 0 < w["overhead_fraction"] < 1
        assert len(w["esft_iterations_s"]) == 2 and w["member0_outputs_match"]
        assert len(w["pure_generations_s"]) == 2 and w["pure_generation"][0]["seconds"] == min(w["pure_generations_s"])
        # pure generation of the same prompts, population times: the same tokens, so the ratio is one of times
        pure = w["pure_generation"][0]
        assert pure["engine"] == "esft" and w["inference_engine"] == "esft"
        assert (pure["prompt_tokens"], pure["generated_tokens"]) == (w["prompt_tokens"], w["generated_tokens"])
        assert w["inference_ratio"] == pytest.approx(w["delivered_tokens_per_s"] / pure["delivered_tokens_per_s"],
                                                     rel=1e-2)
        from esft.bench.inference import vllm_available

        assert w["vllm"] == ("installed, not timed (--no-vllm)" if vllm_available() else "not installed")
    with open("/proc/cpuinfo") as f:
        model_name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    assert report["cpu"]["model"] == model_name and isinstance(report["cpu"]["flags"], list)
    assert report["date_utc"].endswith("Z")
    table = bench.format_table(report)
    assert "decode-heavy" in table and "speedup" in table
    assert "cpu-preset: pure generation of the same prompts: esft " in table and "inference ratio against esft" in table


def test_bf16_iteration_sits_between_its_fp32_comparison_and_its_pure_generation(monkeypatch):
    """With bf16 rollouts, every repeat runs the fp32-rollout iteration, the bf16 one, then the pure generation,
    each from the snapshot weights: the iteration is adjacent to both runs its two ratios are taken against."""
    order: list[str] = []
    model = torch.nn.Linear(2, 2)
    snapshot = {k: v.clone() for k, v in model.state_dict().items()}

    def iteration(model_, tokenizer, work, population, noise, generation, seed, rank, lanes, rollout=None):
        assert torch.equal(model_.weight, snapshot["weight"])  # reset before each
        model_.weight.data.add_(1.0)  # an update
        order.append("bf16" if rollout is torch.bfloat16 else "fp32")
        return {"lanes": lanes}

    def pure(model_, tokenizer, work, population, generation, lanes, rollout):
        assert torch.equal(model_.weight, snapshot["weight"]) and rollout is torch.bfloat16 and lanes == 2
        order.append("pure")
        return {"seconds": 1.0}

    monkeypatch.setattr(bench, "esft_iteration", iteration)
    monkeypatch.setattr(bench, "esft_generation", pure)
    monkeypatch.setattr(bench, "naive_iteration", lambda *a: order.append("naive") or {})
    cfg = bench.BenchConfig(workloads=["cpu-preset"], repeats=2, parallel_members=2)
    logged: list[str] = []

    def log(message):  # each step's line comes just before that step
        logged.append(message)
        order.append("log")

    runs = bench._iterations(cfg, model, None, "cpu-preset", small_workload("cpu-preset"), snapshot, [], log,
                             torch.bfloat16)
    assert order == ["log", "fp32", "log", "bf16", "log", "pure", "log", "naive"] * 2
    assert [m.split(" (")[0] for m in logged[:4]] == [
        "cpu-preset: esft iteration with fp32 rollouts 1/2", "cpu-preset: esft iteration 1/2",
        "cpu-preset: pure generation 1/2", "cpu-preset: naive iteration 1/2"]
    assert [len(runs[k]) for k in ("fp32", "esft", "pure", "naive")] == [2, 2, 2, 2]


def test_each_workload_runs_its_own_lanes_unless_parallel_members_is_given(tokenizer, monkeypatch):
    """`--parallel-members` unset: the esft iteration and its pure generation run the lanes of the configuration
    the workload stands for (cpu-preset: the `cpu` preset's); set, it applies to every workload."""
    from esft.es.es_config import PRESETS

    assert bench.build_workload("cpu-preset", tokenizer).parallel_members == PRESETS["cpu"]["parallel_members"] == 1
    assert small_workload().parallel_members == bench.FAST_PARALLEL_MEMBERS == 2
    seen: list[tuple[str, int]] = []

    def iteration(model_, tokenizer_, work, population, noise, generation, seed, rank, lanes, rollout=None):
        seen.append(("esft", lanes))
        return {"lanes": lanes}

    def pure(model_, tokenizer_, work, population, generation, lanes, rollout):
        seen.append(("pure", lanes))
        return {"seconds": 1.0}

    monkeypatch.setattr(bench, "esft_iteration", iteration)
    monkeypatch.setattr(bench, "esft_generation", pure)
    model = torch.nn.Linear(2, 2)
    snapshot = {k: v.clone() for k, v in model.state_dict().items()}
    one = dataclasses.replace(small_workload("cpu-preset"), parallel_members=1)
    for given, expected in ((None, 1), (3, 3)):
        seen.clear()
        cfg = bench.BenchConfig(workloads=["cpu-preset"], naive=False, parallel_members=given)
        bench._iterations(cfg, model, None, "cpu-preset", one, snapshot, [], lambda m: None)
        assert seen == [("esft", expected), ("pure", expected)]


def test_speedup_vs_fp32_is_the_fastest_fp32_over_the_fastest_bf16_iteration_and_each_pair(tokenizer, monkeypatch):
    """`speedup_vs_fp32` takes the fastest of each kind; `speedup_vs_fp32_per_repeat` each repeat's fp32 iteration
    over the bf16 one that ran right after it (the pair that met the same machine state)."""
    seconds = {"fp32": iter([20.0, 18.0, 19.0]), "bf16": iter([10.0, 12.0, 9.5])}

    def iteration(model, tokenizer, work, population, noise, generation, seed, rank, lanes, rollout=None):
        it = next(seconds["bf16" if rollout is torch.bfloat16 else "fp32"])
        return {"timings": {"iteration": it, "perturb": 0.1, "restore": 0.1, "update": 0.1, "generate": it - 0.3},
                "prompt_tokens": 100, "generated_tokens": 50, "texts": ["x"], "lanes": lanes}

    monkeypatch.setattr(bench, "esft_iteration", iteration)
    monkeypatch.setattr(bench, "build_workload", lambda name, tok: small_workload(name))
    monkeypatch.setattr(bench, "matmul_gflops", lambda dtype, size=2048: 10.0)
    cfg = bench.BenchConfig(workloads=["cpu-preset"], repeats=3, rollout_dtype="bfloat16", naive=False,
                            inference=False)
    report = bench.run_bench(cfg, model=make_tiny_model(), tokenizer=tokenizer, log=lambda m: None)
    w = report["workloads"]["cpu-preset"]
    assert w["esft_iterations_s"] == [10.0, 12.0, 9.5] and w["fp32_rollout_iterations_s"] == [20.0, 18.0, 19.0]
    assert w["fp32_rollout_iteration_s"] == 18.0 and w["speedup_vs_fp32"] == round(18.0 / 9.5, 3)
    assert w["speedup_vs_fp32_per_repeat"] == [2.0, 1.5, 2.0]
    assert "cpu-preset: fp32-rollout iteration over the bf16 one right after it, per repeat: 2.00, 1.50, 2.00" in (
        bench.format_table(report))


@pytest.mark.parametrize("rollout", ["float32", "bfloat16"])
def test_run_bench_roofline_is_executed_flops_over_the_matmul_rate(tokenizer, monkeypatch, rollout):
    """With given matmul readings, the report's roofline ratio is the FLOPs the engine was seen to execute (counted
    from its calls) at the best reading of each dtype, over the iteration's time; delivered tokens keep their own
    rate."""
    model = make_tiny_model()
    monkeypatch.setattr(bench, "build_workload", lambda name, tok: small_workload(name, min_new=0))
    # GFLOP/s, slow enough for ratios well above the report's 1e-4 rounding; read before and after the workload
    readings = {torch.float32: iter([0.02, 0.05]), torch.bfloat16: iter([0.2, 0.1])}
    monkeypatch.setattr(bench, "matmul_gflops", lambda dtype, size=2048: next(readings[dtype]))
    counter = EngineCounter(model, monkeypatch)
    from esft.bench import iterations

    real_warm_up = iterations.warm_up

    def warm_up(*args, **kwargs):  # the warm-up is outside the timed iteration: its FLOPs are not the iteration's
        real_warm_up(*args, **kwargs)
        assert counter.calls["prefill"] > 0  # it ran through the engine
        counter.flops = {"fp32": 0, "bf16": 0}

    monkeypatch.setattr(iterations, "warm_up", warm_up)
    cfg = bench.BenchConfig(workloads=["cpu-preset"], population=2, noise="table", naive=False,
                            rollout_dtype=rollout, compare_fp32=False, inference=False)
    report = bench.run_bench(cfg, model=model, tokenizer=tokenizer, log=lambda m: None)
    w = report["workloads"]["cpu-preset"]
    # bf16 is timed where oneDNN has a bf16 matmul, and for bf16 rollouts everywhere (their FLOPs need its rate)
    bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported() or rollout == "bfloat16"
    assert report["matmul_gflops_readings"] == {"fp32": [0.02, 0.05], "bf16": [0.2, 0.1] if bf16 else []}
    assert report["matmul_gflops"] == 0.05 and report["matmul_gflops_bf16"] == (0.2 if bf16 else None)
    assert report["rollout_precision"]["rollout_dtype"] == rollout
    assert w["executed_flops"] == counter.flops and counter.calls["decode"] > 0
    if rollout == "bfloat16":  # every linear in bf16; the attention in fp32 on the packed path, else bf16 too
        assert counter.flops["bf16"] > 10 * counter.flops["fp32"]
        from esft.generation.packed import onednn_bf16

        packed_path = onednn_bf16()  # bf16 weights stay on the packed path only where oneDNN runs bf16
        assert (counter.flops["fp32"] > 0) == packed_path
    ideal = counter.flops["fp32"] / 0.05e9 + counter.flops["bf16"] / 0.2e9
    best = sum(counter.flops.values()) / (0.2e9 if bf16 else 0.05e9)  # everything at the best dtype's rate
    rel = 5e-3 + 0.0005 / w["iteration_s"]  # the report rounds iteration_s to the millisecond
    if torch.ops.mkldnn._is_mkldnn_bf16_supported() or rollout == "float32":
        assert w["roofline_ratio_per_dtype"] == pytest.approx(ideal / w["iteration_s"], rel=rel)
    else:  # bf16 rollouts at torch's emulated bf16 rate, which depends on the shape: no per-dtype ratio
        assert report["matmul_size_bf16"] == 512 and w["roofline_ratio_per_dtype"] is None
    assert w["roofline_ratio"] == pytest.approx(best / w["iteration_s"], rel=rel)
    assert w["executed_gflop"] == pytest.approx(sum(counter.flops.values()) / 1e9, abs=1e-3)
    delivered = w["prompt_tokens"] + w["generated_tokens"]
    assert w["delivered_tokens_per_s"] == pytest.approx(delivered / w["iteration_s"], rel=rel)
    # delivered prompt tokens: every member's whole prompts, shared prefix included
    assert w["prompt_tokens"] == 2 * sum(len(x) for x in encode_prompts(tokenizer, small_workload().prompts))


def test_parse_overrides_and_cli():
    assert bench.parse_overrides(["lean=false", "batch_size=8"]) == {"lean": False, "batch_size": 8}
    with pytest.raises(ValueError):
        bench.parse_overrides(["nonsense=1"])
    from esft.cli import build_parser

    args = build_parser().parse_args(["bench", "--workloads", "cpu-preset", "--repeats", "2", "--json",
                                      "--set", "lean=false"])
    assert args.func.__name__ == "_bench" and args.repeats == 2 and args.json and args.set == ["lean=false"]
    # untyped flags stay unset (BenchConfig's defaults apply), so that a typed flag can be told apart
    assert not {"exact", "noise", "parallel_members", "vllm"} & set(vars(args))
    assert build_parser().parse_args(["bench", "--parallel-members", "3"]).parallel_members == 3
    assert build_parser().parse_args(["bench", "--exact"]).exact


@pytest.mark.parametrize("flags, words", [(["--noise", "lowrank", "--rank", "0"], "--rank"),
                                          (["--noise", "per-tensor", "--rank", "-2"], "--rank"),
                                          (["--noise", "bogus"], "unknown noise mode"),
                                          (["--population", "1"], "--population must be >= 2"),
                                          (["--repeats", "0"], "(--repeats): repeats = 0 is not accepted"),
                                          (["--threads", "-1"], "(--threads): threads = -1 is not accepted"),
                                          (["--workers", "0"], "(--workers): workers = 0 is not accepted"),
                                          (["--rollout-dtype", "fp8"], "rollout_dtype = 'fp8' is not accepted"),
                                          (["--seed", "-1"], "(--seed): seed = -1 is not accepted")])
def test_bench_refuses_a_bad_noise_or_rank_before_the_model_loads(monkeypatch, capsys, flags, words):
    """`esft bench --noise lowrank --rank 0` used to load the model and time the matmul first; `--rollout-dtype
    fp8` was refused only after the model loaded, `--repeats 0` ended in "min() arg is an empty sequence",
    `--threads -1` in torch's words with exit status 1, and `--workers 0` ran."""
    import esft.models
    from esft.cli import main

    def no_load(*args, **kwargs):
        raise AssertionError("the model loaded before the options were checked")

    monkeypatch.setattr(esft.models, "load_model", no_load)
    assert main(["bench", "--workloads", "cpu-preset", *flags]) == 2
    assert words in capsys.readouterr().err


def test_matmul_gflops_is_positive():
    assert bench.matmul_gflops(torch.float32, size=128, reps=2) > 0


def test_check_outputs_compares_fast_engine_with_model_generate(tokenizer, monkeypatch):
    model = make_tiny_model()
    work = small_workload(min_new=0)
    check = bench.check_outputs(model, tokenizer, work, bench.FAST_GENERATION)
    ref = generate(model, tokenizer, work.prompts, GenerationConfig(max_new_tokens=6, batch_size=5, engine="hf"))
    tokens = sum(len(g.completion_ids) for g in ref)  # model.generate's own count, eos included
    assert check == {"identical": 5, "completions": 5, "tokens": tokens, "first_difference": None}
    # a real difference is found and located: greedy-break the esft engine by flipping its argmax to the runner-up
    from esft.generation import loop as generation

    def runner_up(logits, temperature, top_p, generator):
        return logits.topk(2, dim=-1).indices[:, 1]

    monkeypatch.setattr(generation, "sample_next", runner_up)
    broken = bench.check_outputs(model, tokenizer, work, {})
    monkeypatch.undo()
    assert broken["identical"] == 0 and broken["first_difference"] == {"row": 0, "token": 0}
    # and through run_bench / the table
    monkeypatch.setattr(bench, "build_workload", lambda name, tok: small_workload(name, min_new=0))
    monkeypatch.setattr(bench, "matmul_gflops", lambda dtype, size=2048: 10.0)
    report = bench.run_bench(bench.BenchConfig(workloads=["cpu-preset"], population=2, naive=False,
                                               check_outputs=True), model=model, tokenizer=tokenizer,
                             log=lambda m: None)
    assert report["workloads"]["cpu-preset"]["outputs_vs_hf_generate"]["identical"] == 5
    assert "5/5 greedy completions identical" in bench.format_table(report)


def test_overhead_fraction_divides_the_lanes_concurrent_perturbations():
    """Two lanes perturb concurrently: 2 s of lane-summed perturbation is 1 s of the iteration's wall time."""
    t = {"perturb": 2.0, "restore": 0.4, "update": 0.3, "iteration": 10.0}
    assert bench.overhead_fraction(t, 2) == pytest.approx((1.2 + 0.3) / 10)
    assert bench.overhead_fraction(t, 1) == pytest.approx(2.7 / 10)  # one lane: the plain sum


def test_inference_ratio_is_taken_against_the_faster_engine():
    from esft.bench.inference import inference_entry

    ours = {"engine": "esft", "delivered_tokens_per_s": 1000.0}
    slower = {"engine": "vllm", "delivered_tokens_per_s": 400.0}
    faster = {"engine": "vllm", "delivered_tokens_per_s": 2000.0}
    e = inference_entry(ours, 900.0, slower)
    assert e["inference_engine"] == "esft" and e["inference_ratio"] == 0.9 and e["vllm"] == "timed"
    assert e["pure_generation"] == [ours, slower]
    e = inference_entry(ours, 900.0, faster)
    assert e["inference_engine"] == "vllm" and e["inference_ratio"] == 0.45
    e = inference_entry(ours, 900.0, "failed: no engine")
    assert e["inference_engine"] == "esft" and e["vllm"] == "failed: no engine"


def test_bench_vllm_engine_is_built_as_an_es_replica_without_prefix_caching():
    """The population's calls repeat one batch of prompts: with a prefix cache vLLM would skip their prefill
    after the first call, which an ES member (new weights) cannot. The bench's engine is built as a replica's."""
    from esft.bench.inference import bench_engine_kwargs
    from esft.es.distributed.vllm_backend.vllm_replica import engine_kwargs
    from esft.es.distributed.hf_replica import ReplicaSpec
    from esft.es.es_config import ESConfig

    jobs = {"w": {"prompt_ids": [[1, 2, 3], [4] * 10], "max_new_tokens": 5}}
    kw = bench_engine_kwargs("/m", jobs, "bfloat16", True, 1 << 30)
    replica = engine_kwargs(ReplicaSpec(config=ESConfig(model="smollm2-135m", task="boolq"), threads=1, options={}),
                            "cpu")
    assert kw["enable_prefix_caching"] is False and replica["enable_prefix_caching"] is False
    assert kw["max_model_len"] == 10 + 5 + 8 and kw["enforce_eager"] and kw["kv_cache_memory_bytes"] == 1 << 30
    gpu = bench_engine_kwargs("/m", jobs, "bfloat16", False, 1 << 30, 0.55)
    assert "kv_cache_memory_bytes" not in gpu and gpu["gpu_memory_utilization"] == 0.55


def test_bench_vllm_warm_up_runs_the_whole_batch_untimed_before_the_population():
    """vLLM's timed calls must find the batch's prefill and decode shapes seen once, as esft's lanes (warmed on
    the full batch) do: the warm-up call gets every prompt, a few tokens, and is not counted."""
    from types import SimpleNamespace

    from esft.bench.inference import VLLM_WARM_UP_TOKENS, timed_vllm_generation

    calls = []

    class Recorder:  # stands in for vllm.LLM: records each call's prompts and limits, answers max_tokens tokens
        def generate(self, prompts, sampling, use_tqdm):
            calls.append((len(prompts), sampling["max_tokens"], sampling["min_tokens"]))
            texts.append(sampling["detokenize"])
            return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[0] * sampling["max_tokens"])])
                    for _ in prompts]

    texts = []
    job = {"prompt_ids": [[1, 2, 3]] * 5, "max_new_tokens": 24, "min_new_tokens": 24}
    out = timed_vllm_generation(Recorder(), dict, job, population=3)
    assert texts == [False] * 4  # token ids only, as esft's own pure generation: no text decoding timed
    assert calls[0] == (5, VLLM_WARM_UP_TOKENS, VLLM_WARM_UP_TOKENS)
    assert calls[1:] == [(5, 24, 24)] * 3
    assert out["generated_tokens"] == 3 * 5 * 24 and out["prompt_tokens"] == 3 * 5 * 3
    short = {"prompt_ids": [[1]] * 2, "max_new_tokens": 2, "min_new_tokens": 0}
    calls.clear()
    timed_vllm_generation(Recorder(), dict, short, population=1)
    assert calls[0] == (2, 2, 0)


@pytest.mark.parametrize("fails", [False, True])
def test_run_bench_gives_the_callers_thread_count_back(tokenizer, monkeypatch, fails):
    """`threads` is for the measurement: a notebook that benches with 1 thread keeps its own count afterwards, also
    when the measurement raises."""
    monkeypatch.setattr(bench, "build_workload", lambda name, tok: small_workload(name))
    seen: list[int] = []

    def rate(dtype, size=2048):
        seen.append(torch.get_num_threads())
        if fails:
            raise RuntimeError("boom")
        return 10.0

    monkeypatch.setattr(bench, "matmul_gflops", rate)
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    cfg = bench.BenchConfig(workloads=["cpu-preset"], population=2, repeats=1, naive=False, vllm=False,
                            threads=other)
    try:
        if fails:
            with pytest.raises(RuntimeError, match="boom"):
                bench.run_bench(cfg, model=make_tiny_model(), tokenizer=tokenizer, log=lambda m: None)
        else:
            bench.run_bench(cfg, model=make_tiny_model(), tokenizer=tokenizer, log=lambda m: None)
        assert seen and set(seen) == {other}  # measured with the requested count
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("item", ["nonsense=1", "lean"])
def test_a_refused_override_is_named(item):
    """`esft bench --set lean=false --set nosuch=1` said only "--set expects KEY=VALUE ...", not which of the
    overrides it refused."""
    with pytest.raises(ValueError, match=rf"^--set '{item}': expected KEY=VALUE with KEY a GenerationConfig engine "
                                         r"field \(.*lean.*\)$"):
        bench.parse_overrides(["lean=false", item])


def test_the_bench_warns_of_bf16_rollouts_on_a_cpu_that_emulates_bf16_and_measures_them(tokenizer, monkeypatch):
    from esft.generation import packed, precision

    monkeypatch.setattr(precision, "cpu_flags", lambda: ["avx2", "fma"])  # as on a Zen 2: no bf16 at all
    monkeypatch.setattr(packed, "onednn_bf16", lambda: False)
    monkeypatch.setattr(bench, "build_workload", lambda name, tok: small_workload(name))
    sizes: dict[torch.dtype, set[int]] = {torch.float32: set(), torch.bfloat16: set()}

    def rate(dtype, size=2048):
        sizes[dtype].add(size)
        return 10.0

    monkeypatch.setattr(bench, "matmul_gflops", rate)
    cfg = bench.BenchConfig(workloads=["cpu-preset"], population=2, naive=False, rollout_dtype="bfloat16",
                            compare_fp32=False, inference=False)
    with pytest.warns(UserWarning, match="no bf16 matmul on this CPU"):
        report = bench.run_bench(cfg, model=make_tiny_model(), tokenizer=tokenizer, log=lambda m: None)
    assert report["rollout_precision"]["rollout_dtype"] == "bfloat16"
    # the warning stays with the report, and the emulated rate is read on a product small enough to finish
    assert "no bf16 matmul on this CPU" in report["rollout_precision"]["rollout_dtype_warning"]
    assert sizes == {torch.float32: {2048}, torch.bfloat16: {bench.EMULATED_BF16_MATMUL_SIZE}}
    # recorded, and no per-dtype roofline at a rate that depends on the product's shape
    assert report["matmul_size_bf16"] == 512 and report["workloads"]["cpu-preset"]["roofline_ratio_per_dtype"] is None
    # its bf16 FLOPs are divided by a bf16 rate measured for them (it failed after the timings without one)
    assert report["matmul_gflops_bf16"] == 10.0 and report["workloads"]["cpu-preset"]["roofline_ratio"] > 0


def test_the_bf16_matmul_is_timed_where_its_rate_is_needed_at_a_size_that_finishes():
    """2048^3 where oneDNN has bf16 (as fp32); for bf16 rollouts without it, the emulated rate at the small size
    (2048^3 emulated takes ~30 s a reading on a Zen 2); not at all for fp32 rollouts without it."""
    assert bench.bf16_matmul_size(True, False) == bench.bf16_matmul_size(True, True) == 2048
    assert bench.bf16_matmul_size(False, True) == bench.EMULATED_BF16_MATMUL_SIZE == 512
    assert bench.bf16_matmul_size(False, False) is None
