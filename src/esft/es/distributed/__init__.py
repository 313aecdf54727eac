"""Distributed ES: executors whose members run on other processes or machines (one model replica each).

factory        make_executor(config, ...): the executor an ESConfig asks for (local, or Ray with hf / vllm workers)
hf_replica     HFReplica (esft.generation on a PyTorch model), ReplicaSpec, fp32-master checksums
connection     connect_ray (probing the address first), disconnect_ray
ray_executor   RayExecutor: members on Ray workers, only seeds and scalars on the wire (docs/distributed.md)

The vLLM replica is esft.es.distributed.vllm_backend. Ray and vLLM are imported only when a run asks for them.
"""

from esft.es.distributed.factory import make_executor, make_ray_executor

__all__ = ["make_executor", "make_ray_executor"]
