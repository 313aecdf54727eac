"""esft bench as a demanding user meets it: bad input refused before the model loads, in one line."""

from __future__ import annotations

import time

import pytest


def _main_without_model(monkeypatch, argv):
    import esft.models
    from esft.cli import main

    def no_load(*args, **kwargs):
        raise AssertionError("the model loaded before the options were checked")

    monkeypatch.setattr(esft.models, "load_model", no_load)
    return main(argv)


@pytest.mark.parametrize("flags, words", [
    (["--set", "lean=[1"], "--set lean: '[1' is not a YAML value"),
    (["--set", "batch_size=0"], "--set: batch_size = 0 is not accepted"),
    (["--set", "engine=bogus"], "--set: engine = 'bogus' is not accepted"),
    (["--set", "lean=maybe"], "--set: lean = 'maybe' is not accepted"),
])
def test_bad_generation_overrides_are_refused_before_the_model_loads(monkeypatch, capsys, flags, words):
    """`--set lean=[1` ended in a YAML traceback (exit 1); `--set batch_size=0` or `engine=bogus` loaded the model,
    timed the matmul and built the workload before GenerationConfig refused the value."""
    assert _main_without_model(monkeypatch, ["bench", "--workloads", "cpu-preset", *flags]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flags, words", [
    (["--workloads", ","], "--workloads: none given"),
    (["--workloads", "cpu-preset,cpu-preset"], "--workloads: 'cpu-preset' is given twice"),
    (["--workloads", "cpu-preset", "--noise", "lowrank", "--workers", "2"],
     "--workers: a low-rank population is one batched generation in one process"),
    (["--workloads", "cpu-preset", "--noise", "lowrank", "--rollout-dtype", "bfloat16"],
     "--rollout-dtype bfloat16: bf16 rollouts run on local member lanes only"),
    (["--workloads", "cpu-preset", "--workers", "2", "--rollout-dtype", "bfloat16"],
     "--rollout-dtype bfloat16: bf16 rollouts run on local member lanes only"),
    (["--workloads", "cpu-preset", "--rank", "4"], "--rank 4: only --noise lowrank reads it (noise 'table' draws"),
    (["--workloads", "cpu-preset", "--exact", "--rank", "4"], "--rank 4: only --noise lowrank reads it"),
])
def test_workloads_and_layouts_that_cannot_run_are_refused_before_the_model_loads(monkeypatch, capsys, flags, words):
    """An empty --workloads loaded the model, timed the matmul and printed an empty table with exit status 0; a
    workload named twice ran twice, the second run replacing the first in the report; --noise lowrank with
    --workers 2 was refused only after the model loaded and the matmul was timed; --rank 4 without --noise lowrank
    timed full-rank noise and said nothing of the rank."""
    assert _main_without_model(monkeypatch, ["bench", *flags]) == 2
    assert words in capsys.readouterr().err


def test_a_ctrl_c_during_pure_generation_stops_the_other_lanes_at_their_next_step(monkeypatch):
    """Ctrl-C reaches lane 0 (the calling thread) of esft's pure generation: the other lane used to finish its
    member and then generate every member left, so `esft bench` went on for those minutes before it stopped."""
    import threading

    import torch

    import esft.generation as generation
    from esft.bench import inference
    from esft.generation import check_cancelled

    from test_bench import small_workload

    started, finished = {"main": 0, "other": 0}, {"main": 0, "other": 0}

    def fake_generate(model, tokenizer, prompts, gen, prompt_ids=None):
        if gen.max_new_tokens == 1:  # the untimed warm-up
            return []
        lane = "main" if threading.current_thread() is threading.main_thread() else "other"
        started[lane] += 1
        if lane == "main":
            time.sleep(0.05)  # the other lane is inside its first member
            raise KeyboardInterrupt
        for _ in range(25):  # a member of ~0.5 s, checking for cancellation at each step as the esft engine does
            check_cancelled()
            time.sleep(0.02)
        finished[lane] += 1
        return []

    monkeypatch.setattr(generation, "generate", fake_generate)
    monkeypatch.setattr(generation, "encode_prompts", lambda tokenizer, prompts: [[1]])
    previous = torch.get_num_threads()
    torch.set_num_threads(2)  # two lanes need two threads
    try:
        with pytest.raises(KeyboardInterrupt):
            inference.esft_generation(torch.nn.Linear(1, 1), None, small_workload(), population=6, gen_overrides={},
                                      lanes=2)
    finally:
        torch.set_num_threads(previous)
    assert started["other"] <= 1 and finished["other"] == 0


