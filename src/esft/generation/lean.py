"""The lean engine: esft's decode loop (`loop.decode_loop`) with the lean step (`lean_step`) over the lean KV
cache (`kv_cache`), the prompts laid out by `prefill`, and packed linears / the screened lm_head (`packed`) where
GenerationConfig asks for them and this machine can run them (else a warning, once, and the plain path).

`lean_decode` is `esft.generation.decode`'s path for the models `unsupported_reason` accepts. The public names of
the engine's parts are re-exported here, so `esft.generation.lean` is the lean engine's one namespace.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from esft.generation.hf_step import cache_kwarg, hf_prefill
from esft.generation.kv_cache import KVCache
from esft.generation.lean_step import (
    SUPPORTED_TYPES,
    LeanModel,
    decode_step,
    fused_attention_reason,
    rms,
    rotate_half,
    unsupported_reason,
)
from esft.generation.loop import decode_loop
from esft.generation.packed import (
    LMHeadScreen,
    ScreenedLogits,
    bf16_matmul_is_native,
    packed_linear_reason,
    screen_lm_head_reason,
)
from esft.generation.prefill import PREFILL_BUCKET_TOKENS, common_prefix, layout_prefill, length_buckets

__all__ = [
    "KVCache", "LMHeadScreen", "LeanModel", "LeanStep", "PREFILL_BUCKET_TOKENS", "SUPPORTED_TYPES", "ScreenedLogits",
    "bf16_matmul_is_native", "common_prefix", "decode_step", "fused_attention_reason", "layout_prefill",
    "lean_decode", "length_buckets", "packed_linear_reason", "screen_lm_head_reason", "unsupported_reason",
]

_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        import warnings

        warnings.warn(message, stacklevel=4)  # at lean_decode's caller


def _options(model, config, delta) -> tuple[bool, bool, bool]:
    """(packed_linear, fused_attention, screened_lm_head) as `config` asks, less what cannot run here (warned),
    and less the screen where it is off by design (sampling, a low-rank population, no native bf16: silently)."""
    dtype = model.lm_head.weight.dtype
    packed = bool(config.packed_linear)
    if packed and (why := packed_linear_reason(dtype)) is not None:
        _warn_once(f"packed_linear ignored: {why}")
        packed = False
    fused = bool(config.fused_attention)
    if fused and (why := fused_attention_reason(dtype)) is not None:
        _warn_once(f"fused_attention ignored: {why}")
        fused = False
    if dtype == torch.bfloat16 and packed != fused:  # bf16 weights: both (fp32 activations) or neither (HF's bf16)
        _warn_once("packed_linear and fused_attention ignored: bf16 weights need both")
        packed = fused = False
    # greedy only, not under a low-rank population (its rows perturb the lm_head), and only on a CPU with native
    # bf16 dot products, where the bf16 head pays (elsewhere it would be emulated, slower than the fp32 head it
    # saves; `esft env` says which this is): skipped silently there, as the option means
    screen = (bool(config.screened_lm_head) and config.temperature == 0 and delta is None
              and bf16_matmul_is_native())
    if screen and (why := screen_lm_head_reason(model, packed, fused, delta)) is not None:
        _warn_once(f"screened_lm_head ignored: {why}")
        screen = False
    return packed, fused, screen


def _lean_head_prefill(lean: LeanModel) -> Callable:
    """A `prefill` that runs the HF base model and returns the last position's hidden states, for the lean
    lm_head (`LeanModel.head_logits`, applied by `layout_prefill`): the HF head multiplies a strided [B, 1, D]
    slice by a batched matmul, ~36 ms for 8 rows of SmolLM2 here (~13 GFLOP/s). Same logits to ~1e-6 relative
    (packed_linear's caveat)."""
    from transformers import DynamicCache

    def prefill(model, input_ids, attention_mask, position_ids, cache=None):
        cache = DynamicCache(config=model.config) if cache is None else cache
        out = model.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=True, **{cache_kwarg(model.model): cache})
        return out.last_hidden_state[:, -1, :].contiguous(), cache

    return prefill


