"""Weight-space geometry of fine-tuning updates (paper Tables 3, 4 and 20).

Pure metrics on tensors:
    sparsity(delta, eps=1e-5)          fraction of entries with |d| <= eps (tensor, or a mapping of tensors)
    stable_rank(matrix)                ||W||_F^2 / ||W||_2^2
    cosine_similarity(delta_a, delta_b)  float for two tensors; {"total", "per_tensor"} for two mappings

Streaming comparisons of checkpoints (folders, modules or dicts; see esft.analysis.sources):
    update_norm(base, tuned)           {"total": ||theta - theta_0||_2, "per_tensor": {canonical name: norm}}
    compare_updates(base, {"es": A, "grpo": B})   every metric above in one pass, per tensor, per family, total

Deltas are formed and accumulated in float64 (a bf16 or fp32 subtraction would round away ~1e-6 updates), one
row chunk at a time, so no model is ever fully in memory; only stable ranks need a whole matrix (one at a time).
Tensors are matched by canonical name, so fused layouts (qkv_proj, gate_up_proj, c_attn) report per q/k/v/gate/up.
"""

from __future__ import annotations

import math
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Iterable, Mapping

import numpy as np
import torch

from esft.analysis.canonical import STABLE_RANK_ROLES, is_matrix_family, kind_of, layer_of, role_of
from esft.analysis.sources import DEFAULT_CHUNK_ELEMS, aligned_refs, as_source, iter_chunks, read_full

DEFAULT_EPS = 1e-5  # paper Table 4


# ---- pure metrics ------------------------------------------------------------------------------------------------

def _tensors(x: torch.Tensor | Mapping[str, torch.Tensor] | Iterable[torch.Tensor]) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, Mapping):
        return list(x.values())
    return list(x)


def sparsity(delta: torch.Tensor | Mapping[str, torch.Tensor] | Iterable[torch.Tensor], eps: float = DEFAULT_EPS) -> float:
    """Fraction of entries with |d| <= eps, over one tensor or all tensors of a mapping/iterable."""
    small = total = 0
    for t in _tensors(delta):
        small += int((t.abs() <= eps).sum())
        total += t.numel()
    if total == 0:
        raise ValueError("sparsity of an empty update")
    return small / total


def stable_rank(matrix: torch.Tensor) -> float:
    """||W||_F^2 / ||W||_2^2 in float64 (1 for a rank-one matrix, up to min(m, n)); NaN for a zero matrix.
    Tensors with more than two dims are flattened to (shape[0], -1)."""
    w = matrix.detach().to(torch.float64)
    if w.dim() < 2:
        raise ValueError(f"stable rank needs a matrix, got shape {tuple(matrix.shape)}")
    if w.dim() > 2:
        w = w.reshape(w.shape[0], -1)
    fro_sq = float(w.pow(2).sum())
    if fro_sq == 0.0:
        return math.nan
    # svdvals, not matrix_norm(ord=2): same largest singular value, but matrix_norm also forms singular vectors
    # on some backends and was 2x slower here (420 matrices of SmolLM2-135M updates per pair)
    with _one_thread_if_small(w.numel() if w.device.type == "cpu" else None):
        spec = float(torch.linalg.svdvals(w)[0])
    return fro_sq / (spec * spec)


SMALL_SVD = 1 << 22  # entries; below this a CPU SVD runs on one thread


