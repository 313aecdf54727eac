"""The decode loop of the esft engine, shared by its two step functions (the HF forward, `hf_step`, and the
lean step, `lean`).

`model.generate` keeps computing rows that already emitted eos until the longest row ends; with verbose models
and a 1024-token budget that is most of the work. This loop drops finished rows from the batch (and, through the
step function, from its KV cache), so every forward pass stays useful. Greedy outputs equal `model.generate`'s
(tests/test_generation.py, tests/test_lean.py).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

from esft.generation.cancel import check_cancelled
from esft.generation.generation_config import GenerationConfig


def sample_next(logits: torch.Tensor, temperature: float, top_p: float,
                generator: torch.Generator | None) -> torch.Tensor:
    """Next token per row: argmax when temperature == 0, else nucleus sampling at that temperature."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, sorted_i = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
        drop = sorted_p.cumsum(dim=-1) - sorted_p > top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        choice = torch.multinomial(sorted_p, 1, generator=generator).squeeze(-1)
        return sorted_i.gather(-1, choice[:, None]).squeeze(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _sampler(config: GenerationConfig, eos: list[int]):
    """next-token rule of the decode loop: `sample_next`, with eos masked out before `min_new_tokens` (in place on
    the logits, as transformers' MinNewTokensLengthLogitsProcessor does)."""

    min_new = int(config.min_new_tokens)

    def sample(logits: torch.Tensor, step: int, generator) -> torch.Tensor:
        if step < min_new:
            logits[:, eos] = -float("inf")
        return sample_next(logits, config.temperature, config.top_p, generator)

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
                on_keep: Callable[[torch.Tensor], None] | None = None) -> list[list[int]]:
    """Decode from the prefill's last-position `logits` [B, V] until every row has emitted eos or
    config.max_new_tokens tokens; returns each row's generated ids (the first eos included).

    Per step: cancellation check (`cancel_on`), next token per live row (config.temperature / top_p / seed, eos
    suppressed before config.min_new_tokens), finished rows dropped from the step's state (`step_fn.keep`) and
    from the caller's (`on_keep(indices kept)`, e.g. a low-rank population's member of each row), then one
    forward (`step_fn(token, step)`)."""
    sample = _sampler(config, eos)
    batch, device = logits.shape[0], logits.device
    generator = None
    if config.temperature > 0:
        generator = torch.Generator(device=device).manual_seed(config.seed)
    budget = config.max_new_tokens
    rows = torch.arange(batch, device=device)  # original row index of each live row
    outputs: list[list[int]] = [[] for _ in range(batch)]
    eos_t = torch.tensor(eos, device=device)
    for step in range(budget):
        check_cancelled()
        token = sample(logits, step, generator) if isinstance(logits, torch.Tensor) else logits.greedy()
        for r, t in zip(rows.tolist(), token.tolist()):
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
        logits = step_fn(token, step)
    return outputs
