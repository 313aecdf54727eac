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
the cached keys/values differs (a slice of a preallocated buffer instead of a concatenated tensor, `kv_cache`),
which does not change the arithmetic. Greedy outputs equal `model.generate`'s (tests/test_lean.py, and a slow test
on the real model). The prompt prefill runs through the Hugging Face forward (the opt-in fast options below
replace it or its lm_head: `esft.generation.lean`).

Opt-in, not bit-exact (~1e-6 relative, another summation order; GenerationConfig.packed_linear /
fused_attention / screened_lm_head, all in esft.config.FAST_CPU_GENERATION): the projections and lm_head through
oneDNN with weights reordered once per call (`packed`); rotary + cache append + attention in one compiled kernel
(esft.kernels) over keys cached in 64-column tiles; with both, q|k|v and gate|up stacked into one matmul each,
the RMSNorm / residual / SwiGLU glue compiled (`_fused_step`), and the prompt prefill through the same path
(`esft.generation.lean`); for greedy decoding, the lm_head screened in bf16 with a rigorous error bound so that
only the possible argmaxes get exact fp32 logits (`packed.LMHeadScreen`). docs/performance.md measures each.

Supported: `model_type` llama / qwen2 / qwen3 with SDPA attention, SiLU MLP, no sliding-window layers and a
position-independent rotary type. `unsupported_reason(model)` says why anything else falls back to the HF forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from esft.generation.kv_cache import KVCache
from esft.generation.packed import (
    LMHeadScreen,
    ScreenedLogits,
    fill_released,
    pack_weight,
    packed_linear,
    packed_linear_bf16,
    packed_linear_reason,
    release_packed,
    released_tiles,
    screen_lm_head_reason,
)
from esft.generation.vocab import VocabRows

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


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm.forward, op for op (fp32 variance, rsqrt, gain applied in the input dtype)."""
    dtype = x.dtype
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return weight * h.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The rotary embedding's half rotation, as transformers' `rotate_half`."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def fused_attention_reason(dtype: torch.dtype) -> str | None:
    """None when the compiled decode-attention kernel (esft.kernels) can run here for weights of `dtype`, else why
    not (builds it). The kernel is fp32; bf16 weights run it on fp32 activations (with packed linears only)."""
    if dtype not in (torch.float32, torch.bfloat16):
        return f"dtype {dtype} (the kernel runs fp32 activations for fp32 or bf16 weights)"
    from esft.kernels import build_error, load_decode_attention

    if load_decode_attention() is None:
        return f"the kernel did not build ({build_error()})"
    return None


class _Handles:
    """The weights handed to `LeanModel.linear`: the parameters themselves or, packed, their reordered copies
    (`pack_weight`); `names` maps each handle's id to its parameter's name (what a low-rank delta is keyed by)."""

    def __init__(self, model, packed: bool, batch_hint: int):
        self.param_names = {id(p): name for name, p in model.named_parameters()}
        self.names: dict[int, str] = {}
        self.packed, self.batch_hint = packed, batch_hint

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        handle = pack_weight(t, self.batch_hint) if self.packed else t
        if id(t) in self.param_names:
            self.names[id(handle)] = self.param_names[id(t)]
        return handle


#: lm_head rows packed at once by `LeanModel.head_logits` where the whole packed matrix is not kept.
HEAD_SLICE_ROWS = 8192


class LeanModel:
    """Weight references (not copies: ES perturbs parameters in place) plus the few constants of one model.

    Built per `generate` call, so it always sees the current parameter tensors. `packed=True` instead holds
    reordered copies of the projection and lm_head weights (`pack_weight`; built here: ~0.2 s and one weight copy
    for the 135M model) and runs the decode matmuls through oneDNN (bf16 weights on AMX: esft's AMX linear): at
    batch 32 on this CPU they reach ~150-180 GFLOP/s instead of MKL's ~100, but sum in another order, so logits
    differ from `F.linear`'s by ~1e-6 relative (GenerationConfig.packed_linear, opt-in like share_prefix).
    `batch_hint` is the expected rows. With `screen_lm_head` on fp32 weights the lm_head is not held packed: the
    screen computes the decode steps' logits, and the prefill's come from `head_logits`, slice by slice.
    """

    def __init__(self, model, packed: bool = False, batch_hint: int = 32, fused_attention: bool = False,
                 delta=None, screen_lm_head: bool = False):
        reason = unsupported_reason(model, ignore_hooks=delta is not None)
        if reason is not None:
            raise ValueError(f"lean decode does not support this model: {reason}")
        self.fused = _load_fused_attention(model) if fused_attention else None
        self.key_tile = int(self.fused.KEY_TILE) if self.fused is not None else None  # KVCache(key_tile=)
        weight_dtype = model.lm_head.weight.dtype
        if packed and (why := packed_linear_reason(weight_dtype)) is not None:
            raise ValueError(f"packed linears are not available: {why}")
        # bf16 weights with fp32 activations (bf16 rollouts) exist only on the stacked path below
        self.low_precision = packed and weight_dtype == torch.bfloat16
        if self.low_precision and (self.fused is None or delta is not None):
            raise ValueError("bf16 packed weights need fused_attention and no low-rank delta")
        # bf16 weights keep their K/V cache in bf16 too: decode attention streams the whole cache every step, and
        # half the bytes is most of its cost; the kernel widens it back to fp32 for the arithmetic
        self.cache_dtype: torch.dtype | None = torch.bfloat16 if self.low_precision else None
        # the dtype the step's activations (and so its rotary tables) have: fp32 around bf16 packed weights, the
        # weights' own dtype on every other path, as in the HF forward
        self.activation_dtype = torch.float32 if self.low_precision else weight_dtype
        self.packed_linear = packed
        # With packed weights, the compiled kernels and no per-projection delta, the step multiplies by q|k|v and
        # gate|up stacked into one weight each (4 matmuls per layer instead of 7: fewer calls, and the thin k/v
        # projections no longer run alone) and does the norm/residual/SwiGLU glue in compiled code (_fused_step).
        self.fused_projections = packed and self.fused is not None and delta is None
        if not self.fused_projections:
            fill_released()  # the plain layers read every projection (only the stacked path fills layer by layer)
        w = _Handles(model, packed, batch_hint)
        # `delta` (a low-rank population) adds each row's perturbation term after every linear and the embedding,
        # exactly what its forward hooks do under the HF forward
        self.delta = delta
        self.embed_name = w.param_names.get(id(model.model.embed_tokens.weight))
        base = packed_linear_bf16 if self.low_precision else packed_linear if packed else F.linear
        self.linear = _row_linear(base, delta, w.names)
        # The stacked layers' matmuls: with bf16 weights, bf16 in and bf16 out (the compiled glue rounds its
        # outputs to bf16 and widens its inputs itself, `low=True`), the same bits as `packed_linear_bf16`'s
        # conversions without their passes; fp32 elsewhere and for the lm_head.
        self.layer_linear = packed_linear if self.low_precision else self.linear
        self.model = model
        self._read_config(model.config)
        inner = model.model
        # the vocabulary matrix by rows: an ES lane's copy is freed on the stacked path and its rows computed from
        # the masters when read (esft.generation.vocab); a tied lm_head is the same object
        self.vocab = VocabRows(inner.embed_tokens.weight)
        head = model.lm_head.weight
        self.head_rows = self.vocab if head is inner.embed_tokens.weight else VocabRows(head)
        self.final_norm = _gain(inner.norm.weight, self.low_precision)
        self.final_eps = inner.norm.variance_epsilon
        # The packed fp32 lm_head is read at every decode step unless the bf16 screen picks the tokens; then only
        # the prompts' last positions need it (`head_logits`, packed slice by slice) and a diverged member's
        # fallback (packed whole, when read): an ES lane never holds it.
        self._pack = w
        self._head_on_demand = screen_lm_head and packed and not self.low_precision
        self._lm_head = None if self._head_on_demand else w(self.head_rows.whole())
        self.lm_bias = model.lm_head.bias
        self.rotary = inner.rotary_emb
        self.layers: list[_Layer] = []
        for layer in inner.layers:
            self.scaling = layer.self_attn.scaling
            self.layers.append(_stacked_layer(layer, w, self.low_precision) if self.fused_projections
                               else _plain_layer(layer, w))
        self.qk_eps = self.eps
        # the RMSNorm after each layer's MLP residual: the next layer's input norm, the final norm after the last
        self.next_norm = [(L.ln1, self.eps) for L in self.layers[1:]] + [(self.final_norm, self.final_eps)]
        self.screen = None
        if screen_lm_head:
            if (why := screen_lm_head_reason(model, packed, fused_attention, delta)) is not None:
                raise ValueError(f"lm_head screening is not available: {why}")
            self.screen = LMHeadScreen(self.head_rows, batch_hint,
                                       packed_bf16=self.lm_head if self.low_precision else None)
        # Freed on every fp32 stacked path, where nothing in this call needs the matrix whole again: the screened
        # one reads rows and blocks (`lm_head` writes it back for a diverged member); the unscreened one (sampling,
        # no screen asked for, an lm_head with a bias, a CPU without native bf16) has packed its head whole above and
        # reads only token rows, so the plain 108 MiB would be a second copy. Its price is the write of the matrix
        # into fresh pages at the next member: 1.6-3.7% of a cpu-preset iteration on a Zen 2 (docs/performance.md,
        # "A CPU without AVX-512"), for 1.44-1.49x instead of 1.56-1.61x the evaluation's peak. A bf16 lane keeps
        # its 54 MiB: there the write-back cost ~1% of an iteration for too little memory ("vocabulary rows").
        if self.fused_projections and not self.low_precision:
            self.vocab.free()
            self.head_rows.free()

    @property
    def lm_head(self) -> torch.Tensor:
        """The lm_head weight as the linears take it (packed where `packed`), packed on first read if deferred."""
        if self._lm_head is None:
            self._lm_head = self._pack(self.head_rows.whole())
        return self._lm_head

    def head_logits(self, hidden: list[torch.Tensor]) -> list[torch.Tensor]:
        """Full-vocabulary logits of each tensor of final hidden states [n_i, D] in `hidden` (one per prefill
        forward). Where the lm_head is packed on demand, its rows are packed `HEAD_SLICE_ROWS` at a time and each
        slice multiplies every tensor before the next is packed: one slice (18 MiB for SmolLM2) exists at once
        instead of the whole 108 MiB matrix, and each is packed once per call. On the CPUs tested, the logits
        have the bits of the whole packed matrix (oneDNN sums each logit over the hidden dimension in an order
        the number of output columns did not change; tests/test_prefill_head.py checks it on the CPU at hand)."""
        if self._lm_head is not None or not self._head_on_demand:
            return [self.linear(h, self.lm_head, self.lm_bias) for h in hidden]
        hint = self._pack.batch_hint  # (on demand: no bias, no low-rank delta)
        out = [h.new_empty((h.shape[0], self.head_rows.shape[0])) for h in hidden]
        for start, rows in self.head_rows.blocks(HEAD_SLICE_ROWS):
            packed = pack_weight(rows, hint)
            for h, logits in zip(hidden, out):
                logits[:, start:start + rows.shape[0]] = packed_linear(h, packed)
        return out

    def _read_config(self, cfg) -> None:
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.groups = self.n_heads // self.n_kv
        self.eps = cfg.rms_norm_eps

    def rope_tables(self, length: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for positions 0..length-1 from the model's own rotary module ([length, head_dim] each)."""
        pos = torch.arange(length, device=like.device)[None]
        cos, sin = self.rotary(like, position_ids=pos)
        return cos[0], sin[0]


def _load_fused_attention(model):
    if (why := fused_attention_reason(model.lm_head.weight.dtype)) is not None:
        raise ValueError(f"fused attention is not available: {why}")
    from esft.kernels import load_decode_attention

    return load_decode_attention()


def _row_linear(base_linear, delta, names: dict[int, str]):
    """`base_linear`, plus each row's low-rank term where `delta` perturbs the weight (`names`: handle id ->
    parameter name)."""
    if delta is None:
        return base_linear

    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = base_linear(x, weight, bias)
        name = names.get(id(weight))
        if name is not None and name in delta.factors:
            out = delta.add_linear(name, x, out)
        return out

    return linear


def _plain_layer(layer, w: _Handles) -> _Layer:
    a, m = layer.self_attn, layer.mlp
    return _Layer(
        ln1=layer.input_layernorm.weight, ln2=layer.post_attention_layernorm.weight,
        wq=w(a.q_proj.weight), bq=a.q_proj.bias, wk=w(a.k_proj.weight), bk=a.k_proj.bias,
        wv=w(a.v_proj.weight), bv=a.v_proj.bias, wo=w(a.o_proj.weight), bo=a.o_proj.bias,
        wg=w(m.gate_proj.weight), wu=w(m.up_proj.weight), wd=w(m.down_proj.weight),
        qn=a.q_norm.weight if hasattr(a, "q_norm") else None, kn=a.k_norm.weight if hasattr(a, "k_norm") else None)


def _gain(weight: torch.Tensor | None, low_precision: bool) -> torch.Tensor | None:
    """A norm gain as the fp32 kernels read it: the parameter itself, or an fp32 copy of a bf16 one."""
    return weight.to(torch.float32) if low_precision and weight is not None else weight


def _stacked_layer(layer, w: _Handles, low_precision: bool = False) -> _Layer:
    """LeanModel.fused_projections' layout: q|k|v and gate|up stacked into one weight each (norm gains in fp32
    with bf16 weights, `_gain`)."""
    a, m = layer.self_attn, layer.mlp
    groups = ((a.q_proj.weight, a.k_proj.weight, a.v_proj.weight), (a.o_proj.weight,),
              (m.gate_proj.weight, m.up_proj.weight), (m.down_proj.weight,))
    # a lane's freed projections written by their owner straight into the packed layout where it can
    # (`released_tiles`); the rest of its deferred write of this layer done now (`releasing`), then packed here
    tiles = [released_tiles(*g) if w.packed else None for g in groups]
    unpacked = [t for g, done in zip(groups, tiles) if done is None for t in g]
    if unpacked:
        fill_released(*unpacked)
    wqkv, wo, wgu, wd = (done if done is not None else w(g[0] if len(g) == 1 else torch.cat(g).detach())
                         for g, done in zip(groups, tiles))
    biases = (a.q_proj.bias, a.k_proj.bias, a.v_proj.bias)
    qn, kn = (getattr(getattr(a, name, None), "weight", None) for name in ("q_norm", "k_norm"))
    out = _Layer(
        ln1=_gain(layer.input_layernorm.weight, low_precision),
        ln2=_gain(layer.post_attention_layernorm.weight, low_precision),
        wq=None, bq=None, wk=None, bk=None, wv=None, bv=None, wo=wo, bo=a.o_proj.bias, wg=None, wu=None, wd=wd,
        qn=_gain(qn, low_precision), kn=_gain(kn, low_precision), wqkv=wqkv,
        bqkv=None if biases[0] is None else torch.cat(biases).detach(), wgu=wgu)
    # layer by layer, so that a released lane copy never holds its plain and its packed projections in full at once
    release_packed(*unpacked)
    return out


def _fused_step(lean: LeanModel, cache: KVCache, token: torch.Tensor, cos_rows: torch.Tensor,
                sin_rows: torch.Tensor, packed: bool, suppress: torch.Tensor | None) -> torch.Tensor | ScreenedLogits:
    """`decode_step` for LeanModel.fused_projections: the same sequence of operations on [rows, hidden] tensors,
    with q|k|v and gate|up as one matmul each and the glue in compiled code (esft.kernels):
    x += o; h = RMSNorm(x) is one `add_rms_norm`, silu(g) * u one `silu_mul`."""
    n, col = cache.rows, cache.length
    heads, kv, hd = lean.n_heads, lean.n_kv, lean.head_dim
    lin, K, low = lean.layer_linear, lean.fused, lean.low_precision
    attend, add_rms, silu_mul = K.decode_attention, K.add_rms_norm, K.silu_mul
    q_end, k_end = heads * hd, (heads + kv) * hd
    eps, scaling, mask = lean.eps, lean.scaling, cache.mask
    layers = lean.layers
    x = lean.vocab.embed(token).to(torch.float32)  # (a bf16 table's rows -> fp32)
    h = K.rms_norm(x, layers[0].ln1, eps, low)
    last = len(layers) - 1
    for i, L in enumerate(layers):
        qkv = lin(h, L.wqkv, L.bqkv)
        q = qkv[:, :q_end].view(n, heads, hd)
        k = qkv[:, q_end:k_end].view(n, kv, hd)
        v = qkv[:, k_end:].view(n, kv, hd)
        if L.qn is not None:
            q, k = rms(q, L.qn, lean.qk_eps), rms(k, L.kn, lean.qk_eps)
            if low:  # (the kernel takes q, k and v in the cache's dtype)
                q, k = q.to(torch.bfloat16), k.to(torch.bfloat16)
        a = attend(q, k, v, cos_rows, sin_rows, cache.k[i], cache.v[i], mask, col, scaling, packed)
        h = add_rms(x, lin(a.view(n, q_end), L.wo, L.bo), L.ln2, eps, low)
        # the final norm's output stays fp32: the lm_head (and its screen) take fp32 hidden states
        h = add_rms(x, lin(silu_mul(lin(h, L.wgu)), L.wd), *lean.next_norm[i], low and i < last)
    if lean.screen is not None and suppress is not None:
        logits = lean.screen.logits(h, K, suppress)
        if logits is not None:
            return logits
    return lean.linear(h, lean.lm_head, lean.lm_bias)  # fp32 h: with bf16 weights rounded to bf16 for the matmul


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
    x = lean.vocab.embed(token[:, None])
    if lean.delta is not None and lean.embed_name in lean.delta.factors:
        x = lean.delta.add_embedding(lean.embed_name, token[:, None], x)
    for i, L in enumerate(lean.layers):
        residual = x
        h = rms(x, L.ln1, lean.eps)
        if fused is not None:  # rotary, cache append and attention in one compiled call (esft.kernels)
            q = lin(h, L.wq, L.bq).view(n, heads, hd)
            k = lin(h, L.wk, L.bk).view(n, kv, hd)
            if L.qn is not None:
                q, k = rms(q, L.qn, lean.qk_eps), rms(k, L.kn, lean.qk_eps)
            v = lin(h, L.wv, L.bv).view(n, kv, hd)
            a = fused.decode_attention(q, k, v, cos_rows, sin_rows, cache.k[i], cache.v[i],
                                       cache.mask, col, lean.scaling, packed).view(n, 1, heads * hd)
        else:
            q = lin(h, L.wq, L.bq).view(n, 1, heads, hd)
            k = lin(h, L.wk, L.bk).view(n, 1, kv, hd)
            if L.qn is not None:
                q, k = rms(q, L.qn, lean.qk_eps), rms(k, L.kn, lean.qk_eps)
            q = q.transpose(1, 2)
            k = k.transpose(1, 2)
            v = lin(h, L.wv, L.bv).view(n, 1, kv, hd).transpose(1, 2)
            q = (q * cos) + (rotate_half(q) * sin)
            k = (k * cos) + (rotate_half(k) * sin)
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
        h = rms(x, L.ln2, lean.eps)
        x = residual + lin(F.silu(lin(h, L.wg)) * lin(h, L.wu), L.wd)
    x = rms(x, lean.final_norm, lean.final_eps)
    cache.length = used
    return lin(x, lean.lm_head, lean.lm_bias)[:, -1, :]