@contextmanager
def _one_thread_if_small(numel: int | None):
    """Small SVDs on one thread: on a busy 2-core machine, 2 OpenMP threads spent 9x the CPU time (spin-waiting)
    on SmolLM2-135M's 576x1536 update matrices (128 s vs 14 s for 210 matrices). Large ones keep every thread."""
    if numel is None or numel >= SMALL_SVD or torch.get_num_threads() == 1:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def cosine_similarity(delta_a: torch.Tensor | Mapping[str, torch.Tensor],
                      delta_b: torch.Tensor | Mapping[str, torch.Tensor]) -> float | dict[str, Any]:
    """Cosine of two updates. Two tensors -> float. Two mappings -> {"total": cosine of the concatenated
    vectors (names in both), "per_tensor": {name: cosine}}; NaN where a norm is zero."""
    if isinstance(delta_a, torch.Tensor) and isinstance(delta_b, torch.Tensor):
        a, b = delta_a.double().flatten(), delta_b.double().flatten()
        return _cos(float(a @ b), float(a @ a), float(b @ b))
    if not (isinstance(delta_a, Mapping) and isinstance(delta_b, Mapping)):
        raise TypeError("cosine_similarity takes two tensors or two mappings of tensors")
    dot = aa = bb = 0.0
    per: dict[str, float] = {}
    for name, ta in delta_a.items():
        if name not in delta_b:
            continue
        a, b = ta.double().flatten(), delta_b[name].double().flatten()
        d, na, nb = float(a @ b), float(a @ a), float(b @ b)
        per[name] = _cos(d, na, nb)
        dot, aa, bb = dot + d, aa + na, bb + nb
    return {"total": _cos(dot, aa, bb), "per_tensor": per}


def _cos(dot: float, aa: float, bb: float) -> float:
    return dot / math.sqrt(aa * bb) if aa > 0 and bb > 0 else math.nan


def delta_state(base: Any, tuned: Any) -> dict[str, torch.Tensor]:
    """In-memory float64 deltas by canonical name (small models and tests; the streaming functions do not
    materialise this)."""
    sb, st = as_source(base), as_source(tuned)
    rows, _ = aligned_refs([sb, st])
    return {name: read_full(st, rt) - read_full(sb, rb) for name, (rb, rt) in rows}


# ---- streaming comparisons -----------------------------------------------------------------------------------------

def update_norm(base: Any, tuned: Any, chunk_elems: int = DEFAULT_CHUNK_ELEMS) -> dict[str, Any]:
    """L2 norm of tuned - base over the whole parameter vector and per canonical tensor (streamed, float64)."""
    rep = compare_updates(base, {"tuned": tuned}, stable_ranks=False, chunk_elems=chunk_elems)
    return {"total": rep["total"]["tuned"]["norm"],
            "per_tensor": {r["name"]: math.sqrt(r["tuned"]["sq"]) for r in rep["tensors"]},
            "numel": rep["total"]["numel"]}