def _lean_prefill(lean: LeanModel) -> Callable:
    """A `prefill` for LeanModel.fused_projections: the prompt through the same packed, stacked matmuls and
    compiled glue as the decode step (oneDNN reaches ~210 GFLOP/s on a prompt batch here, MKL's sgemm under the
    HF forward ~175), SDPA for the attention, each layer's K/V through `cache.update` (a DynamicCache, or
    `layout_prefill`'s writer into the KVCache). Returns the last positions' hidden states: `layout_prefill`
    applies the lm_head (`LeanModel.head_logits`).

    Masking: a query attends to the unpadded cached and new columns up to its own position, as in the HF forward.
    A padding query (left padding) also attends to itself, so that no row of the softmax is empty; its outputs
    are never read (its key column stays masked for every real query and in decoding)."""
    from transformers import DynamicCache

    q_end, hd = lean.n_heads * lean.head_dim, lean.head_dim
    K, lin, layers = lean.fused, lean.layer_linear, lean.layers
    low = lean.low_precision  # bf16 matmul inputs and outputs (LeanModel.layer_linear); attention in fp32

    def prefill(model, input_ids, attention_mask, position_ids, cache=None):
        cache = DynamicCache(config=model.config) if cache is None else cache
        b, t = input_ids.shape
        past = attention_mask.shape[1] - t
        x = lean.vocab.embed(input_ids).reshape(b * t, -1).to(torch.float32)
        cos, sin = lean.rotary(x, position_ids=position_ids)  # [b, t, hd]
        rotary = (cos.reshape(b * t, hd), sin.reshape(b * t, hd), cos[:, None], sin[:, None])
        cols = torch.arange(past + t, device=x.device)
        rows = past + torch.arange(t, device=x.device)
        allowed = attention_mask.bool()[:, None, :] & (cols[None, :] <= rows[:, None])[None]  # [b, t, past + t]
        allowed |= (cols[None, :] == rows[:, None])[None]
        mask = allowed[:, None]
        h = K.rms_norm(x, layers[0].ln1, lean.eps, low)
        last_layer = len(layers) - 1
        for i, L in enumerate(layers):
            q, k, v = _rotated_qkv(lean, L, lin(h, L.wqkv, L.bqkv), b, t, rotary)
            keys, values = cache.update(k, v, i)
            a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=lean.scaling, enable_gqa=True)
            a = a.transpose(1, 2).reshape(b * t, q_end).to(h.dtype)
            h = K.add_rms_norm(x, lin(a, L.wo, L.bo), L.ln2, lean.eps, low)
            h = K.add_rms_norm(x, lin(K.silu_mul(lin(h, L.wgu)), L.wd), *lean.next_norm[i], low and i < last_layer)
        return h.view(b, t, -1)[:, -1].contiguous(), cache

    return prefill


def _rotated_qkv(lean: LeanModel, L, qkv: torch.Tensor, b: int, t: int, rotary: tuple) -> tuple[torch.Tensor, ...]:
    """q, k (rotated) and v [b, heads, t, head_dim] in fp32 from a prefill layer's q|k|v projection [b * t, width]:
    one compiled pass (`rotary_qkv`, the same bits as the torch ops) unless the model normalises q and k first.
    `rotary`: cos and sin as [b * t, head_dim] rows and as [b, 1, t, head_dim]."""
    heads, kv, hd = lean.n_heads, lean.n_kv, lean.head_dim
    if L.qn is None:
        return tuple(y.view(b, t, -1, hd).transpose(1, 2)
                     for y in lean.fused.rotary_qkv(qkv, rotary[0], rotary[1], heads, kv))
    qkv = qkv.to(torch.float32)
    q_end, k_end = heads * hd, (heads + kv) * hd
    q = rms(qkv[:, :q_end].view(b, t, heads, hd), L.qn, lean.qk_eps).transpose(1, 2)
    k = rms(qkv[:, q_end:k_end].view(b, t, kv, hd), L.kn, lean.qk_eps).transpose(1, 2)
    cos, sin = rotary[2], rotary[3]
    return ((q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin),
            qkv[:, k_end:].view(b, t, kv, hd).transpose(1, 2))


