"""Packed linears (weights reordered once per call: oneDNN's layout, or for bf16 weights on CPUs with AMX the
tile layout of esft's AMX linear) and greedy decoding's bf16-screened lm_head.

Both are opt-in (GenerationConfig.packed_linear / screened_lm_head, in esft.config.FAST_CPU_GENERATION) and
not bit-exact: oneDNN sums in another order than `F.linear`, so logits differ by ~1e-6 relative. The `*_reason`
functions say why an option cannot run here (None when it can).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import torch
import torch.nn.functional as F


def packed_linear_reason(dtype: torch.dtype) -> str | None:
    """None when oneDNN packed linears (`LeanModel(packed=True)`) can run here for weights of `dtype` (fp32, or
    bf16 weights with fp32 activations: `packed_linear_bf16`), else why not."""
    if dtype not in (torch.float32, torch.bfloat16):
        return f"dtype {dtype} (packed linears take fp32 or bf16 weights)"
    if not torch.backends.mkldnn.is_available():
        return "torch was built without oneDNN (mkldnn)"
    ops = torch.ops.mkldnn
    if not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
        return "this torch has no mkldnn._linear_pointwise"
    if dtype == torch.bfloat16 and not onednn_bf16():
        return "this torch's oneDNN has no bf16 matmul"
    return None


def onednn_bf16() -> bool:
    """True where this torch's oneDNN runs bf16 matmuls at all (natively or emulated: `bf16_matmul_is_native`
    tells which). The one place esft asks."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def bf16_matmul_is_native() -> bool:
    """True where oneDNN's bf16 matmul runs on bf16 dot-product instructions (AVX512-BF16 or AMX). oneDNN also
    accepts bf16 on plain AVX-512 CPUs (`mkldnn._is_mkldnn_bf16_supported`) but emulates it there, slower than
    fp32, which would make the screen a loss."""
    cpu = getattr(torch, "cpu", None)
    native = any(bool(getattr(cpu, name, lambda: False)()) for name in ("_is_avx512_bf16_supported",
                                                                        "_is_amx_tile_supported"))
    return native and onednn_bf16()


def screen_lm_head_reason(model, packed: bool, fused_attention: bool, delta=None) -> str | None:
    """None when greedy lm_head screening (`LeanModel(screen_lm_head=True)`) can run, else why not."""
    if not (packed and fused_attention):
        return "it needs packed_linear and fused_attention"
    if delta is not None:
        return "a low-rank population perturbs the lm_head per row"
    if model.lm_head.bias is not None:
        return "the lm_head has a bias"
    if not bf16_matmul_is_native():
        return "this CPU has no native bf16 dot product (AVX512-BF16 or AMX): oneDNN would emulate it, slower than fp32"
    return None


def tile_layout(weight: torch.Tensor) -> torch.Tensor:
    """A [N, K] weight (N and K multiples of 32) as the AMX linear reads it (esft/kernels/amx_linear.cpp, whose
    `pack` writes the same in one pass):
    [N/32, K/32, 16, 32, 2], block (n, k) holding rows 32n..32n+31 and columns 32k..32k+31 as 16 pairs of columns,
    each pair's 32 rows side by side (element [n, k, p, r, j] = weight[32n + r, 32k + 2p + j])."""
    n, k = weight.shape
    return weight.detach().reshape(n // 32, 32, k // 32, 16, 2).permute(0, 2, 3, 1, 4).contiguous()


def amx_linear_reason(weight: torch.Tensor) -> str | None:
    """None when `pack_weight` packs `weight` for the AMX linear (a bf16 [N, K] weight, N and K multiples of 32,
    on a CPU and build where the kernel runs), else why it takes oneDNN's layout instead."""
    if weight.dtype != torch.bfloat16 or weight.dim() != 2:
        return "the AMX linear takes 2-D bf16 weights"
    if weight.shape[0] % 32 or weight.shape[1] % 32:
        return f"a {tuple(weight.shape)} weight (the AMX linear needs both sides multiples of 32)"
    from esft.kernels import build_error, load_amx_linear

    if load_amx_linear() is None:
        return f"the AMX linear is not available here ({build_error('amx_linear')})"
    return None


def pack_weight(weight: torch.Tensor, batch_hint: int) -> torch.Tensor:
    """`weight` reordered once for `packed_linear`: bf16 weights for the AMX linear where it runs (`tile_layout`,
    a plain 5-D tensor), everything else into oneDNN's blocked layout for about `batch_hint` rows per call."""
    if amx_linear_reason(weight) is None:
        from esft.kernels import load_amx_linear

        return load_amx_linear().pack(weight.detach().contiguous())  # `tile_layout`, in one compiled pass
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_hint)