def test_the_repeats_help_names_the_report_keys_that_hold_every_repeat():
    """`esft bench --help` said the repeats other than the fastest "are in `runs`", a key no report has."""
    import re

    from esft import bench
    from esft.config_flags import field_docs

    def run(seconds: float) -> dict:
        timings = {"perturb": 0.1, "restore": 0.1, "score": 0.1, "update": 0.1, "generate": 1.0,
                   "iteration": seconds}
        return {"timings": timings, "prompt_tokens": 3, "generated_tokens": 2, "texts": ["a"], "lanes": 1}

    entry = bench._workload_entry({"esft": [run(2.0), run(1.5)], "naive": [run(9.0), run(8.0)]}, [0.1],
                                  "per-tensor")[0]
    named = re.findall(r"`([a-z_0-9]+)`", field_docs(bench.BenchConfig)["repeats"])
    assert named and all(name in entry for name in named), named
    assert entry["esft_iterations_s"] == [2.0, 1.5] and entry["naive_iterations_s"] == [9.0, 8.0]


#: /proc/cpuinfo of an arm64 Linux machine (Graviton2, Neoverse-N1): no "model name" and no "flags" line
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1

"""


def test_cpu_info_records_an_arm_cpus_features_and_part(tmp_path):
    """On arm64 Linux the report's `cpu` had model and flags both null: /proc/cpuinfo there says "Features", and
    names the core by implementer and part, not "model name"."""
    from esft.bench.roofline import cpu_info

    path = tmp_path / "cpuinfo"
    path.write_text(ARM_CPUINFO)
    info = cpu_info(path)
    assert info["flags"] is not None and "asimddp" in info["flags"] and "fp" in info["flags"]
    assert info["model"] == "CPU implementer 0x41, part 0xd0c, variant 0x3, revision 1"
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu avx512f\n\n")
    assert cpu_info(x86)["model"] == "AMD EPYC 9R14" and cpu_info(x86)["flags"] == ["fpu", "avx512f"]
    assert "family" not in info and "family" not in cpu_info(x86)  # not given: not guessed


def test_cpu_info_tells_cpu_generations_that_share_a_model_name_apart(tmp_path):
    """Cloud VMs call a Zen 2 and a Zen 4 both "AMD EPYC"; the family and model numbers tell the readings apart."""
    from esft.bench.roofline import cpu_info

    text = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: {f}\nmodel\t\t: {m}\nmodel name\t: AMD EPYC\n"
            "stepping\t: 0\nflags\t\t: fpu avx2\n\nprocessor\t: 1\ncpu family\t: 99\n\n")
    seen = []
    for family, number in ((23, 49), (25, 17)):
        path = tmp_path / f"cpuinfo-{family}"
        path.write_text(text.format(f=family, m=number))
        info = cpu_info(path)
        assert info["model"] == "AMD EPYC"
        seen.append((info["family"], info["model_number"], info["stepping"]))
    assert seen == [(23, 49, 0), (25, 17, 0)]  # the first processor's block, not the last one's


def test_an_interrupt_while_vllm_generates_stops_its_process_instead_of_waiting_for_it(monkeypatch):
    """SIGTERM (which esft turns into KeyboardInterrupt) reaches only esft's process, not vLLM's spawned one:
    `esft bench` then waited for vLLM to generate every workload (minutes) before it stopped."""
    import multiprocessing

    from esft.bench import inference

    calls: list[str] = []

    class Child:
        def __init__(self, target, args):
            pass

        def start(self):
            calls.append("start")

        def terminate(self):
            calls.append("terminate")

        def join(self, timeout=None):
            calls.append("join")

    class Queue:
        def get(self):
            raise KeyboardInterrupt  # arrives while the parent waits for vLLM's timings

    class Context:
        Process = Child

        def Queue(self):
            return Queue()

    monkeypatch.setattr(multiprocessing, "get_context", lambda method: Context())
    with pytest.raises(KeyboardInterrupt):
        inference.vllm_generation("/m", {}, 4, "float32", 2)
    assert calls[:2] == ["start", "terminate"] and "join" in calls


def test_the_attention_kernel_is_built_on_the_calling_thread_before_any_lane_runs(tokenizer, monkeypatch):
    """On a first run (no cached build) the kernel was built by whichever lane generated first, often a pool
    thread: a Ctrl-C then waited for that build (30-60 s) to end. `esft train es` builds it on the calling thread
    first (esft.es.build); the bench now does the same."""
    import threading

    import esft.kernels
    from esft import bench
    from esft.bench import iterations

    from conftest import make_tiny_model
    from test_bench import small_workload

    calls: list[bool] = []  # per call of load_decode_attention: made on the main thread?
    at_warm_up: list[list[bool]] = []
    real_warm_up = iterations.warm_up

    def load():
        calls.append(threading.current_thread() is threading.main_thread())
        return None  # no kernel: the torch ops run

    def warm_up(*args):
        at_warm_up.append(list(calls))
        return real_warm_up(*args)

    monkeypatch.setattr(esft.kernels, "load_decode_attention", load)
    monkeypatch.setattr(iterations, "warm_up", warm_up)
    bench.esft_iteration(make_tiny_model(), tokenizer, small_workload(), population=2, noise="table",
                         gen_overrides=dict(bench.FAST_GENERATION), parallel_members=2)
    assert at_warm_up == [[True]]


def test_the_report_says_when_the_attention_kernel_did_not_run(tokenizer, monkeypatch):
    """Without a C++ compiler the lean engine drops fused_attention and the screened lm_head (a warning on stderr),
    while the JSON's generation_overrides still listed both as on: nothing in the report said they never ran."""
    import esft.kernels
    from esft import bench

    from conftest import make_tiny_model
    from test_bench import small_workload

    monkeypatch.setattr(esft.kernels, "_CACHE", {})
    monkeypatch.setattr(esft.kernels, "_ERRORS", {"decode_attention": "no C++ compiler: c++ is not on PATH"})
    monkeypatch.setattr(bench, "build_workload", lambda name, tok: small_workload(name))
    monkeypatch.setattr(bench, "matmul_gflops", lambda dtype, size=2048: 10.0)
    cfg = bench.BenchConfig(workloads=["cpu-preset"], population=2, naive=False, inference=False, vllm=False,
                            rollout_dtype="float32")
    report = bench.run_bench(cfg, model=make_tiny_model(), tokenizer=tokenizer, log=lambda m: None)
    assert report["generation_overrides"]["fused_attention"] is True  # asked for
    assert report["decode_attention_kernel"] == "no C++ compiler: c++ is not on PATH"  # and why it did not run
    assert "attention kernel not used: no C++ compiler" in bench.format_table(report)


