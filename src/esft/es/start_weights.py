"""The fp32 masters of an ES run start from the start model's stored weights, not from their low-precision copy.

A model loaded in bf16 (the GPU default) or fp16 holds its weights rounded; masters taken from it would start
from the rounded values, which erases an earlier stage's update smaller than the dtype's resolution (a GRPO stage
of a `grpo->es` chain moves most weights by less than bf16's spacing). Where the start model is a local folder
whose files hold fp32 tensors (esft's ES checkpoints of a bf16 model keep theirs in `masters.safetensors`), the
masters are read from there, tensor by tensor, and the model's own parameters set to round(master), as every later
perturbation writes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from esft.es.es_rundir import MASTERS_FILE, parameter_aliases


def stored_fp32(folder: Path, names: dict[str, list[str]]) -> dict[str, torch.Tensor]:
    """Parameter name -> its fp32 tensor in `folder`'s safetensors files, for the names (each with its aliases:
    tied weights are saved once) stored in fp32: from `masters.safetensors` where the folder has one, else from
    the model files. One tensor in memory at a time besides those returned."""
    from safetensors import safe_open

    masters = folder / MASTERS_FILE
    files = [masters] if masters.is_file() else sorted(p for p in folder.glob("*.safetensors")
                                                       if p.name != MASTERS_FILE)
    found: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            keys = set(handle.keys())
            for name, aliases in names.items():
                hit = next((a for a in aliases if a in keys), None)
                if name not in found and hit is not None and handle.get_slice(hit).get_dtype() == "F32":
                    found[name] = handle.get_tensor(hit)
    return found


def rounded_masters(params: dict[str, torch.Tensor], folder: Path,
                    aliases: dict[str, list[str]] | None = None) -> dict[str, torch.Tensor]:
    """The fp32 tensors `folder` stores (`stored_fp32`) for those of `params` held in a lower precision (bf16,
    fp16): the masters those should start from. Empty when every tensor is fp32 (nothing is read then). A stored
    tensor of another shape is refused (ValueError): copied into a master it would broadcast, or fail unnamed."""
    rounded = [n for n, p in params.items() if p.dtype != torch.float32]
    if not rounded:
        return {}
    found = stored_fp32(folder, {n: (aliases or {}).get(n, [n]) for n in rounded})
    for name, tensor in found.items():
        if tensor.shape != params[name].shape:
            raise ValueError(f"{folder}: {name} is stored with shape {tuple(tensor.shape)}, the model's is "
                             f"{tuple(params[name].shape)}")
    return found


@torch.no_grad()
def exact_start(weights: Any, model: torch.nn.Module, source: str | None) -> int:
    """Set the masters of `weights` (a MasterWeights of `model`) whose parameters `model` holds in a lower
    precision from `source`'s stored fp32 tensors (`stored_fp32`); returns how many were set. Nothing is read for
    an fp32 model, a hub id or a folder without fp32 tensors: the masters then stay those of the loaded model."""
    from esft.models import resolve_model_path

    if not source or all(p.dtype == torch.float32 for p in weights.params.values()):
        return 0
    try:
        folder = Path(resolve_model_path(str(source)))
    except FileNotFoundError:  # a model given as an object, its recorded name no longer a folder
        return 0
    if not folder.is_dir():  # a hub id: its files are the loader's business
        return 0
    found = rounded_masters(weights.params, folder, parameter_aliases(model))
    for name, tensor in found.items():
        master = weights.master[name]
        master.copy_(tensor)
        weights.params[name].copy_(master)  # round(master), whichever file the model itself was loaded from
    return len(found)


@torch.no_grad()
def fp32_start(model: torch.nn.Module, source: str | None) -> int:
    """Set the parameters of `model`, an fp32 model loaded from `source`, from the fp32 masters an ES checkpoint
    of a bf16 / fp16 model keeps beside its rounded model file (`masters.safetensors`); returns how many were set.
    A trainer that keeps fp32 weights of its own (GRPO after ES in a chain) would otherwise start from the model
    file's rounding of the ES weights, and every weight would differ from the ES result by that rounding. Nothing
    is read where `source` is no folder, or a folder without that file (its model files are what was loaded)."""
    folder = Path(str(source)).expanduser() if source else None
    if folder is None or not (folder / MASTERS_FILE).is_file():
        return 0
    params = dict(model.named_parameters())
    found = stored_fp32(folder, parameter_aliases(model))
    for name, tensor in found.items():
        if tensor.shape != params[name].shape:
            raise ValueError(f"{folder}: {name} is stored with shape {tuple(tensor.shape)}, the model's is "
                             f"{tuple(params[name].shape)}")
        params[name].copy_(tensor)
    return len(found)


__all__ = ["exact_start", "fp32_start", "rounded_masters", "stored_fp32"]