_RELEASABLE = threading.local()

#: fill(weights) writes those of `weights` whose contents the caller deferred (None: all of them)
Fill = Callable[[Iterable[torch.Tensor] | None], None]
#: rows(weight, index, out) -> rows `index` (int64 row ids or a slice) of a freed weight, as its owner's write makes
#: them; `out` (or None) a buffer of their shape and dtype the result may be written to
Rows = Callable[[torch.Tensor, "torch.Tensor | slice", "torch.Tensor | None"], torch.Tensor]
#: tiles(weights) -> freed weights (same columns) as their owner's write makes them, stacked by rows, in the AMX
#: linear's `tile_layout`; or None where the owner cannot write that
Tiles = Callable[[Sequence[torch.Tensor]], "torch.Tensor | None"]


@contextmanager
def releasing(weights: Iterable[torch.Tensor], fill: Fill | None = None, rows: Rows | None = None,
              tiles: Tiles | None = None) -> Iterator[None]:
    """Inside this context (on this thread only), the lean engine frees the storage of these plain weights once
    it has packed them (`release_packed`): an ES lane's copy whose weights are rewritten in full before its next
    use then holds one copy of its projections while it generates, the packed one, instead of two. Never for
    weights anything else reads: a released tensor keeps its shape but has no storage. Only the stacked path
    (`LeanModel.fused_projections`, whose prefill and decode read packed weights only) releases; the norm gains
    are always kept.

    `fill`: the owner of the weights may leave released ones unwritten (an ES lane's perturbation of its freed
    projections, `esft.es.noise.MasterWeights.fill`) and have the engine ask for them just before it reads them
    (`fill_released`): the stacked path asks layer by layer, right before packing, so the lane never holds its
    plain projections in full, only one layer's at a time; every other path asks for all of them first.
    `rows`: the owner can also compute any rows of such a weight (`MasterWeights.rows`); then the stacked path
    frees the vocabulary matrix too and reads its rows when it needs them (`esft.generation.vocab.VocabRows`).
    `tiles`: the owner can write freed weights straight into the AMX linear's layout (`MasterWeights.tiles`); then
    the stacked path packs a freed layer that way (`released_tiles`), and its plain weights are never written.
    A nested context without `fill` / `rows` / `tiles` keeps the enclosing one's."""
    previous = (getattr(_RELEASABLE, "ids", frozenset()), getattr(_RELEASABLE, "fill", None),
                getattr(_RELEASABLE, "rows", None), getattr(_RELEASABLE, "tiles", None))
    _RELEASABLE.ids = frozenset(id(w) for w in weights)
    _RELEASABLE.fill = fill if fill is not None else previous[1]
    _RELEASABLE.rows = rows if rows is not None else previous[2]
    _RELEASABLE.tiles = tiles if tiles is not None else previous[3]
    try:
        yield
    finally:
        _RELEASABLE.ids, _RELEASABLE.fill, _RELEASABLE.rows, _RELEASABLE.tiles = previous


def released_tiles(*weights: torch.Tensor) -> torch.Tensor | None:
    """`weights` stacked by rows and packed for the AMX linear by their owner (the enclosing `releasing` context's
    `tiles`), where that context names them all, none holds storage (their contents are the owner's deferred
    write) and `pack_weight` would give them the tile layout; else None (the caller fills, stacks and packs)."""
    tiles = getattr(_RELEASABLE, "tiles", None)
    ids = getattr(_RELEASABLE, "ids", frozenset())
    if tiles is None or not all(id(w) in ids and w.untyped_storage().nbytes() == 0 for w in weights):
        return None
    if any(amx_linear_reason(w) is not None for w in weights):
        return None
    return tiles(weights)


def released_rows(weight: torch.Tensor) -> Rows | None:
    """The enclosing `releasing` context's `rows` where that context may free `weight`, else None."""
    if id(weight) in getattr(_RELEASABLE, "ids", frozenset()):
        return getattr(_RELEASABLE, "rows", None)
    return None


