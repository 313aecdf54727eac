"""Measurements that a prior cannot fool: the best constant answer, label-balanced subsets, balanced rewards.

A weak model can lift its accuracy by learning the answer prior alone (always "yes" scores 63.5% on the first 200
questions of BoolQ's test split, docs/results/constant_baselines.md). An accuracy therefore means something only
next to the accuracy of the best *constant* answer on the same examples, the share of the most frequent gold
answer, reported with its 95% Wilson interval. On a
*label-balanced* subset (the same number of examples per gold label) that baseline is 1/K for K labels, so a
climb there cannot come from the prior. `class_balanced_weights` is the training-side counterpart: per-example
reward weights that make each label weigh the same in a batch mean.

These are pure functions of gold labels (with the Wilson interval every accuracy in esft carries); `Task.gold_key`
turns an example into its label.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from typing import Any, Callable, Hashable, Iterable, Sequence, TypeVar

#: the tasks with labels, in the words of a refusal that needs one
LABELLED_TASKS = ("boolq, chemistry, mmlu, a Countdown variant with several operators, a data task scored by mcq, "
                  "a task class whose label_set names its labels")

T = TypeVar("T")

#: Seed of balanced subsets: like the data splits, they must not move when a run's seed changes.
BALANCE_SEED = 42


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a binomial proportion (well-behaved at 0 and 1, unlike Wald)."""
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def scores_interval(scores: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """95% interval of a mean score: Wilson's for scores in [0, 1] (right or wrong, partial credit); for a reward
    function's scores on another scale (`reward: module:function` may return any number) the normal approximation
    mean +- z s / sqrt(n), as Wilson's takes the mean for a proportion (a mean of 3.8 fails its square root, one of
    1.05 gets an interval below it). One such score has no spread to measure: its interval is the score itself."""
    n = len(scores)
    if all(0.0 <= s <= 1.0 for s in scores):
        return wilson_interval(math.fsum(scores), n)
    mean = math.fsum(scores) / n
    half = z * statistics.stdev(scores) / math.sqrt(n) if n > 1 else 0.0
    return (mean - half, mean + half)


#: The two names of a held-out score (`score_name`).
ACCURACY, MEAN_REWARD = "accuracy", "mean reward"


def score_name(values: Iterable[float | None]) -> str:
    """What a held-out score is called where it is shown: ACCURACY while every value lies in [0, 1] (right or
    wrong, or partial credit), MEAN_REWARD otherwise (a `module:function` reward may return any number, and a
    mean of 2.5 or -1 is no accuracy). Only an accuracy is shown beside the constant-answer baseline: that
    baseline is the share of examples whose gold answer is the most frequent one, which says nothing on another
    reward's scale.

    `values` are whatever the caller has of the scores (None skipped): the scores themselves, or their means and
    95% interval bounds. From means and bounds alone, scores outside [0, 1] whose means and intervals all stay in
    it still read as an accuracy: a place that has the scores should pass them."""
    return ACCURACY if all(0.0 <= v <= 1.0 for v in values if v is not None) else MEAN_REWARD


def summaries_score_name(summaries: Iterable[dict[str, Any]], mean: str = "test_accuracy",
                         ci: str = "test_ci95") -> str:
    """`score_name` of evaluation summaries (metrics.jsonl records, or a result's per-task summary with
    mean="accuracy", ci="ci95"): from each one's mean and 95% interval bounds."""
    return score_name(v for s in summaries for v in (s.get(mean), *(s.get(ci) or ())))


def constant_baseline(labels: Sequence[Hashable]) -> dict[str, Any] | None:
    """Accuracy of always giving the most frequent gold answer among `labels`, with its 95% Wilson interval.

    Returns None for no labels. Ties go to the label seen first, so the answer named is deterministic.
    """
    if not labels:
        return None
    counts = Counter(labels)
    answer, count = counts.most_common(1)[0]
    n = len(labels)
    lo, hi = wilson_interval(count, n)
    return {"constant_baseline": count / n, "constant_baseline_ci95": [lo, hi], "constant_answer": answer,
            "constant_answer_count": count, "labels": len(counts)}


#: the most frequent gold answers `best_constant_answer` scores
CONSTANT_CANDIDATES = 5


def best_constant_answer(golds: Sequence[str], scorer: Callable[[str], list[float]],
                         candidates: int = CONSTANT_CANDIDATES) -> dict[str, Any]:
    """The constant-answer baseline of a task scored by a reward: `scorer(answer)` gives every example's score of
    the completion `answer`, and the best mean among the `candidates` most frequent gold answers is the baseline (a
    reward may give partial credit, so the most frequent answer's share is not what always giving it scores), with
    its scores' interval. Empty when a score leaves [0, 1]: on a mean reward's scale no share is shown
    (`score_name`)."""
    best: dict[str, Any] = {}
    for answer, _ in Counter(golds).most_common(candidates):
        scores = scorer(answer)
        if not scores or not all(0.0 <= s <= 1.0 for s in scores):
            return {}
        mean = math.fsum(scores) / len(scores)
        if not best or mean > best["constant_baseline"]:
            best = {"constant_baseline": mean, "constant_baseline_ci95": list(scores_interval(scores)),
                    "constant_answer": answer}
    return best


def balanced_indices(labels: Sequence[Hashable], size: int | None = None, seed: int = BALANCE_SEED,
                     label_set: Sequence[Hashable] | None = None) -> list[int]:
    """Indices of a label-balanced subset: the same count for every label, drawn by `random.Random(seed)`.

    `label_set` names the labels to balance over (every one must occur; a repeat counts once); None = the labels
    that occur. Items whose label is outside it are never drawn. `size` is the total; it is rounded down to a
    multiple of the number of labels, and asking for more per label than the rarest label has raises ValueError.
    None = as many as the rarest label allows. The indices come back in their original order, so the subset keeps
    the split's order.
    """
    groups: dict[Hashable, list[int]] = {}
    for i, label in enumerate(labels):
        groups.setdefault(label, []).append(i)
    keys = list(dict.fromkeys(label_set)) if label_set is not None else list(groups)
    if not keys:
        raise ValueError("no labels to balance over")
    missing = [k for k in keys if not groups.get(k)]
    if missing:
        raise ValueError(f"cannot balance: no example has label {missing[0]!r}")
    available = min(len(groups[k]) for k in keys)
    if size is None:
        per_label = available
    else:
        if size < len(keys):
            raise ValueError(f"a balanced subset of {len(keys)} labels needs size >= {len(keys)}, got {size}")
        per_label = size // len(keys)
        if per_label > available:
            raise ValueError(f"a balanced subset of {size} needs {per_label} examples per label, but the rarest "
                             f"label has {available} (at most {available * len(keys)} in all)")
    rng = random.Random(seed)
    chosen: list[int] = []
    for key in sorted(keys, key=repr):  # a fixed label order: the draw must not depend on the data's order
        chosen += rng.sample(groups[key], per_label)
    return sorted(chosen)


def balanced_subset(examples: Sequence[T], labels: Sequence[Hashable], size: int | None = None,
                    seed: int = BALANCE_SEED, label_set: Sequence[Hashable] | None = None) -> list[T]:
    """The examples at `balanced_indices(labels, size, seed, label_set)`."""
    if len(examples) != len(labels):
        raise ValueError(f"{len(examples)} examples but {len(labels)} labels")
    return [examples[i] for i in balanced_indices(labels, size, seed, label_set)]


def class_balanced_weights(labels: Sequence[Hashable]) -> list[float]:
    """Per-example reward weights n / (K * count(label)) for a batch with K distinct labels.

    They average to 1, and the weighted mean of the rewards is the mean over labels of each label's mean reward:
    a batch of 12 "yes" and 4 "no" questions counts the 4 "no" answers as much as the 12 "yes" ones, so always
    answering "yes" earns 0.5 rather than 0.75. A batch with one label gets weights 1.
    """
    counts = Counter(labels)
    n, k = len(labels), len(counts)
    return [n / (k * counts[label]) for label in labels]


__all__ = ["ACCURACY", "BALANCE_SEED", "LABELLED_TASKS", "MEAN_REWARD", "balanced_indices", "balanced_subset",
           "class_balanced_weights", "constant_baseline", "score_name", "summaries_score_name"]
