"""MATH (Hendrycks et al.): competition problems with a `\\boxed{}` final answer.

Scoring (paper Table 19): take the last `\\boxed{}` (nested braces handled), normalise prediction and gold the
same way (LaTeX wrappers, spacing, currency, degrees, percent, units, trailing period), compare the strings, and
on a mismatch compare them as numbers (integers, decimals, `\\frac{a}{b}`, `a/b`, thousands separators, a leading
`+`):
equal, or less than 1e-6 apart (the paper's "tolerance < 1e-6"), relative to the gold when it is below 1 in size
(a gold 0 needs an exact 0). A unit is dropped only
where it is one: a trailing `\\text{ cm}` / `\\mbox{ inches}^2` after a quantity (`strip_unit`); other wrappers
keep their content (`\\text{Evelyn}` -> `Evelyn`), and the joining words of a list of answers read as commas
(`-2 \\text{ or } -12` = `-2, -12`), so a hedged `5 \\text{ or } 7` does not match 5.
Normalisation uses only linear-time regexes and one brace scan per wrapper; boxed answers longer than
`MAX_ANSWER_CHARS` (gold answers are at most 159 characters) score 0 without being normalised, so junk cannot make
the scorer slow.

Splits: `test` = MATH-500 (500); `train` = 200 problems drawn by `random.Random(42)` from the 7,500 MATH
train problems (both bundled parts, none of which is a MATH-500 problem); `train_pool` = all 7,500 but the two
whose solution boxes nothing (number_theory 7115 and 7117: no reply could score on them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from esft.tasks.base import Example, Messages, Task, chat, extracted_fields, last_boxed
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
_UNIT_OPEN = re.compile(r"\\(?:text|mbox)\s*\{")
# After a unit's closing brace only an exponent (`cm}^2`) and a full stop may follow.
_UNIT_TAIL = re.compile(r"\}\s*(?:\^\s*(?:\{\s*\d\s*\}|\d))?\s*\.?\s*")
_UNIT_WORDS = re.compile(r"\s*[A-Za-z][A-Za-z.]*(?:\s+[A-Za-z][A-Za-z.]*)*\s*")  # "cm", " square units", " p.m."
#: Words that join answers ("5 or 7", "2, 3, and 4"): never a unit, and read as a list separator.
_JOINING_WORDS = frozenset({"and", "or"})
_JOINER = re.compile(r",? (?:and|or) ")  # applied once runs of whitespace are single spaces
_NUMBER_END = re.compile(r"(?:\d|\}|\)|\\pi)$")  # what a quantity with a unit ends with: 5, \frac{1}{2}, 2\pi
_SPACING = re.compile(r"\\\\|\\[,;:! ]|\\q?quad(?![A-Za-z])|~")  # `\\` (a row break) is matched to keep it
_TRAILING_SPACING = ("\\,", "\\;", "\\:", "\\!", "\\ ", "\\", "~", "\\quad", "\\qquad")
_LEFT_RIGHT = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)(?![A-Za-z])")
_DEGREES = re.compile(r"\^\s*(?:\{\s*\\circ\s*\}|\\circ)|°|\\degree(?![A-Za-z])")  # a brace only as a pair: {30^\circ}
_FRAC_DIGITS = re.compile(r"\\frac(\d)(\d)")
_FRAC_DIGIT_BRACE = re.compile(r"\\frac(\d)\{")
_FRAC_BRACE_DIGIT = re.compile(r"\\frac\{((?:[^{}]|\{[^{}]*\})*)\}(\d)")  # one level of nesting: \frac{\sqrt{3}}2
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


def strip_unit(answer: str) -> str:
    """`answer` without a trailing unit: `\\text{...}` or `\\mbox{...}` holding only words (an exponent and a
    full stop may follow), after a quantity ending in a digit, `}`, `)` or `\\pi`, and set off by a space (inside
    the braces or before the wrapper) unless the unit has two letters or more. So `15\\mbox{ cm}^2` -> `15`,
    `12\\sqrt{13}\\text{ feet}` -> `12\\sqrt{13}`, `1.85\\ \\text{USD}` -> `1.85`, while `2\\text{ and }3`,
    `5 \\text{ or more}`, `5\\text{i}`, `\\text{(A)}` and `\\text{ east}` are left alone (the Hendrycks MATH
    normalisation cut at the first `\\text{ ` instead, which dropped everything after a joining word)."""
    last = None
    for last in _UNIT_OPEN.finditer(answer):
        pass
    if last is None:
        return answer
    close = answer.find("}", last.end())
    unit = answer[last.end() : close]
    if close < 0 or not _UNIT_TAIL.fullmatch(answer, close) or not _UNIT_WORDS.fullmatch(unit):
        return answer
    if any(word.lower().strip(".") in _JOINING_WORDS for word in unit.split()):
        return answer
    before = answer[: last.start()]
    value = before.rstrip()
    while value.endswith(_TRAILING_SPACING):
        value = value[: -len(next(t for t in _TRAILING_SPACING if value.endswith(t)))].rstrip()
    spaced = unit[:1].isspace() or value != before
    if not _NUMBER_END.search(value) or not (spaced or sum(c.isalpha() for c in unit) >= 2):
        return answer
    return value


def normalize_answer(answer: str) -> str:
    """Canonical string form of a MATH answer (applied to prediction and gold alike)."""
    s = answer.strip()
    if s.endswith("\\") and len(s) < len(answer.lstrip()):  # `5\ `: the space was a control space's, not padding
        s += " "
    s = s.replace("\n", " ").replace("\\displaystyle", "")
    s = strip_unit(s)
    s = _unwrap(s)
    s = _SPACING.sub(lambda m: m.group(0) if m.group(0) == "\\\\" else " ", s)
    s = _LEFT_RIGHT.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _DEGREES.sub("", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "").replace("{,}", ",")
    s = _JOINER.sub(",", re.sub(r"\s+", " ", s))  # "-2 or -12", "6, 8, and 10": lists
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
    if s[0] == "+":  # an explicit sign: "+5" is the number 5; "+-5" and a lone "+" are not numbers
        s = s[1:]
        if s[:1] in ("", "+", "-"):
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
    # Relative below 1: a flat 1e-6 would let \\frac{1}{23427} match a gold \\frac{1}{23426}.
    return a is not None and b is not None and (a == b or abs(a - b) < TOLERANCE * min(1, abs(b)))


def canonical_answer(answer: str) -> str:
    """The form `answers_match` compares an answer in, a number's as a fraction ("0.5", "1/2", "\\frac12" and
    "x=\\dfrac{1}{2}" are all "1/2"): answers with one canonical form match each other (answers within the
    tolerance of one another may still have two)."""
    text = normalize_answer(answer)
    number = parse_number(text)
    return text if number is None else str(number)


def gold_answer(example: Example) -> str:
    """The example's gold answer as text (a number is written out); a missing one or one of another type is a
    data bug and raises (KeyError / TypeError)."""
    gold = example["answer"]
    if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
        raise TypeError(f"malformed MATH example: answer must be text, got {gold!r}")
    return gold if isinstance(gold, str) else str(gold)


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
        elif split == "train_pool":  # without problems whose solution boxes nothing (2 in MATH): no reply scores
            rows = [r for r in self._source("train") if str(r["answer"]).strip()]
        else:
            rows = seeded_sample(self._source("train"), TRAIN_SIZE)
        return [dict(r) for r in rows]

    def prompt(self, example: Example) -> Messages:
        return chat(self.system_prompt, example["problem"])

    def gold_key(self, example: Example) -> Any:
        """The gold answer in the form the scorer compares it (`canonical_answer`): "5" and "x=5", or "0.5" and
        "\\frac{1}{2}", are one constant answer, which scores on both. A gold with no canonical form ("\\$") keeps
        its text, as the data tasks' `math` verifier keeps it; None when it has no text."""
        answer = example.get("answer")
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            return None
        return canonical_answer(str(answer)) or str(answer).strip() or None

    def score(self, completion: str, example: Example) -> float:
        gold = gold_answer(example)  # checked first, so a data bug raises whatever the completion
        pred = last_boxed(completion)
        return 1.0 if pred is not None and answers_match(pred, gold) else 0.0

    def is_well_formed(self, completion: str, example: Example) -> bool:
        pred = last_boxed(completion)
        return pred is not None and bool(pred.strip())

    def details(self, completion: str, example: Example) -> dict[str, Any]:
        pred = last_boxed(completion)
        out: dict[str, Any] = extracted_fields(pred)
        if pred is not None and len(pred) <= MAX_ANSWER_CHARS:
            out["normalized"] = normalize_answer(pred)
            out["gold_normalized"] = normalize_answer(gold_answer(example))
            # maj@k's vote (esft.passk.answer_key): answers the scorer reads as one ("0.5", "\\frac12") vote as one
            out["vote_key"] = canonical_answer(pred) or None
        return out
