"""One model replica of a distributed ES run, and the checksum that tells whether replicas still agree.

A replica holds the model, its fp32 masters (`MasterWeights`) and, for Adam, the optimizer state. It evaluates
members exactly as `LocalExecutor` does (the same code, so the same bits on the same hardware), applies every
update from (seeds, coefficients) and reports a checksum of its masters. `HFReplica` is the plain-PyTorch
replica (esft.generation); `esft.es.distributed.vllm_backend.VLLMReplica` has the same methods on a vLLM engine.

This module imports no Ray: the Ray executor wraps these classes with `ray.remote` at run time, and tests can
drive them in-process.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from esft.es.build import generation_config, make_strategy, make_weights
from esft.es.es_config import ESConfig
from esft.es.executor import LocalExecutor, PopulationResult
from esft.es.noise import MasterWeights, Update
from esft.es.strategy import Member

Checksum = dict[str, int]


@torch.no_grad()
def masters_checksum(weights: MasterWeights) -> Checksum:
    """Per-tensor checksum of the fp32 masters: the sum of their bit patterns read as int32, in int64.

    Integer addition is exact and order-free, so the value is the same on any device and thread count, and
    any change of a single bit changes it. It is a drift detector, not a cryptographic hash; it costs one
    read of the masters (~0.1 s per 100M parameters on a CPU core) and allocates nothing the size of a tensor.
    """
    return {name: int(m.view(torch.int32).sum(dtype=torch.int64)) for name, m in weights.iter_masters()}


@torch.no_grad()
def frozen_checksum(model: torch.nn.Module, selected: Sequence[str]) -> Checksum:
    """Per-tensor checksum of the parameters ES never perturbs (`include` / `exclude`; names outside `selected`),
    as the model holds them: the sum of their bit patterns as integers of their own width, in int64. No update
    touches them, so they are compared once, at start-up (a node whose copy of the model differs there)."""
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    chosen = set(selected)
    return {name: int(p.detach().contiguous().view(ints[p.element_size()]).sum(dtype=torch.int64))
            for name, p in model.named_parameters() if name not in chosen}


def checksum_digest(checksum: Checksum) -> str:
    """Short printable summary of a checksum (for logs)."""
    return hashlib.sha256(json.dumps(sorted(checksum.items())).encode()).hexdigest()[:16]


def checksum_diff(reference: Checksum, other: Checksum) -> list[str]:
    """Names of the tensors whose checksums differ (missing names count as different)."""
    names = list(reference) + [n for n in other if n not in reference]
    return [n for n in names if reference.get(n) != other.get(n)]


@dataclass
class ReplicaSpec:
    """How a worker builds its replica. Shipped to workers once (pickled); must not hold a model.

    builder: `builder(config) -> (model, tokenizer, task)`; None = `load_model(config.model, dtype, device)` and
    `get_task(config.task, ...)`, which every worker resolves for itself (same files -> same weights, verified
    by the start-up checksum). generate_fn: the `LocalExecutor` seam (None = esft.generation.generate).
    threads: torch intra-op threads in the worker (0 = leave torch's default). Matmul blocking may depend on
    it, so compare bit-identity only between runs with the same thread count.
    """

    config: ESConfig
    builder: Callable[[ESConfig], tuple[Any, Any, Any]] | None = None
    generate_fn: Any = None
    threads: int = 0
    options: dict[str, Any] = field(default_factory=dict)


def build_replica_parts(spec: ReplicaSpec) -> tuple[Any, Any, Any]:
    cfg = spec.config
    if spec.builder is not None:
        return spec.builder(cfg)
    from esft.models import load_model
    from esft.tasks import get_task

    model, tokenizer = load_model(cfg.model, dtype=cfg.dtype, device=cfg.device)
    return model, tokenizer, get_task(cfg.task, **cfg.task_kwargs())


class HFReplica:
    """A replica that generates with esft.generation (or the spec's generate_fn) on a PyTorch model."""

    def __init__(self, spec: ReplicaSpec, rank: int = 0):
        if spec.threads:
            torch.set_num_threads(int(spec.threads))
        self.rank = rank
        cfg = spec.config
        model, tokenizer, task = build_replica_parts(spec)
        model.eval()
        for p in model.parameters():  # as in ESTrainer: no autograd, graph-free generate
            p.requires_grad_(False)
        self.model = model
        self.weights = make_weights(model, cfg)
        self.strategy = make_strategy(cfg)
        self.optimizer = self.strategy.make_optimizer(list(self.weights.master.values()))
        self.executor = LocalExecutor(model, tokenizer, self.weights, task, self.strategy, generation_config(cfg),
                                      generate_fn=spec.generate_fn)

    # -- what the driver asks
    def info(self) -> dict[str, Any]:
        device = next(iter(self.weights.params.values())).device
        return {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(), "device": str(device),
                "device_type": device.type, "threads": torch.get_num_threads(),
                "num_params": self.weights.num_params, "backend": "hf",
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def evaluate(self, members: Sequence[Member], batch: Sequence[dict]) -> PopulationResult:
        return self.executor.evaluate_members(members, batch)

    def evaluate_center(self, batch: Sequence[dict]) -> PopulationResult:
        return self.executor.evaluate_center(batch)

    def apply(self, update: Update) -> float:
        return self.weights.apply(update, self.optimizer)

    def checksum(self) -> Checksum:
        return masters_checksum(self.weights)

    def frozen_checksum(self) -> Checksum:
        return frozen_checksum(self.model, self.weights.names)

    def load_state(self, masters: dict[str, torch.Tensor], optimizer_state: dict | None = None) -> Checksum:
        """Take the driver's masters (start-up after a resume, or a repair); returns the new checksum."""
        device = next(iter(self.weights.params.values())).device
        self.weights.load_masters({k: v.to(device) for k, v in masters.items()})
        if optimizer_state is not None and self.optimizer is not None:
            self.optimizer.load_state_dict(optimizer_state)
        return self.checksum()

    def pid(self) -> int:
        return os.getpid()
