"""`VLLMReplica`: an ES replica whose generation runs on a vLLM engine (one engine per GPU, one Ray actor each).

It has the methods of `esft.es.replica.HFReplica` (info, evaluate, evaluate_center, apply, checksum,
load_state), so `RayExecutor` drives either. Member evaluation is `LocalExecutor`'s own loop (perturb ->
generate -> score -> restore, the same result rows and counters) with two seams filled by vLLM:

* weights: `EngineWeights` forwards perturb / restore / update to `ESWorkerExtension` inside the engine
  (`collective_rpc`) and resets the prefix cache after each edit;
* generate_fn: the batch's prompts (chat template applied once by the HF tokenizer, as on the PyTorch path) go
  to `LLM.generate` as token ids, greedy; completions are decoded with the same tokenizer as esft.generation.

The engine is built with prefix caching off, CUDA graphs on (weights are edited in place, so captured graphs
stay valid), TP = 1. By default the engine core runs inside the actor process (VLLM_ENABLE_V1_MULTIPROCESSING=0),
so `collective_rpc` is a plain call and the start-up weight sync can hand tensors over without serialisation.
`engine_factory` / `sampling_factory` let CPU tests run all of this against a fake engine.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any, Callable, Sequence

from esft.es.executor import PopulationResult
from esft.es.noise import Update
from esft.es.replica import Checksum, ReplicaSpec
from esft.es.strategy import Member
from esft.vllm_backend.extension import EXTENSION_PATH

DEFAULT_GPU_MEMORY_UTILIZATION = 0.7
"""vLLM's share of its GPU: the driver's PyTorch replica (reference for checksums, checkpoints) may share GPU 0"""


def make_llm(spec: ReplicaSpec) -> Any:
    """The vLLM engine of one replica, in the dtype the driver's replica uses (same weights, same rounding)."""
    from vllm import LLM

    from esft.models import parse_dtype, resolve_model_path

    cfg, opts = spec.config, spec.options
    path = resolve_model_path(cfg.model)
    dtype = str(parse_dtype(cfg.dtype, "cuda")).replace("torch.", "")
    kwargs: dict[str, Any] = dict(
        model=path, tokenizer=path, dtype=dtype, seed=int(cfg.seed), tensor_parallel_size=1,
        enable_prefix_caching=False,  # cached KV of the previous member's weights must never be reused
        worker_extension_cls=EXTENSION_PATH,
        gpu_memory_utilization=float(opts.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION)),
        enforce_eager=bool(opts.get("enforce_eager", False)),
    )
    if opts.get("max_model_len"):
        kwargs["max_model_len"] = int(opts["max_model_len"])
    kwargs.update(opts.get("vllm_kwargs") or {})
    return LLM(**kwargs)


def sampling_fields(config: Any, max_tokens: int | None = None) -> dict[str, Any]:
    """Greedy decoding with the run's token budget (the paper's protocol), as SamplingParams keyword args."""
    return dict(n=1, temperature=0.0, top_p=1.0, max_tokens=int(max_tokens or config.max_new_tokens),
                seed=int(config.seed), skip_special_tokens=True)


def _vllm_sampling_params(**fields: Any) -> Any:
    from vllm import SamplingParams

    return SamplingParams(**fields)


class EngineWeights:
    """The `MasterWeights` calls LocalExecutor makes (perturb, restore), forwarded into the engine."""

    def __init__(self, replica: "VLLMReplica"):
        self.replica = replica
        self.perturbed: tuple[int, int] | None = None

    def perturb(self, seed: int, sign: int, sigma: float, replace: bool = False) -> None:
        self.perturbed = (int(seed), int(sign))  # before the call: a failure part-way still gets restored
        self.replica.rpc("esft_perturb", int(seed), int(sign), float(sigma), bool(replace))
        self.replica.reset_prefix_cache()

    def restore(self) -> None:
        self.replica.rpc("esft_restore")
        self.perturbed = None
        self.replica.reset_prefix_cache()


