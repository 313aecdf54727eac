"""Tensor sources: checkpoints on disk (streamed), state dicts and modules, behind one small interface.

Weight analyses of multi-billion-parameter models cannot hold several models in memory. A `CheckpointSource`
opens the safetensors files of a Hugging Face folder (single file or sharded with `model.safetensors.index.json`)
memory-mapped and reads one tensor, or a range of its rows, at a time; the analyses then keep at most one chunk
per source in float64. `aligned_refs` matches tensors of several sources by canonical name (esft.analysis.canonical),
and `read_rows` reads a canonical view (including a slice of a fused tensor) chunk by chunk.

ES checkpoints of non-fp32 models carry their fp32 master weights in `masters.safetensors` (esft.es.es_rundir);
those are the exact weights and are preferred over the rounded model file when present.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Mapping, Protocol, Sequence, runtime_checkable

import torch

from esft.analysis.canonical import TensorRef, canonical_refs, tied_lm_head

MASTERS_FILE = "masters.safetensors"  # written by esft.es.es_rundir for non-fp32 ES checkpoints
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_CHUNK_ELEMS = 1 << 24  # 16M entries: 128 MiB per float64 chunk


@runtime_checkable
class TensorSource(Protocol):
    name: str
    config: dict[str, Any] | None

    def shapes(self) -> dict[str, tuple[int, ...]]: ...

    def read(self, key: str, start: int | None = None, stop: int | None = None) -> torch.Tensor:
        """Rows [start, stop) along dim 0 of a stored tensor (all of it when both are None)."""
        ...


class CheckpointSource:
    """A Hugging Face model folder read lazily from its safetensors files (mmap, one tensor slice at a time)."""

    def __init__(self, folder: str | Path, prefer_masters: bool = True):
        from safetensors import safe_open

        self.folder = Path(folder)
        self.name = str(self.folder)
        if not self.folder.is_dir():
            raise FileNotFoundError(f"checkpoint folder {self.folder} does not exist")
        cfg = self.folder / "config.json"
        self.config = json.loads(cfg.read_text()) if cfg.exists() else None
        index = self.folder / INDEX_FILE
        if index.exists():
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in self.folder.glob("*.safetensors") if p.name != MASTERS_FILE)
            weight_map = {}
        if not files:
            raise FileNotFoundError(f"no *.safetensors weights in {self.folder}")
        self._handles = {f: safe_open(str(self.folder / f), framework="pt", device="cpu") for f in files}
        self._where: dict[str, tuple[Any, str]] = {}
        for f, h in self._handles.items():
            for k in h.keys():
                if not weight_map or weight_map.get(k) == f:
                    self._where[k] = (h, k)
        masters = self.folder / MASTERS_FILE
        self.uses_masters = False
        if prefer_masters and masters.exists():
            h = safe_open(str(masters), framework="pt", device="cpu")
            self._handles[MASTERS_FILE] = h
            unmatched = [k for k in h.keys() if k not in self._where]
            if unmatched:
                # masters are saved under the module's parameter names; a model file that stores other names would
                # leave those tensors measured from their rounded copies, silently
                raise ValueError(f"{masters}: {len(unmatched)} fp32 master tensor(s) match no weight name in the "
                                 f"model files (first: {unmatched[0]!r}): they cannot be paired; to measure its "
                                 f"rounded weights instead, give a copy of the folder without {MASTERS_FILE}")
            for k in h.keys():
                self._where[k] = (h, k)
                self.uses_masters = True

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(h.get_slice(n).get_shape()) for k, (h, n) in self._where.items()}

    def read(self, key: str, start: int | None = None, stop: int | None = None) -> torch.Tensor:
        handle, name = self._where[key]
        if start is None and stop is None:
            return handle.get_tensor(name)
        sl = handle.get_slice(name)
        if not sl.get_shape():  # 0-d tensor
            return handle.get_tensor(name)
        return sl[start:stop]


class StateDictSource:
    """In-memory tensors by name. Tensors sharing storage (tied weights) are listed once, under the first name."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], config: Mapping[str, Any] | None = None,
                 name: str = "<state dict>"):
        seen: set[tuple[int, int, tuple]] = set()
        self.tensors: dict[str, torch.Tensor] = {}
        for k, t in tensors.items():
            ident = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape)) if t.numel() else None
            if ident is not None and ident in seen:
                continue
            if ident is not None:
                seen.add(ident)
            self.tensors[k] = t.detach()
        self.config = dict(config) if config else None
        self.name = name

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(t.shape) for k, t in self.tensors.items()}

    def read(self, key: str, start: int | None = None, stop: int | None = None) -> torch.Tensor:
        t = self.tensors[key]
        if (start is None and stop is None) or t.dim() == 0:
            return t
        return t[start:stop]


