"""The rollout precision dispatch (esft.generation.precision) in detail: the CPU flags read from /proc/cpuinfo, the
probe's ratio, what a choice records, and the edges of `auto` (device names, the probe threshold).

Run: pytest -q tests/test_rollout_precision.py   (~1 s)
"""

from __future__ import annotations

import functools
import io

import pytest
import torch

from esft.config import FAST_CPU_GENERATION
from esft.generation import packed, precision

FAST = dict(FAST_CPU_GENERATION)
AMX = ["avx512f", "amx_bf16"]


@pytest.fixture(autouse=True)
def _kernel_built(monkeypatch):
    """The machines of these tests are mocked (flags, probe): so is whether the fused-attention kernel builds."""
    monkeypatch.setattr(precision, "fused_kernel_reason", lambda: None, raising=False)


def _cpuinfo(monkeypatch, text: str | None) -> None:
    """Make `cpu_flags` read `text` as /proc/cpuinfo (None: the file cannot be opened)."""
    def fake_open(path, *args, **kwargs):
        assert path == "/proc/cpuinfo"
        if text is None:
            raise FileNotFoundError(path)
        return io.StringIO(text)

    from esft import kernels

    monkeypatch.setattr(kernels, "open", fake_open, raising=False)  # the one reader of /proc/cpuinfo


def test_cpu_flags_are_read_from_the_x86_flags_or_the_arm_features_line(monkeypatch):
    """x86 lists its flags on a 'flags\\t\\t:' line, Arm on 'Features\\t:'; tabs and repeated spaces separate
    nothing but the words, and the first such line is the one read."""
    _cpuinfo(monkeypatch, "processor\t: 0\nmodel name\t: x\nflags\t\t: fpu  avx512f\tavx512_bf16\n"
                          "flags\t\t: other\n")
    assert precision.cpu_flags() == ["fpu", "avx512f", "avx512_bf16"]
    _cpuinfo(monkeypatch, "processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\nCPU part\t: 0xd4f\n")
    assert precision.cpu_flags() == ["fp", "asimd", "bf16", "i8mm"]
    assert precision.native_bf16_flags(precision.cpu_flags()) == ["bf16"]  # Arm's FEAT_BF16 counts


def test_cpu_flags_are_empty_without_a_readable_cpuinfo_or_a_flags_line(monkeypatch):
    """A machine without /proc/cpuinfo (macOS, Windows) or without a flags line reports no flags: fp32."""
    _cpuinfo(monkeypatch, None)
    assert precision.cpu_flags() == []
    assert precision.resolve_rollout_dtype("auto", generation_options=FAST, probe=lambda: 3.0).dtype == "float32"
    _cpuinfo(monkeypatch, "processor\t: 0\nvendor_id\t: x\n")
    assert precision.cpu_flags() == []


def test_probe_is_fp32_time_over_bf16_time(monkeypatch):
    """The probe's number is fp32 time / bf16 time of the same packed linear run in each dtype (a bf16 run twice as
    fast reads 2.0), and None where oneDNN has no bf16 packed linear (without timing anything)."""
    if packed.packed_linear_reason(torch.bfloat16) is not None:
        pytest.skip("this torch has no bf16 packed linear")
    seen = []

    def fake_times(fns, reps, calls):
        threads = torch.get_num_threads()
        out = {}
        for key, fn in fns.items():
            dtype = fn().dtype  # the output of the timed linear says which dtype ran
            assert key == dtype
            seen.append((dtype, threads))
            out[key] = {torch.float32: 0.006, torch.bfloat16: 0.002}[dtype]
        return out

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setattr(precision, "_best_times", fake_times)
        assert precision.probe_bf16_speedup.__wrapped__() == pytest.approx(3.0)
        assert torch.get_num_threads() == 2  # the caller's threads are back
    finally:
        torch.set_num_threads(before)
    assert sorted((str(d), t) for d, t in seen) == [("torch.bfloat16", 1), ("torch.float32", 1)]  # on one thread
    monkeypatch.setattr(packed, "packed_linear_reason", lambda dtype: "no bf16 here")
    assert precision.probe_bf16_speedup.__wrapped__() is None
    assert len(seen) == 2


def test_the_probe_alternates_the_dtypes_timings():
    """A busy moment must slow both dtypes alike: each rep times every function in turn, `calls` calls each."""
    order = []
    fns = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    best = precision._best_times(fns, reps=3, calls=2)
    assert order == ["a", "b"] + ["a", "a", "b", "b"] * 3  # one untimed call each, then alternated reps
    assert set(best) == {"a", "b"} and all(0 <= t < 1 for t in best.values())


