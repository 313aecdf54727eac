"""Lean decode step for Llama-family models: the Hugging Face forward's arithmetic without its per-step overhead.

Why this exists: at batch 32 on a 2-core CPU, one decode step of `model(...)` with a `DynamicCache` spends more
time in `torch.cat` (the cache grows by one column per step, so every layer copies its whole K and V: ~300 MB per
step at 200 cached tokens) than in the matmuls, plus mask building, rotary recomputation and module/kwargs plumbing
for 30 layers. transformers' `StaticCache` avoids the copy but attends over the full preallocated length every
step and still rebuilds masks. No library offers "HF-identical numerics, preallocated cache sliced to the current
length, rows dropped when they finish" for CPU, so this module re-states the decode step by hand.

Exactness: each operation is the one the Hugging Face modules run, in the same order, on tensors of the same
shapes (RMSNorm in fp32 then weight *, `F.linear` per projection, rotary tables produced by the model's own
`rotary_emb`, SDPA called exactly like `transformers.integrations.sdpa_attention` does for a one-token query:
`pack_gqa` + boolean mask when any row is padded, `enable_gqa` and no mask otherwise). Only the memory layout of
the cached keys/values differs (a slice of a preallocated buffer instead of a concatenated tensor), which does not
change the arithmetic. Greedy outputs equal `model.generate`'s (tests/test_lean.py, and a slow test on the real
model). The prompt prefill runs through the Hugging Face forward (the opt-in fast options below replace it or
its lm_head).

Opt-in, not bit-exact (~1e-6 relative, another summation order; GenerationConfig.packed_linear /
fused_attention / screened_lm_head, all in esft.config.FAST_CPU_GENERATION): the projections and lm_head through
oneDNN with weights reordered once per call; rotary + cache append + attention in one compiled kernel
(esft.kernels) over keys cached in 64-column tiles; with both, q|k|v and gate|up stacked into one matmul each,
the RMSNorm / residual / SwiGLU glue compiled, and the prompt prefill through the same path (`_fused_step`,
`_lean_prefill`); for greedy decoding, the lm_head screened in bf16 with a rigorous error bound so that only
the possible argmaxes get exact fp32 logits (`LMHeadScreen`). docs/performance.md measures each.

Supported: `model_type` llama / qwen2 / qwen3 with SDPA attention, SiLU MLP, no sliding-window layers and a
position-independent rotary type. `unsupported_reason(model)` says why anything else falls back to the HF forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

SUPPORTED_TYPES = ("llama", "qwen2", "qwen3")


def unsupported_reason(model, ignore_hooks: bool = False) -> str | None:
    """None when `LeanModel` can run `model`; otherwise a short reason (the caller falls back to HF).
    `ignore_hooks`: the caller re-applies its own forward hooks' effect (`LeanModel(delta=...)`)."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return "no config"
    if getattr(cfg, "model_type", None) not in SUPPORTED_TYPES:
        return f"model_type {getattr(cfg, 'model_type', None)!r} not in {SUPPORTED_TYPES}"
    if getattr(cfg, "_attn_implementation", None) != "sdpa":
        return f"attention implementation {getattr(cfg, '_attn_implementation', None)!r} (lean path mirrors sdpa)"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r}"
    if getattr(cfg, "mlp_bias", False):
        return "mlp_bias"
    layer_types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or getattr(cfg, "use_sliding_window", False):
        return "sliding-window attention layers"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if isinstance(rope, dict) and rope.get("rope_type", "default") in ("dynamic", "longrope"):
        return f"rope_type {rope.get('rope_type')!r} depends on the sequence length"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "unexpected module layout"
    if not hasattr(model, "lm_head"):
        return "no lm_head"
    if any(p.device.type != "cpu" for p in model.parameters()):
        return "lean path is for CPU (GPU runs use the HF forward / vLLM)"
    # the lean step calls F.linear on the weights directly, so module hooks (e.g. a low-rank population's
    # per-row perturbation) would silently not run
    if ignore_hooks:
        return None
    from torch.nn.modules import module as _module

    if _module._global_forward_hooks or _module._global_forward_pre_hooks:
        return "global module forward hooks are registered"
    for name, mod in model.named_modules():
        if mod._forward_hooks or mod._forward_pre_hooks:
            return f"forward hooks on {name or 'the model'}"
    return None


@dataclass
class _Layer:
    ln1: torch.Tensor
    ln2: torch.Tensor
    wq: torch.Tensor
    bq: torch.Tensor | None
    wk: torch.Tensor
    bk: torch.Tensor | None
    wv: torch.Tensor
    bv: torch.Tensor | None
    wo: torch.Tensor
    bo: torch.Tensor | None
    wg: torch.Tensor
    wu: torch.Tensor
    wd: torch.Tensor
    qn: torch.Tensor | None  # qwen3 per-head q/k RMSNorm gains
    kn: torch.Tensor | None
    wqkv: torch.Tensor | None = None  # fused layout (LeanModel.fused_projections): q|k|v and gate|up stacked
    bqkv: torch.Tensor | None = None
    wgu: torch.Tensor | None = None


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # LlamaRMSNorm.forward, op for op (fp32 variance, rsqrt, gain applied in the input dtype)
    dtype = x.dtype
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def packed_linear_reason(dtype: torch.dtype) -> str | None:
    """None when oneDNN packed linears (`LeanModel(packed=True)`) can run here, else why not."""
    if dtype != torch.float32:
        return f"dtype {dtype} (packed linears are fp32 only)"
    if not torch.backends.mkldnn.is_available():
        return "torch was built without oneDNN (mkldnn)"
    ops = torch.ops.mkldnn
    if not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
        return "this torch has no mkldnn._linear_pointwise"
    return None


