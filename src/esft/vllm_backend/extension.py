"""vLLM worker extension: ES perturb / restore / update applied in place to a vLLM engine's weights.

vLLM mixes this class into its GPU worker (`LLM(..., worker_extension_cls="esft.vllm_backend.extension.
ESWorkerExtension")`); the replica calls its methods with `llm.collective_rpc("esft_perturb", args=(...))`.
Only plain Python values cross that boundary (ints, floats, strings, lists), so any vLLM RPC transport works.

Weights are edited in place, so CUDA graphs captured by the engine stay valid (same addresses); the caller
resets the prefix cache after every edit, and the engine is built with prefix caching off (a cached
prefix would keep the old weights' keys and values).

The math is esft's own `MasterWeights`, run on views of vLLM's tensors, so a vLLM replica holds bit-for-bit the
same fp32 masters as a PyTorch replica on the same device type (noise per (seed, Hugging Face tensor name),
exact restore by copy from the fp32 masters, update accumulated in fp32 in a fixed order). vLLM fuses some
Hugging Face tensors (q/k/v -> qkv_proj, gate/up -> gate_up_proj, declared by the model's
`packed_modules_mapping`) and pads the vocabulary rows of embeddings; `hf_views` maps every Hugging Face name to
the matching rows of the vLLM tensor, so the noise of `q_proj` lands on the q rows of `qkv_proj` and padded
rows are never touched. Tensor parallelism is not supported (one engine per GPU, TP = 1).
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import torch

from esft.es.noise import MasterWeights, Update
from esft.es.replica import masters_checksum


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
    packed: dict[str, list[str]] = {k: list(v) for k, v in (getattr(model, "packed_modules_mapping", None) or {}).items()}
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


class ESWorkerExtension:
    """Mixed into vLLM's worker; methods are called through `LLM.collective_rpc`. All state lives in
    `self._esft` (a `MasterWeights` over views of the engine's tensors)."""

    # vLLM may hold its weights as inference tensors; editing them must happen in inference mode, and so must
    # every op on the masters (created there), consistently.
    def esft_init(self, selected: Sequence[str], shapes: dict[str, Sequence[int]],
                  noise: str = "per-tensor") -> dict[str, Any]:
        with torch.inference_mode():
            views = hf_views(_engine_model(self), shapes, list(selected))
            self._esft = MasterWeights(_Views(views), noise=noise)
            dev = next(iter(views.values())).device
            return {"num_params": self._esft.num_params, "num_tensors": len(views), "device": str(dev),
                    "device_type": dev.type, "dtypes": self._esft.dtypes}

    def esft_perturb(self, seed: int, sign: int, sigma: float, replace: bool = False) -> None:
        with torch.inference_mode():
            self._esft.perturb(int(seed), int(sign), float(sigma), replace=bool(replace))

    def esft_restore(self) -> None:
        with torch.inference_mode():
            self._esft.restore()

    def esft_apply(self, seeds: Sequence[int], coefficients: Sequence[float], scale: float,
                   kind: str = "sgd") -> float:
        if kind != "sgd":
            raise ValueError("the vLLM backend applies SGD updates only (optimizer 'sgd'); use worker_backend hf")
        update = Update(seeds=tuple(int(s) for s in seeds), coefficients=tuple(float(c) for c in coefficients),
                        scale=float(scale), kind="sgd")
        with torch.inference_mode():
            if self._esft.perturbed is not None:  # a member evaluation was interrupted: back to the centre first
                self._esft.restore()
            return float(self._esft.apply(update))

    def esft_checksum(self) -> dict[str, int]:
        with torch.inference_mode():
            return masters_checksum(self._esft)

    def esft_load_masters(self, masters: dict[str, torch.Tensor]) -> dict[str, int]:
        with torch.inference_mode():
            dev = next(iter(self._esft.params.values())).device
            self._esft.load_masters({k: v.to(dev) for k, v in masters.items()})
            return masters_checksum(self._esft)


EXTENSION_PATH = f"{ESWorkerExtension.__module__}.{ESWorkerExtension.__qualname__}"