def test_overhead_fraction_of_ray_workers_divides_their_concurrent_worker_seconds(monkeypatch):
    """With --workers 2 each Ray worker perturbs, scores and restores its members, concurrently, and the executor
    sums their timings in worker-seconds (esft.es.population.merge_rows): the overhead divided
    nothing, so two workers' 2 s of perturbation counted as 2 s of the iteration's wall time instead of 1 s."""
    from esft import bench
    from esft.bench import iterations

    t = {"perturb": 2.0, "restore": 0.4, "score": 0.6, "update": 0.3, "generate": 9.0, "iteration": 10.0}
    ray = {"timings": t, "prompt_tokens": 3, "generated_tokens": 2, "texts": ["a"], "workers": 2}
    entry = bench._workload_entry({"esft": [ray], "naive": []}, [0.1], "table")[0]
    assert entry["overhead_fraction"] == round(((2.0 + 0.4 + 0.6) / 2 + 0.3) / 10, 4)
    assert entry["overhead_fraction_summed_lanes"] == round((2.0 + 0.4 + 0.6 + 0.3) / 10, 4)
    # and the Ray iteration says how many workers ran it
    import numpy as np
    import torch

    import esft.es.distributed.factory as factory
    from esft.es.executor import PopulationResult

    from test_bench import small_workload

    class Workers:  # stands in for the Ray executor: every member scored 0..1, timings in worker-seconds
        def __init__(self, **kwargs):
            pass

        def start(self):
            pass

        def evaluate_members(self, members, batch):
            return PopulationResult(scores=np.linspace(0, 1, len(members) * len(batch)).reshape(len(members), -1),
                                    well_formed=np.zeros((len(members), len(batch)), dtype=bool),
                                    texts=[[""] * len(batch)] * len(members), timings=dict(t))

        def on_update(self, update, iteration):
            pass

        def settle(self):
            pass

        def close(self):
            pass

    monkeypatch.setattr(factory, "make_ray_executor", lambda cfg, weights, builder: Workers())
    out = iterations.esft_iteration_parallel(torch.nn.Linear(2, 2), small_workload(), 2, "table", {}, 2, 1,
                                             "smollm2-135m")
    assert out["workers"] == 2


