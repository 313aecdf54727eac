"""Sampling-based metrics: unbiased pass@k, mean@n and maj@k, with bootstrap confidence intervals.

Given n sampled completions per question, c of them correct:

* pass@k  P(at least one of k samples drawn without replacement from the n is correct), the unbiased estimator
          1 - C(n-c, k) / C(n, k) (Chen et al. 2021), computed as 1 - prod_{i=n-c+1..n} (1 - k/i): the binomials
          overflow float64 for n in the hundreds, the product never does.
* mean@n  expected accuracy of one sample (average over all n): the unbiased estimate of the expected mean of
          k samples is c/n for every k, so it is reported once, as mean@n.
* maj@k   accuracy of the majority answer among k samples. Answers are compared by a key (the task's extracted,
          normalised answer); samples without an answer do not vote; a tie between answers scores the fraction
          of the tied answers that are correct (the expected score of a uniform tie-break). With k < n the value
          is the average over random k-subsets of the n samples (a seeded Monte Carlo estimate; exact when k = n).
* chance  for a task whose answer is one of L labels (yes/no, A-D), the pass@k of a uniform random guess,
          1 - (1 - 1/L)^k (`chance_pass_at_k`): it climbs with k, so a pass@k at large k means little below it.

pass@k is counted only from right/wrong scores (every score 0 or 1). A task scored with partial credit or a reward
on another scale (a `module:function` reward) gets mean@n = its mean score, maj@k = the mean score of the majority
answer, and pass@k None with a one-line reason (`not_right_or_wrong`): no threshold turns a reward into right or
wrong without inventing what "correct" means.

Confidence intervals: percentile bootstrap over questions (questions are resampled with replacement, the n
samples of a question stay together), because questions, not samples, are the independent units: the samples
of one question are correlated, so a Wilson interval over all Q*n completions would be too narrow. When every
question has the same value in [0, 1] (all solved, none solved) the bootstrap has no spread to resample; the
interval is then the Wilson interval of that mean over the Q questions.

Everything here is a pure function of arrays; `esft.evaluation` turns generations into those arrays.
"""

from __future__ import annotations

import numbers
from collections import Counter
from typing import Any, Hashable, Sequence

import numpy as np

from esft.tasks.base import answer_digest
from esft.tasks.labels import wilson_interval

