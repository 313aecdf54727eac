"""Strict and loose evaluation of one response against an example's instruction list.

Strict: the response as it is. Loose (IFEval's "loose" accuracy): an instruction passes if it passes on
any of eight variants - the response; without its first line (often "Sure, here is..."); without its
last line (often "Let me know if..."); without both; and each of these four with every `*` removed
(markdown emphasis). In both modes a blank variant fails every instruction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from esft.tasks.ifeval.checkers import INSTRUCTIONS


def loose_variants(response: str) -> list[str]:
    lines = response.split("\n")
    trimmed = [
        response,
        "\n".join(lines[1:]).strip(),
        "\n".join(lines[:-1]).strip(),
        "\n".join(lines[1:-1]).strip(),
    ]
    return trimmed + [t.replace("*", "") for t in trimmed]


def check_instruction(instruction_id: str, kwargs: Mapping[str, Any] | None, response: str) -> bool:
    """One instruction on one text; unknown ids, bad parameters and checker errors all count as a fail
    (a scorer used as a training reward must never raise)."""
    if not response.strip():
        return False
    ins = INSTRUCTIONS.get(instruction_id)
    if ins is None:
        return False
    try:
        # The Hugging Face copy of the data lists every parameter name with None for unused ones.
        params = {k: v for k, v in (kwargs or {}).items() if v is not None}
        return bool(ins.check(response, params))
    except Exception:  # noqa: BLE001 - junk input or malformed parameters: the instruction is not followed
        return False


@dataclass(frozen=True)
class Result:
    instruction_ids: tuple[str, ...]
    strict: tuple[bool, ...]
    loose: tuple[bool, ...]

    @property
    def prompt_strict(self) -> bool:
        return all(self.strict)

    @property
    def prompt_loose(self) -> bool:
        return all(self.loose)


def _instructions(example: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any] | None]]:
    ids: Sequence[str] = example.get("instruction_id_list") or []
    kwargs: Sequence[Any] = example.get("kwargs") or []
    return [(str(i), kwargs[k] if k < len(kwargs) else None) for k, i in enumerate(ids)]


def evaluate_strict(response: str, example: Mapping[str, Any]) -> tuple[bool, ...]:
    return tuple(check_instruction(i, kw, response) for i, kw in _instructions(example))


def evaluate(response: str, example: Mapping[str, Any]) -> Result:
    """Strict and loose verdict for every instruction of `example`."""
    instructions = _instructions(example)
    strict = tuple(check_instruction(i, kw, response) for i, kw in instructions)
    variants = loose_variants(response)
    # A strict pass is a loose pass (the response itself is the first variant): skip re-checking it.
    loose = tuple(
        s or any(check_instruction(i, kw, v) for v in variants[1:])
        for (i, kw), s in zip(instructions, strict)
    )
    return Result(tuple(i for i, _ in instructions), strict, loose)