def fused_attention_reason(dtype: torch.dtype) -> str | None:
    """None when the compiled decode-attention kernel (esft.kernels) can run here, else why not (builds it)."""
    if dtype != torch.float32:
        return f"dtype {dtype} (the kernel is fp32 only)"
    from esft.kernels import build_error, load_decode_attention

    if load_decode_attention() is None:
        return f"the kernel did not build ({build_error()})"
    return None


def bf16_matmul_is_native() -> bool:
    """True where oneDNN's bf16 matmul runs on bf16 dot-product instructions (AVX512-BF16 or AMX). oneDNN also
    accepts bf16 on plain AVX-512 CPUs (`mkldnn._is_mkldnn_bf16_supported`) but emulates it there, slower than
    fp32, which would make the screen a loss."""
    cpu = getattr(torch, "cpu", None)
    native = any(bool(getattr(cpu, name, lambda: False)()) for name in ("_is_avx512_bf16_supported",
                                                                        "_is_amx_tile_supported"))
    return native and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


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


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        import warnings

        warnings.warn(message, stacklevel=3)


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    # torch's own oneDNN linear (what inductor's CPU backend emits for frozen weights): the weight is reordered
    # once into oneDNN's blocked layout, so a small-batch call does not re-pack it as MKL's sgemm does each time
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


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

    def __init__(self, weight: torch.Tensor, batch_hint: int):
        weight = weight.detach()
        self.weight = weight  # the live parameter (ES perturbs it in place; this object lives for one call)
        self.packed_bf16 = torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16), batch_hint)
        self.row_norms = torch.linalg.vector_norm(weight, dim=1)
        k = weight.shape[1]
        u = 2.0 ** -8
        gamma = k * 2.0 ** -24 / (1 - k * 2.0 ** -24)
        self.c_prod = (2 * u + u * u + 2.1 * gamma) * 1.001
        self.c_out = 2.0 ** -7 * 1.01

    def logits(self, h: torch.Tensor, kernels, suppress: torch.Tensor) -> ScreenedLogits | None:
        """Logits of final hidden states h [n, D], exact where a row's argmax may lie (ScreenedLogits).
        `suppress` (int64 token ids) are excluded, as the sampler's eos suppression would exclude them. None when
        some row has no finite candidate (the caller then computes the full fp32 logits)."""
        approx = _packed_linear(h.to(torch.bfloat16), self.packed_bf16)
        if suppress.numel():  # the lowest finite bf16, not -inf: the bound arithmetic stays finite
            approx.index_fill_(1, suppress, torch.finfo(torch.bfloat16).min)
        hnorm = torch.linalg.vector_norm(h, dim=1)
        cols, keep = kernels.screen_candidates(approx, hnorm, self.row_norms, self.c_prod, self.c_out)
        if not bool(keep.any(1).all()):  # a non-finite row (a diverged member): no bound holds; caller goes full
            return None
        values = F.linear(h, self.weight.index_select(0, cols)).masked_fill_(~keep, float("-inf"))
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


