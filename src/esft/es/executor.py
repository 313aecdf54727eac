"""Seams of the ES loop: who evaluates the population (executor) and how rewards become fitness (fitness rule).

Executor: `evaluate_members(members, batch) -> PopulationResult` (a reward matrix [N, B] plus counters); the
trainer turns it into one fitness per member with a `FitnessRule`. `LocalExecutor` perturbs the model in place,
generates greedily, scores and restores, member after member. A distributed executor (Ray) only needs to return
the same matrix: replicas share the member seeds, so no weights cross the network (REFERENCE.md section 5).

FitnessRule: `(result, batch) -> fitness [N]`, higher is better (esft maximises). `MeanReward` is the paper's
rule (mean 0/1 reward over the batch), optionally plus a format bonus; `esft.es.dart.DartES` (DART-ES) is a
stateful rule that also draws the batches (see the hooks listed in esft.es.dart).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from esft.es.noise import MasterWeights
from esft.es.strategy import Member

GenerateFn = Callable[..., list]  # generate(model, tokenizer, prompts, cfg) -> list[Generation]


@dataclass
class PopulationResult:
    """Outcome of evaluating R rows (members, or the one unperturbed model) on a batch of B examples."""

    scores: np.ndarray
    """[R, B] task scores (0/1 under the paper's protocol)"""
    well_formed: np.ndarray
    """[R, B] bool: answer in the required format (for the format bonus and the box rate)"""
    texts: list[list[str]]
    """[R][B] completions"""
    tokens_generated: int = 0
    prompt_tokens: int = 0
    finished: int = 0
    """completions that ended with eos (the rest hit max_new_tokens)"""
    timings: dict[str, float] = field(default_factory=dict)
    """seconds: perturb, generate, score, restore"""


class Executor(Protocol):
    def evaluate_members(self, members: Sequence[Member], batch: Sequence[dict]) -> PopulationResult: ...

    def evaluate_center(self, batch: Sequence[dict]) -> PopulationResult: ...


class FitnessRule(Protocol):
    def __call__(self, result: PopulationResult, batch: Sequence[dict]) -> np.ndarray: ...


@dataclass
class MeanReward:
    """Fitness = mean over the batch of (score + format_bonus * well_formed). format_bonus 0 = the paper."""

    format_bonus: float = 0.0

    def rewards(self, result: PopulationResult) -> np.ndarray:
        r = np.asarray(result.scores, dtype=np.float64)
        if self.format_bonus:
            r = r + self.format_bonus * np.asarray(result.well_formed, dtype=np.float64)
        return r

    def __call__(self, result: PopulationResult, batch: Sequence[dict]) -> np.ndarray:
        return self.rewards(result).mean(axis=1)


FITNESS_RULES = ("mean", "dart")


def make_fitness_rule(name: str, format_bonus: float = 0.0, options: dict | None = None) -> FitnessRule:
    """"mean" (the paper, options unused) or "dart" (DART-ES, esft.es.dart; options = DartOptions fields)."""
    if name == "mean":
        if options:
            raise ValueError(f"fitness rule 'mean' takes no fitness_options, got {sorted(options)}")
        return MeanReward(format_bonus)
    if name == "dart":
        from esft.es.dart import make_dart

        return make_dart(format_bonus, options)
    raise ValueError(f"unknown fitness rule {name!r}; available: {', '.join(FITNESS_RULES)}")


class LocalExecutor:
    """Evaluates members one after another on the local model: perturb -> generate -> score -> restore.

    `generate_fn(model, tokenizer, prompts, gen_config)` defaults to `esft.generation.generate` (greedy, from
    `gen_config`); tests pass a stub. The weights are restored even if generation raises, so a caught Ctrl-C
    leaves the model at the centre.
    """

    def __init__(self, model: Any, tokenizer: Any, weights: MasterWeights, task: Any, sigma: float,
                 gen_config: Any, generate_fn: GenerateFn | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.weights = weights
        self.task = task
        self.sigma = float(sigma)
        self.gen_config = gen_config
        self._encode = None
        if generate_fn is None:
            # lazy: keeps the ES core importable (and testable) without the generation stack
            from esft.generation import encode_prompts, generate as generate_fn

            # the chat template is applied once per batch, not once per member
            self._encode = lambda prompts: encode_prompts(tokenizer, prompts)
        self.generate_fn = generate_fn

    def _prompts(self, batch: Sequence[dict]) -> tuple[list, dict]:
        prompts = [self.task.prompt(ex) for ex in batch]
        extra = {"prompt_ids": self._encode(prompts)} if self._encode is not None else {}
        return prompts, extra

    def _run(self, prompts: tuple[list, dict], batch: Sequence[dict], result: PopulationResult, row: int) -> None:
        t0 = time.perf_counter()
        gens = self.generate_fn(self.model, self.tokenizer, prompts[0], self.gen_config, **prompts[1])
        t1 = time.perf_counter()
        for j, (gen, example) in enumerate(zip(gens, batch)):
            text = gen.text
            result.texts[row].append(text)
            result.scores[row, j] = float(self.task.score(text, example))
            result.well_formed[row, j] = bool(self.task.is_well_formed(text, example))
            result.tokens_generated += len(getattr(gen, "completion_ids", ()) or ())
            result.prompt_tokens += int(getattr(gen, "prompt_tokens", 0) or 0)
            result.finished += int(bool(getattr(gen, "finished", False)))
        t2 = time.perf_counter()
        result.timings["generate"] += t1 - t0
        result.timings["score"] += t2 - t1

    def _empty(self, rows: int, cols: int) -> PopulationResult:
        return PopulationResult(scores=np.zeros((rows, cols)), well_formed=np.zeros((rows, cols), dtype=bool),
                                texts=[[] for _ in range(rows)],
                                timings={"perturb": 0.0, "generate": 0.0, "score": 0.0, "restore": 0.0})

    def evaluate_members(self, members: Sequence[Member], batch: Sequence[dict]) -> PopulationResult:
        prompts = self._prompts(batch)
        result = self._empty(len(members), len(batch))
        for i, (seed, sign) in enumerate(members):
            t0 = time.perf_counter()
            self.weights.perturb(seed, sign, self.sigma)
            result.timings["perturb"] += time.perf_counter() - t0
            try:
                self._run(prompts, batch, result, i)
            finally:
                t0 = time.perf_counter()
                self.weights.restore()
                result.timings["restore"] += time.perf_counter() - t0
        return result

    def evaluate_center(self, batch: Sequence[dict]) -> PopulationResult:
        """The unperturbed model on a batch (train-batch reward, held-out accuracy)."""
        prompts = self._prompts(batch)
        result = self._empty(1, len(batch))
        if batch:
            self._run(prompts, batch, result, 0)
        return result
