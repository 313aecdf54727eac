"""Which precision ES rollouts run in on this machine: bf16 where the CPU multiplies bf16 natively, fp32 elsewhere.

Why: on CPUs with bf16 dot-product instructions (AVX512-BF16, AMX) oneDNN's bf16 matmul runs ~2x (small batch)
to ~3-4x (large) the fp32 rate and moves half the bytes, while on CPUs without them it is emulated and slower
than fp32. So `auto` picks bf16 only when the CPU's flags name a native bf16 instruction *and* a start-up
micro-benchmark (a decode-shaped packed matmul in both dtypes) confirms bf16 is faster here; "float32" is the exact
mode and always available. Only the rollouts change: masters, noise, fitness shaping and updates stay fp32
(esft.es.noise.MasterWeights rounds master + sigma * eps to bf16 once per member).

`resolve_rollout_dtype` is a pure function of its inputs (flags, probe result, kernel check, request), so both
branches are tested on any machine with mocked flags, probes and kernel checks.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import torch

ROLLOUT_DTYPES = ("auto", "float32", "bfloat16")
#: /proc/cpuinfo flags of native bf16 dot products (x86); Arm's "bf16" (FEAT_BF16) is listed as well
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
#: bf16 must beat fp32 by this factor in the start-up probe for `auto` to pick it (noise margin)
MIN_PROBE_SPEEDUP = 1.2


def cpu_flags() -> list[str]:
    """This CPU's feature flags (Linux /proc/cpuinfo 'flags' or 'Features'); empty elsewhere (esft.kernels reads
    them)."""
    from esft import kernels

    return kernels.cpu_flags()


def native_bf16_flags(flags: Iterable[str]) -> list[str]:
    """The flags among `flags` that mean a native bf16 dot product."""
    have = set(flags)
    return [f for f in NATIVE_BF16_FLAGS if f in have]


def _best_times(fns: dict[Any, Callable[[], object]], reps: int, calls: int) -> dict[Any, float]:
    """Each function's fastest of `reps` timings of `calls` calls, after one untimed call of each; the functions'
    timings alternate, so that a busy moment slows each alike."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(reps):
        for key, fn in fns.items():
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            best[key] = min(best[key], time.perf_counter() - t)
    return best


