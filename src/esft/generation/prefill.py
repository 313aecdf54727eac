"""The prompt prefill's layout in the lean KV cache: the rows' shared prefix prefilled once, the remainders in
groups of similar length (GenerationConfig.share_prefix / prefill_buckets; `esft.bench` counts its FLOPs)."""

from __future__ import annotations

from typing import Callable

import torch

from esft.generation.kv_cache import KVCache
from esft.generation.lean_step import LeanModel
from esft.generation.prompts import left_pad


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
                   extra_columns: int, share_prefix: bool, buckets: int, min_prefix: int = 8,
                   head: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None, writes_cache: bool = False):
    """Prompt prefill into a fresh KVCache, optionally (1) prefilling the rows' common token prefix once, at
    batch 1, and giving every row a copy of its K/V, and (2) prefilling the remainders in up to `buckets` groups of
    similar length instead of one batch padded to the longest.

    Returns (last-prompt-token logits [B, V], cache, next positions [B]). Cache columns are [prefix | remainders,
    right-aligned and left-padded]; positions continue from the prefix, so RoPE sees what a plain prefill sees.
    With neither option (or no usable prefix and one bucket) this is the plain HF prefill, bit for bit. Otherwise
    the prefix K/V come from a batch-1 forward and attention sums run over a different column layout, so logits
    match a plain prefill to ~1e-6 relative, not bit for bit (hence opt-in: GenerationConfig.share_prefix,
    prefill_buckets).

    `head`: `prefill` returns the last positions' hidden states instead of logits, and head([hidden, ...])
    gives each forward's logits [g, V] once the whole layout is in the cache and the forwards' caches are freed
    (the same rows per call as a prefill projecting its own rows, so the same logits). `LeanModel.head_logits`
    packs the fp32 lm_head slice by slice there where the screen computes the decode steps' logits. The shared
    prefix's forward then projects nothing.

    `writes_cache`: `prefill` only calls its cache's `update(keys, values, layer)` (the lean prefill), so each
    forward gets a `CacheRows` that writes every layer's K/V straight into the KVCache: no forward holds a
    DynamicCache of all its rows and layers beside the KVCache (fp32 K/V of 30 layers x 9 rows x 184 columns,
    76 MB, in the cpu preset's largest group).
    Otherwise (the HF forward) the forward fills a DynamicCache, copied into the KVCache afterwards. The same
    bits either way.
    """
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
        return _plain_prefill(model, lean, input_ids, attention_mask, prefill, extra_columns, head, writes_cache)
    prefix_cache = None
    if p:
        pre = torch.tensor([rows[0][:p]], dtype=torch.long, device=device)
        _, prefix_cache = prefill(model, pre, torch.ones_like(pre), torch.arange(p, device=device)[None])
    suffix_width = max(lengths) - p
    total = p + suffix_width
    outs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (rows, their last positions' prefill outputs)
    next_pos = torch.empty(batch, dtype=torch.long, device=device)
    cache = None
    if writes_cache:
        cache = _new_cache(lean, batch, total + extra_columns, device, torch.float32)
        cache.zero(total)
    for group in groups:
        idx = torch.tensor(group, dtype=torch.long, device=device)
        suffix, suffix_mask = left_pad([rows[r][p:] for r in group], 0, device)  # pad id irrelevant: masked
        g, w = suffix.shape
        mask = torch.cat([suffix_mask.new_ones((g, p)), suffix_mask], dim=1)
        positions = (suffix_mask.cumsum(-1) - 1).clamp(min=0) + p
        cols = torch.cat([torch.arange(p), torch.arange(total - w, total)]).to(device)
        mask_in = mask.to(attention_mask.dtype)
        if writes_cache:
            group_out, _ = prefill(model, suffix, mask_in, positions, CacheRows(cache, idx, cols, prefix_cache))
        else:
            group_out, hf_cache = prefill(model, suffix, mask_in, positions, _expanded(model, prefix_cache, g))
            if cache is None:
                cache = _new_cache(lean, batch, total + extra_columns, device, hf_cache.layers[0].keys.dtype)
                cache.zero(total)
            into = CacheRows(cache, idx, cols)
            for i, layer in enumerate(hf_cache.layers):
                into.update(layer.keys, layer.values, i)
            del hf_cache
        outs.append((idx, group_out))
        next_pos[idx] = positions[:, -1] + 1
        cache.mask[idx[:, None], cols[None, :]] = mask.bool()
    cache.length = total
    return _gather_logits(outs, batch, head), cache, next_pos


def _plain_prefill(model, lean: LeanModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   prefill: Callable, extra_columns: int, head, writes_cache: bool):
    """`layout_prefill` with no shared prefix and one group: the batch as it is, in one forward."""
    batch, width = input_ids.shape
    device = input_ids.device
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    if writes_cache:
        cache = _new_cache(lean, batch, width + extra_columns, device, torch.float32)
        every, cols = torch.arange(batch, device=device), torch.arange(width, device=device)
        out, _ = prefill(model, input_ids, attention_mask, position_ids, CacheRows(cache, every, cols))
        cache.mask[:, :width] = attention_mask.bool()
        cache.length = width
    else:
        out, hf_cache = prefill(model, input_ids, attention_mask, position_ids)
        cache = _new_cache(lean, batch, width + extra_columns, device, hf_cache.layers[0].keys.dtype)
        cache.load_prefill(hf_cache, attention_mask)
    return (head([out])[0] if head is not None else out), cache, position_ids[:, -1] + 1


class CacheRows:
    """A prefill forward's `cache` that writes each layer's keys and values straight into `rows` x `cols` of a
    KVCache, after the shared prefix's (`prefix`: its batch-1 DynamicCache) where there is one. `update` returns
    what a DynamicCache holding that prefix would (the prefix's K/V expanded to the rows, then the new ones), so
    the forward's attention is unchanged; the KVCache rounds them once where it is bf16, as a copy would."""

    def __init__(self, cache: KVCache, rows: torch.Tensor, cols: torch.Tensor, prefix=None):
        self.cache, self.rows, self.cols, self.prefix = cache, rows, cols, prefix

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.prefix is not None:
            pre, g = self.prefix.layers[layer], keys.shape[0]
            keys = torch.cat([pre.keys.expand(g, -1, -1, -1), keys], dim=-2)
            values = torch.cat([pre.values.expand(g, -1, -1, -1), values], dim=-2)
        self.cache.put_keys(layer, self.rows, self.cols, keys)
        v = self.cache.v[layer]
        v[self.rows[:, None], :, self.cols[None, :]] = values.transpose(1, 2).to(v.dtype)
        return keys, values


def _expanded(model, prefix_cache, rows: int):
    """A DynamicCache holding the prefix's K/V once per row (None without a prefix), for the HF forward."""
    if prefix_cache is None:
        return None
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    for i, layer in enumerate(prefix_cache.layers):
        cache.update(layer.keys.expand(rows, -1, -1, -1).contiguous(),
                     layer.values.expand(rows, -1, -1, -1).contiguous(), i)
    return cache


def _new_cache(lean: LeanModel, rows: int, capacity: int, device, prefill_dtype: torch.dtype) -> KVCache:
    """The KVCache the prompt fills: the lean model's cache dtype where it keeps one (bf16), else the prefill's K/V
    dtype (fp32 for the lean prefill, whose attention runs in fp32, known before it runs)."""
    return KVCache(lean, rows, capacity, lean.cache_dtype or prefill_dtype, device, key_tile=lean.key_tile)


def _gather_logits(outs: list[tuple[torch.Tensor, torch.Tensor]], batch: int,
                   head: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None) -> torch.Tensor:
    """Logits [batch, V] from each prefill forward's (rows, last-position outputs), `head` applied to them all."""
    parts = head([out for _, out in outs]) if head is not None else [out for _, out in outs]
    logits = parts[0].new_empty((batch, parts[0].shape[-1]))
    for (idx, _), part in zip(outs, parts):
        logits[idx] = part
    return logits