class LeanStep:
    """`loop.DecodeStep` through `decode_step`: the lean model, its KV cache, the live rows' next positions and
    the rotary tables of every position the call can reach."""

    def __init__(self, lean: LeanModel, cache: KVCache, next_pos: torch.Tensor, budget: int, eos: list[int],
                 min_new_tokens: int = 0):
        self.lean, self.cache, self.next_pos = lean, cache, next_pos
        # computed once: a few KB even for a 1024-token budget
        self.cos, self.sin = lean.rope_tables(int(next_pos.max()) + budget + 1,
                                              cache.k[0].new_empty(1, dtype=lean.activation_dtype))
        self.eos = torch.tensor(eos, device=next_pos.device)
        self.no_suppress = self.eos[:0]
        self.min_new = min_new_tokens

    def keep(self, index: torch.Tensor) -> None:
        self.cache.keep(index)
        self.next_pos = self.next_pos[index]

    def __call__(self, token: torch.Tensor, step: int) -> torch.Tensor | ScreenedLogits:
        self.cache.ensure(self.cache.length + 1)
        suppress = None
        if self.lean.screen is not None:
            # the sampler suppresses eos before min_new_tokens; a screened lm_head must exclude them too
            suppress = self.eos if step + 1 < self.min_new else self.no_suppress
        logits = decode_step(self.lean, self.cache, token, self.next_pos, self.cos, self.sin, suppress)
        self.next_pos = self.next_pos + 1
        return logits


def lean_decode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, config,
                eos: list[int], delta=None, on_keep: Callable[[torch.Tensor], None] | None = None,
                row_keys: Sequence[int] | None = None) -> list[list[int]]:
    """`esft.generation.decode` with the lean step: same contract (greedy-identical to `model.generate`).

    The prompt runs through the HF forward (`hf_prefill`); with packed linears (and no low-rank `delta`) through
    `_lean_prefill` (stacked projections) or `_lean_head_prefill` (HF forward, lean lm_head) instead.
    config.share_prefix / prefill_buckets change the prefill layout (`layout_prefill`).
    """
    packed, fused, screen = _options(model, config, delta)
    lean = LeanModel(model, packed=packed, batch_hint=input_ids.shape[0], fused_attention=fused, delta=delta,
                     screen_lm_head=screen)
    budget = config.max_new_tokens
    min_new = int(config.min_new_tokens)
    prefill, head, lean_prefill = hf_prefill, None, lean.fused_projections
    if lean_prefill:
        prefill, head = _lean_prefill(lean), lean.head_logits
    elif packed and delta is None:
        prefill, head = _lean_head_prefill(lean), lean.head_logits
    # room for 256 tokens (or the forced minimum) up front; longer completions grow the buffer by doubling
    logits, cache, next_pos = layout_prefill(
        model, lean, input_ids, attention_mask, prefill, extra_columns=min(budget, max(256, config.min_new_tokens)),
        # a per-row perturbation (delta) maps hook rows to batch rows, so its prefill stays one plain batch
        share_prefix=bool(config.share_prefix) and delta is None,
        buckets=int(config.prefill_buckets) if delta is None else 1, head=head, writes_cache=lean_prefill)
    step = LeanStep(lean, cache, next_pos, budget, eos, min_new)
    try:
        return decode_loop(step, logits, config, eos, on_keep=on_keep, row_keys=row_keys)
    finally:
        cache.release()
