"""`make_executor(config, ...)`: the executor an `ESConfig` asks for (`executor: local | ray`,
`worker_backend: hf | vllm`). Ray and vLLM are imported only when asked for."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from esft.es.config import ESConfig
from esft.es.executor import Executor, LocalExecutor
from esft.es.noise import MasterWeights

EXECUTORS = ("local", "ray")
WORKER_BACKENDS = ("hf", "vllm")
RAY_OPTIONS = {"threads_per_worker", "checksum_every", "start_timeout_s", "num_cpus_per_worker", "use_gpu"}
VLLM_OPTIONS = {"gpu_memory_utilization", "enforce_eager", "max_model_len", "vllm_kwargs"}


def make_executor(config: ESConfig, *, model: Any, tokenizer: Any, weights: MasterWeights, task: Any,
                  gen_config: Any, generate_fn: Any = None, optimizer: Any = None) -> Executor:
    if config.executor not in EXECUTORS:
        raise ValueError(f"unknown executor {config.executor!r}; choose one of {EXECUTORS}")
    if config.worker_backend not in WORKER_BACKENDS:
        raise ValueError(f"unknown worker_backend {config.worker_backend!r}; choose one of {WORKER_BACKENDS}")
    if config.noise == "lowrank" and config.executor != "local":
        # replicas would evaluate members one by one on materialised weights, not bit-identical to the batched pass
        raise ValueError("noise 'lowrank' evaluates the population in one batched pass: use --executor local")
    if int(config.parallel_members) < 1:
        raise ValueError(f"parallel_members must be >= 1, got {config.parallel_members}")
    if config.parallel_members > 1 and (config.executor != "local" or config.noise == "lowrank"):
        # a layout option (results do not depend on it) that presets set for the local executor: not an error
        where = "the Ray executor spreads members over workers (num_workers)" if config.executor != "local" \
            else "a low-rank population is one batched pass"
        warnings.warn(f"parallel_members={config.parallel_members} ignored: {where}", stacklevel=2)
    if config.executor == "local":
        if config.worker_backend != "hf":
            raise ValueError("worker_backend 'vllm' runs vLLM engines as Ray actors: use --executor ray")
        if config.noise == "lowrank":
            from esft.es.lowrank import LowRankExecutor

            return LowRankExecutor(model, tokenizer, weights, task, config.sigma, gen_config, generate_fn=generate_fn)
        return LocalExecutor(model, tokenizer, weights, task, config.sigma, gen_config, generate_fn=generate_fn,
                             parallel_members=config.parallel_members)
    return make_ray_executor(config, weights=weights, optimizer=optimizer, generate_fn=generate_fn, model=model)


def make_ray_executor(config: ESConfig, *, weights: MasterWeights, optimizer: Any = None, generate_fn: Any = None,
                      builder: Any = None, model: Any = None, **overrides: Any):
    from esft.es.ray_executor import RayExecutor
    from esft.es.replica import HFReplica, ReplicaSpec

    opts = dict(config.executor_options)
    unknown = set(opts) - RAY_OPTIONS - VLLM_OPTIONS
    if unknown:
        raise ValueError(f"unknown executor_options {sorted(unknown)}; known: {sorted(RAY_OPTIONS | VLLM_OPTIONS)}")
    threads = int(opts.get("threads_per_worker", 1 if (config.device or "cpu") == "cpu" else 0))
    spec = ReplicaSpec(config=config, builder=builder, generate_fn=generate_fn, threads=threads,
                       options={k: v for k, v in opts.items() if k in VLLM_OPTIONS})
    replica_cls: type = HFReplica
    if config.worker_backend == "vllm":
        if generate_fn is not None:
            raise ValueError("worker_backend 'vllm' generates with vLLM; a custom generate_fn cannot be used")
        from esft.vllm_backend import VLLMReplica, require_vllm

        require_vllm()
        if config.optimizer != "sgd":
            raise ValueError("worker_backend 'vllm' supports optimizer 'sgd' only (no optimizer state in engines)")
        # vLLM fuses and pads some tensors; the engine maps Hugging Face names onto its own from these shapes
        shapes = {n: list(p.shape) for n, p in (model.named_parameters() if model is not None
                                                  else weights.params.items())}
        spec.options["layout"] = {"selected": weights.names, "shapes": shapes}
        replica_cls = VLLMReplica
    actor_options = {}
    if "num_cpus_per_worker" in opts:
        actor_options["num_cpus"] = opts["num_cpus_per_worker"]
    kwargs = dict(num_workers=config.num_workers, address=config.ray_address,
                  checksum_every=int(opts.get("checksum_every", 10)),
                  event_log=Path(config.output_dir) / "metrics.jsonl", replica_cls=replica_cls,
                  actor_options=actor_options, use_gpu=opts.get("use_gpu"),
                  start_timeout_s=float(opts.get("start_timeout_s", 1800)))
    kwargs.update(overrides)
    return RayExecutor(spec, weights, optimizer, **kwargs)
