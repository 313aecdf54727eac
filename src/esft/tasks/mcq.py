"""Four-choice multiple-choice tasks: SciKnowEval Chemistry (trained) and MMLU (holdout).

Both ask for the JSON answer `{"answer": "X"}` and share one letter-extraction cascade (paper Table 19):

1. JSON style  `"answer": "X"`             (key case-insensitive; single quotes as in a Python dict too)
2. unquoted    `answer: X`                 (also `**Answer:** X`, `Answer: (X)`)
3. the last standalone A/B/C/D token

The first level that matches decides, and within it the *last* match wins. Only capital letters count, so the
article "a" is never an answer. A *standalone* token is a capital A-D not glued to a letter, digit or a technical
joiner (`-`, `=`, `+`, `#`, `/`, `\\`, `_`, `^`, `&`, `@`, `~`), and not followed by an apostrophe and a letter: so
`C-H`, `C=O`, `D-glucose`, `A/B`, `A's`, `H2O` contribute nothing, while `(B)`, `B.`, `**C**`, `"D"` do.

The capital article. "A dog is ..." at the start of a sentence would otherwise be read as answer A and, being
last, override an earlier real answer ("... so B. A good check is ..."). Level 3 therefore skips an "A" that
starts a sentence (text start, or after `.`, `!`, `?` or a newline, ignoring spaces and markdown `*#>-`) and is
followed by one space and a lower-case word or a digit, unless that word is a verb that shows A is being named ("A is
correct", "A was", "A would", "A seems", "A appears"). A mid-sentence capital "A" is always a candidate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from esft.tasks.base import Example, Messages, Task, chat
from esft.tasks.common import (
    SPLIT_SEED, TEST_SIZE, TRAIN_SIZE, bundled, load_hub_rows, seeded_shuffle,
)

LETTERS = ("A", "B", "C", "D")

SYSTEM_PROMPT = (
    "Answer the multiple-choice question. Exactly one of the options A, B, C, D is correct. You may reason "
    "briefly, then end your reply with the answer as JSON on its own line: {\"answer\": \"X\"}, where X is the "
    "letter A, B, C or D."
)

# ---- letter extraction ------------------------------------------------------------------------------------------
_JSON_ANSWER = re.compile(r"""["'](?i:answer)["']\s*:\s*["']\s*([A-D])\s*["']""")  # JSON or a Python dict
_PLAIN_ANSWER = re.compile(r"\b(?i:answer)[*_\s]*:[*_\s]*[(\[\"']?\s*([A-D])(?![A-Za-z0-9])")
_JOINERS = r"A-Za-z0-9_\-=+#/\\^&@~"
_STANDALONE = re.compile(rf"(?<![{_JOINERS}])([A-D])(?![{_JOINERS}])(?!['’][A-Za-z])")
_NEXT_WORD = re.compile(r"[*_]* ([a-z]+|[0-9])")  # "A dog", "**A** dog", "A 60-year-old man"
_NAMING_VERBS = frozenset({"is", "was", "would", "seems", "appears"})


def _is_sentence_initial_article(text: str, start: int, end: int) -> bool:
    """True for a capital "A" used as the article at a sentence start (see the module docstring)."""
    if text[start] != "A":
        return False
    m = _NEXT_WORD.match(text, end)
    if m is None or m.group(1) in _NAMING_VERBS:
        return False
    before = text[max(0, start - 16) : start].rstrip(" \t*#>-")  # bounded look-back keeps this O(1)
    return before == "" or before[-1] in ".!?\n"


def extract_letter(text: str) -> tuple[str | None, int | None]:
    """(letter, cascade level 1-3) or (None, None). Never raises on a string."""
    if not isinstance(text, str):
        return None, None
    for level, pattern in ((1, _JSON_ANSWER), (2, _PLAIN_ANSWER)):
        last = None
        for m in pattern.finditer(text):
            last = m.group(1)
        if last is not None:
            return last, level
    letter = _last_standalone(text)
    return (letter, 3) if letter is not None else (None, None)


def _last_standalone(text: str, window: int = 4096) -> str | None:
    """Last standalone letter that is not a sentence-initial article, scanning windows from the end so a long
    completion full of candidates ("A A A ...") costs little. Window edges change nothing: with
    `finditer(text, pos, endpos)` the look-behind still sees the character before `pos`, and `endpos` is two
    characters past the window so the look-aheads of a letter at its last position see real text."""
    end = len(text)
    while end > 0:
        start = max(0, end - window)
        last = None
        for m in _STANDALONE.finditer(text, start, end + 2):
            if m.start() >= end:
                break
            if not _is_sentence_initial_article(text, m.start(1), m.end(1)):
                last = m.group(1)
        if last is not None:
            return last
        end = start
    return None


def format_choices(choices: list[str]) -> str:
    return "\n".join(f"{letter}. {text}" for letter, text in zip(LETTERS, choices))


# ---- shared task behaviour ----------------------------------------------------------------------------------
@dataclass
class _MCQTask(Task):
    system_prompt: str = SYSTEM_PROMPT
    hf_dataset: str | None = None
    _cache: dict[str, list[Example]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def score(self, completion: str, example: Example) -> float:
        try:
            letter, _ = extract_letter(completion)
            return 1.0 if letter is not None and letter == example["answer"] else 0.0
        except Exception:  # never let a strange completion or example crash training
            return 0.0

    def is_well_formed(self, completion: str, example: Example) -> bool:
        return extract_letter(completion)[0] is not None

    def details(self, completion: str, example: Example) -> dict[str, Any]:
        letter, level = extract_letter(completion)
        return {"extracted": letter, "extraction_level": level}

    def _cached(self, key: str, build) -> list[Example]:
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]