CI_METHOD = "percentile bootstrap over questions (Wilson over questions when all score alike)"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one question with n samples of which c are correct.

    Requires 0 <= c <= n and 1 <= k <= n: with fewer samples than k the estimator is undefined (raises
    ValueError, so a too-small `--samples` fails loudly instead of reporting a biased number)."""
    if any(float(v) != int(v) for v in (n, c, k)):  # a fractional count would be truncated into another question
        raise ValueError(f"pass@k needs whole numbers, got n={n}, c={c}, k={k}")
    n, c, k = int(n), int(c), int(k)
    if n < 1:
        raise ValueError(f"pass@k needs n >= 1 samples, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"correct count c={c} must lie in [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n, got n={n} samples")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1..n} (1 - k/i)
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_at_k_per_question(correct: np.ndarray, n: int, k: int) -> np.ndarray:
    """pass@k of each question from its correct count (vectorised over questions)."""
    return np.array([pass_at_k(n, c, k) for c in np.asarray(correct).ravel().tolist()], dtype=np.float64)


# ---- majority vote ---------------------------------------------------------------------------------------------

def majority_score(keys: Sequence[Hashable | None], scores: Sequence[float]) -> float:
    """Score of the majority answer among samples (keys None = no answer, no vote).

    The score of an answer is the mean score of the samples that gave it (samples with equal keys normally score
    alike). Ties between the most frequent answers give the mean of their scores; no answer at all gives 0."""
    votes: Counter = Counter()
    total: dict[Hashable, float] = {}
    for key, s in zip(keys, scores):
        if key is None:
            continue
        votes[key] += 1
        total[key] = total.get(key, 0.0) + float(s)
    if not votes:
        return 0.0
    top = max(votes.values())
    tied = [key for key, v in votes.items() if v == top]
    return float(np.mean([total[key] / votes[key] for key in tied]))


def maj_at_k(keys: Sequence[Hashable | None], scores: Sequence[float], k: int, rng: np.random.Generator | None = None,
             draws: int = 64) -> float:
    """maj@k of one question from its n samples: exact for k == n, else the mean over `draws` random k-subsets."""
    n = len(keys)
    if not 1 <= k <= n:
        raise ValueError(f"maj@{k} needs 1 <= k <= n, got n={n} samples")
    if k == n:
        return majority_score(keys, scores)
    if k == 1:  # a single sample is its own majority: the mean over all subsets is exact
        return float(np.mean([float(s) if key is not None else 0.0 for key, s in zip(keys, scores)]))
    rng = rng if rng is not None else np.random.default_rng(0)
    total = 0.0
    for _ in range(draws):
        idx = rng.choice(n, size=k, replace=False)
        total += majority_score([keys[i] for i in idx], [scores[i] for i in idx])
    return total / draws


# ---- confidence intervals ------------------------------------------------------------------------------------------

def bootstrap_ci(values: Sequence[float], level: float = 0.95, resamples: int = 2000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-question values in [0, 1] (resampling questions).

    When every question has the same value the bootstrap collapses to a point (every resample has the same
    mean), which would claim certainty from a few questions: for a value in [0, 1] and the 95% level, the Wilson
    interval of that mean over the questions is returned instead (0 of 3 questions: [0, 0.56], as the greedy
    accuracy's interval)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return (0.0, 1.0)
    if np.ptp(v) == 0.0:
        if level == 0.95 and 0.0 <= v[0] <= 1.0:
            return wilson_interval(float(v.sum()), int(v.size))
        return (float(v[0]), float(v[0]))  # a score outside [0, 1] (a custom task's) or another level: no model
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(resamples, v.size))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return (float(lo), float(hi))


# ---- one task's summary ---------------------------------------------------------------------------------------------

def parse_ks(ks: Sequence[int] | None, n: int) -> list[int]:
    """The k values to report: the requested ones (each a whole number 1 <= k <= n, else ValueError), default
    [1, n]."""
    if not ks:
        return sorted({1, n})
    # a fractional k (2.5 in a config file) would be truncated into another k, reported as that one; True as k = 1
    odd = [k for k in ks if isinstance(k, bool) or not isinstance(k, numbers.Real) or not float(k).is_integer()]
    if odd:
        raise ValueError(f"k={odd} are not whole numbers: pass@k and maj@k draw k whole samples per question")
    out = sorted({int(k) for k in ks})
    bad = [k for k in out if not 1 <= k <= n]
    if bad:
        raise ValueError(f"k={bad} not in [1, samples={n}]: pass@k and maj@k need at least k samples per question")
    return out


def not_right_or_wrong(scores: np.ndarray) -> str | None:
    """Why pass@k cannot be counted from `scores`, or None when every score is 0 or 1 (right or wrong).

    pass@k asks whether one of k samples is *correct*; a partial credit (0.7) or a reward on another scale (a
    `module:function` reward, a sum of rewards scoring 2) says how good a sample is, not whether it is right, and
    any threshold that made it right or wrong (0.5, say) would be the report's choice, not the task's."""
    s = np.asarray(scores, dtype=np.float64)
    other = s[(s != 0.0) & (s != 1.0)]
    if other.size == 0:
        return None
    outside = other[(other < 0.0) | (other > 1.0)]  # the telling one: a score no accuracy can be
    shown = float((outside if outside.size else other).flat[0])
    return (f"pass@k needs right/wrong scores (0 or 1); these include {shown:g} (partial credit or a reward on "
            "another scale), which no threshold makes right or wrong")


def summarize_samples(scores: np.ndarray, keys: Sequence[Sequence[Hashable | None]] | None, ks: Sequence[int],
                      seed: int = 0, resamples: int = 2000, maj_draws: int = 64) -> dict[str, Any]:
    """Metrics of a [Q, n] matrix of scores and optional [Q][n] answer keys.

    Returns {"questions", "samples", "mean@n": {...}, "pass@k": {"k": {...}}, "maj@k": {"k": {...}} (only with
    keys), "ci_method"}; each {...} is {"value", "ci95": [lo, hi]}; the k keys are strings (JSON-stable). mean@n
    is the mean score (with 0/1 scores, c / n). pass@k counts correct samples, so it needs 0/1 scores: with any
    other score it is None and "pass@k_note" says why (`not_right_or_wrong`); maj@k is then the mean score of the
    majority answer."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 2 or s.shape[1] < 1:
        raise ValueError(f"scores must be a [questions, samples] matrix, got shape {s.shape}")
    q, n = s.shape
    ks = parse_ks(ks, n)

    def metric(per_question: np.ndarray) -> dict[str, Any]:
        return {"value": float(per_question.mean()) if q else 0.0,
                "ci95": list(bootstrap_ci(per_question, resamples=resamples, seed=seed))}

    out: dict[str, Any] = {"questions": q, "samples": n, "ci_method": CI_METHOD,
                           "mean@n": metric(s.mean(axis=1) if q else np.zeros(0))}
    note = not_right_or_wrong(s)
    if note is None:
        correct = s.sum(axis=1).round().astype(int)  # exact: every score is 0 or 1
        # string keys: the summary goes to JSON, where int keys would come back as strings anyway
        out["pass@k"] = {str(k): metric(pass_at_k_per_question(correct, n, k)) for k in ks}
    else:
        out["pass@k"], out["pass@k_note"] = None, note
    if keys is not None:
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x3A7]))
        out["maj@k"] = {str(k): metric(np.array([maj_at_k(list(keys[i]), list(s[i]), k, rng, maj_draws)
                                            for i in range(q)], dtype=np.float64)) for k in ks}
    return out


