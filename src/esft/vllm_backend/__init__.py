"""vLLM generation backend for ES (`--executor ray --worker-backend vllm`; `pip install 'esft[vllm]'`, GPUs only).

extension  ESWorkerExtension: perturb / restore / update in place inside a vLLM engine (worker_extension_cls)
replica    VLLMReplica: one engine per GPU as a Ray actor, driven by esft.es.ray_executor.RayExecutor

Nothing here imports vLLM at import time; `require_vllm()` says clearly what is missing.
"""

from __future__ import annotations

import importlib.util

from esft.vllm_backend.extension import EXTENSION_PATH, ESWorkerExtension, UnsupportedLayout, hf_views
from esft.vllm_backend.replica import EngineWeights, VLLMReplica, make_llm, sampling_fields


def vllm_unavailable_reason() -> str | None:
    """None when this machine can run the vLLM backend, else why not (for errors and test skips)."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install 'esft[vllm]' on a machine with NVIDIA GPUs)"
    import torch

    if not torch.cuda.is_available():
        return "the vLLM backend needs a CUDA GPU and this machine has none (use --worker-backend hf)"
    return None


def require_vllm() -> None:
    reason = vllm_unavailable_reason()
    if reason:
        raise RuntimeError(f"worker_backend 'vllm' is not available here: {reason}")


__all__ = ["EXTENSION_PATH", "ESWorkerExtension", "EngineWeights", "UnsupportedLayout", "VLLMReplica", "hf_views",
           "make_llm", "require_vllm", "sampling_fields", "vllm_unavailable_reason"]
