"""esft bench's driver, iterations and pure generation against their definitions (esft.bench docstring,
docs/performance.md): what `--json` prints, how vLLM's warm-up samples, and the report fields the mutation audit of
2026-12-05 found unchecked.

Run: PYTHONPATH=src pytest -q tests/test_bench_mutmutbench.py   (a few seconds)
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from esft import bench


def canned_report() -> dict:
    return {"matmul_gflops": 12.5, "matmul_gflops_bf16": None, "dtype": "float32", "threads": 2, "params": 2e6,
            "population": 4, "noise": "table", "generation_overrides": {}, "workloads": {}}


@pytest.mark.parametrize("as_json", [True, False])
def test_bench_prints_the_report_as_json_with_json_and_as_the_table_without(monkeypatch, capsys, as_json):
    """`esft bench --json` prints the report itself (one JSON object on stdout); without it, the table."""
    from esft.cli import main

    monkeypatch.setattr(bench, "run_bench", lambda config, log: canned_report())
    assert main(["bench", "--workloads", "cpu-preset", *(["--json"] if as_json else [])]) == 0
    out = capsys.readouterr().out
    if as_json:
        assert json.loads(out) == canned_report()
    else:
        assert out.startswith("matmul 12.5 GFLOP/s (float32, 2 threads)") and out.strip() == bench.format_table(
            canned_report())


def test_vllm_warm_up_call_is_greedy_as_the_timed_calls():
    """The untimed warm-up must run the sampler the timed calls run (greedy), so that they find it warm."""
    from esft.bench.inference import timed_vllm_generation

    seen = []

    class Recorder:  # stands in for vllm.LLM
        def generate(self, prompts, sampling, use_tqdm):
            seen.append(sampling)
            return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[0])]) for _ in prompts]

    timed_vllm_generation(Recorder(), dict, {"prompt_ids": [[1, 2]], "max_new_tokens": 8, "min_new_tokens": 0}, 2)
    assert [(s["n"], s["temperature"]) for s in seen] == [(1, 0.0)] * 3


def test_a_ray_iteration_without_lanes_is_reported_as_one_lane():
    """Ray replicas run their members each in its own process: the entry's `lanes` (which generate_roofline_ratio
    divides by) is 1, not 0 or missing, for an iteration that records `workers` and no lanes."""
    t = {"perturb": 2.0, "restore": 0.4, "score": 0.6, "update": 0.3, "generate": 9.0, "iteration": 10.0}
    ray = {"timings": t, "prompt_tokens": 3, "generated_tokens": 2, "texts": ["a"], "workers": 2}
    entry = bench._workload_entry({"esft": [ray], "naive": []}, [0.1], "table")[0]
    assert entry["lanes"] == 1


def test_a_batch_size_override_without_ray_workers_is_passed_on(monkeypatch):
    """`--set batch_size=N` is refused only with --workers (whose replicas batch by the workload); on local lanes
    it is the generation batch size the bench runs."""
    from esft.cli import main

    seen = []
    monkeypatch.setattr(bench, "run_bench", lambda config, log: seen.append(config) or canned_report())
    assert main(["bench", "--workloads", "cpu-preset", "--set", "batch_size=8", "--json"]) == 0
    assert seen[0].workers == 1 and seen[0].generation["batch_size"] == 8
