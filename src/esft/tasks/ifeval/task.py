"""`IFEvalTask`: the IFEval holdout (541 prompts, test split only) behind the common `Task` interface."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from esft.tasks.base import Example, Messages, Task, chat, completion_text, read_bundled_jsonl, wilson_interval
from esft.tasks.ifeval.instructions import evaluate, evaluate_strict

DATA_FILE = "ifeval.jsonl.gz"

# IFEval prompts carry their own format instructions, so the system prompt only asks to follow them.
SYSTEM_PROMPT = "You are a helpful assistant. Follow every instruction in the user's request exactly."


@lru_cache(maxsize=1)
def _rows() -> tuple[Example, ...]:
    return tuple(read_bundled_jsonl(DATA_FILE))


def _text(completion: Any) -> str:
    if completion is None:
        return ""
    return completion if isinstance(completion, str) else completion_text(completion)


@dataclass
class IFEvalTask(Task):
    """Score = prompt-level strict accuracy (1.0 iff every instruction passes on the response as is)."""

    name: str = "ifeval"
    splits: tuple[str, ...] = ("test",)
    system_prompt: str = SYSTEM_PROMPT

    def _load(self, split: str) -> list[Example]:
        # Fresh dicts so callers may annotate examples without touching the cached rows.
        return [dict(row) for row in _rows()]

    def prompt(self, example: Example) -> Messages:
        return chat(self.system_prompt, str(example["prompt"]))

    def score(self, completion: str, example: Example) -> float:
        """1.0 iff every instruction passes; a malformed example raises (see `evaluate`)."""
        return 1.0 if all(evaluate_strict(_text(completion), example)) else 0.0

    def is_well_formed(self, completion: str, example: Example) -> bool:
        # IFEval has no answer format beyond the instructions themselves; a non-blank reply is "formed".
        return bool(_text(completion).strip())

    def details(self, completion: str, example: Example) -> dict[str, Any]:
        """Per-instruction verdicts (lists aligned with `instruction_ids`) and both prompt-level ones."""
        result = evaluate(_text(completion), example)
        return {
            "instruction_ids": list(result.instruction_ids),
            "strict": list(result.strict),
            "loose": list(result.loose),
            "prompt_strict": result.prompt_strict,
            "prompt_loose": result.prompt_loose,
        }

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """n, accuracy (= prompt-level strict, from `score`) with a Wilson 95% CI, and IFEval's four
        numbers: prompt-level strict/loose (fraction of prompts with every instruction followed) and
        instruction-level strict/loose (fraction over all instructions of all prompts).

        Records without the `details` fields count through `score` alone: a passing score means every
        instruction passed (strict, hence loose); a failing one is a loose fail too, as is unknowable."""
        n = len(records)
        prompt_strict = sum(1 for r in records if r.get("score", 0.0) >= 1.0)
        lo, hi = wilson_interval(prompt_strict, n)
        prompt_loose = sum(1 for r in records if _prompt_loose(r))
        inst_total = sum(len(r.get("strict", ())) for r in records)
        inst_strict = sum(sum(bool(x) for x in r.get("strict", ())) for r in records)
        inst_loose = sum(sum(bool(x) for x in r.get("loose", ())) for r in records)
        return {
            "n": n,
            "accuracy": prompt_strict / n if n else 0.0,
            "ci95": [lo, hi],
            "prompt_strict": prompt_strict / n if n else 0.0,
            "prompt_loose": prompt_loose / n if n else 0.0,
            "instruction_strict": inst_strict / inst_total if inst_total else 0.0,
            "instruction_loose": inst_loose / inst_total if inst_total else 0.0,
            "n_instructions": inst_total,
        }


def _prompt_loose(record: dict[str, Any]) -> bool:
    if "prompt_loose" in record:
        return bool(record["prompt_loose"])
    if "loose" in record:
        return all(bool(x) for x in record["loose"])
    return record.get("score", 0.0) >= 1.0