def test_vllms_log_goes_to_stderr_not_into_the_json_on_stdout(monkeypatch):
    """vLLM logs to stdout unless told otherwise (VLLM_LOGGING_STREAM): `esft bench --json > out.json` with vLLM
    installed wrote ~30 "(SpawnProcess-1 pid=...) INFO ..." lines before the JSON, so out.json did not parse."""
    import os
    import sys
    import types

    from esft.bench import inference
    from esft.es.distributed.vllm_backend import vllm_replica

    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")})
    streams: list[str | None] = []  # VLLM_LOGGING_STREAM where vLLM is first imported, and where its engine starts

    def device_type():  # esft's first import of vllm in the child (vllm.platforms configures vLLM's logging)
        streams.append(os.environ.get("VLLM_LOGGING_STREAM"))
        return "cpu"

    class LLM:
        def __init__(self, **kwargs):
            streams.append(os.environ.get("VLLM_LOGGING_STREAM"))

    fake = types.ModuleType("vllm")
    fake.LLM, fake.SamplingParams = LLM, dict
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setattr(vllm_replica, "platform_device_type", device_type)
    monkeypatch.setattr(vllm_replica, "prepare_cpu_process", lambda threads: None)
    monkeypatch.setattr(inference, "timed_vllm_generation", lambda llm, sampling, job, population: {})
    put: list = []
    inference._vllm_child(types.SimpleNamespace(put=put.append), "/m", {"w": {"prompt_ids": [[1]],
                          "max_new_tokens": 2, "min_new_tokens": 0}}, 2, "float32", 2)
    assert put and put[0][0] is True, put
    assert streams and all(s == "ext://sys.stderr" for s in streams), streams


@pytest.mark.parametrize("item", ["max_new_tokens=8", "min_new_tokens=0", "temperature=0.7", "top_p=0.9", "seed=3"])
def test_a_set_that_would_change_the_workload_on_one_side_only_is_refused(monkeypatch, capsys, item):
    """`--set max_new_tokens=8` reached the esft iteration and its pure generation only: the naive iteration (and
    vLLM, and --check-outputs) still generated the workload's 256 tokens, so speedup_vs_naive compared 8 tokens
    against 256; `--set temperature=0.7` had esft sample while the naive iteration decoded greedily."""
    assert _main_without_model(monkeypatch, ["bench", "--workloads", "cpu-preset", "--set", item]) == 2
    key = item.split("=")[0]
    assert f"--set {key}: the workload's, not an engine option" in capsys.readouterr().err