class LeanModel:
    """Weight references (not copies: ES perturbs parameters in place) plus the few constants of one model.

    Built per `generate` call, so it always sees the current parameter tensors. `packed=True` instead holds
    oneDNN-reordered copies of the projection and lm_head weights (built here: ~0.2 s and one weight copy for
    the 135M model) and runs the decode matmuls through oneDNN: at batch 32 on this CPU they reach ~150-180
    GFLOP/s instead of MKL's ~100, but sum in another order, so logits differ from `F.linear`'s by ~1e-6
    relative (GenerationConfig.packed_linear, opt-in like share_prefix). `batch_hint` is the expected rows.
    """

    def __init__(self, model, packed: bool = False, batch_hint: int = 32, fused_attention: bool = False,
                 delta=None, screen_lm_head: bool = False):
        reason = unsupported_reason(model, ignore_hooks=delta is not None)
        if reason is not None:
            raise ValueError(f"lean decode does not support this model: {reason}")
        self.fused = None
        if fused_attention:
            if (why := fused_attention_reason(model.lm_head.weight.dtype)) is not None:
                raise ValueError(f"fused attention is not available: {why}")
            from esft.kernels import load_decode_attention

            self.fused = load_decode_attention()
        self.key_tile = int(self.fused.KEY_TILE) if self.fused is not None else None  # KVCache(key_tile=)
        if packed and (why := packed_linear_reason(model.lm_head.weight.dtype)) is not None:
            raise ValueError(f"packed linears are not available: {why}")
        self.packed_linear = packed
        base_linear = _packed_linear if packed else F.linear
        param_names = {id(p): name for name, p in model.named_parameters()}
        handle_names: dict[int, str] = {}  # id of the tensor handed to `linear` -> parameter name

        def w(t: torch.Tensor) -> torch.Tensor:
            handle = torch.ops.mkldnn._reorder_linear_weight(t.detach(), batch_hint) if packed else t
            if id(t) in param_names:
                handle_names[id(handle)] = param_names[id(t)]
            return handle

        # `delta` (a low-rank population) adds each row's perturbation term after every linear and the embedding,
        # exactly what its forward hooks do under the HF forward
        self.delta = delta
        self.embed_name = param_names.get(id(model.model.embed_tokens.weight))
        if delta is None:
            self.linear = base_linear
        else:

            def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
                out = base_linear(x, weight, bias)
                name = handle_names.get(id(weight))
                if name is not None and name in delta.factors:
                    out = delta.add_linear(name, x, out)
                return out

            self.linear = linear

        cfg = model.config
        self.model = model
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.groups = self.n_heads // self.n_kv
        self.eps = cfg.rms_norm_eps
        inner = model.model
        self.embed = inner.embed_tokens.weight
        self.padding_idx = inner.embed_tokens.padding_idx
        self.final_norm = inner.norm.weight
        self.final_eps = inner.norm.variance_epsilon
        self.lm_head = w(model.lm_head.weight)
        self.lm_bias = model.lm_head.bias
        self.rotary = inner.rotary_emb
        # With packed weights, the compiled kernels and no per-projection delta, the step multiplies by q|k|v and
        # gate|up stacked into one weight each (4 matmuls per layer instead of 7: fewer calls, and the thin k/v
        # projections no longer run alone) and does the norm/residual/SwiGLU glue in compiled code (_fused_step).
        self.fused_projections = packed and self.fused is not None and delta is None
        self.layers: list[_Layer] = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            self.scaling = a.scaling
            qn = a.q_norm.weight if hasattr(a, "q_norm") else None
            kn = a.k_norm.weight if hasattr(a, "k_norm") else None
            if self.fused_projections:
                biases = (a.q_proj.bias, a.k_proj.bias, a.v_proj.bias)
                self.layers.append(_Layer(
                    ln1=layer.input_layernorm.weight, ln2=layer.post_attention_layernorm.weight,
                    wq=None, bq=None, wk=None, bk=None, wv=None, bv=None,
                    wo=w(a.o_proj.weight), bo=a.o_proj.bias, wg=None, wu=None, wd=w(m.down_proj.weight),
                    qn=qn, kn=kn,
                    wqkv=w(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach()),
                    bqkv=None if biases[0] is None else torch.cat(biases).detach(),
                    wgu=w(torch.cat([m.gate_proj.weight, m.up_proj.weight]).detach())))
                continue
            self.layers.append(_Layer(
                ln1=layer.input_layernorm.weight, ln2=layer.post_attention_layernorm.weight,
                wq=w(a.q_proj.weight), bq=a.q_proj.bias, wk=w(a.k_proj.weight), bk=a.k_proj.bias,
                wv=w(a.v_proj.weight), bv=a.v_proj.bias, wo=w(a.o_proj.weight), bo=a.o_proj.bias,
                wg=w(m.gate_proj.weight), wu=w(m.up_proj.weight), wd=w(m.down_proj.weight), qn=qn, kn=kn))
        self.qk_eps = self.eps
        # the RMSNorm after each layer's MLP residual: the next layer's input norm, the final norm after the last
        self.next_norm = [(L.ln1, self.eps) for L in self.layers[1:]] + [(self.final_norm, self.final_eps)]
        self.screen = None
        if screen_lm_head:
            if (why := screen_lm_head_reason(model, packed, fused_attention, delta)) is not None:
                raise ValueError(f"lm_head screening is not available: {why}")
            self.screen = LMHeadScreen(model.lm_head.weight, batch_hint)

    def rope_tables(self, length: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for positions 0..length-1 from the model's own rotary module ([length, head_dim] each)."""
        pos = torch.arange(length, device=like.device)[None]
        cos, sin = self.rotary(like, position_ids=pos)
        return cos[0], sin[0]


class KVCache:
    """Preallocated keys/values [rows, kv_heads, capacity, head_dim] per layer, plus the attended-column mask.

    Columns 0..length-1 are in use; a step writes column `length`. Capacity grows by doubling (amortised copy),
    so a 1024-token budget does not allocate 1024 columns for rows that stop after 30. `keep(rows)` compacts the
    batch in place when rows finish.

    `key_tile=T` (what the compiled attention kernel reads, T = its KEY_TILE) stores each layer's keys as
    [rows, kv_heads, capacity / T, head_dim, T]: transposed within tiles of T columns, so that the kernel reads
    each tile as one contiguous block. That is not a view of the logical layout, so keys are written with
    `put_keys` and read back with `keys`; values keep the logical layout either way.
    """

    def __init__(self, lean: LeanModel, rows: int, capacity: int, dtype: torch.dtype, device,
                 key_tile: int | None = None):
        self.lean = lean
        self.key_tile = key_tile
        if key_tile:
            capacity = -(-capacity // key_tile) * key_tile
        self.k = [self._new_keys(rows, capacity, dtype, device) for _ in lean.layers]
        self.v = [torch.empty((rows, lean.n_kv, capacity, lean.head_dim), dtype=dtype, device=device)
                  for _ in lean.layers]
        self.mask = torch.zeros((rows, capacity), dtype=torch.bool, device=device)
        self.rows = rows
        self.length = 0

    def _new_keys(self, rows: int, capacity: int, dtype, device) -> torch.Tensor:
        kv, hd = self.lean.n_kv, self.lean.head_dim
        if not self.key_tile:
            return torch.empty((rows, kv, capacity, hd), dtype=dtype, device=device)
        return torch.empty((rows, kv, capacity // self.key_tile, hd, self.key_tile), dtype=dtype, device=device)

    def _key_span(self, columns: int) -> int:
        """Extent along the keys' third axis holding columns 0..columns-1 (tiles when tiled)."""
        return -(-columns // self.key_tile) if self.key_tile else columns

    @property
    def capacity(self) -> int:
        return self.mask.shape[1]

    def put_keys(self, layer: int, rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor) -> None:
        """Write keys [len(rows), kv_heads, len(cols), head_dim] at rows x columns (1-D index tensors)."""
        buf = self.k[layer]
        if not self.key_tile:
            buf[rows[:, None], :, cols[None, :]] = keys.transpose(1, 2)
            return
        t = self.key_tile
        # advanced indices on axes 0, 2, 4 broadcast to [rows, cols] and come first: [rows, cols, kv, head_dim]
        buf[rows[:, None], :, (cols // t)[None, :], :, (cols % t)[None, :]] = keys.transpose(1, 2)

    def keys(self, layer: int) -> torch.Tensor:
        """The live keys in the logical layout [rows, kv_heads, length, head_dim] (a copy when tiled)."""
        buf = self.k[layer][: self.rows]
        if not self.key_tile:
            return buf[:, :, : self.length]
        r, kv, tiles, hd, t = buf.shape
        return buf.transpose(3, 4).reshape(r, kv, tiles * t, hd)[:, :, : self.length]

    def zero(self, columns: int) -> None:
        """Zero columns 0..columns-1 of every row (gap columns stay masked but must be finite: 0 * NaN leaks)."""
        for buf in self.k:
            buf[:, :, : self._key_span(columns)].zero_()
        for buf in self.v:
            buf[:, :, :columns].zero_()

    def load_prefill(self, hf_cache, attention_mask: torch.Tensor) -> None:
        """Copy the prompt K/V out of a Hugging Face DynamicCache filled by the prefill forward."""
        rows, width = attention_mask.shape
        for i, layer in enumerate(hf_cache.layers):
            if self.key_tile:
                self.put_keys(i, torch.arange(rows), torch.arange(width), layer.keys)
            else:
                self.k[i][:, :, :width].copy_(layer.keys)
            self.v[i][:, :, :width].copy_(layer.values)
        self.mask[:, :width] = attention_mask.bool()
        self.length = width

    def ensure(self, columns: int) -> None:
        if columns <= self.capacity:
            return
        new = max(columns, 2 * self.capacity)
        if self.key_tile:
            new = -(-new // self.key_tile) * self.key_tile
        span = self._key_span(self.length)
        for i, old in enumerate(self.k):
            buf = self._new_keys(old.shape[0], new, old.dtype, old.device)
            buf[:, :, :span].copy_(old[:, :, :span])
            self.k[i] = buf
        for i, old in enumerate(self.v):
            buf = old.new_empty((old.shape[0], old.shape[1], new, old.shape[3]))
            buf[:, :, : self.length].copy_(old[:, :, : self.length])
            self.v[i] = buf
        mask = self.mask.new_zeros((self.mask.shape[0], new))
        mask[:, : self.length] = self.mask[:, : self.length]
        self.mask = mask

    def keep(self, index: torch.Tensor) -> None:
        """Keep only rows `index` (ascending), moved to the front; only the used columns are copied."""
        n, used = int(index.numel()), self.length
        span = self._key_span(used)
        for buf in self.k:
            buf[:n, :, :span] = buf[index, :, :span]
        for buf in self.v:
            buf[:n, :, :used] = buf[index, :, :used]
        self.mask[:n, :used] = self.mask[index, :used]
        self.rows = n


def _fused_step(lean: LeanModel, cache: KVCache, token: torch.Tensor, cos_rows: torch.Tensor,
                sin_rows: torch.Tensor, packed: bool, suppress: torch.Tensor | None) -> torch.Tensor | ScreenedLogits:
    """`decode_step` for LeanModel.fused_projections: the same sequence of operations on [rows, hidden] tensors,
    with q|k|v and gate|up as one matmul each and the glue in compiled code (esft.kernels):
    x += o; h = RMSNorm(x) is one `add_rms_norm`, silu(g) * u one `silu_mul`."""
    n, col = cache.rows, cache.length
    heads, kv, hd = lean.n_heads, lean.n_kv, lean.head_dim
    lin, K = lean.linear, lean.fused
    attend, add_rms, silu_mul = K.decode_attention, K.add_rms_norm, K.silu_mul
    q_end, k_end = heads * hd, (heads + kv) * hd
    eps, scaling, mask = lean.eps, lean.scaling, cache.mask
    layers = lean.layers
    x = F.embedding(token, lean.embed, lean.padding_idx)
    h = K.rms_norm(x, layers[0].ln1, eps)
    for i, L in enumerate(layers):
        qkv = lin(h, L.wqkv, L.bqkv)
        q = qkv[:, :q_end].view(n, heads, hd)
        k = qkv[:, q_end:k_end].view(n, kv, hd)
        v = qkv[:, k_end:].view(n, kv, hd)
        if L.qn is not None:
            q, k = _rms(q, L.qn, lean.qk_eps), _rms(k, L.kn, lean.qk_eps)
        a = attend(q, k, v, cos_rows, sin_rows, cache.k[i], cache.v[i], mask, col, scaling, packed)
        h = add_rms(x, lin(a.view(n, q_end), L.wo, L.bo), L.ln2, eps)
        h = add_rms(x, lin(silu_mul(lin(h, L.wgu)), L.wd), *lean.next_norm[i])
    if lean.screen is not None and suppress is not None:
        logits = lean.screen.logits(h, K, suppress)
        if logits is not None:
            return logits
    return lin(h, lean.lm_head, lean.lm_bias)


def decode_step(lean: LeanModel, cache: KVCache, token: torch.Tensor, position: torch.Tensor,
                cos_table: torch.Tensor, sin_table: torch.Tensor, suppress: torch.Tensor | None = None
                ) -> torch.Tensor | ScreenedLogits:
    """One token per live row through the model; appends its K/V at column `cache.length`; returns logits [n, V].

    The per-layer sequence below is LlamaDecoderLayer / Qwen3DecoderLayer.forward with the HF SDPA integration
    inlined (see module docstring); shapes keep the HF [rows, 1, hidden] layout so every kernel sees what it sees
    under `model(...)`. `suppress` (greedy decoding with LeanModel(screen_lm_head=True) only): token ids the
    sampler will exclude; the result is then a `ScreenedLogits` (exact logits of the possible argmaxes only).
    """
    n = cache.rows
    col = cache.length
    used = col + 1
    heads, kv, hd, groups = lean.n_heads, lean.n_kv, lean.head_dim, lean.groups
    lin = lean.linear
    cache.mask[:n, col] = True
    mask = cache.mask[:n, :used]
    # HF passes no mask (and enable_gqa) when no row is padded, else a boolean [n, 1, 1, used] mask and a packed
    # query. SDPA turns a boolean mask into where(~mask, -inf, 0) on every call; doing that once per step instead
    # of once per layer gives the same additive mask.
    packed = not bool(mask.all())
    fused = lean.fused
    attn_mask = None
    cos_rows, sin_rows = cos_table[position], sin_table[position]  # [n, hd]
    if lean.fused_projections:
        logits = _fused_step(lean, cache, token, cos_rows, sin_rows, packed, suppress)
        cache.length = used
        return logits
    if fused is None:
        cos, sin = cos_rows[:, None, None, :], sin_rows[:, None, None, :]  # as apply_rotary_pos_emb unsqueezes
        if packed:
            attn_mask = torch.zeros(mask.shape, dtype=cache.k[0].dtype, device=mask.device)
            attn_mask.masked_fill_(~mask, float("-inf"))
            attn_mask = attn_mask[:, None, None, :]
    x = F.embedding(token[:, None], lean.embed, lean.padding_idx)
    if lean.delta is not None and lean.embed_name in lean.delta.factors:
        x = lean.delta.add_embedding(lean.embed_name, token[:, None], x)
    for i, L in enumerate(lean.layers):
        residual = x
        h = _rms(x, L.ln1, lean.eps)
        if fused is not None:  # rotary, cache append and attention in one compiled call (esft.kernels)
            q = lin(h, L.wq, L.bq).view(n, heads, hd)
            k = lin(h, L.wk, L.bk).view(n, kv, hd)
            if L.qn is not None:
                q, k = _rms(q, L.qn, lean.qk_eps), _rms(k, L.kn, lean.qk_eps)
            v = lin(h, L.wv, L.bv).view(n, kv, hd)
            a = fused.decode_attention(q, k, v, cos_rows, sin_rows, cache.k[i], cache.v[i],
                                       cache.mask, col, lean.scaling, packed).view(n, 1, heads * hd)
        else:
            q = lin(h, L.wq, L.bq).view(n, 1, heads, hd)
            k = lin(h, L.wk, L.bk).view(n, 1, kv, hd)
            if L.qn is not None:
                q, k = _rms(q, L.qn, lean.qk_eps), _rms(k, L.kn, lean.qk_eps)
            q = q.transpose(1, 2)
            k = k.transpose(1, 2)
            v = lin(h, L.wv, L.bv).view(n, 1, kv, hd).transpose(1, 2)
            q = (q * cos) + (_rotate_half(q) * sin)
            k = (k * cos) + (_rotate_half(k) * sin)
            kb, vb = cache.k[i], cache.v[i]
            kb[:n, :, col : col + 1].copy_(k)
            vb[:n, :, col : col + 1].copy_(v)
            keys, values = kb[:n, :, :used], vb[:n, :, :used]
            if packed:
                a = F.scaled_dot_product_attention(q.reshape(n, kv, groups, hd), keys, values, attn_mask=attn_mask,
                                                   dropout_p=0.0, scale=lean.scaling, is_causal=False)
            else:
                a = F.scaled_dot_product_attention(q, keys, values, dropout_p=0.0, scale=lean.scaling,
                                                   is_causal=False, enable_gqa=True)
            a = a.reshape(n, -1, 1, hd).transpose(1, 2).contiguous()
            a = a.reshape(n, 1, -1).contiguous()
        x = residual + lin(a, L.wo, L.bo)
        residual = x
        h = _rms(x, L.ln2, lean.eps)
        x = residual + lin(F.silu(lin(h, L.wg)) * lin(h, L.wu), L.wd)
    x = _rms(x, lean.final_norm, lean.final_eps)
    cache.length = used
    return lin(x, lean.lm_head, lean.lm_bias)[:, -1, :]


def common_prefix(rows: list[list[int]]) -> int:
    """Length of the longest token prefix shared by all rows."""
    first, n = rows[0], min(len(r) for r in rows)
    k = 0
    while k < n and all(r[k] == first[k] for r in rows):
        k += 1
    return k


#: What one more prefill forward costs, in prompt tokens: streaming the weights once plus the forward's per-call
#: work. Measured on SmolLM2-135M, 2 CPU threads, with the HF forward: a forward costs ~0.13 s beyond its tokens,
#: ~85 tokens' worth (`esft bench`'s decode-heavy prefill 2.1 s in one bucket vs 2.6 s in four, for 3% less
#: padding). With the lean prefill one and four buckets cost the same there (1.8 s); 64 is kept as the margin.
PREFILL_BUCKET_TOKENS = 64


def length_buckets(lengths: list[int], max_buckets: int, bucket_tokens: int = 0) -> list[list[int]]:
    """Row indices split into at most `max_buckets` groups of similar length, minimising the padded positions
    sum(rows in group x longest in group) plus `bucket_tokens` per group (the fixed cost of one more forward;
    exact dynamic programme over the rows sorted by length)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    n, k_max = len(order), max(1, min(max_buckets, len(order)))
    inf = float("inf")
    # best[k][j]: cost of the first j sorted rows in k groups; a group of sorted rows i..j-1 costs (j - i) * len[i]
    best = [[inf] * (n + 1) for _ in range(k_max + 1)]
    cut = [[0] * (n + 1) for _ in range(k_max + 1)]
    best[0][0] = 0
    for k in range(1, k_max + 1):
        for j in range(1, n + 1):
            for i in range(k - 1, j):
                c = best[k - 1][i] + (j - i) * lengths[order[i]]
                if c < best[k][j]:
                    best[k][j], cut[k][j] = c, i
    k = min(range(1, k_max + 1), key=lambda kk: best[kk][n] + kk * bucket_tokens)
    groups, j = [], n
    while k > 0:
        i = cut[k][j]
        groups.append(order[i:j])
        j, k = i, k - 1
    return groups[::-1]


def layout_prefill(model, lean: LeanModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, prefill: Callable,
                   extra_columns: int, share_prefix: bool, buckets: int, min_prefix: int = 8):
    """Prompt prefill into a fresh KVCache, optionally (1) prefilling the rows' common token prefix once, at
    batch 1, and giving every row a copy of its K/V, and (2) prefilling the remainders in up to `buckets` groups of
    similar length instead of one batch padded to the longest.

    Returns (last-prompt-token logits [B, V], cache, next positions [B]). Cache columns are [prefix | remainders,
    right-aligned and left-padded]; positions continue from the prefix, so RoPE sees what a plain prefill sees.
    With neither option (or no usable prefix and one bucket) this is the plain HF prefill, bit for bit. Otherwise
    the prefix K/V come from a batch-1 forward and attention sums run over a different column layout, so logits
    match a plain prefill to ~1e-6 relative, not bit for bit (hence opt-in: GenerationConfig.share_prefix,
    prefill_buckets).
    """
    from esft.generation import left_pad

    batch, width = input_ids.shape
    device = input_ids.device
    lengths = attention_mask.sum(-1).tolist()
    rows = [input_ids[r, width - n:].tolist() for r, n in enumerate(lengths)]
    p = min(common_prefix(rows), min(lengths) - 1) if (share_prefix and batch > 1) else 0
    if p < min_prefix:  # every row keeps >= 1 own token, whose logits we need; a short prefix is not worth it
        p = 0
    groups = (length_buckets([n - p for n in lengths], buckets, PREFILL_BUCKET_TOKENS) if buckets > 1
              else [list(range(batch))])
    if p == 0 and len(groups) == 1:
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits, hf_cache = prefill(model, input_ids, attention_mask, position_ids)
        cache = KVCache(lean, batch, width + extra_columns, hf_cache.layers[0].keys.dtype, device,
                        key_tile=lean.key_tile)
        cache.load_prefill(hf_cache, attention_mask)
        return logits, cache, position_ids[:, -1] + 1
    prefix_cache = None
    if p:
        pre = torch.tensor([rows[0][:p]], dtype=torch.long, device=device)
        _, prefix_cache = prefill(model, pre, torch.ones_like(pre), torch.arange(p, device=device)[None])
    suffix_width = max(lengths) - p
    total = p + suffix_width
    logits = None
    next_pos = torch.empty(batch, dtype=torch.long, device=device)
    cache = None
    for group in groups:
        idx = torch.tensor(group, dtype=torch.long, device=device)
        suffix, suffix_mask = left_pad([rows[r][p:] for r in group], 0, device)  # pad id irrelevant: masked
        g, w = suffix.shape
        hf_cache = None
        if prefix_cache is not None:
            from transformers import DynamicCache

            hf_cache = DynamicCache(config=model.config)
            for i, layer in enumerate(prefix_cache.layers):
                hf_cache.update(layer.keys.expand(g, -1, -1, -1).contiguous(),
                                layer.values.expand(g, -1, -1, -1).contiguous(), i)
        mask = torch.cat([suffix_mask.new_ones((g, p)), suffix_mask], dim=1)
        positions = (suffix_mask.cumsum(-1) - 1).clamp(min=0) + p
        group_logits, hf_cache = prefill(model, suffix, mask.to(attention_mask.dtype), positions, hf_cache)
        if cache is None:
            cache = KVCache(lean, batch, total + extra_columns, hf_cache.layers[0].keys.dtype, device,
                            key_tile=lean.key_tile)
            cache.zero(total)
            logits = group_logits.new_empty((batch, group_logits.shape[-1]))
        logits[idx] = group_logits
        next_pos[idx] = positions[:, -1] + 1
        cols = torch.cat([torch.arange(p), torch.arange(total - w, total)]).to(device)
        for i, layer in enumerate(hf_cache.layers):
            cache.put_keys(i, idx, cols, layer.keys)
            cache.v[i][idx[:, None], :, cols[None, :]] = layer.values.transpose(1, 2)
        cache.mask[idx[:, None], cols[None, :]] = mask.bool()
    cache.length = total
    return logits, cache, next_pos


def _lean_head_prefill(lean: LeanModel) -> Callable:
    """A `prefill` that runs the HF base model and the last position's logits through the lean lm_head: the HF
    head multiplies a strided [B, 1, D] slice by a batched matmul, ~36 ms for 8 rows of SmolLM2 here (~13
    GFLOP/s). Same logits to ~1e-6 relative (packed_linear's caveat)."""
    from transformers import DynamicCache

    from esft.generation import _cache_kwarg

    def prefill(model, input_ids, attention_mask, position_ids, cache=None):
        cache = DynamicCache(config=model.config) if cache is None else cache
        out = model.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=True, **{_cache_kwarg(model.model): cache})
        h = out.last_hidden_state[:, -1, :].contiguous()
        return lean.linear(h, lean.lm_head, lean.lm_bias), cache

    return prefill


def _lean_prefill(lean: LeanModel) -> Callable:
    """A `prefill` for LeanModel.fused_projections: the prompt through the same packed, stacked matmuls and
    compiled glue as the decode step (oneDNN reaches ~210 GFLOP/s on a prompt batch here, MKL's sgemm under the
    HF forward ~175), SDPA for the attention, K/V into the DynamicCache that `layout_prefill` reads.

    Masking: a query attends to the unpadded cached and new columns up to its own position, as in the HF forward.
    A padding query (left padding) also attends to itself, so that no row of the softmax is empty; its outputs
    are never read (its key column stays masked for every real query and in decoding)."""
    from transformers import DynamicCache

    heads, kv, hd = lean.n_heads, lean.n_kv, lean.head_dim
    q_end, k_end = heads * hd, (heads + kv) * hd
    K, lin, layers = lean.fused, lean.linear, lean.layers

    def prefill(model, input_ids, attention_mask, position_ids, cache=None):
        cache = DynamicCache(config=model.config) if cache is None else cache
        b, t = input_ids.shape
        past = attention_mask.shape[1] - t
        x = F.embedding(input_ids, lean.embed, lean.padding_idx).reshape(b * t, -1)
        cos, sin = lean.rotary(x, position_ids=position_ids)  # [b, t, hd]
        cos, sin = cos[:, None], sin[:, None]
        cols = torch.arange(past + t, device=x.device)
        rows = past + torch.arange(t, device=x.device)
        allowed = attention_mask.bool()[:, None, :] & (cols[None, :] <= rows[:, None])[None]  # [b, t, past + t]
        allowed |= (cols[None, :] == rows[:, None])[None]
        mask = allowed[:, None]
        h = K.rms_norm(x, layers[0].ln1, lean.eps)
        for i, L in enumerate(layers):
            qkv = lin(h, L.wqkv, L.bqkv)
            q = qkv[:, :q_end].view(b, t, heads, hd)
            k = qkv[:, q_end:k_end].view(b, t, kv, hd)
            v = qkv[:, k_end:].view(b, t, kv, hd).transpose(1, 2)
            if L.qn is not None:
                q, k = _rms(q, L.qn, lean.qk_eps), _rms(k, L.kn, lean.qk_eps)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            q = (q * cos) + (_rotate_half(q) * sin)
            k = (k * cos) + (_rotate_half(k) * sin)
            keys, values = cache.update(k, v, i)
            a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=lean.scaling, enable_gqa=True)
            a = a.transpose(1, 2).reshape(b * t, q_end)
            h = K.add_rms_norm(x, lin(a, L.wo, L.bo), L.ln2, lean.eps)
            h = K.add_rms_norm(x, lin(K.silu_mul(lin(h, L.wgu)), L.wd), *lean.next_norm[i])
        last = h.view(b, t, -1)[:, -1].contiguous()
        return lin(last, lean.lm_head, lean.lm_bias), cache

    return prefill


def lean_decode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, config,
                eos: list[int], sample: Callable, prefill: Callable, delta=None,
                on_keep: Callable[[torch.Tensor], None] | None = None) -> list[list[int]]:
    """`esft.generation.decode` with the lean step: same contract (greedy-identical to `model.generate`).

    `prefill(model, input_ids, attention_mask, position_ids, cache=None) -> (last-position logits, DynamicCache)` runs
    the prompt through the HF forward; with packed linears (and no low-rank `delta`) the lean path replaces it by
    `_lean_prefill` (stacked projections) or `_lean_head_prefill` (HF forward, lean lm_head).
    `sample(logits, step, generator)` picks the next token (eos suppression included). config.share_prefix /
    prefill_buckets change the prefill layout (`layout_prefill`).
    """
    from esft.generation import check_cancelled  # lazy: esft.generation imports this module lazily too

    batch = input_ids.shape[0]
    packed = bool(getattr(config, "packed_linear", False))
    if packed and (why := packed_linear_reason(model.lm_head.weight.dtype)) is not None:
        _warn_once(f"packed_linear ignored: {why}")
        packed = False
    fused = bool(getattr(config, "fused_attention", False))
    if fused and (why := fused_attention_reason(model.lm_head.weight.dtype)) is not None:
        _warn_once(f"fused_attention ignored: {why}")
        fused = False
    # greedy only, and not under a low-rank population (its rows perturb the lm_head): skipped silently there
    screen = bool(getattr(config, "screened_lm_head", False)) and config.temperature == 0 and delta is None
    if screen and (why := screen_lm_head_reason(model, packed, fused, delta)) is not None:
        _warn_once(f"screened_lm_head ignored: {why}")
        screen = False
    lean = LeanModel(model, packed=packed, batch_hint=batch, fused_attention=fused, delta=delta,
                     screen_lm_head=screen)
    device = input_ids.device
    generator = None
    if config.temperature > 0:
        generator = torch.Generator(device=device).manual_seed(config.seed)
    budget = config.max_new_tokens
    if lean.fused_projections:
        prefill = _lean_prefill(lean)
    elif packed and delta is None:
        prefill = _lean_head_prefill(lean)
    # room for 256 tokens (or the forced minimum) up front; longer completions grow the buffer by doubling
    logits, cache, next_pos = layout_prefill(
        model, lean, input_ids, attention_mask, prefill, extra_columns=min(budget, max(256, config.min_new_tokens)),
        # a per-row perturbation (delta) maps hook rows to batch rows, so its prefill stays one plain batch
        share_prefix=bool(getattr(config, "share_prefix", False)) and delta is None,
        buckets=int(getattr(config, "prefill_buckets", 1) or 1) if delta is None else 1)
    # every position this call can reach, computed once (a few KB even for a 1024-token budget)
    cos_t, sin_t = lean.rope_tables(int(next_pos.max()) + budget + 1, cache.k[0].new_empty(1))
    rows = torch.arange(batch, device=device)
    outputs: list[list[int]] = [[] for _ in range(batch)]
    eos_t = torch.tensor(eos, device=device)
    min_new = int(getattr(config, "min_new_tokens", 0) or 0)
    no_suppress = eos_t[:0]
    for step in range(budget):
        check_cancelled()
        token = logits.greedy() if isinstance(logits, ScreenedLogits) else sample(logits, step, generator)
        for r, t in zip(rows.tolist(), token.tolist()):
            outputs[r].append(t)
        if step == budget - 1:
            break
        alive = ~torch.isin(token, eos_t)
        if not bool(alive.all()):
            if not bool(alive.any()):
                break
            keep = alive.nonzero().squeeze(-1)
            cache.keep(keep)
            if on_keep is not None:
                on_keep(keep)
            rows, token, next_pos = rows[keep], token[keep], next_pos[keep]
        cache.ensure(cache.length + 1)
        # the sampler suppresses eos before min_new_tokens; a screened lm_head must exclude them too
        suppress = (eos_t if step + 1 < min_new else no_suppress) if screen else None
        logits = decode_step(lean, cache, token, next_pos, cos_t, sin_t, suppress)
        next_pos = next_pos + 1
    return outputs