def module_source(model: torch.nn.Module, name: str = "<module>") -> StateDictSource:
    """Parameters of a module (tied weights once, as `named_parameters` de-duplicates them)."""
    cfg = getattr(model, "config", None)
    config = cfg.to_dict() if hasattr(cfg, "to_dict") else None
    return StateDictSource(dict(model.named_parameters()), config, name)


def as_source(x: Any) -> TensorSource:
    """A TensorSource from a folder path, a module, a mapping of tensors, or a source."""
    if isinstance(x, (str, Path)):
        return CheckpointSource(x)
    if isinstance(x, torch.nn.Module):
        return module_source(x)
    if isinstance(x, Mapping):
        return StateDictSource(x)
    if isinstance(x, TensorSource):
        return x
    raise TypeError(f"cannot read tensors from {type(x).__name__}; pass a folder, a module or a dict of tensors")


def refs_of(source: TensorSource) -> dict[str, TensorRef]:
    shapes = source.shapes()
    return canonical_refs(shapes, source.config, tied_lm_head(shapes, source.config))


def aligned_refs(sources: Sequence[TensorSource]) -> tuple[list[tuple[str, list[TensorRef]]], dict[str, list[str]]]:
    """Canonical tensors present in every source, in the first source's order, with each source's view;
    and, per source, the canonical names it has that some other source lacks (reported, never guessed)."""
    maps = [refs_of(s) for s in sources]
    common = [n for n in maps[0] if all(n in m for m in maps[1:])]
    rows = []
    for n in common:
        refs = [m[n] for m in maps]
        shapes = {r.shape for r in refs}
        if len(shapes) != 1:
            raise ValueError(f"tensor {n} has different shapes across sources: {[r.shape for r in refs]}")
        rows.append((n, refs))
    common_set = set(common)
    unmatched: dict[str, list[str]] = {}
    for i, (s, m) in enumerate(zip(sources, maps)):
        extra = [n for n in m if n not in common_set]
        if extra:
            unmatched[s.name if s.name not in unmatched else f"{s.name}#{i}"] = extra
    return rows, unmatched


def read_rows(source: TensorSource, ref: TensorRef, start: int, stop: int) -> torch.Tensor:
    """Rows [start, stop) of a canonical view, as stored dtype."""
    if ref.segments is None:
        t = source.read(ref.key, start, stop) if ref.shape else source.read(ref.key)
    else:
        parts, offset = [], 0
        for a, b in ref.segments:
            n = b - a
            lo, hi = max(start, offset), min(stop, offset + n)
            if lo < hi:
                parts.append(source.read(ref.key, a + lo - offset, a + hi - offset))
            offset += n
        t = torch.cat(parts, dim=0) if len(parts) > 1 else parts[0]
    if ref.columns is not None:
        t = t[..., ref.columns[0]:ref.columns[1]]
    return t


def iter_chunks(sources: Sequence[TensorSource], refs: Sequence[TensorRef], chunk_elems: int = DEFAULT_CHUNK_ELEMS,
                dtype: torch.dtype = torch.float64) -> Iterator[list[torch.Tensor]]:
    """The same row range of one canonical tensor from every source, converted to `dtype`, chunk by chunk."""
    ref = refs[0]
    if not ref.shape:
        yield [s.read(r.key).to(dtype) for s, r in zip(sources, refs)]
        return
    row = max(1, ref.numel // max(1, ref.rows))
    step = max(1, chunk_elems // row)
    for start in range(0, ref.rows, step):
        stop = min(ref.rows, start + step)
        yield [read_rows(s, r, start, stop).to(dtype) for s, r in zip(sources, refs)]


def read_full(source: TensorSource, ref: TensorRef, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A whole canonical view (used where a metric needs the full matrix, e.g. its spectral norm)."""
    if not ref.shape:
        return source.read(ref.key).to(dtype)
    return read_rows(source, ref, 0, ref.rows).to(dtype)