def test_a_batch_size_override_with_ray_workers_is_refused_before_the_model_loads(monkeypatch, capsys):
    """`--workers 2 --set batch_size=8` loaded the model, timed the matmul and built the workload, then the
    replicas' ESConfig refused batch_size (it is ESConfig.generation_batch_size there, the workload's)."""
    assert _main_without_model(monkeypatch, ["bench", "--workloads", "cpu-preset", "--workers", "2",
                                             "--set", "batch_size=8"]) == 2
    assert "--set batch_size: not with --workers" in capsys.readouterr().err


@pytest.mark.parametrize("layout", [{"noise": "lowrank"}, {"workers": 2}])
def test_a_low_rank_or_ray_bench_records_the_rollout_request_as_made(layout):
    """With --noise lowrank or --workers the members run fp32 rollouts whatever --rollout-dtype says; the report
    recorded `rollout_dtype_requested: float32` for a user who asked for auto."""
    from esft.bench import BenchConfig, bench_precision

    config = BenchConfig(workloads=["cpu-preset"], **layout)
    precision = bench_precision(config)
    assert config.rollout_dtype == "auto"
    record = precision.record()
    assert record["rollout_dtype"] == "float32" and record["rollout_dtype_requested"] == "auto"
    assert "local member lanes only" in record["rollout_dtype_reason"]
    asked = bench_precision(BenchConfig(workloads=["cpu-preset"], rollout_dtype="float32", **layout)).record()
    assert (asked["rollout_dtype_requested"], asked["rollout_dtype_reason"]) == ("float32", "requested")
    local = bench_precision(BenchConfig(workloads=["cpu-preset"]), flags=["avx512_bf16"], probe=lambda: 1.9)
    assert local.record()["rollout_dtype_requested"] == "auto" and local.dtype in ("bfloat16", "float32")


@pytest.mark.parametrize("flags, words", [
    (["--no-inference", "--vllm"], "--vllm: vLLM is timed in the pure-generation comparison, which --no-inference"),
    (["--noise", "lowrank", "--vllm"], "--vllm: not with --noise lowrank"),
    (["--noise", "lowrank", "--inference"], "--inference: not with --noise lowrank"),
    (["--workers", "2", "--inference"], "--inference: not with --workers 2"),
    (["--noise", "lowrank", "--parallel-members", "2"], "--parallel-members: not with --noise lowrank"),
    (["--workers", "2", "--parallel-members", "2"], "--parallel-members: not with --workers 2"),
    (["--workers", "2", "--compare-fp32"], "--compare-fp32: not with --workers 2: its rollouts are fp32"),
    (["--rollout-dtype", "float32", "--compare-fp32"], "the rollouts are fp32 already (--rollout-dtype float32)"),
    (["--exact", "--compare-fp32"], "the rollouts are fp32 already (--exact)"),
    (["--rank", "4"], "--rank 4: only --noise lowrank reads it (noise 'table' draws full-rank perturbations)"),
])
def test_a_typed_flag_the_run_would_ignore_is_refused_before_the_model_loads(monkeypatch, capsys, flags, words):
    """`--no-inference --vllm` ran without timing vLLM and without a word (the parser gave every flag its default,
    so a typed one could not be told apart); so did --rank without low-rank noise, --compare-fp32 with fp32
    rollouts, and --inference, --vllm or --parallel-members 2 with a low-rank population or Ray workers."""
    import esft.bench.inference

    monkeypatch.setattr(esft.bench.inference, "vllm_available", lambda: True)
    assert _main_without_model(monkeypatch, ["bench", "--workloads", "cpu-preset", *flags]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_vllm_asked_for_where_it_is_not_installed_is_refused_before_the_model_loads(monkeypatch, capsys):
    """`--vllm` without vLLM in this environment ran and reported "vllm": "not installed" after the whole bench."""
    import esft.bench.inference

    monkeypatch.setattr(esft.bench.inference, "vllm_available", lambda: False)
    assert _main_without_model(monkeypatch, ["bench", "--workloads", "cpu-preset", "--vllm"]) == 2
    assert "--vllm: vLLM is not installed in this Python environment" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [
    [], ["--no-inference", "--no-vllm"], ["--noise", "lowrank", "--rank", "4", "--parallel-members", "1"],
    ["--noise", "lowrank", "--no-inference", "--no-compare-fp32"], ["--workers", "2", "--no-vllm"],
    ["--vllm", "--compare-fp32", "--parallel-members", "2"], ["--exact", "--rollout-dtype", "auto", "--compare-fp32"],
])
def test_flags_that_take_effect_or_ask_for_nothing_still_run(monkeypatch, flags):
    """A false value (`--no-vllm`, `--parallel-members 1`) asks for nothing the run ignores, and a flag the run
    reads passes; the defaults the user did not type reach run_bench as before."""
    import esft.bench
    import esft.bench.inference
    from esft.cli import main

    seen = []
    monkeypatch.setattr(esft.bench.inference, "vllm_available", lambda: True)
    monkeypatch.setattr(esft.bench, "run_bench", lambda config, log: seen.append(config) or {"workloads": {}})
    assert main(["bench", "--workloads", "cpu-preset", "--json", *flags]) == 0
    assert seen[0].repeats == 1 and seen[0].population == 4 and seen[0].workloads == ["cpu-preset"]
    assert seen[0].rank == (4 if "--rank" in flags else 1)


