"""`make_executor(config, ...)`: the executor an `ESConfig` asks for (`executor: local | ray`,
`worker_backend: hf | vllm`). Ray and vLLM are imported only when asked for. `esft.api.train_es` hands it to
the trainer as its `executor_factory`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from esft.es.build import VLLM_OPTIONS, check_executor_options, check_layout, make_local_executor, make_strategy
from esft.es.distributed.connection import workers_use_gpu
from esft.es.es_config import ESConfig
from esft.es.executor import Executor
from esft.es.noise import MasterWeights
from esft.es.strategy import ES


def make_executor(config: ESConfig, *, model: Any, tokenizer: Any, weights: MasterWeights, task: Any,
                  gen_config: Any, generate_fn: Any = None, optimizer: Any = None,
                  strategy: ES | None = None, owns_ray: bool = False) -> Executor:
    """`strategy`: the driver's, whose sigma a local executor reads (default: one built from the config).
    `owns_ray`: the Ray connection was made for this run (`connect`), so the executor shuts it down on close."""
    check_layout(config)
    if config.executor == "local":
        return make_local_executor(config, model=model, tokenizer=tokenizer, weights=weights, task=task,
                                   strategy=strategy if strategy is not None else make_strategy(config),
                                   gen_config=gen_config, generate_fn=generate_fn)
    return make_ray_executor(config, weights=weights, optimizer=optimizer, generate_fn=generate_fn, model=model,
                             owns_ray=owns_ray)


def connect(config: ESConfig) -> bool:
    """Join the Ray cluster a `executor: ray` config names, before the model loads, so that a wrong or
    unreachable `ray_address` fails in seconds rather than after the model has loaded; True when this call
    connected (the run then owns the connection: `make_executor(owns_ray=True)`). False for a local run or when
    the process is already connected."""
    if config.executor != "ray":
        return False
    if config.worker_backend == "vllm":  # vLLM missing or without a device: say so before Ray and the model start
        from esft.es.distributed.vllm_backend import check_engine_config, require_vllm

        require_vllm()
        check_engine_config(config)
    from esft.es.distributed.connection import connect_ray
    from esft.rundir import say

    where = config.ray_address or os.environ.get("RAY_ADDRESS") or "a new local Ray instance (or a running one)"
    say(f"esft: connecting to Ray: {where} ...")
    connected = connect_ray(config.ray_address)
    try:  # workers the cluster cannot hold are refused now, not once the driver's model has loaded
        check_placement(config)
    except BaseException:
        if connected:
            from esft.es.distributed.connection import disconnect_ray

            disconnect_ray()
        raise
    return connected


def check_placement(config: ESConfig) -> None:
    """Raise the ValueError `RayExecutor.start` would raise for workers the connected cluster cannot hold at once
    (`ray_executor.place_workers`), from the config alone."""
    from esft.es.distributed.connection import import_ray
    from esft.es.distributed.ray_executor import place_workers

    if not import_ray().is_initialized():  # no cluster to ask; `start` connects and asks
        return
    opts = dict(config.executor_options)
    actor_options = {"num_cpus": opts["num_cpus_per_worker"]} if "num_cpus_per_worker" in opts else {}
    place_workers(config.num_workers, config.device, opts.get("use_gpu"), worker_threads(config, opts) or 1,
                  actor_options)


def machine_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cluster_cores() -> list[int]:
    """The CPUs of each node the workers may run on: the connected Ray cluster's alive nodes, else this machine."""
    from esft.es.distributed.connection import import_ray

    try:
        ray = import_ray()
        cpus = [int(n.get("Resources", {}).get("CPU", 0)) for n in ray.nodes() if n.get("Alive", True)] \
            if ray.is_initialized() else []
    except ImportError:
        cpus = []
    return [c for c in cpus if c > 0] or [machine_cores()]


def cluster_gpus() -> int:
    """The GPUs of the connected Ray cluster; before a connection (`esft.api.train_es` connects first, a caller of
    the factory may not), this machine's CUDA GPUs, which the local Ray instance the executor would start has."""
    from esft.es.distributed.connection import import_ray

    try:
        ray = import_ray()
        if ray.is_initialized():
            return int(ray.cluster_resources().get("GPU", 0))
    except ImportError:
        pass
    import torch

    return torch.cuda.device_count()


