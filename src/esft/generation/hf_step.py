"""The decode step through the Hugging Face forward (`model(...)` with a DynamicCache): every model, and the
path on which module forward hooks see every projection."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from esft.generation.loop import decode_loop


def cache_kwarg(model) -> str:
    """transformers >= 5.2x names the forward's KV-cache argument `cache`; older versions `past_key_values`."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def hf_prefill(model, input_ids, attention_mask, position_ids, cache=None):
    """The prompt through the HF forward: (last-position logits [B, V], filled DynamicCache). With `cache`, the
    tokens extend it (attention_mask then covers the cached columns too)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config) if cache is None else cache
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                use_cache=True, logits_to_keep=1, **{cache_kwarg(model): cache})
    return out.logits[:, -1, :], cache


class HFStep:
    """`loop.DecodeStep` through `model(...)`: the DynamicCache, attention mask and next positions of the live
    rows."""

    def __init__(self, model, cache, attention_mask: torch.Tensor, next_pos: torch.Tensor):
        self.model, self.cache = model, cache
        self.cache_kw = cache_kwarg(model)
        self.attention_mask, self.next_pos = attention_mask, next_pos

    def keep(self, index: torch.Tensor) -> None:
        self.cache.batch_select_indices(index)
        self.attention_mask, self.next_pos = self.attention_mask[index], self.next_pos[index]

    def __call__(self, token: torch.Tensor, step: int) -> torch.Tensor:
        mask = self.attention_mask
        self.attention_mask = mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        out = self.model(input_ids=token[:, None], attention_mask=mask, position_ids=self.next_pos[:, None],
                         use_cache=True, **{self.cache_kw: self.cache})
        self.next_pos = self.next_pos + 1
        return out.logits[:, -1, :]


def decode_hf(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, config: Any,
              eos: list[int], on_keep: Callable[[torch.Tensor], None] | None = None,
              row_keys: Sequence[int] | None = None) -> list[list[int]]:
    """Prefill through the HF forward, then `decode_loop` with `HFStep` (so forward hooks see every projection).
    `on_keep(indices)` is called whenever finished rows are dropped, with the indices of the rows kept, so a
    caller holding per-row state (e.g. the low-rank population's member of each row) can drop them too.
    `row_keys`: the rows' sampling stream keys (`loop.decode_loop`)."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits, cache = hf_prefill(model, input_ids, attention_mask, position_ids)
    step = HFStep(model, cache, attention_mask, position_ids[:, -1] + 1)
    return decode_loop(step, logits, config, eos, on_keep=on_keep, row_keys=row_keys)
