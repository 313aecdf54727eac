"""BoolQ: yes/no questions about a Wikipedia passage.

Scoring (paper Table 19): the last `\\boxed{}`, stripped and lower-cased; yes/true/1 is a positive answer and
no/false/0 a negative one; anything else scores 0. Beyond the paper, a `\\text{...}`-style wrapper and
trailing punctuation inside the box are ignored (`\\boxed{\\text{Yes.}}` reads as yes), and so is markdown
emphasis around the answer (`\\boxed{**No**}` reads as no): they carry no different meaning and the small models
of this study produce them.

Prompt: the format is stated in the system prompt *and* at the end of the user turn: with the system prompt
alone a 135M model boxed 0 of 200 answers, which leaves ES with no signal. For the same
reason `aggregate` reports the boxed rate, accuracy among boxed answers, their yes share and the majority baseline.

Splits: only the official dev set (3,270) is available, so `test` = dev[:2000] and `train` = 200 drawn by
`random.Random(42)` from dev[2000:] (no overlap); `train_pool` = dev[2000:] (1,270). With `hf_dataset`
(e.g. "google/boolq") `test` = validation[:2000] and `train`/`train_pool` come from the real train split.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from esft.tasks.base import Example, Messages, Task, chat, last_boxed
from esft.tasks.common import TEST_SIZE, TRAIN_SIZE, bundled, load_hub_rows, seeded_sample

POSITIVE = frozenset({"yes", "true", "1"})
NEGATIVE = frozenset({"no", "false", "0"})

FORMAT_INSTRUCTION = "Answer with \\boxed{yes} or \\boxed{no}."
SYSTEM_PROMPT = (
    "Read the passage and answer the question about it with yes or no. You may reason briefly, then give "
    "the final answer as \\boxed{yes} or \\boxed{no}."
)

_WRAPPER = re.compile(r"^\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox)\s*\{(?P<inner>.*)\}$", re.DOTALL)
#: Markdown emphasis around the whole answer: **yes**, *no*, __yes__, _no_ (also nested, ***yes***)
_EMPHASIS = re.compile(r"^(\*\*|__|\*|_)(?P<inner>.*)\1$", re.DOTALL)


def parse_yes_no(boxed: str | None) -> bool | None:
    """True / False for a recognised boxed answer, None otherwise."""
    if boxed is None or len(boxed) > 100:  # a real answer is one word; skip the work on junk
        return None
    s = boxed
    for _ in range(4):  # a wrapper or emphasis, possibly one inside the other: \text{**Yes**}, **\text{No}**
        s = s.strip().rstrip(".!").strip()  # the full stop may follow the wrapper: \text{Yes}.
        m = _WRAPPER.match(s) or _EMPHASIS.match(s)
        if m is None:
            break
        s = m.group("inner")
    s = s.strip().rstrip(".!").strip().lower()
    if s in POSITIVE:
        return True
    if s in NEGATIVE:
        return False
    return None


def gold_label(answer: Any) -> bool | None:
    """The gold label as a bool (also from 0/1 or a "yes"/"no"/"true"/"false" string, e.g. a CSV column);
    None when `answer` is none of these."""
    if isinstance(answer, str):
        return parse_yes_no(answer)
    return bool(answer) if answer in (True, False) else None  # True, False, 1, 0 (also numpy's)


def example_label(example: Example) -> bool:
    """The example's gold label; a missing or unreadable answer is a data bug and raises (KeyError / ValueError)."""
    label = gold_label(example["answer"])
    if label is None:
        raise ValueError(f"malformed BoolQ example: answer {example['answer']!r} is not yes/no")
    return label


def truncate_passage(passage: str, max_chars: int | None) -> str:
    """At most `max_chars` characters of the passage, cut at a word boundary, with " ..." marking the cut."""
    if max_chars is None or len(passage) <= max_chars:
        return passage
    cut = passage[:max_chars]
    space = cut.rfind(" ")
    if space > 0:
        cut = cut[:space]
    return cut.rstrip() + " ..."