@pytest.mark.parametrize("threads, warned", [(3, True), (2, False)])
def test_more_threads_than_cores_is_said_before_the_bench_runs(monkeypatch, recwarn, threads, warned):
    """`--threads 64` on a 2-core machine ran oversubscribed and reported its rates and timings as the machine's,
    without a word."""
    import esft.bench
    import esft.es.distributed.factory
    from esft.cli import main

    monkeypatch.setattr(esft.es.distributed.factory, "machine_cores", lambda: 2)
    seen = []
    monkeypatch.setattr(esft.bench, "run_bench", lambda config, log: seen.append(config) or {"workloads": {}})
    assert main(["bench", "--workloads", "cpu-preset", "--threads", str(threads), "--json"]) == 0
    said = [str(w.message) for w in recwarn if "cores this process may run on" in str(w.message)]
    assert seen[0].threads == threads
    assert said == (["--threads 3 is more than the 2 cores this process may run on: threads share cores, so the "
                     "matmul rates and the timings measure that oversubscription"] if warned else [])


def test_ray_workers_without_ray_are_refused_before_the_model_loads(monkeypatch, capsys):
    """`esft bench --workers 2` where Ray is not installed loaded the model, timed the matmul and built the
    workload, then ended in an ImportError traceback (exit status 1)."""
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails, as where it is not installed
    assert _main_without_model(monkeypatch, ["bench", "--workloads", "cpu-preset", "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert "--workers: the workers are Ray processes, and Ray is not installed: pip install 'esft[ray]'" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_low_rank_bench_records_its_rank():
    """The report of `esft bench --noise lowrank --rank 4` said "noise lowrank" and nothing of the rank it timed."""
    import torch

    from esft import bench

    model = torch.nn.Linear(2, 2)
    head = bench._report_head(bench.BenchConfig(noise="lowrank", rank=4), model, torch.float32, {})
    assert head["rank"] == 4
    assert bench._report_head(bench.BenchConfig(noise="table"), model, torch.float32, {})["rank"] is None
    head.update(matmul_gflops=1.0, cpu={"model": "x"})
    assert "noise lowrank (rank 4);" in bench.format_table(head)
