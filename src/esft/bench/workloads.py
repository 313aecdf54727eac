"""The benchmark's workloads (esft.bench): the prompts and generation budget of one ES iteration, and the
pseudo-task whose fitness makes every update real."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

WORKLOADS = ("decode-heavy", "cpu-preset")


#: member lanes of esft's fast configuration (`LocalExecutor(parallel_members=...)`)
FAST_PARALLEL_MEMBERS = 2


@dataclass
class Workload:
    name: str
    prompts: list  # chat messages
    max_new_tokens: int
    min_new_tokens: int
    generation_batch_size: int
    sigma: float
    alpha: float
    parallel_members: int = FAST_PARALLEL_MEMBERS
    """members the esft iteration evaluates at once unless `--parallel-members` says otherwise: what the
    configuration this workload stands for runs (decode-heavy: esft's fast default of two lanes; cpu-preset: the
    `cpu` preset's own)"""


DECODE_SYSTEM = "You are a helpful assistant."


def fit_prompt(tokenizer, passage: str, target: int) -> list[dict[str, str]]:
    """A chat prompt whose templated length is as close to `target` tokens as the passage's words allow."""
    from esft.generation import encode_prompts

    words = passage.split()

    def make(k: int) -> list[dict[str, str]]:
        return [{"role": "system", "content": DECODE_SYSTEM},
                {"role": "user", "content": "Explain this passage in detail:\n" + " ".join(words[:k])}]

    lo, hi = 1, len(words)
    while lo < hi:  # largest k with length <= target
        mid = (lo + hi + 1) // 2
        if len(encode_prompts(tokenizer, [make(mid)])[0]) <= target:
            lo = mid
        else:
            hi = mid - 1
    return make(lo)


def build_workload(name: str, tokenizer) -> Workload:
    from esft.es.es_config import PRESETS
    from esft.tasks.boolq import BoolQTask

    cpu = PRESETS["cpu"]
    if name == "decode-heavy":
        from esft.generation import encode_prompts

        prompts = []
        for ex in BoolQTask().load("train_pool"):  # the first 32 passages long enough for 60-64 tokens
            p = fit_prompt(tokenizer, ex["passage"], 64)
            if len(encode_prompts(tokenizer, [p])[0]) >= 60:
                prompts.append(p)
            if len(prompts) == 32:
                break
        return Workload(name, prompts, max_new_tokens=256, min_new_tokens=256, generation_batch_size=32,
                        sigma=cpu["sigma"], alpha=cpu["alpha"])
    if name == "cpu-preset":
        from esft.es.build import sample_batch

        task = BoolQTask(max_passage_chars=cpu["max_passage_chars"])
        train = task.load("train")
        idx = sample_batch(42, 0, len(train), cpu["batch_size"])
        prompts = [task.prompt(train[i]) for i in idx]
        return Workload(name, prompts, max_new_tokens=cpu["max_new_tokens"], min_new_tokens=0,
                        generation_batch_size=cpu["generation_batch_size"], sigma=cpu["sigma"], alpha=cpu["alpha"],
                        parallel_members=cpu["parallel_members"])
    raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")


class PseudoTask:
    """Task stand-in: the prompts as given, a deterministic text-dependent score (so fitness varies and the
    update is real), nothing well-formed."""

    def prompt(self, example: dict) -> list:
        return example["messages"]

    def score(self, completion: str, example: dict) -> float:
        return (zlib.crc32(completion.encode()) % 1000) / 999.0

    def is_well_formed(self, completion: str, example: dict) -> bool:
        return False


def bench_fitness(result, batch) -> np.ndarray:
    """Mean pseudo-score plus 1e-3 x member index: members that happen to write identical completions still get
    distinct fitness, so the update is never all-zero and its cost is always part of the iteration."""
    from esft.es.fitness import MeanReward

    fitness = MeanReward()(result, batch)
    return fitness + 1e-3 * np.arange(len(fitness))