def _copy(rows: list[Example]) -> list[Example]:
    return [dict(r, choices=list(r["choices"])) for r in rows]


# ---- SciKnowEval Chemistry --------------------------------------------------------------------------------------
def chemistry_hub_row_to_example(row: dict[str, Any], index: int) -> Example | None:
    """Map a `hicai-zju/SciKnowEval` row; None unless it is a Chemistry `mcq-4-choices` record."""
    if row.get("domain") != "Chemistry" or row.get("type") != "mcq-4-choices":
        return None
    choices = row["choices"]
    texts = list(choices["text"]) if isinstance(choices, dict) else list(choices)
    labels = list(choices.get("label", LETTERS)) if isinstance(choices, dict) else list(LETTERS)
    if labels != list(LETTERS) or len(texts) != 4 or row.get("answerKey") not in LETTERS:
        return None
    details = row.get("details") or {}
    return {"id": f"hf/{index}", "question": row["question"], "choices": texts, "answer": row["answerKey"],
            "level": details.get("level"), "task": details.get("task"), "subtask": details.get("subtask")}


@dataclass
class ChemistryTask(_MCQTask):
    """SciKnowEval V2 Chemistry, the 6,263 `mcq-4-choices` records, shuffled once by `random.Random(42)`
    (the Bhoy1/ESvsGRPO recipe): `train` = first 200, `test` = next 2,000, `train_pool` = every record not in
    `test` (4,263, starting with the 200 of `train`). With `hf_dataset` (e.g. "hicai-zju/SciKnowEval:v2") the
    pool is the hub's v2 test split filtered the same way, in hub order."""

    name: str = "chemistry"
    splits: tuple[str, ...] = ("train", "test", "train_pool")

    def _shuffled(self) -> list[Example]:
        def build() -> list[Example]:
            if self.hf_dataset:
                rows = [chemistry_hub_row_to_example(r, i)
                        for i, r in enumerate(load_hub_rows(self.hf_dataset, "test", default_config="v2"))]
                pool = [r for r in rows if r is not None]
            else:
                pool = [dict(r) for r in bundled("chemistry_mcq.jsonl.gz")]
            return seeded_shuffle(pool, SPLIT_SEED)

        return self._cached("shuffled", build)

    def _load(self, split: str) -> list[Example]:
        rows = self._shuffled()
        if split == "train":
            out = rows[:TRAIN_SIZE]
        elif split == "test":
            out = rows[TRAIN_SIZE : TRAIN_SIZE + TEST_SIZE]
        else:
            out = rows[:TRAIN_SIZE] + rows[TRAIN_SIZE + TEST_SIZE :]
        return _copy(out)

    def prompt(self, example: Example) -> Messages:
        return chat(self.system_prompt, f"{example['question']}\n\n{format_choices(example['choices'])}")


# ---- MMLU ---------------------------------------------------------------------------------------------------
def mmlu_hub_row_to_example(row: dict[str, Any], index: int) -> Example:
    """Map a `cais/mmlu` row (`question`, `subject`, `choices` [4], `answer` index 0-3 or a letter)."""
    answer = row["answer"]
    letter = LETTERS[int(answer)] if not (isinstance(answer, str) and answer in LETTERS) else answer
    return {"id": f"hf/{row.get('subject', '')}/{index}", "subject": row.get("subject", ""),
            "question": row["question"], "choices": list(row["choices"]), "answer": letter}


@dataclass
class MMLUTask(_MCQTask):
    """MMLU, zero-shot holdout. `test` = all 14,042 test questions, `train` = the 1,531 val questions.

    Order: by default each split is shuffled once by `random.Random(42)` (from filename-then-row order), so
    `limit=N` gives a mixed-subject sample instead of the first subjects alphabetically (the first 200 rows
    in file order are all abstract algebra and anatomy). `shuffle=False` keeps filename-then-row order.
    Full-split accuracy is the same either way.
    """

    name: str = "mmlu"
    splits: tuple[str, ...] = ("train", "test")
    shuffle: bool = True

    def _load(self, split: str) -> list[Example]:
        def build() -> list[Example]:
            if self.hf_dataset:
                hub_split = "test" if split == "test" else "validation"
                rows = [mmlu_hub_row_to_example(r, i)
                        for i, r in enumerate(load_hub_rows(self.hf_dataset, hub_split, default_config="all"))]
            else:
                rows = [dict(r) for r in bundled("mmlu_test.jsonl.gz" if split == "test" else "mmlu_val.jsonl.gz")]
            return seeded_shuffle(rows, SPLIT_SEED) if self.shuffle else rows

        return _copy(self._cached(split, build))

    def prompt(self, example: Example) -> Messages:
        subject = str(example.get("subject", "")).replace("_", " ")
        head = f"The following is a multiple-choice question about {subject}.\n\n" if subject else ""
        return chat(self.system_prompt, f"{head}{example['question']}\n\n{format_choices(example['choices'])}")
