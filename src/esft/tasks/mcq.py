"""Four-choice multiple-choice tasks: SciKnowEval Chemistry (trained) and MMLU (holdout).

Both ask for the JSON answer `{"answer": "X"}` and share one letter-extraction cascade (paper Table 19):

1. JSON style  `"answer": "X"`             (key case-insensitive; single quotes as in a Python dict too; a missing
                                           quote around the value is tolerated, as by the paper's code)
2. unquoted    `answer: X`                 (also `**Answer:** X`, `Answer: (X)`, `Answer: $\\boxed{X}$`)
3. the last standalone A/B/C/D token

The first level that matches decides, and within it the *last* match wins. Only capital letters count, so the
article "a" is never an answer. A *standalone* token is a capital A-D not glued to a letter, digit or a technical
joiner (`-`, `=`, `+`, `#`, `/`, `\\`, `_`, `^`, `&`, `@`, `~`, and the unit and formula signs `°`, `µ`, `μ`,
superscript and subscript digits and letters), and not followed by an apostrophe and a letter: so `C-H`, `C=O`,
`D-glucose`, `A/B`, `A's`, `H2O`, `C₆H₆`, `¹³C`, `25 °C` contribute nothing, while `(B)`, `B.`, `**C**`, `"D"` do.

The capital article. "A dog is ..." at the start of a sentence would otherwise be read as answer A and, being
last, override an earlier real answer ("... so B. A good check is ..."). Level 3 therefore skips an "A" that
starts a sentence (text start, or after `.`, `!`, `?` or a newline, ignoring spaces and markdown `*#>-`; only the
16 characters before it are examined) and is followed by one space and a lower-case word or a digit, unless that word
is a verb that shows A is being named ("A is correct", "A was", "A would", "A seems", "A appears"). A mid-sentence
capital "A" is always a candidate.

Boxed and hedged answers follow the same cascade, as the paper's protocol specifies ("use the last match found";
it has no `\\boxed{}` level and no notion of a hedge; its public implementation does the same): `\\boxed{B}` then
"C is wrong" reads C, "A or B" reads B (level 3), "Answer: A or B" reads A (level 2). Kept on purpose: the
study's Chemistry and MMLU accuracies are defined by this cascade, and neither case pays a model to hedge, since
a reply always yields one letter (a hedge over two options scores as one of them). The stated format, JSON, is
read first.

The score uses the whole cascade. The format bonus (`is_well_formed`) asks for the format the system prompt states:
the reply's last non-blank line is `{"answer": "X"}` (a closing code fence may follow it).
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
# Every pattern below is linear in the text: no two adjacent quantifiers can match the same characters, so a run of
# spaces after "Answer:" is consumed once instead of being split every possible way (quadratic backtracking).
# Superscript and subscript digits and letters, the degree sign and the micro sign glue a letter into a formula or
# unit as ASCII digits and letters do: the C of "C₆H₆", "¹³C" or "25 °C" is no more an answer than that of "C6H6".
_GLUE = r"\u00b0\u00b5\u03bc\u00b2\u00b3\u00b9\u2070-\u209f"
_JOINERS = rf"A-Za-z0-9_\-=+#/\\^&@~{_GLUE}"
# JSON or a Python dict; the value's quotes may be missing, as in the paper's reference regex (`"answer": B`)
_JSON_ANSWER = re.compile(
    rf"""["'](?i:answer)["']\s*+:\s*+(?:["']\s*+)?([A-D])(?:\s*+["']|(?![{_JOINERS}]))""")
# `answer: X`, also as a markdown, quoted or dict key, with X in brackets, quotes or math (`$\boxed{B}$`)
_PLAIN_ANSWER = re.compile(
    r"\b(?i:answer)[\"'*_\s]*:[*_\s$]*(?:\\(?:boxed|text|textbf|mathbf|mathrm)\s*\{\s*){0,2}"
    rf"(?:[(\[\"']\s*)?([A-D])(?![A-Za-z0-9{_GLUE}])")
_NAMING_VERBS = ("is", "was", "would", "seems", "appears")
_MARKUP = r" \t*#>\-"      # skipped when looking back for the start of a sentence
_SENTENCE_END = r".!?\n"
_LOOK_BACK = 16            # characters examined before a candidate "A" (keeps the check O(1))


def _not_sentence_initial() -> str:
    """Look-behind, placed right after an "A": within the `_LOOK_BACK` characters before it, the last character
    that is not markup exists and does not end a sentence. One fixed-width look-behind per markup run length."""
    other = f"[^{_MARKUP}{_SENTENCE_END}]"
    return "(?:" + "|".join(f"(?<={other}[{_MARKUP}]{{{k}}}A)" for k in range(_LOOK_BACK)) + ")"


# A standalone capital A-D that is not the article: B, C or D; or an A not followed by a lower-case word or a
# digit ("A.", "A)"); or an A followed by a naming verb ("A is correct"); or an A in mid-sentence ("Choose A dog").
_CANDIDATE = (
    rf"(?<![{_JOINERS}])([A-D])(?![{_JOINERS}])(?!['’][A-Za-z])"
    rf"(?:(?<!A)|(?![*_]* [a-z0-9])|(?=[*_]* (?:{'|'.join(_NAMING_VERBS)})(?![a-z]))|{_not_sentence_initial()})"
)
# The greedy `.*` runs to the end and backs off one character at a time, so `match` finds the *last* candidate
# after looking only at the text behind it (one pass, from the end).
_LAST_CANDIDATE = re.compile(r"(?s:.*)" + _CANDIDATE)

# The stated answer format (the system prompt): the last line of the reply is the JSON object `{"answer": "X"}`.
_STATED_FORMAT = re.compile(r"""[ \t]*\{[ \t]*"answer"[ \t]*:[ \t]*"([A-D])"[ \t]*\}[ \t]*""")
_CODE_FENCE = "```"


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


def _last_standalone(text: str) -> str | None:
    """Last standalone letter that is not a sentence-initial article (see the module docstring)."""
    m = _LAST_CANDIDATE.match(text)
    return None if m is None else m.group(1)


def stated_format_letter(text: str) -> str | None:
    """The letter of a reply whose last non-blank line is `{"answer": "X"}` (a closing code fence after it is
    allowed), else None. Such a letter is also what the cascade extracts: it is the last level-1 match."""
    if not isinstance(text, str):
        return None
    body = text.rstrip()
    if body.endswith(_CODE_FENCE):
        head = body[: -len(_CODE_FENCE)].rstrip(" \t")
        if head.endswith("\n"):  # the fence closes a code block the JSON line sits in
            body = head.rstrip()
    m = _STATED_FORMAT.fullmatch(body, body.rfind("\n") + 1)
    return None if m is None else m.group(1)


def gold_letter(example: Example) -> str:
    """The example's answer letter; a missing or invalid one is a data bug and raises (KeyError / ValueError)."""
    gold = example["answer"]
    if not isinstance(gold, str) or gold not in LETTERS:
        raise ValueError(f"malformed example: answer {gold!r} is not one of A, B, C, D")
    return gold


# A few SciKnowEval records (5 of 6,263) carry labels inside their option texts, shuffled against the positions
# the gold letter names: position A holds "B. Achiral", position B "A. Chiral" (gold B). Shown as "A. B. Achiral"
# the prompt would name two letters per option, the wrong one first, so such labels are dropped from the prompt.
_OWN_LABEL = re.compile(r"\(?([A-D])[.)]\s+")


def strip_own_labels(choices: list[str]) -> list[str]:
    """The option texts without a leading label, where each of the four carries one and together they are A-D
    in some order; otherwise unchanged (an MMLU option "(A) and (C)" is content, not a label)."""
    found = [_OWN_LABEL.match(text) for text in choices]
    if len(choices) != len(LETTERS) or not all(found) or sorted(m.group(1) for m in found) != list(LETTERS):
        return list(choices)
    return [text[m.end():] for text, m in zip(choices, found)]


def format_choices(choices: list[str]) -> str:
    """The options as the gold letter reads them: "A. <first>" to "D. <fourth>"."""
    return "\n".join(f"{letter}. {text}" for letter, text in zip(LETTERS, strip_own_labels(choices)))


# ---- shared task behaviour ----------------------------------------------------------------------------------
@dataclass
class _MCQTask(Task):
    system_prompt: str = SYSTEM_PROMPT
    hf_dataset: str | None = None
    _cache: dict[str, list[Example]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def score(self, completion: str, example: Example) -> float:
        gold = gold_letter(example)  # checked first, so a data bug raises whatever the completion
        return 1.0 if extract_letter(completion)[0] == gold else 0.0

    def is_well_formed(self, completion: str, example: Example) -> bool:
        """True when the reply ends in the answer format the system prompt states (`{"answer": "X"}` on its own
        last line). The score's cascade is more lenient (paper Table 19); the format bonus rewards the format."""
        return stated_format_letter(completion) is not None

    def details(self, completion: str, example: Example) -> dict[str, Any]:
        letter, level = extract_letter(completion)
        return {"extracted": letter, "extraction_level": level}

    def _cached(self, key: str, build) -> list[Example]:
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]


def question_key(example: Example) -> tuple[str, tuple[str, ...]]:
    """A question and its options as one key, case and runs of whitespace aside: two rows with equal keys ask the
    same question (MMLU's val split repeats 28 test rows so)."""
    def norm(text: Any) -> str:
        return " ".join(str(text).split()).lower()

    return norm(example["question"]), tuple(norm(c) for c in example["choices"])


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
    if isinstance(answer, str) and answer in LETTERS:
        letter = answer
    else:
        option = int(answer)
        if not 0 <= option < len(LETTERS):  # -1 (a hub's "no label") would otherwise index D
            raise ValueError(f"MMLU row {index}: answer {answer!r} is not an option index 0-3 or a letter A-D")
        letter = LETTERS[option]
    return {"id": f"hf/{row.get('subject', '')}/{index}", "subject": row.get("subject", ""),
            "question": row["question"], "choices": list(row["choices"]), "answer": letter}


@dataclass
class MMLUTask(_MCQTask):
    """MMLU, zero-shot holdout. `test` = all 14,042 test questions, `train` = the val questions that are not also
    test questions: 1,503 of the 1,531 (28 val rows repeat a test row's question and options word for word,
    `question_key`), so that training on `train` never sees a question `test` scores.

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
            if split == "train":
                tested = {question_key(r) for r in self._load("test")}
                rows = [r for r in rows if question_key(r) not in tested]
            return seeded_shuffle(rows, SPLIT_SEED) if self.shuffle else rows

        return _copy(self._cached(split, build))

    def prompt(self, example: Example) -> Messages:
        subject = str(example.get("subject", "")).replace("_", " ")
        head = f"The following is a multiple-choice question about {subject}.\n\n" if subject else ""
        return chat(self.system_prompt, f"{head}{example['question']}\n\n{format_choices(example['choices'])}")
