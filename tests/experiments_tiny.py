"""Tiny fixtures for the experiment tests: a spec on a random-init Llama with the real SmolLM2 tokenizer
(tests/conftest.py `make_tiny_model`), hooks that load it instead of the embedded model, and call counters.

Budgets are minimal (ES: population 2, batch 2, 2 new tokens; GRPO: 2 prompts x 2 samples, 1 step; evaluation:
1 example per task, 2 new tokens), so a whole experiment runs in seconds through the real trainers, the real
generation loop and the real task scorers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ES_BLOCK = {"population_size": 2, "batch_size": 2, "max_new_tokens": 2, "sigma": 0.01, "alpha": 0.005,
            "generation_batch_size": 8, "eval_every": 0, "samples_per_iteration": 0, "device": "cpu",
            "dtype": "float32"}
GRPO_BLOCK = {"max_steps": 1, "prompts_per_step": 2, "num_generations": 2, "per_device_train_batch_size": 4,
              "max_completion_length": 2, "learning_rate": 1e-3, "device": "cpu", "precision": "fp32",
              "log_kl": False, "samples_per_iteration": 0}
EVAL_BLOCK = {"limit": 1, "max_new_tokens": 2, "batch_size": 8, "dtype": "float32", "device": "cpu",
              "holdout": ["mmlu"]}


def write_spec(path: Path, kind: str, tasks: list[str], algorithms: dict[str, Any], **extra: Any) -> Path:
    data = {"name": path.stem, "kind": kind, "model": "tiny", "tasks": tasks, "seeds": [42],
            "algorithms": algorithms, "evaluation": EVAL_BLOCK, **extra}
    evaluated = [*tasks, *data["evaluation"].get("holdout", [])]
    if "boolq" in evaluated and "task_options" not in extra:  # a spec refuses options of a task it does not use
        data["task_options"] = {"boolq": {"max_passage_chars": 120}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class TinyHooks:
    """esft.experiments.runner.Hooks for the tiny model; counts trainer calls and ES iterations."""

    def __init__(self, tokenizer: Any):
        from esft.experiments.runner import Hooks

        self.tokenizer = tokenizer
        self.trained: list[tuple[str, str]] = []  # (algorithm, run_dir)
        self.hooks = Hooks(load_model=self.load_model, train_kwargs=self.train_kwargs, progress=False,
                           collect_garbage=False)

    def load_model(self, ref: str, dtype: str = "float32", device: str | None = None):
        from transformers import LlamaForCausalLM

        from conftest import make_tiny_model

        if ref == "tiny":
            model = make_tiny_model()
        else:
            model = LlamaForCausalLM.from_pretrained(ref).eval()
            model.requires_grad_(False)
        return model, self.tokenizer

    def train_kwargs(self, step: Any, config: Any) -> dict[str, Any]:
        self.trained.append((step.algorithm, step.run_dir))
        model, tokenizer = self.load_model(config.model)
        return {"model": model, "tokenizer": tokenizer}