class VLLMReplica:
    """One vLLM engine + the ES state inside it. spec.options["layout"] = {"selected": [HF names perturbed],
    "shapes": {HF name: shape}} from the driver's model (see `esft.es.executor_factory`)."""

    def __init__(self, spec: ReplicaSpec, rank: int = 0, engine_factory: Callable[[ReplicaSpec], Any] | None = None,
                 sampling_factory: Callable[..., Any] | None = None):
        from esft.es.executor import LocalExecutor
        from esft.es.trainer import generation_config

        cfg = spec.config
        self.rank = rank
        self.config = cfg
        if engine_factory is None:
            # engine core in this process: collective_rpc is a direct call (no pickling of tensors or updates)
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if spec.builder is not None:
            _, tokenizer, task = spec.builder(cfg)
        else:
            from esft.models import load_tokenizer
            from esft.tasks import get_task

            tokenizer, task = load_tokenizer(cfg.model), get_task(cfg.task, **cfg.task_kwargs())
        self.tokenizer = tokenizer
        self.engine = (engine_factory or make_llm)(spec)
        layout = spec.options.get("layout")
        if not layout:
            raise ValueError("VLLMReplica needs spec.options['layout'] (selected names and shapes of the HF model)")
        self.layout_info = self.rpc("esft_init", list(layout["selected"]), dict(layout["shapes"]), cfg.noise)
        self.sampling = (sampling_factory or _vllm_sampling_params)(**sampling_fields(cfg))
        self.weights = EngineWeights(self)
        self._encoded: tuple[str, list[list[int]]] | None = None
        self.executor = LocalExecutor(None, tokenizer, self.weights, task, cfg.sigma, generation_config(cfg),
                                      generate_fn=self._generate)

    # -- engine plumbing
    def rpc(self, method: str, *args: Any) -> Any:
        results = self.engine.collective_rpc(method, args=args)
        if len(results) != 1:  # one engine per GPU: tensor / pipeline parallel engines are not supported
            raise RuntimeError(f"expected one vLLM worker per engine, got {len(results)}")
        return results[0]

    def reset_prefix_cache(self) -> None:
        reset = getattr(self.engine, "reset_prefix_cache", None)
        if reset is not None:
            reset()

    def _token_ids(self, prompts: Sequence[Any]) -> list[list[int]]:
        """Prompt token ids, cached for the batch: every member of an iteration sends the same prompts."""
        from esft.generation import encode_prompts

        key = json.dumps(prompts, sort_keys=True, default=str)
        if self._encoded is None or self._encoded[0] != key:
            ids = [list(map(int, p)) if isinstance(p, (list, tuple)) and all(isinstance(t, int) for t in p)
                   else encode_prompts(self.tokenizer, [p])[0] for p in prompts]
            self._encoded = (key, ids)
        return self._encoded[1]

    def _generate(self, model: Any, tokenizer: Any, prompts: Sequence[Any], gen_config: Any, **_: Any) -> list:
        from esft.generation import Generation

        ids = self._token_ids(prompts)
        outputs = self.engine.generate([{"prompt_token_ids": p} for p in ids], self.sampling, use_tqdm=False)
        gens = []
        for p, out in zip(ids, outputs):
            comp = out.outputs[0]
            token_ids = [int(t) for t in comp.token_ids]
            # decoded like esft.generation (skip special tokens), so scorers see the same kind of text
            gens.append(Generation(text=tokenizer.decode(token_ids, skip_special_tokens=True),
                                   completion_ids=token_ids, prompt_tokens=len(p),
                                   finished=getattr(comp, "finish_reason", None) == "stop"))
        return gens

    # -- the replica interface (same as HFReplica)
    def info(self) -> dict[str, Any]:
        return {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(),
                "device": self.layout_info["device"], "device_type": self.layout_info["device_type"],
                "num_params": self.layout_info["num_params"], "backend": "vllm",
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def evaluate(self, members: Sequence[Member], batch: Sequence[dict]) -> PopulationResult:
        return self.executor.evaluate_members(members, batch)

    def evaluate_center(self, batch: Sequence[dict]) -> PopulationResult:
        return self.executor.evaluate_center(batch)

    def apply(self, update: Update) -> float:
        if update.kind != "sgd":
            raise ValueError("the vLLM backend applies SGD updates only (optimizer 'sgd'); use worker_backend hf")
        norm = self.rpc("esft_apply", [int(s) for s in update.seeds], [float(c) for c in update.coefficients],
                        float(update.scale), update.kind)
        self.reset_prefix_cache()
        return float(norm)

    def checksum(self) -> Checksum:
        return self.rpc("esft_checksum")

    def load_state(self, masters: dict, optimizer_state: dict | None = None) -> Checksum:
        if optimizer_state:
            raise ValueError("the vLLM backend has no optimizer state (SGD only)")
        checksum = self.rpc("esft_load_masters", masters)
        self.reset_prefix_cache()
        return checksum

    def pid(self) -> int:
        return os.getpid()
