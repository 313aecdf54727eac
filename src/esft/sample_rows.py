"""The rows of a run directory's `samples/` files: one shape for ES and GRPO, so a reader of either reads both.

    samples/iter_XXXXXX.jsonl   TRAIN_SAMPLE_FIELDS, then ES's member, seed and sign, or GRPO's reward
    samples/eval_XXXXXX.jsonl   EVAL_SAMPLE_FIELDS, the task's details (`extracted`, ...) before the completion

`well_formed` is absent for a task that checks no format (esft.tasks.base.checks_format): a reader that finds it
in a row computes a format rate, and a rate of a check nobody made would read 0.
"""

from __future__ import annotations

from typing import Any

#: a training completion: the iteration it was generated in (0-based, as metrics.jsonl's `iteration`), its
#: example's index in the train split, its task score, format flag, whether it ended with eos, its length
TRAIN_SAMPLE_FIELDS = ("iteration", "index", "score", "well_formed", "finished", "completion_tokens", "completion")
#: a held-out completion: as a training one, with its prompt's length and the example (its gold answer)
EVAL_SAMPLE_FIELDS = ("index", "score", "well_formed", "finished", "prompt_tokens", "completion_tokens",
                      "completion", "example")


def sample_row(head: dict[str, Any], *, score: float, well_formed: bool | None, completion: str,
               finished: bool | None = None, completion_tokens: int | None = None, prompt_tokens: int | None = None,
               details: dict[str, Any] | None = None, example: dict[str, Any] | None = None) -> dict[str, Any]:
    """One row: `head` (ids) first, then the fields above in their order, each but score and completion only
    where given (a custom executor may not know a completion's length), the task's `details` after the format flag."""
    row = dict(head)
    row["score"] = float(score)
    if well_formed is not None:
        row["well_formed"] = bool(well_formed)
    row.update(details or {})
    if finished is not None:
        row["finished"] = bool(finished)
    if prompt_tokens is not None:
        row["prompt_tokens"] = int(prompt_tokens)
    if completion_tokens is not None:
        row["completion_tokens"] = int(completion_tokens)
    row["completion"] = completion
    if example is not None:
        row["example"] = example
    return row