def chance_pass_at_k(labels: Sequence[Hashable], ks: Sequence[int]) -> dict[str, Any]:
    """pass@k of a uniform random guess among the task's L answer labels, {"labels": [...], "pass@k": {"k": p}}.

    Each sample is right with probability 1/L whatever the question, independently of the other samples, so
    pass@k = 1 - (1 - 1/L)^k (BoolQ, L = 2: 50% at k=1, 75% at k=2, 93.75% at k=4). The unbiased estimator of a
    guesser's n samples has this expectation. Unlike the constant answer, which is right on the same questions at
    every k, chance climbs with k: pass@k above the constant line but not above this one can be pure guessing."""
    names = list(dict.fromkeys(labels))
    if not names:
        raise ValueError("chance pass@k needs at least one answer label")
    miss = 1.0 - 1.0 / len(names)
    return {"labels": names, "pass@k": {str(int(k)): 1.0 - miss ** int(k) for k in sorted({int(k) for k in ks})}}


def answer_key(details: dict[str, Any]) -> Hashable | None:
    """The voting key of one completion from a task's `details()`: its `vote_key` when it gives one (compared as
    it is), the normalised answer when the task gives one (MATH), else a digest of the extracted answer with
    whitespace removed (letters, yes/no, Countdown expressions; esft.tasks.base.answer_digest), which for an
    answer cut for display comes with it
    (`extracted_digest`); None when the task extracts nothing (IFEval) or the completion has no answer. Only
    equality of keys matters: a vote counts equal answers."""
    if "vote_key" in details:  # a task's own key, compared as it is (`exact`'s normalised completion or its digest)
        return None if details["vote_key"] is None else ("vote", details["vote_key"])
    if "normalized" not in details and isinstance(details.get("extracted"), str):
        # by digest whether cut for display or not, so one answer spelled with more whitespace (cut) and with
        # less (whole) is one vote
        extracted = details["extracted"]
        digest = details["extracted_digest"] if "extracted_digest" in details else answer_digest(extracted)
        return None if digest is None else ("sha256", digest)
    value = details.get("normalized", details.get("extracted"))
    if value is None:
        return None
    if isinstance(value, str):
        value = "".join(value.split())
        return value or None
    return value if isinstance(value, Hashable) else str(value)


__all__ = ["pass_at_k", "pass_at_k_per_question", "majority_score", "maj_at_k", "bootstrap_ci", "parse_ks",
           "summarize_samples", "not_right_or_wrong", "answer_key", "chance_pass_at_k", "CI_METHOD"]