def compare_updates(base: Any, tuned: Any | Mapping[str, Any], eps: float = DEFAULT_EPS, stable_ranks: bool = True,
                    chunk_elems: int = DEFAULT_CHUNK_ELEMS, stable_rank_device: str | None = None,
                    progress: bool = False) -> dict[str, Any]:
    """Norm, sparsity, max |d| and (attention/MLP matrices) stable rank of each update tuned[label] - base, and
    the cosine between every pair of updates, per canonical tensor, per family (role), per kind and in total.

    `tuned`: one source or {label: source} (labels such as "es", "grpo"). Sources: checkpoint folders (streamed),
    modules or dicts. Reads one row chunk of one tensor per source at a time; stable ranks read one whole matrix
    per source. `stable_rank_device` (e.g. "cuda") moves the spectral norms of large matrices to an accelerator.
    Returns a JSON-serialisable dict.
    """
    labelled = dict(tuned) if isinstance(tuned, Mapping) and not _is_tensor_mapping(tuned) else {"tuned": tuned}
    labels = list(labelled)
    sources = [as_source(base)] + [as_source(v) for v in labelled.values()]
    rows, unmatched = aligned_refs(sources)
    pairs = [(labels[i], labels[j]) for i in range(len(labels)) for j in range(i + 1, len(labels))]
    tensors: list[dict[str, Any]] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(rows), desc="weights", unit="tensor", leave=False)
    for name, refs in rows:
        shape = refs[0].shape
        acc = {lab: {"sq": 0.0, "small": 0, "max_abs": 0.0} for lab in labels}
        dots = {p: 0.0 for p in pairs}
        for chunk in iter_chunks(sources, refs, chunk_elems):
            b = chunk[0]
            deltas = {lab: t - b for lab, t in zip(labels, chunk[1:])}
            for lab, d in deltas.items():
                a = acc[lab]
                a["sq"] += float(d.pow(2).sum())
                a["small"] += int((d.abs() <= eps).sum())
                if d.numel():
                    a["max_abs"] = max(a["max_abs"], float(d.abs().max()))
            for p in pairs:
                dots[p] += float((deltas[p[0]] * deltas[p[1]]).sum())
            del chunk, deltas
        row: dict[str, Any] = {"name": name, "role": role_of(name), "kind": kind_of(name), "layer": layer_of(name),
                               "shape": list(shape), "numel": refs[0].numel}
        want_rank = stable_ranks and is_matrix_family(name, shape)
        for lab, src, ref in zip(labels, sources[1:], refs[1:]):
            a = acc[lab]
            a["stable_rank"] = None
            if want_rank:
                d = read_full(src, ref) - read_full(sources[0], refs[0])
                if stable_rank_device:
                    d = d.to(stable_rank_device)
                sr = stable_rank(d)
                a["stable_rank"] = None if math.isnan(sr) else sr
                del d
            row[lab] = a
        for p in pairs:
            row["cos:" + "|".join(p)] = _nan_to_none(_cos(dots[p], acc[p[0]]["sq"], acc[p[1]]["sq"]))
            row["dot:" + "|".join(p)] = dots[p]
        tensors.append(row)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return {
        "eps": eps, "labels": labels, "pairs": ["|".join(p) for p in pairs],
        "sources": {"base": sources[0].name, **{lab: s.name for lab, s in zip(labels, sources[1:])}},
        "unmatched": unmatched,
        "tensors": tensors,
        "total": summarize(tensors, labels, pairs),
        "families": {k: summarize(v, labels, pairs) for k, v in _group(tensors, "role").items()},
        "kinds": {k: summarize(v, labels, pairs) for k, v in _group(tensors, "kind").items()},
    }


def _is_tensor_mapping(x: Mapping) -> bool:
    return bool(x) and all(isinstance(v, torch.Tensor) for v in x.values())


def _group(rows: list[dict[str, Any]], key: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[r[key]].append(r)
    return dict(out)


def _nan_to_none(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def summarize(rows: list[dict[str, Any]], labels: list[str], pairs: list[tuple[str, str]] | list[str]) -> dict[str, Any]:
    """Aggregate per-tensor rows: norm = sqrt(sum sq), sparsity = sum small / sum numel, stable rank = mean over
    the attention QKVO and MLP gate/up/down matrices (paper Table 4), cosine = sum dot / (|a| |b|)."""
    numel = sum(r["numel"] for r in rows)
    out: dict[str, Any] = {"numel": numel, "tensors": len(rows)}
    for lab in labels:
        sq = sum(r[lab]["sq"] for r in rows)
        ranks = [r[lab]["stable_rank"] for r in rows
                 if r[lab].get("stable_rank") is not None and r["role"] in STABLE_RANK_ROLES]
        out[lab] = {
            "norm": math.sqrt(sq), "sq": sq,
            "sparsity": (sum(r[lab]["small"] for r in rows) / numel) if numel else None,
            "max_abs": max((r[lab]["max_abs"] for r in rows), default=0.0),
            "stable_rank_mean": float(np.mean(ranks)) if ranks else None,
            "stable_rank_median": float(np.median(ranks)) if ranks else None,
            "stable_rank_n": len(ranks),
        }
    for p in pairs:
        key = p if isinstance(p, str) else "|".join(p)
        a, b = key.split("|")
        dot = sum(r["dot:" + key] for r in rows)
        out["cos:" + key] = _nan_to_none(_cos(dot, out[a]["sq"], out[b]["sq"]))
        out["norm_ratio:" + key] = (out[a]["norm"] / out[b]["norm"]) if out[b]["norm"] > 0 else None
    return out
