"""Tiny fixtures for the GRPO tests: a toy chat task whose reward varies across random completions, a config for
a random-init Llama with the real SmolLM2 vocabulary (tests/conftest.py), and a `generate` spy that counts what
the model really produced, independently of esft's and TRL's bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from esft.grpo import GRPOConfig
from esft.tasks.base import Task, chat

# Tiny matmuls: one thread avoids OpenMP spin-waits on a shared 2-core machine.
torch.set_num_threads(1)

EOS = 2  # SmolLM2: eos == pad == <|im_end|>, which also closes every chat turn inside the prompt


@dataclass
class ParityTask(Task):
    """Reward 1 when the code points of the completion sum to an even number: about half of a random model's
    samples, so every group has reward spread and GRPO gets a gradient."""

    name: str = "parity"
    n: int = 6  # 3 steps per epoch at 2 prompts per step: a 4-step run crosses an epoch boundary

    def _load(self, split: str) -> list[dict[str, Any]]:
        # "answer" is a label for the constant-answer baseline only (even 2, odd 1 of 3); the reward ignores it
        return [{"id": i, "question": f"Say something about the number {i}.", "answer": "odd" if i % 3 == 1 else "even"}
                for i in range(self.n)]

    def prompt(self, example: dict[str, Any]):
        return chat("Be brief.", example["question"])

    def score(self, completion: str, example: dict[str, Any]) -> float:
        return float(sum(map(ord, completion)) % 2 == 0)

    def is_well_formed(self, completion: str, example: dict[str, Any]) -> bool:
        return len(completion) > 3


def tiny_config(output_dir, **overrides: Any) -> GRPOConfig:
    values: dict[str, Any] = dict(
        model="tiny", task="parity", output_dir=str(output_dir), seed=3, max_steps=4, prompts_per_step=2,
        num_generations=4, per_device_train_batch_size=4, max_completion_length=6, learning_rate=1e-3,
        save_steps=2, device="cpu", precision="fp32", format_bonus=0.1, eval_every=2, eval_limit=3,
        # a strong bias towards eos makes the random model finish most completions (real sampled eos tokens)
        trl_args={"generation_kwargs": {"sequence_bias": [[[EOS], 9.0]]}})
    values.update(overrides)
    return GRPOConfig(**values)


class GenerateSpy:
    """Wraps `model.generate` and counts, from its inputs and outputs, the prompt tokens (attention mask) and the
    completion tokens up to and including the first eos."""

    def __init__(self, model: Any, eos_ids: set[int]):
        self.model, self.eos_ids = model, eos_ids
        self.original = model.generate
        self.calls: list[dict[str, int]] = []
        model.generate = self

    def __call__(self, *args: Any, **kwargs: Any):
        out = self.original(*args, **kwargs)
        width = kwargs["input_ids"].size(1)
        prompt_tokens = int(kwargs["attention_mask"].sum())
        generated = finished = 0
        for row in out[:, width:].tolist():
            cut = next((k for k, t in enumerate(row) if t in self.eos_ids), None)
            generated += len(row) if cut is None else cut + 1
            finished += cut is not None
        self.calls.append({"rows": int(out.size(0)), "prompt_tokens": prompt_tokens, "generated": generated,
                           "finished": finished})
        return out