@functools.lru_cache(maxsize=1)
def probe_bf16_speedup(rows: int = 16, out: int = 1536, inner: int = 576, reps: int = 20,
                       calls: int = 8) -> float | None:
    """fp32 time / bf16 time of a decode-shaped packed linear ([rows, inner] x [inner, out], the rollout's
    kind of matmul) on one torch thread; None where oneDNN's packed linear or bf16 is missing. ~0.3 s, once per
    process.

    One thread, because the question is the arithmetic (native or emulated bf16), and a parallel call this short
    waits on any thread another process has descheduled: with two threads on a busy 2-core AMX Xeon the probe
    read anywhere from 0.03x to 386x, and 0.05x once at a bench's start, which chose fp32 rollouts there; one
    thread, with the two dtypes' timings alternated, read 4.7-6.7x busy or idle (docs/performance.md, "The bf16
    probe on one thread")."""
    from esft.generation.packed import pack_weight, packed_linear, packed_linear_reason

    if packed_linear_reason(torch.bfloat16) is not None:
        return None
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(out, inner, generator=gen)
    x = torch.randn(rows, inner, generator=gen)
    fns = {}
    for dtype in (torch.float32, torch.bfloat16):
        packed = pack_weight(w.to(dtype), rows)  # the rollouts' own path: the AMX linear for bf16 where it runs
        fns[dtype] = functools.partial(packed_linear, x.to(dtype), packed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = _best_times(fns, reps, calls)
    finally:
        torch.set_num_threads(threads)
    return times[torch.float32] / max(times[torch.bfloat16], 1e-12)


def emulated_bf16_warning(flags: Iterable[str], onednn: bool) -> str | None:
    """What to tell a run that asked for bf16 rollouts on this CPU, or None where bf16 is native. `flags`: the CPU's
    (empty where they could not be read: then nothing is claimed of them); `onednn`: whether torch's oneDNN has a
    bf16 matmul at all."""
    flags = list(flags)
    fix = "--rollout-dtype auto or float32 rolls out in fp32 here"
    if not onednn:
        return ("rollout_dtype 'bfloat16': torch's oneDNN has no bf16 matmul on this CPU, so the members leave the "
                "packed fast path and run bf16 emulated, many times slower than fp32 rollouts (docs/performance.md); "
                + fix)
    if flags and not native_bf16_flags(flags):
        return (f"rollout_dtype 'bfloat16' on a CPU without a native bf16 dot product (none of "
                f"{', '.join(NATIVE_BF16_FLAGS)} in its flags): oneDNN emulates bf16 here, slower than fp32; " + fix)
    return None


@dataclass(frozen=True)
class RolloutPrecision:
    """What `resolve_rollout_dtype` chose, and why (recorded in the run directory)."""

    dtype: str
    """"float32" or "bfloat16": the dtype of the rollout weights"""
    requested: str
    reason: str
    native_flags: tuple[str, ...] = ()
    probe_speedup: float | None = None
    warning: str | None = None
    """what the run should warn of (bf16 asked for on a CPU that would emulate it), or None"""

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.dtype == "bfloat16" else torch.float32

    def record(self) -> dict[str, object]:
        return {"rollout_dtype": self.dtype, "rollout_dtype_requested": self.requested,
                "rollout_dtype_reason": self.reason, "cpu_native_bf16_flags": list(self.native_flags),
                "bf16_probe_speedup": None if self.probe_speedup is None else round(self.probe_speedup, 3),
                "rollout_dtype_warning": self.warning}


def fast_path(generation_options: Mapping[str, object]) -> bool:
    """bf16 rollouts run on the lean engine's packed, fused path (bf16 oneDNN weights, fp32 activations)."""
    return bool(generation_options.get("packed_linear")) and bool(generation_options.get("fused_attention"))


def fused_kernel_reason() -> str | None:
    """Why the compiled decode-attention kernel (esft.kernels), without which bf16 weights leave the packed fused
    path for HF's bf16 forward, cannot run here (no C++ compiler, a failed build, ESFT_NO_KERNELS), or None; builds
    it on first use."""
    from esft.generation.lean_step import fused_attention_reason

    return fused_attention_reason(torch.bfloat16)


def resolve_rollout_dtype(requested: str | None, *, device: str | None = "cpu",
                          generation_options: Mapping[str, object] | None = None,
                          flags: Iterable[str] | None = None,
                          probe: Callable[[], float | None] | None = None,
                          onednn: bool | None = None,
                          kernel: Callable[[], str | None] | None = None) -> RolloutPrecision:
    """The rollout dtype of a run. `requested`: "float32" (exact, always), "bfloat16" (always, even where slow),
    "auto" (bf16 when the device is a CPU, the rollouts take the packed fused path, the CPU's `flags` name a
    native bf16 dot product, `probe()` (fp32 / bf16 time) is at least MIN_PROBE_SPEEDUP and `kernel()` finds the
    fused-attention kernel built; fp32 otherwise). None means "float32" (run directories made before this option
    existed). `flags` / `probe` / `kernel` default to this machine's (`cpu_flags`, `probe_bf16_speedup`,
    `fused_kernel_reason`), `onednn` whether torch's oneDNN has a bf16 matmul (`esft.generation.packed.onednn_bf16`);
    tests pass their own."""
    requested = "float32" if requested is None else str(requested)
    if requested not in ROLLOUT_DTYPES:
        raise ValueError(f"unknown rollout_dtype {requested!r}; choose one of {ROLLOUT_DTYPES}")
    on_cpu = device in (None, "cpu") or str(device).startswith("cpu")
    if requested == "bfloat16" and on_cpu:  # honoured as asked, but a slow run should not be a surprise
        from esft.generation.packed import onednn_bf16

        flags = cpu_flags() if flags is None else flags
        return RolloutPrecision(requested, requested, "requested",
                                warning=emulated_bf16_warning(flags, onednn_bf16() if onednn is None else onednn))
    if requested != "auto":
        return RolloutPrecision(requested, requested, "requested")
    if not on_cpu:
        return RolloutPrecision("float32", requested, f"device {device}: bf16 rollouts are a CPU option")
    if not fast_path(generation_options or {}):
        return RolloutPrecision("float32", requested, "generation_options lack packed_linear + fused_attention")
    native = tuple(native_bf16_flags(cpu_flags() if flags is None else flags))
    if not native:
        return RolloutPrecision("float32", requested, "no native bf16 dot product in the CPU flags")
    speedup = (probe_bf16_speedup if probe is None else probe)()
    if speedup is None:
        return RolloutPrecision("float32", requested, "torch's oneDNN has no bf16 packed linear", native)
    if speedup < MIN_PROBE_SPEEDUP:
        return RolloutPrecision("float32", requested, f"bf16 probe only {speedup:.2f}x fp32", native, speedup)
    # last, as it may build the kernel: without it bf16 weights take neither the packed linears the probe timed nor
    # the fused attention (esft.generation.lean), but HF's bf16 forward
    why = (fused_kernel_reason if kernel is None else kernel)()
    if why is not None:
        return RolloutPrecision("float32", requested, f"fused_attention cannot run here: {why}", native, speedup)
    return RolloutPrecision("bfloat16", requested, f"native bf16 ({', '.join(native)}), probe {speedup:.2f}x fp32",
                            native, speedup)