def hub_row_to_example(row: dict[str, Any], index: int) -> Example:
    """Map a `google/boolq` row (`question`, `answer` bool, `passage`, no title); an answer given as text
    ("False", "no") or 0/1 is read as `gold_label` reads it (bool("False") would be True), any other raises."""
    answer = gold_label(row["answer"])
    if answer is None:
        raise ValueError(f"BoolQ row {index}: answer {row['answer']!r} is not yes/no")
    return {"id": f"hf/{index}", "question": row["question"], "title": row.get("title", ""),
            "passage": row["passage"], "answer": answer}


@dataclass
class BoolQTask(Task):
    name: str = "boolq"
    splits: tuple[str, ...] = ("train", "test", "train_pool")
    system_prompt: str = SYSTEM_PROMPT
    hf_dataset: str | None = None
    #: cut passages to this many characters (word boundary) to shorten prompts on CPU; None = full passage
    max_passage_chars: int | None = None
    _cache: dict[str, list[Example]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_passage_chars is not None and self.max_passage_chars < 1:
            raise ValueError(f"max_passage_chars must be >= 1 or None, got {self.max_passage_chars}")

    def _pools(self) -> tuple[list[Example], list[Example]]:
        """(test source, train pool)."""
        if "test" not in self._cache:
            if self.hf_dataset:
                val = load_hub_rows(self.hf_dataset, "validation")
                train = load_hub_rows(self.hf_dataset, "train")
                self._cache["test"] = [hub_row_to_example(r, i) for i, r in enumerate(val)][:TEST_SIZE]
                self._cache["pool"] = [hub_row_to_example(r, i) for i, r in enumerate(train)]
            else:
                dev = [dict(r) for r in bundled("boolq_dev.jsonl.gz")]
                self._cache["test"], self._cache["pool"] = dev[:TEST_SIZE], dev[TEST_SIZE:]
        return self._cache["test"], self._cache["pool"]

    def _load(self, split: str) -> list[Example]:
        test, pool = self._pools()
        rows = test if split == "test" else pool if split == "train_pool" else seeded_sample(pool, TRAIN_SIZE)
        return [dict(r) for r in rows]

    def prompt(self, example: Example) -> Messages:
        passage = truncate_passage(example["passage"], self.max_passage_chars)
        question = example["question"].strip()
        question = question[:1].upper() + question[1:]
        if not question.endswith("?"):
            question += "?"  # BoolQ questions are stored lower-case without a question mark
        title = f"Title: {example['title']}\n" if example.get("title") else ""
        user = f"{title}Passage: {passage}\n\nQuestion: {question}\n\n{FORMAT_INSTRUCTION}"
        return chat(self.system_prompt, user)

    def score(self, completion: str, example: Example) -> float:
        gold = example_label(example)  # checked first, so a data bug raises whatever the completion
        return 1.0 if parse_yes_no(last_boxed(completion)) is gold else 0.0

    def is_well_formed(self, completion: str, example: Example) -> bool:
        return parse_yes_no(last_boxed(completion)) is not None

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Accuracy plus what it takes to read it (docs/results/es-cpu-demo): the rate of recognised boxed answers,
        accuracy among them, the share of "yes" among them (a yes-bias shows here) and the majority-class
        baseline of the evaluated examples (needs `extracted` from `details` and `example` in each record)."""
        out = super().aggregate(records)
        answered = [r for r in records if r.get("extracted") in ("yes", "no")]
        out["boxed_rate"] = len(answered) / len(records) if records else 0.0
        out["accuracy_among_boxed"] = sum(r["score"] for r in answered) / len(answered) if answered else None
        out["yes_rate_among_boxed"] = (sum(r["extracted"] == "yes" for r in answered) / len(answered)
                                       if answered else None)
        golds = [gold_label((r.get("example") or {}).get("answer")) for r in records]
        if records and all(g is not None for g in golds):
            yes = sum(golds) / len(golds)
            out["majority_baseline"] = max(yes, 1 - yes)
        return out

    def details(self, completion: str, example: Example) -> dict[str, Any]:
        boxed = last_boxed(completion)
        pred = parse_yes_no(boxed)
        return {"extracted": None if pred is None else ("yes" if pred else "no"),
                "boxed": boxed if boxed is None or len(boxed) <= 100 else boxed[:100] + "..."}
