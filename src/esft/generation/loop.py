"""The decode loop of the esft engine, shared by its two step functions (the HF forward, `hf_step`, and the
lean step, `lean`).

`model.generate` keeps computing rows that already emitted eos until the longest row ends; with verbose models
and a 1024-token budget that is most of the work. This loop drops finished rows from the batch (and, through the
step function, from its KV cache), so every forward pass stays useful. Greedy outputs equal `model.generate`'s
(tests/test_generation.py, tests/test_lean.py).
"""

from __future__ import annotations

import random
from typing import Any, Callable, Protocol, Sequence

import torch

from esft.generation.cancel import check_cancelled
from esft.generation.generation_config import GenerationConfig
from esft.generation.sampling import sample_next


def row_streams(seed: int, keys: Sequence[int]) -> list[random.Random]:
    """One random stream per row, keyed by (seed, the row's key): `generate` keys rows by prompt index, so a
    prompt's samples do not depend on the batch it lands in or on when the other rows finish."""
    return [random.Random(f"esft-sample:{int(seed)}:{int(k)}") for k in keys]


def _sampler(config: GenerationConfig, eos: list[int]):
    """next-token rule of the decode loop: `sample_next`, with eos masked out before `min_new_tokens` (in place on
    the logits, as transformers' MinNewTokensLengthLogitsProcessor does)."""

    min_new = int(config.min_new_tokens)

    def sample(logits: torch.Tensor, step: int, streams: list[random.Random] | None) -> torch.Tensor:
        if step < min_new:
            logits[:, eos] = -float("inf")
        if streams is None:
            return sample_next(logits, config.temperature, config.top_p, None)
        uniforms = torch.tensor([s.random() for s in streams], dtype=torch.float64)
        return sample_next(logits, config.temperature, config.top_p, None, uniforms=uniforms)

    return sample


class DecodeStep(Protocol):
    """One engine's forward over the live rows, with its per-row state (KV cache, positions, attention mask)."""

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the live rows `index` (ascending positions among the current rows) in the per-row state."""

    def __call__(self, token: torch.Tensor, step: int) -> Any:
        """Feed `token` (int64 [n], one per live row, picked at loop step `step`) and return the logits of the next
        position: a tensor [n, V], or a screened result whose `greedy()` gives the argmax per row (the lean
        step's bf16-screened lm_head, only where decoding is greedy)."""


def decode_loop(step_fn: DecodeStep, logits: torch.Tensor, config: GenerationConfig, eos: list[int],
                on_keep: Callable[[torch.Tensor], None] | None = None,
                row_keys: Sequence[int] | None = None) -> list[list[int]]:
    """Decode from the prefill's last-position `logits` [B, V] until every row has emitted eos or
    config.max_new_tokens tokens; returns each row's generated ids (the first eos included).

    Per step: cancellation check (`cancel_on`), next token per live row (config.temperature / top_p, eos
    suppressed before config.min_new_tokens), finished rows dropped from the step's state (`step_fn.keep`) and
    from the caller's (`on_keep(indices kept)`, e.g. a low-rank population's member of each row), then one
    forward (`step_fn(token, step)`). Sampling draws one number per live row and step from that row's stream,
    keyed by (config.seed, row_keys[r]) (`row_streams`; default keys: the rows' positions in the batch)."""
    sample = _sampler(config, eos)
    batch, device = logits.shape[0], logits.device
    streams = None
    if config.temperature > 0:
        streams = row_streams(config.seed, range(batch) if row_keys is None else row_keys)
    budget = config.max_new_tokens
    rows = torch.arange(batch, device=device)  # original row index of each live row
    live = list(range(batch))
    outputs: list[list[int]] = [[] for _ in range(batch)]
    eos_t = torch.tensor(eos, device=device)
    for step in range(budget):
        check_cancelled()
        if not isinstance(logits, torch.Tensor):
            token = logits.greedy()
        else:
            token = sample(logits, step, None if streams is None else [streams[r] for r in live])
        for r, t in zip(live, token.tolist()):
            outputs[r].append(t)
        if step == budget - 1:
            break
        alive = ~torch.isin(token, eos_t)
        if not bool(alive.all()):
            if not bool(alive.any()):
                break
            keep = alive.nonzero().squeeze(-1)
            step_fn.keep(keep)
            if on_keep is not None:
                on_keep(keep)
            rows, token = rows[keep], token[keep]
            live = rows.tolist()
        logits = step_fn(token, step)
    return outputs
