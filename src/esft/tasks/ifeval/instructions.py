"""Strict and loose evaluation of one response against an example's instruction list.

Strict: the response as it is. Loose (IFEval's "loose" accuracy): an instruction passes if it passes on
any of eight variants - the response; without its first line (often "Sure, here is..."); without its
last line (often "Let me know if..."); without both; and each of these four with every `*` removed
(markdown emphasis). In both modes a blank variant fails every instruction. A variant equal to one already
checked is not checked again (a one-line response has only two distinct variants).

Any text is checked without raising. A malformed example (a data bug: a missing or non-list
`instruction_id_list`, `kwargs` not aligned with it, an unknown instruction, a missing or bad parameter) raises
KeyError, TypeError or ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from esft.tasks.ifeval.checkers import INSTRUCTIONS, check_params, missing_params


def loose_variants(response: str) -> list[str]:
    lines = response.split("\n")
    trimmed = [
        response,
        "\n".join(lines[1:]).strip(),
        "\n".join(lines[:-1]).strip(),
        "\n".join(lines[1:-1]).strip(),
    ]
    return trimmed + [t.replace("*", "") for t in trimmed]


def _params(instruction_id: str, kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The parameters a checker gets; an unknown instruction or a missing parameter raises ValueError."""
    if instruction_id not in INSTRUCTIONS:
        raise ValueError(f"malformed IFEval example: unknown instruction {instruction_id!r}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"malformed IFEval example: parameters of {instruction_id!r} are {kwargs!r}, not a dict")
    missing = missing_params(instruction_id, kwargs)
    if missing:
        raise ValueError(f"malformed IFEval example: {instruction_id!r} lacks {', '.join(missing)}")
    # The Hugging Face copy of the data lists every parameter name with None for unused ones.
    params = {k: v for k, v in (kwargs or {}).items() if v is not None}
    check_params(instruction_id, params)
    return params


def check_instruction(instruction_id: str, kwargs: Mapping[str, Any] | None, response: str) -> bool:
    """One instruction on one text. A blank text follows no instruction; a malformed instruction raises."""
    params = _params(instruction_id, kwargs)
    if not response.strip():
        return False
    return bool(INSTRUCTIONS[instruction_id].check(response, params))


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
    ids: Sequence[Any] = example["instruction_id_list"]
    kwargs: Sequence[Any] = example["kwargs"]
    if not isinstance(ids, (list, tuple)) or not all(isinstance(i, str) for i in ids):
        raise TypeError(f"malformed IFEval example: instruction_id_list must be a list of ids, got {ids!r}")
    if not isinstance(kwargs, (list, tuple)) or len(kwargs) != len(ids):
        raise ValueError(f"malformed IFEval example: kwargs must be a list with one entry per instruction, "
                         f"got {kwargs!r} for {len(ids)} instruction(s)")
    for i, kw in zip(ids, kwargs):
        _params(i, kw)  # every instruction is checked, so a data bug raises whatever the response
    return list(zip(ids, kwargs))


def evaluate_strict(response: str, example: Mapping[str, Any]) -> tuple[bool, ...]:
    return tuple(check_instruction(i, kw, response) for i, kw in _instructions(example))


def evaluate(response: str, example: Mapping[str, Any]) -> Result:
    """Strict and loose verdict for every instruction of `example`."""
    instructions = _instructions(example)
    strict = tuple(check_instruction(i, kw, response) for i, kw in instructions)
    # The response itself is the first variant (a strict pass is a loose pass); the others are checked once each.
    others = list(dict.fromkeys(v for v in loose_variants(response)[1:] if v != response and v.strip()))
    loose = tuple(
        s or any(check_instruction(i, kw, v) for v in others)
        for (i, kw), s in zip(instructions, strict)
    )
    return Result(tuple(i for i, _ in instructions), strict, loose)