def test_best_times_are_the_fastest_of_the_timed_runs_after_a_warm_up(monkeypatch):
    """`_best_times` runs each function once untimed, then `reps` timed runs of `calls` calls, and keeps each
    function's shortest."""
    # reps of (a, b): (5, 2), (1, 4), (3, 1) s
    clock = iter([0.0, 5.0, 10.0, 12.0, 20.0, 21.0, 30.0, 34.0, 40.0, 43.0, 50.0, 51.0])
    monkeypatch.setattr(precision.time, "perf_counter", lambda: next(clock))
    calls = []
    best = precision._best_times({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 3, 2)
    assert best == {"a": 1.0, "b": 1.0}
    assert calls.count("a") == calls.count("b") == 1 + 3 * 2


def test_choices_record_what_was_requested_chosen_and_why():
    """The run directory records the dtype, the request, the reason, the native flags and the probe (rounded to
    3 places), for a bf16 choice and for each fp32 fallback that got as far as reading flags or probing."""
    resolve = precision.resolve_rollout_dtype
    chosen = resolve("auto", generation_options=FAST, flags=AMX, probe=lambda: 2.34567)
    assert chosen.record() == {"rollout_dtype": "bfloat16", "rollout_dtype_requested": "auto",
                               "rollout_dtype_reason": "native bf16 (amx_bf16), probe 2.35x fp32",
                               "cpu_native_bf16_flags": ["amx_bf16"], "bf16_probe_speedup": 2.346,
                               "rollout_dtype_warning": None}
    slow = resolve("auto", generation_options=FAST, flags=AMX, probe=lambda: 1.1)
    assert (slow.native_flags, slow.probe_speedup, slow.torch_dtype) == (("amx_bf16",), 1.1, torch.float32)
    missing = resolve("auto", generation_options=FAST, flags=AMX, probe=lambda: None)
    assert missing.native_flags == ("amx_bf16",) and missing.record()["bf16_probe_speedup"] is None
    asked = resolve("float32", generation_options=FAST, flags=AMX, probe=lambda: 3.0)
    assert asked.record()["rollout_dtype_requested"] == "float32" and asked.reason == "requested"
    assert asked.torch_dtype == torch.float32


def test_auto_needs_both_packed_linear_and_fused_attention():
    """bf16 rollouts exist only on the lean engine's packed, fused path: one of the two options is not enough."""
    for options in ({"packed_linear": True}, {"fused_attention": True}, {**FAST, "packed_linear": False}):
        assert not precision.fast_path(options)
        assert precision.resolve_rollout_dtype("auto", generation_options=options, flags=AMX,
                                               probe=lambda: 3.0).dtype == "float32"
    assert precision.fast_path(FAST)


def test_auto_needs_the_fused_attention_kernel_and_asks_for_it_last():
    """Without the compiled kernel (no compiler, a failed build, ESFT_NO_KERNELS) bf16 weights leave the packed fused
    path: `auto` keeps fp32 and records why. The check may build the kernel, so it comes after every other test of
    the choice: a CPU without native bf16, or a probe that says no, never asks for it."""
    asked = []

    def kernel(why):
        return lambda: asked.append(why) or why

    missing = precision.resolve_rollout_dtype("auto", generation_options=FAST, flags=AMX, probe=lambda: 2.5,
                                              kernel=kernel("no C++ compiler: c++ is not on PATH"))
    assert (missing.dtype, missing.native_flags, missing.probe_speedup) == ("float32", ("amx_bf16",), 2.5)
    assert missing.reason == "fused_attention cannot run here: no C++ compiler: c++ is not on PATH"
    built = precision.resolve_rollout_dtype("auto", generation_options=FAST, flags=AMX, probe=lambda: 2.5,
                                            kernel=kernel(None))
    assert built.dtype == "bfloat16" and asked == ["no C++ compiler: c++ is not on PATH", None]
    for flags, speedup in ((["avx2"], 3.0), (AMX, 1.1), (AMX, None)):
        assert precision.resolve_rollout_dtype("auto", generation_options=FAST, flags=flags, probe=lambda: speedup,
                                               kernel=kernel("unused")).dtype == "float32"
    assert precision.resolve_rollout_dtype("bfloat16", generation_options=FAST, flags=AMX, onednn=True,
                                           kernel=kernel("unused")).dtype == "bfloat16"
    assert "unused" not in asked


@pytest.mark.parametrize("device,dtype", [(None, "bfloat16"), ("cpu", "bfloat16"), ("cpu:0", "bfloat16"),
                                          (torch.device("cpu"), "bfloat16"), (torch.device("cuda"), "float32"),
                                          ("cuda:0", "float32"), ("meta", "float32")])
def test_auto_counts_every_spelling_of_the_cpu(device, dtype):
    """No device, "cpu", an indexed "cpu:0" and a torch.device are all the CPU, where `auto` may pick bf16; any
    other device, as a string or a torch.device, rolls out in fp32."""
    assert precision.resolve_rollout_dtype("auto", device=device, generation_options=FAST, flags=AMX,
                                           probe=lambda: 2.0).dtype == dtype


@pytest.mark.parametrize("speedup,dtype", [(1.19, "float32"), (1.2, "bfloat16"), (1.3, "bfloat16"),
                                           (150.0, "bfloat16")])
def test_auto_takes_bf16_from_a_probe_of_at_least_min_speedup(speedup, dtype):
    """The probe threshold is MIN_PROBE_SPEEDUP = 1.2, inclusive, with no upper bound."""
    assert precision.MIN_PROBE_SPEEDUP == 1.2
    assert precision.resolve_rollout_dtype("auto", generation_options=FAST, flags=AMX,
                                           probe=lambda: speedup).dtype == dtype


def test_native_flags_are_listed_once_in_a_fixed_order():
    """The recorded native flags do not depend on where or how often /proc/cpuinfo lists them."""
    assert precision.native_bf16_flags(["amx_bf16", "sse", "avx512_bf16", "amx_bf16"]) == ["avx512_bf16", "amx_bf16"]
    chosen = precision.resolve_rollout_dtype("auto", generation_options=FAST, flags=["bf16", "amx_bf16"],
                                             probe=lambda: 2.0)
    assert chosen.native_flags == ("amx_bf16", "bf16")
    assert chosen.record()["cpu_native_bf16_flags"] == ["amx_bf16", "bf16"]


def _never():
    raise AssertionError("the probe must not run")


def test_auto_without_generation_options_is_fp32_unprobed():
    """No generation options at all means neither fast kernel: fp32, decided before the flags or the probe."""
    chosen = precision.resolve_rollout_dtype("auto", generation_options=None, flags=AMX, probe=_never)
    assert chosen.dtype == "float32" and "packed_linear" in chosen.reason
    assert chosen.record()["cpu_native_bf16_flags"] == [] and chosen.probe_speedup is None


def test_explicit_requests_record_themselves_on_any_device():
    """"bfloat16" and "float32" are honoured on any device and options, recorded as requested, unprobed."""
    for requested in ("bfloat16", "float32"):
        chosen = precision.resolve_rollout_dtype(requested, device="cuda", generation_options={}, flags=[],
                                                 probe=_never)
        assert chosen.record() == {"rollout_dtype": requested, "rollout_dtype_requested": requested,
                                   "rollout_dtype_reason": "requested", "cpu_native_bf16_flags": [],
                                   "bf16_probe_speedup": None, "rollout_dtype_warning": None}
        assert chosen.torch_dtype == {"bfloat16": torch.bfloat16, "float32": torch.float32}[requested]


def test_probe_survives_a_bf16_time_of_zero(monkeypatch):
    """A bf16 run below the clock's resolution reads as a huge speedup, not a division by zero."""
    if packed.packed_linear_reason(torch.bfloat16) is not None:
        pytest.skip("this torch has no bf16 packed linear")
    monkeypatch.setattr(precision, "_best_times", lambda fns, reps, calls: {
        key: 0.0 if fn().dtype == torch.bfloat16 else 0.003 for key, fn in fns.items()})
    assert precision.probe_bf16_speedup.__wrapped__() == pytest.approx(0.003 / 1e-12)


def test_bf16_asked_for_on_a_cpu_that_would_emulate_it_is_honoured_with_a_warning():
    """"bfloat16" is honoured everywhere, but where the CPU has no native bf16 its rollouts are emulated, slower
    than fp32 (many times, where torch's oneDNN has no bf16 matmul at all and the fast path is dropped): the choice
    carries a warning that says so and what to run instead; nowhere else does it."""
    resolve = functools.partial(precision.resolve_rollout_dtype, "bfloat16", generation_options=FAST, probe=_never)
    plain_avx512 = resolve(flags=["avx2", "avx512f"], onednn=True)
    assert plain_avx512.dtype == "bfloat16" and plain_avx512.reason == "requested"
    assert "oneDNN emulates bf16" in plain_avx512.warning and "--rollout-dtype auto or float32" in plain_avx512.warning
    assert "avx512_bf16, amx_bf16, bf16" in plain_avx512.warning  # every flag that would count, Arm's too
    no_onednn = resolve(flags=["avx2", "fma"], onednn=False)
    assert "no bf16 matmul" in no_onednn.warning and "many times slower" in no_onednn.warning
    assert no_onednn.record()["rollout_dtype_warning"] == no_onednn.warning  # the run directory keeps it
    # flags that name native bf16 but a torch without oneDNN bf16 is just as slow: warned by the second cause
    assert "no bf16 matmul" in resolve(flags=AMX, onednn=False).warning
    for flags in (["avx512f", "avx512_bf16"], AMX, ["asimd", "bf16"], []):  # [] : flags unreadable, nothing claimed
        assert resolve(flags=flags, onednn=True).warning is None
    assert resolve(device="cpu:0", flags=["avx2"], onednn=True).warning is not None
    assert resolve(device="cuda", flags=[], onednn=False).warning is None  # not a CPU option there
    for requested in ("float32", "auto"):
        assert precision.resolve_rollout_dtype(requested, generation_options=FAST, flags=["avx2"],
                                               probe=lambda: None, onednn=False).warning is None
