"""MATH (Hendrycks et al.): competition problems with a `\\boxed{}` final answer.

Scoring (paper Table 19): take the last `\\boxed{}` (nested braces handled), normalise prediction and gold the
same way (LaTeX wrappers, spacing, currency, degrees, percent, units, trailing period), compare the strings, and
on a mismatch compare them as numbers (integers, decimals, `\\frac{a}{b}`, `a/b`, thousands separators)
within 1e-6. Normalisation uses only linear-time regexes and one brace scan per wrapper; boxed answers longer
than `MAX_ANSWER_CHARS` (gold answers are at most 159 characters) score 0 without being normalised, so junk
cannot make the scorer slow.

Splits: `test` = MATH-500 (500); `train` = 200 problems drawn by `random.Random(42)` from the 7,500 MATH
train problems (both bundled parts, none of which is a MATH-500 problem); `train_pool` = all 7,500.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from esft.tasks.base import Example, Messages, Task, chat, last_boxed
from esft.tasks.common import TRAIN_SIZE, bundled, load_hub_rows, seeded_sample

HF_DATASET = "HuggingFaceH4/MATH-500"
MAX_ANSWER_CHARS = 1000
MAX_NUMBER_CHARS = 60  # longer "numbers" are not compared numerically (keeps Fraction parsing cheap)
TOLERANCE = Fraction(1, 1_000_000)

SYSTEM_PROMPT = (
    "Solve the math problem. Reason step by step, then give the final answer in \\boxed{}, "
    "e.g. \\boxed{\\frac{3}{4}}. Put only the final answer inside the box, in simplest form."
)

# ---- normalisation ---------------------------------------------------------------------------------------------
_WRAPPER = re.compile(r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mathit|mbox|operatorname)\s*\{")
_UNIT = re.compile(r"\\(?:text|mbox|mathrm)\{\s")  # `5\text{ cm}`: a wrapper opening with a space holds a unit
_SPACING = re.compile(r"\\\\|\\[,;:! ]|\\q?quad(?![A-Za-z])|~")  # `\\` (a row break) is matched to keep it
_LEFT_RIGHT = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)(?![A-Za-z])")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree(?![A-Za-z])")
_FRAC_DIGITS = re.compile(r"\\frac(\d)(\d)")
_FRAC_DIGIT_BRACE = re.compile(r"\\frac(\d)\{")
_FRAC_BRACE_DIGIT = re.compile(r"\\frac\{([^{}]*)\}(\d)")
_SQRT_SHORT = re.compile(r"\\sqrt(\w)")
_VAR_PREFIX = re.compile(r"^[A-Za-z]=(?!=)")
_PAREN_LETTER = re.compile(r"^\(([A-Za-z])\)$")


def _unwrap(text: str) -> str:
    """Replace every `\\text{X}`-like wrapper by X (balanced braces), one left-to-right pass per wrapper."""
    for _ in range(64):  # bounded: each pass removes one wrapper; answers have a handful at most
        m = _WRAPPER.search(text)
        if m is None:
            return text
        depth, k = 1, m.end()
        while k < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            k += 1
        inner = text[m.end() : k - 1] if depth == 0 else text[m.end() :]
        text = text[: m.start()] + inner + text[k:]
    return text


def normalize_answer(answer: str) -> str:
    """Canonical string form of a MATH answer (applied to prediction and gold alike)."""
    s = answer.strip().replace("\n", " ").replace("\\displaystyle", "")
    unit = _UNIT.search(s)
    if unit and s[: unit.start()].strip():  # "15\mbox{ cm}^2" -> "15"; a leading "\text{ east}" is kept
        s = s[: unit.start()]
    s = _unwrap(s)
    s = _SPACING.sub(lambda m: m.group(0) if m.group(0) == "\\\\" else "", s)
    s = _LEFT_RIGHT.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _DEGREES.sub("", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "").replace("{,}", ",")
    s = re.sub(r"\s+", "", s)
    s = s.rstrip(".")
    s = _VAR_PREFIX.sub("", s)
    s = _FRAC_DIGITS.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_DIGIT_BRACE.sub(r"\\frac{\1}{", s)
    s = _FRAC_BRACE_DIGIT.sub(r"\\frac{\1}{\2}", s)
    s = _SQRT_SHORT.sub(r"\\sqrt{\1}", s)
    s = _PAREN_LETTER.sub(r"\1", s)
    if len(s) >= 2 and s[0] == "{" and s[-1] == "}" and "}" not in s[1:-1]:
        s = s[1:-1]
    return s


_DECIMAL = r"-?(?:\d+(?:\.\d*)?|\.\d+)"
_NUMBER = re.compile(rf"^{_DECIMAL}$", re.ASCII)
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$", re.ASCII)
_LATEX_FRAC = re.compile(rf"^(-?)\\frac\{{({_DECIMAL})\}}\{{({_DECIMAL})\}}$", re.ASCII)
_SLASH_FRAC = re.compile(rf"^({_DECIMAL})/({_DECIMAL})$", re.ASCII)


def parse_number(s: str) -> Fraction | None:
    """Exact value of a normalised answer that is a plain number or a simple fraction, else None."""
    if not s or len(s) > MAX_NUMBER_CHARS:
        return None
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    try:
        if _NUMBER.match(s):
            return Fraction(s)
        m = _LATEX_FRAC.match(s)
        if m:
            value = Fraction(m.group(2)) / Fraction(m.group(3))
            return -value if m.group(1) else value
        m = _SLASH_FRAC.match(s)
        if m:
            return Fraction(m.group(1)) / Fraction(m.group(2))
    except (ValueError, ZeroDivisionError):
        return None
    return None


def answers_match(prediction: str, gold: str) -> bool:
    if len(prediction) > MAX_ANSWER_CHARS:
        return False
    p, g = normalize_answer(prediction), normalize_answer(gold)
    if p == g:
        return bool(p)  # two empty answers are not a match
    a, b = parse_number(p), parse_number(g)
    return a is not None and b is not None and abs(a - b) <= TOLERANCE


# ---- the task ---------------------------------------------------------------------------------------------------
def hub_row_to_example(row: dict[str, Any], index: int) -> Example:
    """Map a MATH-style hub row (`problem` plus `answer`, or only `solution` as in hendrycks_math mirrors)."""
    answer = row.get("answer")
    if not answer:
        answer = last_boxed(row.get("solution") or "") or ""
    return {"id": row.get("unique_id") or f"hf/{index}", "problem": row["problem"], "answer": answer,
            "subject": row.get("subject") or row.get("type"), "level": row.get("level")}


def _bundled_example(row: dict[str, Any]) -> Example:
    return {"id": row["unique_id"], "problem": row["problem"], "answer": row["answer"],
            "subject": row["subject"], "level": row["level"]}


@dataclass
class MathTask(Task):
    name: str = "math"
    splits: tuple[str, ...] = ("train", "test", "train_pool")
    system_prompt: str = SYSTEM_PROMPT
    #: hub dataset for the requested split (its "test" or "train"), e.g. "HuggingFaceH4/MATH-500" for test
    hf_dataset: str | None = None
    _cache: dict[str, list[Example]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def _test_problems(self) -> set[str]:
        # Always the bundled MATH-500: train rows equal to a test problem are dropped whatever the source.
        return {r["problem"] for r in bundled("math_test.jsonl.gz")}

    def _source(self, which: str) -> list[Example]:
        if which not in self._cache:
            if self.hf_dataset:
                rows = [hub_row_to_example(r, i) for i, r in enumerate(load_hub_rows(self.hf_dataset, which))]
            else:
                rows = [_bundled_example(r) for r in bundled(f"math_{which}.jsonl.gz")]
            if which == "train":
                test = self._test_problems()
                rows = [r for r in rows if r["problem"] not in test]
            self._cache[which] = rows
        return self._cache[which]

    def _load(self, split: str) -> list[Example]:
        if split == "test":
            rows = self._source("test")
        elif split == "train_pool":
            rows = self._source("train")
        else:
            rows = seeded_sample(self._source("train"), TRAIN_SIZE)
        return [dict(r) for r in rows]

    def prompt(self, example: Example) -> Messages:
        return chat(self.system_prompt, example["problem"])

    def score(self, completion: str, example: Example) -> float:
        try:
            pred = last_boxed(completion)
            return 1.0 if pred is not None and answers_match(pred, str(example["answer"])) else 0.0
        except Exception:  # never let a strange completion or example crash training
            return 0.0

    def is_well_formed(self, completion: str, example: Example) -> bool:
        pred = last_boxed(completion)
        return pred is not None and bool(pred.strip())

    def details(self, completion: str, example: Example) -> dict[str, Any]:
        pred = last_boxed(completion)
        out: dict[str, Any] = {"extracted": pred if pred is None or len(pred) <= 200 else pred[:200] + "..."}
        if pred is not None and len(pred) <= MAX_ANSWER_CHARS:
            try:
                out["normalized"] = normalize_answer(pred)
                out["gold_normalized"] = normalize_answer(str(example["answer"]))
            except Exception:  # pragma: no cover - defensive
                pass
        return out
