"""Prompts in, completions out: chat-template encoding, left padding, eos ids, and a generated row turned into a
`Generation`.

Every batch is left-padded with an explicit attention mask: on pad == eos models such as Llama and SmolLM2,
masking by `ids != pad` would hide real eos tokens.
"""

from __future__ import annotations

from typing import Sequence

import torch

from esft.generation.generation_config import Generation
from esft.tasks.base import Messages


def eos_token_ids(model, tokenizer) -> list[int]:
    ids: set[int] = set()
    for source in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if source is None:
            continue
        ids.update(source if isinstance(source, (list, tuple)) else [source])
    return sorted(ids)


def encode_prompts(tokenizer, prompts: Sequence[Messages | str]) -> list[list[int]]:
    """Token ids of each prompt: chat messages through the chat template (with the generation prompt)."""
    out = []
    for p in prompts:
        if isinstance(p, str):
            out.append(tokenizer(p, add_special_tokens=False)["input_ids"])
        else:
            ids = tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "keys"):  # some tokenizers return a BatchEncoding
                ids = ids["input_ids"]
            out.append(list(ids))
    return out


def left_pad(batch: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, row in enumerate(batch):
        if row:
            ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row):] = 1
    return ids.to(device), mask.to(device)


def to_generation(row: list[int], eos: list[int], tokenizer, prompt_tokens: int) -> Generation:
    """A generated row as a `Generation`: cut after its first eos (if any) and decoded without special tokens."""
    cut = len(row)
    finished = False
    for k, t in enumerate(row):
        if t in eos:
            cut, finished = k + 1, True
            break
    ids = row[:cut]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    return Generation(text=text, completion_ids=ids, prompt_tokens=prompt_tokens, finished=finished)