def cpu_threads_share(node_cpus: list[int], num_workers: int, num_cpus_per_worker: float | None = None) -> int:
    """torch threads for each CPU worker under `threads_per_worker: 0`, at least 1: the most threads per worker
    with which the nodes (`node_cpus`, `cluster_cores`) still hold `num_workers` workers, a worker on one node
    asking Ray for that many CPUs, so that the workers together run no more threads than there are cores (torch's
    own default is every core, in every worker) and every worker can be placed. `num_cpus_per_worker`, when set,
    is the CPUs Ray gives each worker; with num_workers 0 (one worker per CPU) one core."""
    if num_cpus_per_worker is not None:
        return max(1, int(num_cpus_per_worker))
    if not num_workers:
        return 1
    for threads in range(min(node_cpus), 1, -1):
        if sum(c // threads for c in node_cpus) >= num_workers:
            return threads
    return 1


def worker_threads(config: ESConfig, opts: dict[str, Any]) -> int:
    """torch threads of each worker (`threads_per_worker`, its default and its 0; 0 returned: torch's default)."""
    on_cpu = not workers_use_gpu(config.device, opts.get("use_gpu"), cluster_gpus())
    if config.worker_backend == "vllm" and on_cpu:
        # one CPU engine per machine by default: vLLM batches a member's prompts itself and uses every thread
        default_threads = machine_cores()
    else:
        default_threads = 1 if on_cpu else 0
    threads = int(opts.get("threads_per_worker", default_threads))
    if threads == 0 and on_cpu:  # on GPUs 0 leaves torch's default: the work is on the device
        threads = cpu_threads_share(cluster_cores(), config.num_workers, opts.get("num_cpus_per_worker"))
    return threads


def make_ray_executor(config: ESConfig, *, weights: MasterWeights, optimizer: Any = None, generate_fn: Any = None,
                      builder: Any = None, model: Any = None, **overrides: Any):
    from esft.es.distributed.hf_replica import HFReplica, ReplicaSpec
    from esft.es.distributed.ray_executor import RayExecutor

    check_executor_options(config)  # the trainer checked already, before its model loaded
    opts = dict(config.executor_options)
    spec = ReplicaSpec(config=config, builder=builder, generate_fn=generate_fn, threads=worker_threads(config, opts),
                       options={k: v for k, v in opts.items() if k in VLLM_OPTIONS})
    replica_cls: type = HFReplica
    if config.worker_backend == "vllm":
        if generate_fn is not None:
            raise ValueError("worker_backend 'vllm' generates with vLLM; a custom generate_fn cannot be used")
        from esft.es.distributed.vllm_backend import VLLMReplica, require_vllm

        require_vllm()
        if config.optimizer != "sgd":
            raise ValueError("worker_backend 'vllm' supports optimizer 'sgd' only (no optimizer state in engines)")
        # vLLM fuses and pads some tensors; the engine maps Hugging Face names onto its own from these shapes
        shapes = {n: list(p.shape) for n, p in (model.named_parameters() if model is not None
                                                  else weights.params.items())}
        spec.options["layout"] = {"selected": weights.names, "shapes": shapes}
        replica_cls = VLLMReplica
    else:  # a PyTorch replica holds the whole model: its frozen parameters are compared at start-up
        from esft.es.distributed.hf_replica import frozen_checksum

        overrides.setdefault("frozen", frozen_checksum(model, weights.names) if model is not None else None)
    actor_options = {}
    if "num_cpus_per_worker" in opts:
        actor_options["num_cpus"] = opts["num_cpus_per_worker"]
    kwargs = dict(num_workers=config.num_workers, address=config.ray_address,
                  checksum_every=int(opts.get("checksum_every", 10)),
                  event_log=Path(config.output_dir) / "metrics.jsonl", replica_cls=replica_cls,
                  actor_options=actor_options, use_gpu=opts.get("use_gpu"),
                  start_timeout_s=float(opts.get("start_timeout_s", 1800)),
                  member_timeout_s=float(opts.get("member_timeout_s", 0)))
    kwargs.update(overrides)
    return RayExecutor(spec, weights, optimizer, **kwargs)
