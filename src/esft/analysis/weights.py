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

The report's section (Tables 3, 4, 20 per chain, beside the study's) is esft.analysis.weights_report.
"""

from __future__ import annotations

import math
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import torch

from esft import paper
from esft.analysis.canonical import STABLE_RANK_ROLES, is_matrix_family, kind_of, layer_of, role_of
from esft.analysis.sources import DEFAULT_CHUNK_ELEMS, aligned_refs, as_source, iter_chunks, read_full

DEFAULT_EPS = paper.SPARSITY_EPS


# ---- pure metrics ------------------------------------------------------------------------------------------------

def _tensors(x: torch.Tensor | Mapping[str, torch.Tensor] | Iterable[torch.Tensor]) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, Mapping):
        return list(x.values())
    return list(x)


def sparsity(delta: torch.Tensor | Mapping[str, torch.Tensor] | Iterable[torch.Tensor],
             eps: float = DEFAULT_EPS) -> float:
    """Fraction of entries with |d| <= eps, over one tensor or all tensors of a mapping/iterable. Compared in
    float64: against a bf16/fp16 tensor, torch would round eps to that dtype (1e-5 -> 1.0014e-5 in bf16)."""
    small = total = 0
    for t in _tensors(delta):
        small += int((t.detach().abs().to(torch.float64) <= eps).sum())
        total += t.numel()
    if total == 0:
        raise ValueError("sparsity of an empty update")
    return small / total


def gaussian_stable_rank(shape: tuple[int, ...] | list[int]) -> float:
    """The stable rank of an m x n matrix of i.i.d. Gaussian entries, mn / (sqrt(m) + sqrt(n))^2 (its largest
    singular value sits at the Marchenko-Pastur edge; within ~3% of a drawn matrix's from 192 x 576 up). An ES
    update is a sum of such noise matrices plus a low-rank signal, so this is about the most it can reach."""
    m, n = shape[0], math.prod(shape[1:])
    return m * n / (math.sqrt(m) + math.sqrt(n)) ** 2


def stable_rank(matrix: torch.Tensor) -> float:
    """||W||_F^2 / ||W||_2^2 in float64 (1 for a rank-one matrix, up to min(m, n)); NaN for a zero matrix and
    for one with NaN/inf entries (whose SVD would not converge). Tensors with more than two dims are flattened to
    (shape[0], -1)."""
    w = matrix.detach().to(torch.float64)
    if w.dim() < 2:
        raise ValueError(f"stable rank needs a matrix, got shape {tuple(matrix.shape)}")
    if w.dim() > 2:
        w = w.reshape(w.shape[0], -1)
    fro_sq = float(w.pow(2).sum())
    if fro_sq == 0.0 or not math.isfinite(fro_sq):
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
    vectors (names in both), "per_tensor": {name: cosine}}; NaN where a norm is zero. Tensors compared must have
    the same shape (equal sizes alone would pair unrelated coordinates)."""
    if isinstance(delta_a, torch.Tensor) and isinstance(delta_b, torch.Tensor):
        _same_shape("the two updates", delta_a, delta_b)
        a, b = delta_a.double().flatten(), delta_b.double().flatten()
        return _cos(float(a @ b), float(a @ a), float(b @ b))
    if not (isinstance(delta_a, Mapping) and isinstance(delta_b, Mapping)):
        raise TypeError("cosine_similarity takes two tensors or two mappings of tensors")
    dot = aa = bb = 0.0
    per: dict[str, float] = {}
    for name, ta in delta_a.items():
        if name not in delta_b:
            continue
        _same_shape(f"tensor {name}", ta, delta_b[name])
        a, b = ta.double().flatten(), delta_b[name].double().flatten()
        d, na, nb = float(a @ b), float(a @ a), float(b @ b)
        per[name] = _cos(d, na, nb)
        dot, aa, bb = dot + d, aa + na, bb + nb
    return {"total": _cos(dot, aa, bb), "per_tensor": per}


def _same_shape(what: str, a: torch.Tensor, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"cosine of {what}: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}")


def _cos(dot: float, aa: float, bb: float) -> float:
    return dot / math.sqrt(aa * bb) if aa > 0 and bb > 0 else math.nan


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
        acc = {lab: {"sq": 0.0, "small": 0, "small_bf16": 0, "max_abs": 0.0} for lab in labels}
        dots = {p: 0.0 for p in pairs}
        for chunk in iter_chunks(sources, refs, chunk_elems):
            b = chunk[0]
            b16 = b.to(torch.bfloat16).to(b.dtype)
            deltas = {lab: t - b for lab, t in zip(labels, chunk[1:])}
            for (lab, d), t in zip(deltas.items(), chunk[1:]):
                a = acc[lab]
                a["sq"] += float(d.pow(2).sum())
                a["small"] += int((d.abs() <= eps).sum())
                # as a bf16 checkpoint would hold both weights: most 1e-4-scale changes round away
                a["small_bf16"] += int(((t.to(torch.bfloat16).to(t.dtype) - b16).abs() <= eps).sum())
                if d.numel():
                    a["max_abs"] = _nanmax([a["max_abs"], float(d.abs().max())])
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


def _nanmax(values: list[float]) -> float:
    """Largest value, NaN if any is NaN (Python's max(0.0, nan) is 0.0: a NaN update would read as no change)."""
    return math.nan if any(math.isnan(v) for v in values) else max(values, default=0.0)


def _nan_to_none(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def summarize(rows: list[dict[str, Any]], labels: list[str],
              pairs: list[tuple[str, str]] | list[str]) -> dict[str, Any]:
    """Aggregate per-tensor rows: norm = sqrt(sum sq), sparsity = sum small / sum numel (also of the weights
    rounded to bf16), stable rank = mean over the attention QKVO and MLP gate/up/down matrices (paper Table 4)
    beside that of i.i.d. Gaussian matrices of their shapes, cosine = sum dot / (|a| |b|)."""
    numel = sum(r["numel"] for r in rows)
    out: dict[str, Any] = {"numel": numel, "tensors": len(rows)}
    for lab in labels:
        sq = sum(r[lab]["sq"] for r in rows)
        ranked = [r for r in rows if r[lab].get("stable_rank") is not None and r["role"] in STABLE_RANK_ROLES]
        ranks = [r[lab]["stable_rank"] for r in ranked]
        gauss = [gaussian_stable_rank(r["shape"]) for r in ranked]
        out[lab] = {
            "norm": math.sqrt(sq), "sq": sq,
            "sparsity": (sum(r[lab]["small"] for r in rows) / numel) if numel else None,
            "sparsity_bf16": (sum(r[lab].get("small_bf16", 0) for r in rows) / numel) if numel else None,
            "stable_rank_gaussian": float(np.mean(gauss)) if gauss else None,
            "max_abs": _nanmax([r[lab]["max_abs"] for r in rows]),
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


def plot_weights(rep: dict[str, Any], path: Path, title: str | None = None) -> Path:
    """Per-layer update norm and stable rank of each matrix family, one shade per family and update (ES blues,
    GRPO reds; a second update of the same colours is dashed, a third dotted); `title` says which updates."""
    from matplotlib.ticker import MaxNLocator

    from esft.analysis.plots import pyplot, save

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    # `esft weights` gives no title: the figure still says what it compares
    fig.suptitle(title or f"update from the base model: {', '.join(rep['labels'])}", fontsize=9)
    fams = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    maps = {"es": "Blues", "grpo": "Reds"}
    # two updates of one algorithm (two seeds) share its shades, so each further one gets its own line style
    styles, shared = ("-", "--", ":", "-."), {}
    for j, lab in enumerate(rep["labels"]):
        name = maps.get(lab.split("_")[0], ["Greens", "Purples", "Oranges"][j % 3])
        cmap, style = plt.get_cmap(name), styles[shared.setdefault(name, 0) % len(styles)]
        shared[name] += 1
        for k, fam in enumerate(fams):
            rows = sorted((r for r in rep["tensors"] if r["role"] == fam and r["layer"] is not None),
                          key=lambda r: r["layer"])
            if not rows:
                continue
            layers = [r["layer"] for r in rows]
            kw = dict(color=cmap(0.35 + 0.65 * k / (len(fams) - 1)), ls=style, lw=1.2, marker=".", ms=3)
            axes[0].plot(layers, [math.sqrt(r[lab]["sq"]) for r in rows], label=f"{lab} {fam}", **kw)
            sr = [r[lab]["stable_rank"] for r in rows]
            if any(v is not None for v in sr):
                axes[1].plot(layers, [v if v is not None else float("nan") for v in sr], **kw)
    if any(y > 0 for line in axes[0].get_lines() for y in line.get_ydata()):
        axes[0].set_yscale("log")
    else:  # updates that moved nothing (a run of 0 iterations, or rewards all equal): a log axis has no range
        axes[0].text(0.5, 0.6, "every update norm is 0", transform=axes[0].transAxes, ha="center")
    if not axes[1].get_lines():  # ||dW||_2 = 0 leaves the ratio undefined: say why the panel is empty
        axes[1].text(0.5, 0.5, "no stable rank: no matrix was updated", transform=axes[1].transAxes, ha="center")
    axes[0].set_ylabel(r"$\|\Delta W\|_F$")
    axes[1].set_ylabel("stable rank")
    axes[0].set_title("update norm per matrix", fontsize=9)
    axes[1].set_title(r"stable rank $\|\Delta W\|_F^2 / \|\Delta W\|_2^2$ per matrix", fontsize=9)
    for ax in axes:
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    # beside the panels, one column per update: a legend of this size inside the norm panel would hide its lines
    axes[1].legend(*axes[0].get_legend_handles_labels(), fontsize=7, ncol=len(rep["labels"]), loc="upper left",
                   bbox_to_anchor=(1.02, 1.0))
    return save(fig, path)
