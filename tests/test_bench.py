"""`esft bench` plumbing on the tiny model (the real measurements are `esft bench` itself). Run:
`pytest tests/test_bench.py -q`."""

from __future__ import annotations

import json

import pytest
import torch

from esft import bench
from esft.generation import encode_prompts

from conftest import make_tiny_model

REQUIRED = {"roofline_ratio", "generated_tokens_per_s", "iteration_s", "naive_iteration_s", "speedup_vs_naive",
            "overhead_fraction"}


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def small_workload(name: str = "small", min_new: int = 6) -> bench.Workload:
    prompts = [[{"role": "user", "content": f"Tell me about the number {i} and its friends."}] for i in range(5)]
    return bench.Workload(name, prompts, max_new_tokens=6, min_new_tokens=min_new, generation_batch_size=3,
                          sigma=1e-2, alpha=1e-3)


def test_workloads_have_the_specified_shapes(tokenizer):
    dh = bench.build_workload("decode-heavy", tokenizer)
    lengths = [len(x) for x in encode_prompts(tokenizer, dh.prompts)]
    assert len(lengths) == 32 and all(60 <= n <= 64 for n in lengths), lengths
    assert (dh.max_new_tokens, dh.min_new_tokens, dh.generation_batch_size) == (256, 256, 32)
    cp = bench.build_workload("cpu-preset", tokenizer)
    from esft.es.config import PRESETS

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
    assert bench.BenchConfig().parallel_members == bench.FAST_PARALLEL_MEMBERS == 2


def test_run_bench_report_shape(tokenizer, monkeypatch):
    model = make_tiny_model()
    monkeypatch.setattr(bench, "build_workload", lambda name, tok: small_workload(name))
    monkeypatch.setattr(bench, "matmul_gflops", lambda dtype: 10.0)
    assert bench.BenchConfig().noise == "table" and bench.BenchConfig().generation == bench.FAST_GENERATION
    cfg = bench.BenchConfig(workloads=["decode-heavy", "cpu-preset"], population=2, repeats=2, noise="per-tensor",
                            generation={"lean": True})
    report = bench.run_bench(cfg, model=model, tokenizer=tokenizer, log=lambda m: None)
    json.dumps(report)
    assert isinstance(report["matmul_gflops"], float)
    assert set(report["workloads"]) == {"decode-heavy", "cpu-preset"}
    for w in report["workloads"].values():
        assert REQUIRED <= set(w)
        assert all(isinstance(w[k], float) for k in REQUIRED)
        assert 0 < w["overhead_fraction"] < 1 and w["roofline_ratio"] > 0
        assert len(w["esft_iterations_s"]) == 2 and w["member0_outputs_match"]
    table = bench.format_table(report)
    assert "decode-heavy" in table and "speedup" in table


def test_parse_overrides_and_cli():
    assert bench.parse_overrides(["lean=false", "batch_size=8"]) == {"lean": False, "batch_size": 8}
    with pytest.raises(ValueError):
        bench.parse_overrides(["nonsense=1"])
    from esft.cli import build_parser

    args = build_parser().parse_args(["bench", "--workloads", "cpu-preset", "--repeats", "2", "--json",
                                      "--set", "lean=false"])
    assert args.func.__name__ == "_bench" and args.repeats == 2 and args.json and args.set == ["lean=false"]
    assert not args.exact and args.noise is None and args.parallel_members is None
    assert build_parser().parse_args(["bench", "--parallel-members", "3"]).parallel_members == 3
    assert build_parser().parse_args(["bench", "--exact"]).exact


def test_matmul_gflops_is_positive():
    assert bench.matmul_gflops(torch.float32, size=128, reps=2) > 0


def test_check_outputs_compares_fast_engine_with_model_generate(tokenizer, monkeypatch):
    model = make_tiny_model()
    work = small_workload(min_new=0)
    check = bench.check_outputs(model, tokenizer, work, bench.FAST_GENERATION)
    assert check == {"identical": 5, "completions": 5, "tokens": check["tokens"], "first_difference": None}
    assert check["tokens"] > 0
    # a real difference is found and located: greedy-break the esft engine by flipping its argmax to the runner-up
    import esft.generation as generation

    def runner_up(logits, temperature, top_p, generator):
        return logits.topk(2, dim=-1).indices[:, 1]

    monkeypatch.setattr(generation, "sample_next", runner_up)
    broken = bench.check_outputs(model, tokenizer, work, {})
    monkeypatch.undo()
    assert broken["identical"] == 0 and broken["first_difference"] == {"row": 0, "token": 0}
    # and through run_bench / the table
    monkeypatch.setattr(bench, "build_workload", lambda name, tok: small_workload(name, min_new=0))
    monkeypatch.setattr(bench, "matmul_gflops", lambda dtype: 10.0)
    report = bench.run_bench(bench.BenchConfig(workloads=["cpu-preset"], population=2, naive=False,
                                               check_outputs=True), model=model, tokenizer=tokenizer,
                             log=lambda m: None)
    assert report["workloads"]["cpu-preset"]["outputs_vs_hf_generate"]["identical"] == 5
    assert "5/5 greedy completions identical" in bench.format_table(report)