def release_packed(*weights: torch.Tensor | None) -> None:
    """Free the storage of those `weights` that the enclosing `releasing` context names (no-op outside it)."""
    ids = getattr(_RELEASABLE, "ids", frozenset())
    for w in weights:
        if w is not None and id(w) in ids:
            w.untyped_storage().resize_(0)


def fill_released(*weights: torch.Tensor | None) -> None:
    """Have the enclosing `releasing` context's `fill` write these weights if their owner deferred them; with
    no arguments, every deferred weight (a path that reads the plain weights). No-op outside such a context."""
    fill = getattr(_RELEASABLE, "fill", None)
    if fill is not None:
        fill([w for w in weights if w is not None] if weights else None)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear` with a `pack_weight` weight: the AMX linear for a `tile_layout` weight (bf16 x, bf16 out, the
    bias added in fp32 before the rounding), else torch's own oneDNN linear (what inductor's CPU backend emits for
    frozen weights), so a small-batch call does not re-pack the weight as MKL's sgemm does each time."""
    if packed.dim() == 5:
        from esft.kernels import load_amx_linear

        b = None if bias is None else bias.detach().to(torch.float32).contiguous()
        if x.dim() == 2 and x.is_contiguous():  # a decode step's rows: no reshaping (~5 us a call otherwise)
            return load_amx_linear().linear(x, packed, b)
        out = load_amx_linear().linear(x.reshape(-1, x.shape[-1]).contiguous(), packed, b)
        return out.view(*x.shape[:-1], out.shape[-1])
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def packed_linear_bf16(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`packed_linear` with bf16 weights (bf16 rollouts, esft.generation.precision): the fp32 activations are
    rounded to bf16 for the matmul, which accumulates in fp32 (oneDNN), and the bf16 result comes back as fp32,
    so the residual stream, norms, attention and KV cache stay fp32."""
    return packed_linear(x.to(torch.bfloat16), packed, bias).to(torch.float32)


#: Rows per block in `row_norms`: 2048 x 576 widened to fp32 is 4.5 MB, a block that stays in L3 while it is reduced.
ROW_NORM_BLOCK = 2048


def row_norms(weight: torch.Tensor) -> torch.Tensor:
    """fp32 Euclidean norm of each row of a [V, D] matrix. A bf16 matrix is widened block by block: ATen's
    `vector_norm(..., dtype=float32)` on bf16 takes a scalar path, 86 ms for SmolLM2's 49152 x 576 lm_head on one
    Zen 4 core against 10 ms this way (docs/performance.md, "the screen's row norms"), and the screen rebuilds its
    norms at every generate call (every member)."""
    if weight.dtype == torch.float32:
        return torch.linalg.vector_norm(weight, dim=1)
    out = torch.empty(weight.shape[0], dtype=torch.float32, device=weight.device)
    for start in range(0, weight.shape[0], ROW_NORM_BLOCK):
        block = weight[start:start + ROW_NORM_BLOCK]
        out[start:start + block.shape[0]] = torch.linalg.vector_norm(block.to(torch.float32), dim=1)
    return out


def _packs_by_rows(shape: torch.Size) -> bool:
    """Whether a bf16 [V, D] matrix of this shape packs for the AMX linear (`tile_layout`), whose blocks of 32 rows
    are contiguous: then the screen writes its copy strip by strip (`ROW_NORM_BLOCK` rows, a multiple of 32)
    instead of holding a plain bf16 copy (54 MiB for SmolLM2) beside the packed one while it packs."""
    return amx_linear_reason(torch.empty(shape, dtype=torch.bfloat16, device="meta")) is None


class LMHeadScreen:
    """Greedy decoding's lm_head at half the cost: logits first in bf16 (oneDNN, half the bytes and ~2x the FLOP
    rate of fp32 on CPUs with AVX512-BF16 or AMX), then fp32 logits only for the tokens that a rigorous error
    bound cannot rule out as the row's maximum (~2 per row on SmolLM2). The pick is the argmax of those fp32
    logits (F.linear on the candidates' rows): the full fp32 head's argmax except, possibly, on a near-tie at
    fp32 rounding level, where the two GEMMs may round differently (packed_linear's caveat).

    Bound: rounding h and W to bf16 (unit roundoff u = 2^-8) changes each product h_i w_i by at most
    (2u + u^2)|h_i w_i|; fp32 accumulation over K terms adds at most gamma_K = K 2^-24 / (1 - K 2^-24) of
    sum |h_i w_i| to both the bf16 and the fp32 result; rounding the bf16 result itself costs at most 2^-7 of its
    magnitude (covers truncation too). With sum_i |h_i w_vi| <= ||h|| ||w_v||, every token v satisfies
    |approx_v - exact_v| <= e_v = c_prod ||h|| ||w_v|| + c_out |approx_v| (+1e-30 for flushed denormals), so a
    token whose approx_v + e_v is below some other token's approx_u - e_u cannot be the argmax. The fp32 logits
    of the survivors come from F.linear on their rows (`ScreenedLogits`).
    """

    def __init__(self, vocab: "VocabRows", batch_hint: int, packed_bf16: torch.Tensor | None = None):
        self.vocab = vocab  # the live lm_head's rows (ES perturbs it; this object lives for one generate call)
        # `packed_bf16`: the caller's own packed copy when the weight is bf16 already (bf16 rollouts: the lean
        # model's packed lm_head), so the vocabulary matrix is not held twice. Otherwise the bf16 copy is made
        # block by block, with the fp32 norms (also for bf16 weights: the bound needs them at full precision):
        # straight into the AMX linear's tiles where it runs, else whole, then packed by oneDNN
        self.row_norms = torch.empty(vocab.shape[0], dtype=torch.float32)
        tiles = packed_bf16 is None and _packs_by_rows(vocab.shape)
        plain = None if packed_bf16 is not None or tiles else torch.empty(vocab.shape, dtype=torch.bfloat16)
        if tiles:
            packed_bf16 = torch.empty((vocab.shape[0] // 32, vocab.shape[1] // 32, 16, 32, 2), dtype=torch.bfloat16)
        for start, block in vocab.blocks(ROW_NORM_BLOCK):
            self.row_norms[start:start + block.shape[0]] = row_norms(block)
            if tiles:
                packed_bf16[start // 32:(start + block.shape[0]) // 32] = pack_weight(block.to(torch.bfloat16), 0)
            elif plain is not None:
                plain[start:start + block.shape[0]] = block
        self.packed_bf16 = packed_bf16 if plain is None else pack_weight(plain, batch_hint)
        k = vocab.shape[1]
        u = 2.0 ** -8
        gamma = k * 2.0 ** -24 / (1 - k * 2.0 ** -24)
        self.c_prod = (2 * u + u * u + 2.1 * gamma) * 1.001
        self.c_out = 2.0 ** -7 * 1.01

    def logits(self, h: torch.Tensor, kernels, suppress: torch.Tensor) -> ScreenedLogits | None:
        """Logits of final hidden states h [n, D], exact where a row's argmax may lie (ScreenedLogits).
        `suppress` (int64 token ids) are excluded, as the sampler's eos suppression would exclude them. None when
        some row has no finite candidate (the caller then computes the full fp32 logits)."""
        approx = packed_linear(h.to(torch.bfloat16), self.packed_bf16)
        if suppress.numel():  # the lowest finite bf16, not -inf: the bound arithmetic stays finite
            approx.index_fill_(1, suppress, torch.finfo(torch.bfloat16).min)
        hnorm = torch.linalg.vector_norm(h, dim=1)
        cols, keep = kernels.screen_candidates(approx, hnorm, self.row_norms, self.c_prod, self.c_out)
        if not bool(keep.any(1).all()):  # a non-finite row (a diverged member): no bound holds; caller goes full
            return None
        # (bf16 weights: the candidates' fp32 logits of the bf16 rows, so the pick is the bf16 model's argmax)
        rows = self.vocab.take(cols).to(h.dtype)
        values = F.linear(h, rows).masked_fill_(~keep, float("-inf"))
        if suppress.numel():  # only reachable if every other logit of a row were below -3e38; keep the rule exact
            values[:, torch.isin(cols, suppress)] = float("-inf")
        return ScreenedLogits(cols, values)


@dataclass
class ScreenedLogits:
    """The fp32 logits of the screened candidates: `values[r, j]` is row r's logit of token `cols[j]` (ascending
    ids), -inf where that token was ruled out for row r."""

    cols: torch.Tensor
    values: torch.Tensor

    def greedy(self) -> torch.Tensor:
        # first maximum over ascending ids = the lowest id among ties, as argmax over the full vocabulary
        return self.cols[self.values.argmax(-1)]
