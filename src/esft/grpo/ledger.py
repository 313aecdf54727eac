"""Per-step accounting of a GRPO run, counted from what actually ran (measured, not assumed).

The trainer fills a `StepLedger` from the tensors TRL built (prompt and completion ids, loss masks, advantages)
and the reward function fills in rewards and scores; the run log turns it into one `metrics.jsonl` record per
optimizer step and keeps running totals, so the paper's Table 18 (compute per task) can be computed from a run.
Key names follow the ES trainer where the meaning is the same (`tokens_generated`, `prompt_tokens`,
`finished_rate`, `accuracy`, `format_rate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from esft.rundir import peak_rss_mb

#: counters summed into the run totals
COUNTERS = ("prompts", "completions", "prompt_tokens", "tokens_generated", "finished", "trained_completions",
            "trained_tokens", "forward_tokens", "signal_completions")


@dataclass
class StepLedger:
    prompts: int = 0
    """distinct prompts sampled (groups of num_generations completions)"""
    completions: int = 0
    """completions generated"""
    prompt_tokens: int = 0
    """prompt tokens prefilled: each completion's own prompt (TRL's HF generate repeats the prompt K times)"""
    tokens_generated: int = 0
    """sampled completion tokens, up to and including the first eos"""
    finished: int = 0
    """completions that ended with an eos token (the rest hit max_completion_length)"""
    trained_completions: int = 0
    """completions with at least one token in the loss mask, counted per micro-batch pass"""
    trained_tokens: int = 0
    """completion tokens in the loss mask, summed over micro-batches (and over num_iterations passes)"""
    forward_tokens: int = 0
    """sequence positions (prompt + completion, padding included) run through the training forward/backward"""
    signal_completions: int = 0
    """completions with a non-zero advantage (a group whose rewards are all equal gives no gradient)"""
    rewards: list[float] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    well_formed: list[bool] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    time: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: dict[str, float] = field(default_factory=dict)
    """process peak RSS (monotonic) right after each phase: where it grows shows which phase sets the peak"""

    def mark_rss(self, phase: str) -> None:
        self.peak_rss_mb[phase] = peak_rss_mb()

    def add_time(self, key: str, seconds: float) -> None:
        self.time[key] = self.time.get(key, 0.0) + seconds

    def counts(self) -> dict[str, int]:
        return {k: int(getattr(self, k)) for k in COUNTERS}

    def record(self) -> dict[str, Any]:
        """The accounting part of a metrics.jsonl train record."""
        rec: dict[str, Any] = self.counts()
        rewards = np.asarray(self.rewards, dtype=np.float64)
        if rewards.size:
            rec["reward"] = {"mean": float(rewards.mean()), "std": float(rewards.std()),
                             "min": float(rewards.min()), "max": float(rewards.max())}
            rec["accuracy"] = float(np.mean(self.scores))
            if self.well_formed:  # none for a task that checks no format
                rec["format_rate"] = float(np.mean(self.well_formed))
        rec["finished_rate"] = self.finished / max(1, self.completions)
        return rec


def add_totals(totals: dict[str, int], ledger: StepLedger) -> dict[str, int]:
    out = {k: int(totals.get(k, 0)) for k in COUNTERS}
    for k, v in ledger.counts().items():
        out[k] += v
    return out
