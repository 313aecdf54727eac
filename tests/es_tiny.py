"""Tiny fixtures for the ES tests: a random-init Llama built from a config, a toy task and a stub generate.

The stub "generates" by one forward pass of the model: the argmax over three logits of the last position picks
"\\boxed{yes}", "\\boxed{no}" or an unformatted answer. Rewards therefore depend on the (perturbed) weights,
so fitness varies across members and runs exercise the real perturb / restore / update path in milliseconds,
without a tokenizer or esft.generation.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls on one thread: OpenMP spin-waits on a shared 2-core machine cost ms per call otherwise.
    Autouse in every module that imports it; the previous thread count is restored for other tests."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.float32, vocab_size: int = 256, hidden: int = 64,
               layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab_size,
                         tie_word_embeddings=True, max_position_embeddings=64)
    model = LlamaForCausalLM(config).to(dtype)
    model.eval()
    return model


class ToyTask:
    """Yes/no questions as token-id lists; score = boxed answer matches."""

    name = "toy"
    splits = ("train", "test")

    def __init__(self, n_train: int = 24, n_test: int = 12, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.data = {}
        for split, n in (("train", n_train), ("test", n_test)):
            ids = torch.randint(3, 256, (n, 6), generator=g).tolist()
            self.data[split] = [{"ids": row, "answer": "yes" if i % 3 else "no"} for i, row in enumerate(ids)]

    def load(self, split: str = "test", limit: int | None = None):
        rows = self.data[split]
        return rows if limit is None else rows[:limit]

    def prompt(self, example):
        return example["ids"]

    def score(self, completion: str, example) -> float:
        return float(completion == "\\boxed{" + example["answer"] + "}")

    def is_well_formed(self, completion: str, example) -> bool:
        return completion.startswith("\\boxed{")

    def details(self, completion: str, example):
        return {"answer": example["answer"]}


@torch.no_grad()
def stub_generate(model, tokenizer, prompts, cfg):
    ids = torch.tensor(prompts)
    logits = model(input_ids=ids).logits[:, -1, :3].float()
    choice = logits.argmax(-1).tolist()
    texts = {0: "\\boxed{yes}", 1: "\\boxed{no}", 2: "yes"}
    return [SimpleNamespace(text=texts[c], completion_ids=[c, 2], prompt_tokens=len(p), finished=True)
            for c, p in zip(choice, prompts)]


def state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def bit_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
