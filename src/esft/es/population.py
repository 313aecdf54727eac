"""What an executor returns: the scores of R rows (members, or the one unperturbed model) on a batch of B examples,
each completion's text, format flag, length and end, and the counters and timings of the evaluation; and the
stacking of one-row results that workers return (esft.es.distributed) into one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from esft.tasks.base import checks_format


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
    cell_finished: np.ndarray | None = None
    """[R, B] bool: that completion ended with eos (None: not known, as from an executor that gives counters only)"""
    cell_completion_tokens: np.ndarray | None = None
    """[R, B] int: that completion's generated tokens (None: not known)"""
    cell_prompt_tokens: np.ndarray | None = None
    """[R, B] int: that completion's prompt tokens (None: not known)"""

    def cell(self, row: int, col: int, prompt: bool = False) -> dict[str, Any]:
        """The per-completion fields of a sample row (esft.sample_rows.sample_row) of cell [row, col], its prompt's
        length too with `prompt`; a field this result does not know is left out."""
        out: dict[str, Any] = {"score": float(self.scores[row, col]), "completion": self.texts[row][col]}
        known = (("finished", self.cell_finished, bool), ("completion_tokens", self.cell_completion_tokens, int),
                 ("prompt_tokens", self.cell_prompt_tokens if prompt else None, int))
        out.update({key: kind(values[row, col]) for key, values, kind in known if values is not None})
        return out

    def record(self, row: int, col: int, gen: Any, task: Any, example: dict) -> None:
        """Score one completion (an esft.generation.Generation) of `example` into cell [row, col] and add its
        counters; completions must be recorded in column order (texts are appended)."""
        self.texts[row].append(gen.text)
        self.scores[row, col] = float(task.score(gen.text, example))
        self.well_formed[row, col] = checks_format(task) and bool(task.is_well_formed(gen.text, example))
        self.tokens_generated += len(gen.completion_ids)
        self.prompt_tokens += int(gen.prompt_tokens)
        self.finished += int(bool(gen.finished))
        if self.cell_finished is None:  # known from the first recorded completion on
            shape = np.shape(self.scores)
            self.cell_finished = np.zeros(shape, dtype=bool)
            self.cell_completion_tokens = np.zeros(shape, dtype=np.int64)
            self.cell_prompt_tokens = np.zeros(shape, dtype=np.int64)
        self.cell_finished[row, col] = bool(gen.finished)
        self.cell_completion_tokens[row, col] = len(gen.completion_ids)
        self.cell_prompt_tokens[row, col] = int(gen.prompt_tokens)


def merge_rows(rows: Sequence[PopulationResult]) -> PopulationResult:
    """Stack one-row results (in member order) into one PopulationResult. Timings are summed over workers
    (worker-seconds, as the local executor's are seconds of its single process)."""
    timings: dict[str, float] = {}
    for r in rows:
        for k, v in r.timings.items():
            timings[k] = timings.get(k, 0.0) + float(v)
    return PopulationResult(
        scores=np.concatenate([np.asarray(r.scores) for r in rows], axis=0),
        well_formed=np.concatenate([np.asarray(r.well_formed, dtype=bool) for r in rows], axis=0),
        texts=[t for r in rows for t in r.texts],
        tokens_generated=sum(r.tokens_generated for r in rows),
        prompt_tokens=sum(r.prompt_tokens for r in rows),
        finished=sum(r.finished for r in rows),
        timings=timings,
        **{name: _stacked([getattr(r, name) for r in rows])
           for name in ("cell_finished", "cell_completion_tokens", "cell_prompt_tokens")},
    )


def _stacked(parts: Sequence[np.ndarray | None]) -> np.ndarray | None:
    """The rows' arrays of one per-completion field stacked, None where a row does not know it."""
    return None if any(p is None for p in parts) else np.concatenate([np.asarray(p) for p in parts], axis=0)
