"""How a population's rewards become member fitness, and which train examples each iteration uses.

A `FitnessRule` maps `(result, batch) -> fitness [N]`, higher is better (esft maximises). The trainer calls its
hooks at fixed points of the loop; every hook has a default, so a stateless rule implements `__call__` only:

    bind(num_examples, seed)        once, with the train split's size and the run seed
    sample_batch(seed, t, n, B)     the train indices of iteration t (default: `sample_batch`, uniform)
    log_record()                    extra entry of iteration t's seeds.jsonl line (default: none)
    summary()                       extra entry of iteration t's metrics record (default: none)
    rewards(result)                 per-example rewards behind an evaluation's `train_reward` (default: scores)
    state_dict() / load_state_dict  the rule's state in a checkpoint (default: none)
    replay(record)                  on resume, advance the state by one logged seeds.jsonl line (default: no-op)

`stateful = True` says the rule's state is part of the run: a checkpoint past step 0 must then hold it.
`MeanReward` is the paper's rule (mean 0/1 reward over the batch, optionally plus a format bonus);
`esft.es.dart.DartES` (DART-ES) is a stateful rule that also draws the batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

if TYPE_CHECKING:  # annotations only: rules stay importable without torch
    from esft.es.executor import PopulationResult


def sample_batch(seed: int, iteration: int, n: int, batch_size: int) -> list[int]:
    """Train-example indices of an iteration: a pure function of (run seed, iteration), drawn without
    replacement; the whole split when batch_size >= n (the paper's 200 of 200)."""
    if batch_size >= n:
        return list(range(n))
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(iteration), 0xBA7C]))
    return [int(i) for i in rng.choice(n, size=batch_size, replace=False)]


def train_examples(task: Any) -> list:
    """`task`'s train split, refused (ValueError) when it is empty: every batch would be empty, and the mean reward
    of no example is no fitness. The trainer reads it before the model loads, so a task object that no
    `check_task_fit` saw fails there, not after the load and a step-0 evaluation of train reward NaN."""
    train_set = task.load("train")
    if not len(train_set):
        raise ValueError(f"task {task.shown_name()!r}: its train split is empty; an ES iteration evaluates its "
                         "members on train examples")
    return train_set


def row_means(values: Any, weights: Any = None, count: int | None = None) -> np.ndarray:
    """Per row (member) sum_j values[i, j] * weights[j] / count (weights 1, count = row length by default), each sum
    exact and then rounded once (math.fsum), so it does not depend on the order of the terms.

    Why: members whose rows hold the same values at different examples (same number right and well-formed, another
    choice of which) tie in fitness, but a float sum in array order can give them values an ulp apart. Shaping
    then sees a spread that is not there: centered ranks give the tied members full-size, different weights, and
    z-scores give a ~1e-8 step that is not a zero update (Adam takes a full learning-rate step on it)."""
    v = np.asarray(values, dtype=np.float64)
    if weights is not None:
        v = v * np.asarray(weights, dtype=np.float64)[None, :]
    n = v.shape[1] if count is None else int(count)
    return np.array([math.fsum(row) / n for row in v.tolist()], dtype=np.float64)


class FitnessRule:
    """Base of the fitness rules: `__call__` to implement, hooks with stateless defaults (module docstring)."""

    stateful: bool = False

    def __call__(self, result: PopulationResult, batch: Sequence[dict]) -> np.ndarray:
        raise NotImplementedError

    def rewards(self, result: PopulationResult) -> np.ndarray:
        return np.asarray(result.scores, dtype=np.float64)

    def bind(self, num_examples: int, seed: int) -> None:
        return None

    def sample_batch(self, seed: int, iteration: int, n: int, batch_size: int) -> list[int]:
        return sample_batch(seed, iteration, n, batch_size)

    def log_record(self) -> dict[str, Any] | None:
        return None

    def summary(self) -> dict[str, Any] | None:
        return None

    def state_dict(self) -> dict[str, Any] | None:
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

    def replay(self, record: dict[str, Any]) -> None:
        return None


class CallableRule(FitnessRule):
    """A bare `(result, batch) -> fitness` function as a stateless rule on uniform batches."""

    def __init__(self, fn: Callable[[PopulationResult, Sequence[dict]], Any]):
        self.fn = fn

    def __call__(self, result: PopulationResult, batch: Sequence[dict]) -> np.ndarray:
        return self.fn(result, batch)


def as_fitness_rule(rule: FitnessRule | Callable[..., Any]) -> FitnessRule:
    return rule if isinstance(rule, FitnessRule) else CallableRule(rule)


@dataclass
class MeanReward(FitnessRule):
    """Fitness = mean over the batch of (score + format_bonus * well_formed). format_bonus 0 = the paper."""

    format_bonus: float = 0.0

    def rewards(self, result: PopulationResult) -> np.ndarray:
        r = np.asarray(result.scores, dtype=np.float64)
        if self.format_bonus:
            r = r + self.format_bonus * np.asarray(result.well_formed, dtype=np.float64)
        return r

    def __call__(self, result: PopulationResult, batch: Sequence[dict]) -> np.ndarray:
        # mean score + bonus * format rate, not the mean of their per-example sums: members with the same counts
        # then get the same bits (`row_means`), whichever examples they got right or well-formed
        fitness = row_means(result.scores)
        if self.format_bonus:
            fitness = fitness + self.format_bonus * row_means(result.well_formed)
        return fitness


class ClassBalancedMean(MeanReward):
    """Fitness = the mean over labels of each label's mean reward in the batch (`class_balanced_weights` of the
    batch's labels, e.g. BoolQ yes/no or a Countdown variant's target operator): a member that always answers
    the majority label gains no more than one that always answers the minority one, so the prior earns nothing.
    Examples whose label is outside `labels` (a Countdown target two operators reach) do not count, rather than
    forming a class of their own with a large weight. Opt-in (`fitness_rule: balanced`); the paper's rule is
    `MeanReward`."""

    def __init__(self, label_of: Callable[[dict], Any], labels: Sequence[Any] | None = None,
                 format_bonus: float = 0.0):
        super().__init__(format_bonus)
        self.label_of = label_of
        self.labels = None if labels is None else set(labels)

    def __call__(self, result: PopulationResult, batch: Sequence[dict]) -> np.ndarray:
        from esft.tasks.labels import class_balanced_weights

        labels = [self.label_of(ex) for ex in batch]
        known = [i for i, label in enumerate(labels) if self.labels is None or label in self.labels]
        if not known:  # no labelled example in the batch: the plain mean
            return MeanReward.__call__(self, result, batch)
        weights = np.zeros(len(labels), dtype=np.float64)
        weights[known] = class_balanced_weights([labels[i] for i in known])
        fitness = row_means(result.scores, weights, len(known))  # order-independent sums, as MeanReward's
        if self.format_bonus:
            fitness = fitness + self.format_bonus * row_means(result.well_formed, weights, len(known))
        return fitness


FITNESS_RULES = ("mean", "dart", "balanced")

__all__ = ["FITNESS_RULES", "CallableRule", "ClassBalancedMean", "FitnessRule", "MeanReward", "as_fitness_rule",
           "row_means", "sample_batch", "train_examples"]
