"""The task interface shared by training (ES, GRPO) and evaluation.

A task is data + a prompt format + a scorer. Following nanochat, the reward used for training *is* the
evaluation scorer: `score(completion, example)` returns 1.0 or 0.0 and is used unchanged by
`esft eval`, by the ES fitness and by the GRPO reward adapter.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from dataclasses import dataclass, fields
from importlib import resources
from typing import Any, Callable, ClassVar

from esft.tasks.labels import ACCURACY, constant_baseline, score_name, scores_interval, wilson_interval

Example = dict[str, Any]
Messages = list[dict[str, str]]


def read_bundled_jsonl(filename: str) -> list[Example]:
    """Read a gzip-compressed JSONL file shipped in `esft/data/`."""
    path = resources.files("esft.data").joinpath(filename)
    with path.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


#: Tasks whose gold answer is one of a few labels.
_LABEL_SETS: dict[str, tuple[str, ...]] = {
    "boolq": ("yes", "no"), "chemistry": ("A", "B", "C", "D"), "mmlu": ("A", "B", "C", "D"),
}


class UnknownTaskOption(ValueError):
    """An option a task does not take (built-in, data file or the user's class): the options' fault, not the task
    name's, so a command names the task_options that gave it (esft.validation.check_task)."""


@dataclass
class Task:
    """Base class. Subclasses set `name`, `splits`, `system_prompt` and implement `_load`, `prompt`, `score`."""

    name: str = ""
    #: split names this task provides, e.g. ("train", "test")
    splits: tuple[str, ...] = ("train", "test")
    #: system prompt that states the answer format (paper Table 19)
    system_prompt: str = ""

    def __post_init__(self) -> None:
        # A subclass without @dataclass that sets these as plain class attributes (`name = "sums"`) inherits this
        # __init__, which assigned Task's defaults over them: its name, splits and system prompt were lost unsaid.
        for f in fields(Task):
            declared = getattr(type(self), f.name, f.default)
            if getattr(self, f.name) == f.default and declared != f.default:
                setattr(self, f.name, declared)

    # ---- data -------------------------------------------------------------------------------------
    def load(self, split: str = "test", limit: int | None = None) -> list[Example]:
        """Deterministic split as a list of example dicts; `limit` keeps the first `limit` examples."""
        if split not in self.splits:
            raise ValueError(f"task {self.shown_name()!r} has no split {split!r}; available: "
                             f"{', '.join(self.splits)}")
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        rows = self._load(split)
        bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
        if bad is not None:  # prompt, score, the baseline and the evaluation files read an example's fields
            raise TypeError(f"task {self.shown_name()!r}: row {bad + 1} of split {split!r} is "
                            f"{type(rows[bad]).__name__} {str(rows[bad])[:40]!r}, not an example (a dict of fields)")
        return rows if limit is None else rows[:limit]

    def shown_name(self) -> str:
        """The task as its user named it, for messages: its name; a data task the file or dataset the user gave
        (`sums.jsonl`, where its name, which keys its result files, is `sums`)."""
        return self.name

    def _load(self, split: str) -> list[Example]:  # pragma: no cover - abstract
        raise NotImplementedError

    # ---- prompting and scoring ----------------------------------------------------------------------
    def prompt(self, example: Example) -> Messages:  # pragma: no cover - abstract
        """Chat messages (system prompt stating the answer format, then the user turn)."""
        raise NotImplementedError

    def score(self, completion: str, example: Example) -> float:  # pragma: no cover - abstract
        """1.0 if the completion is correct under the paper's protocol, else 0.0. Never raises on a completion,
        whatever its text; a malformed example (a data bug) raises KeyError, TypeError or ValueError."""
        raise NotImplementedError

    @property
    def checks_format(self) -> bool:
        """Whether `is_well_formed` checks an answer format: a task class that defines it does. False for a task
        scored by an opaque reward function (a data task's `reward: module:function`, a task object or class
        without `is_well_formed`): it then has no format rate, and a format bonus adds nothing
        (`format_bonus_warning` says so before any model loads). A subclass may also set it to False."""
        return type(self).is_well_formed is not Task.is_well_formed

    def is_well_formed(self, completion: str, example: Example) -> bool:
        """True when the completion contains an answer in the required format (used by the format bonus);
        always False for a task that does not check a format (`checks_format`)."""
        return False

    def details(self, completion: str, example: Example) -> dict[str, Any]:
        """Extra per-example fields written next to the score in eval JSONL (e.g. the extracted answer)."""
        return {}

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Summary metrics from per-example records (each has at least `score`): the mean score under the key
        `accuracy` with its 95% CI, the format rate, and, for scores in [0, 1] only (`score_name`), the
        constant-answer baseline: a share of examples, which says nothing beside a mean reward of another scale."""
        n = len(records)
        scores = [float(r["score"]) for r in records]
        correct = sum(scores)
        lo, hi = scores_interval(scores)
        out: dict[str, Any] = {"n": n, "accuracy": correct / n if n else 0.0, "ci95": [lo, hi]}
        if records and "well_formed" in records[0]:
            out["format_rate"] = sum(bool(r["well_formed"]) for r in records) / n
        if score_name(scores) == ACCURACY:
            out.update(self.constant_baseline(records))
        return out

    # ---- gold labels: the constant-answer baseline and label balance ----------------------------------
    def gold_key(self, example: Example) -> Any:
        """The example's gold answer as a hashable key (None = unknown): what a constant answer must equal.

        Default: a bool `answer` is "yes"/"no", a string `answer` is stripped, a number is itself; without an
        `answer`, a `target` (Countdown). Tasks whose answers compare differently override this.
        """
        answer = example.get("answer", example.get("target"))
        if isinstance(answer, bool):
            return "yes" if answer else "no"
        if isinstance(answer, (int, float)):
            return answer
        if isinstance(answer, str):
            return answer.strip() or None
        return None

    def label_set(self) -> tuple[str, ...] | None:
        """The closed set of gold labels when the answer is one of a few labels (label-balanced subsets need
        one), else None."""
        return _LABEL_SETS.get(self.name)

    def answer_labels(self) -> tuple[str, ...] | None:
        """The label set when its labels are the answers themselves (yes/no, A-D), so that a guess among them can
        be right: the chance curve of pass@k (esft.passk.chance_pass_at_k) needs one. None when the task has no
        label set, or when it balances over something other than its gold answer (a Countdown variant's labels
        are operators, and no operator is an answer)."""
        return self.label_set() if type(self).balance_key is Task.balance_key else None

    def validate(self) -> None:
        """Check what can be checked before any model loads (a data task: its file, fields and reward); raise
        ValueError. Nothing by default: a built-in task's options are checked when it is built."""

    def why_empty(self, split: str) -> str:
        """Why `split` holds no examples, naming the options that would give it some, for the refusal before any
        model loads (esft.validation.check_splits); "" when there is nothing to add (the default)."""
        return ""

    def balance_key(self, example: Example) -> Any:
        """What a balanced evaluation subset balances over (one of `label_set()`): the gold label by default;
        a task whose prior is not a single answer balances over something else (a Countdown variant over the
        operator that reaches the target)."""
        return self.gold_key(example)

    @staticmethod
    def evaluated_examples(records: list[dict[str, Any]]) -> list[Example]:
        """The examples of evaluation records, each once (records of several samples of one question share its
        `index`)."""
        examples: dict[Any, Example] = {}
        for i, r in enumerate(records):
            if r.get("example") is not None:
                examples.setdefault(r.get("index", i), r["example"])
        return list(examples.values())

    #: True where the constant answer cannot score what `constant_baseline` counts, so that the baseline is an upper
    #: bound (Countdown: the most frequent target, boxed alone, uses none of the given numbers and scores 0); its
    #: summary then says so, `constant_baseline_bound: "at most"`, and `esft eval` prints "const at most"
    constant_baseline_is_bound: ClassVar[bool] = False

    def constant_baseline(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """`constant_baseline` (accuracy of always giving the most frequent gold answer of the evaluated
        examples), its `constant_baseline_ci95` and the `constant_answer`; empty when a gold answer is unknown.
        `constant_baseline_bound` "at most" where that answer cannot really score (`constant_baseline_is_bound`).

        Each example counts once (records of several samples of one question share its `index`)."""
        labels = [self.gold_key(ex) for ex in self.evaluated_examples(records)]
        if not labels or any(label is None for label in labels):
            return {}
        summary = constant_baseline(labels) or {}
        out = {k: summary[k] for k in ("constant_baseline", "constant_baseline_ci95", "constant_answer")}
        if self.constant_baseline_is_bound:
            out["constant_baseline_bound"] = "at most"
        return out

    # ---- TRL-style reward --------------------------------------------------------------------------
    def reward_function(self, format_bonus: float = 0.0) -> Callable[..., list[float]]:
        """A reward function with TRL's signature `f(completions, **kwargs) -> list[float]`.

        Example fields arrive as keyword lists (TRL passes every dataset column that way); they may also be
        passed as `examples=[...]`. Completions may be strings or TRL conversational lists of messages.
        `format_bonus` adds that amount for a well-formed answer (DART-ES / Qiu et al.); 0 = paper reward.
        """

        def reward(completions: list[Any], **kwargs: Any) -> list[float]:
            examples = kwargs.get("examples")
            if examples is None:
                examples = examples_from_kwargs(completions, kwargs)
            out = []
            for completion, example in zip(completions, examples):
                text = completion_text(completion)
                r = self.score(text, example)
                if format_bonus and self.checks_format and self.is_well_formed(text, example):
                    r += format_bonus
                out.append(float(r))
            return out

        reward.__name__ = f"{self.name}_reward"
        return reward


def examples_from_kwargs(completions: list[Any], kwargs: dict[str, Any]) -> list[Example]:
    """The examples of a TRL reward call: every keyword list as long as `completions` is a column."""
    keys = [k for k, v in kwargs.items() if isinstance(v, list) and len(v) == len(completions)]
    return [{k: kwargs[k][i] for k in keys} for i in range(len(completions))]


def completion_text(completion: Any) -> str:
    """Plain text of a completion given as a string or as a TRL conversational list of messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def chat(system: str, user: str) -> Messages:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), nested braces allowed; None when there is none or
    when the last one is never closed.

    "Last" means the box that opens last (for `\\boxed{\\boxed{x}}` that is the inner one). An unclosed last box
    (a completion cut off mid-answer) is no answer: falling back to an earlier closed box would score an answer the
    completion went on to replace. One linear scan from that box, so adversarial 1 MB completions stay fast.
    """
    if not isinstance(text, str) or "box" not in text:
        return None
    start = None
    for m in _BOX_OPEN.finditer(text):
        start = m.end()
    if start is None:
        return None
    depth = 1
    for k in range(start, len(text)):
        c = text[k]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:k]
    return None


#: Longest extracted answer a record holds whole; a longer one is cut there for display.
DISPLAY_ANSWER_CHARS = 200


def extracted_fields(answer: str | None) -> dict[str, Any]:
    """`{"extracted": answer}`, cut to DISPLAY_ANSWER_CHARS + "..." when longer so records stay small.

    A cut answer also gets `extracted_digest`, a hash of the whole answer with whitespace removed (None when it
    is blank): majority votes (esft.passk.answer_key) compare that, so two long answers that differ only past
    the cut do not count as one answer."""
    if answer is None or len(answer) <= DISPLAY_ANSWER_CHARS:
        return {"extracted": answer}
    return {"extracted": answer[:DISPLAY_ANSWER_CHARS] + "...", "extracted_digest": answer_digest(answer)}


def answer_digest(answer: str) -> str | None:
    """16 hex digits of the sha256 of `answer` with whitespace removed; None when it is blank."""
    squeezed = "".join(answer.split())
    return hashlib.sha256(squeezed.encode("utf-8")).hexdigest()[:16] if squeezed else None


def checks_format(task: Any) -> bool:
    """Whether `task` checks an answer format (`Task.checks_format`). The trainers wrap a task object that is not an
    esft Task in esft.tasks.custom.TaskAdapter (as_task), but an executor takes its task as it is (`esft bench`'s
    PseudoTask, which has no `load`): such an object checks one when it brings its own `is_well_formed`."""
    return task.checks_format if isinstance(task, Task) else callable(getattr(task, "is_well_formed", None))


def task_name(task: Any) -> str:
    """`Task.name`; for a task object that is not an esft Task its own `name`, else its class's name: the name of
    the TaskAdapter that get_task (and esft.tasks.custom.as_task) wraps it in."""
    return task.name if isinstance(task, Task) else str(getattr(task, "name", type(task).__name__))


def format_bonus_warning(task: Any, bonus: float) -> str | None:
    """The warning a run with format bonus `bonus` on `task` prints before any model loads, or None: a task that
    checks no format (`checks_format`) gets no bonus, whatever the setting."""
    if not bonus or checks_format(task):
        return None
    shown = task.shown_name() if isinstance(task, Task) else task_name(task)
    return (f"format bonus {bonus} has no effect: task {shown!r} checks no answer format "
            "(a reward function or the `exact` verifier scores it, or its class has no is_well_formed), so no "
            "completion counts as well formed; set it to 0 (--format-bonus 0, or format_bonus: 0 in a config)")
