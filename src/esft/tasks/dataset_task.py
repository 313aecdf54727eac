"""`DatasetTask`: a task made of the user's data (a JSONL / JSON / CSV file, or a Hugging Face dataset) and a reward.

    esft train es --task data.jsonl --prompt-field question --answer-field answer --reward math
    esft eval --tasks data.csv --reward my_rewards:correctness          (a TRL reward function)

The prompt field holds the user turn (text) or a whole chat (a list of {role, content} messages, TRL's
conversational format); `system_prompt` goes before it. The held-out split is a seeded `test_size` draw from the
rows (or `test_file`, or the hub dataset's `test_split`); the rest is the train split. Everything is checked when the
task is built, before any model loads: the file, the fields (named), the reward (imported and called once on two
rows, so a wrong length or a non-number shows up front).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import math
import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from esft.tasks.base import DISPLAY_ANSWER_CHARS, Example, Messages, Task, completion_text, examples_from_kwargs
from esft.tasks.common import SPLIT_SEED, load_hub_rows
from esft.tasks.labels import best_constant_answer
from esft.tasks.mcq import LETTERS
from esft.tasks.verifiers import (COMPLETION_FORMATS, RewardError, Verifier, builtin_verifier, call_trl_reward,
                                  combine_rewards, import_object, never_scored_warning, unscorable_warning)

#: file suffixes read as data, each also gzip-compressed (the suffixes esft.tasks.custom's task specs take)
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".jsonl.gz", ".json.gz", ".csv.gz", ".tsv.gz")


def is_data_file(path: str) -> bool:
    return str(path).lower().endswith(DATA_SUFFIXES)


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a JSONL, JSON (a list of objects, or JSONL) or CSV / TSV file; errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task data file {path} " + ("is a folder" if path.is_dir() else "does not exist"))
    opener = gzip.open if path.suffix.lower() == ".gz" else open  # is_data_file takes DATA.JSONL.GZ too
    with opener(path, "rb") as fh:
        data = fh.read()
    try:  # utf-8-sig: a byte-order mark (spreadsheet CSV exports) is not part of the first column's name
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        lineno = data[:exc.start].count(b"\n") + 1
        raise ValueError(f"{path}:{lineno}: not UTF-8 text ({exc.reason} at byte {exc.start}): save the file as "
                         "UTF-8") from None
    name = path.name.lower().removesuffix(".gz")
    if name.endswith((".csv", ".tsv")):
        # newline="": a quoted field keeps its line breaks (the csv module's advice for a file it reads)
        reader = csv.DictReader(io.StringIO(text, newline=""), delimiter="\t" if name.endswith(".tsv") else ",")
        rows = [dict(r) for r in reader]
        extra = next((i for i, r in enumerate(rows) if None in r), None)  # DictReader keys extra cells by None
        if extra is not None:
            raise ValueError(f"{path}: row {extra + 1} has {len(reader.fieldnames or []) + len(rows[extra][None])} "
                             f"cells, more than the header's {len(reader.fieldnames or [])} columns: quote a field "
                             'that holds the delimiter ("a, b")')
    elif name.endswith(".json") and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{exc.lineno}: not a JSON list of objects: {exc.msg}") from None
    else:
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: not a JSON object: {exc}") from None
    if not rows:
        raise ValueError(f"task data file {path} holds no rows")
    if name.endswith(".json") and len(rows) == 1:
        check_not_columns(path, rows[0])
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:
        raise ValueError(f"{path}: row {bad + 1} is {type(rows[bad]).__name__}, not an object of fields")
    return rows


def check_not_columns(path: Path, obj: dict[str, Any]) -> None:
    """A .json file holding one object whose every field is a list or a mapping holds its rows by column
    (pandas' default `to_json`) or under a key ({"data": [...]}), not one row: refused, as reading it as a
    single row would end in a task with no held-out split."""
    if obj and all(isinstance(v, (list, dict)) for v in obj.values()):
        raise ValueError(f"{path}: one JSON object of fields {', '.join(map(str, obj))} holding lists or mappings, "
                         "not rows: write a JSON list of row objects or JSONL, one object per line (pandas: "
                         "to_json(orient='records', lines=True))")


def split_sizes(n: int, test_size: float) -> int:
    """Held-out rows out of n: a fraction when test_size < 1, a count otherwise; at least one row stays in train."""
    if not math.isfinite(test_size) or test_size < 0:
        raise ValueError(f"test_size must be a finite number >= 0, got {test_size}")
    if test_size >= 1 and test_size != int(test_size):  # 1.5 rows: neither a fraction nor a count
        raise ValueError(f"test_size must be a fraction below 1 or a whole number of rows, got {test_size}")
    k = round(n * test_size) if test_size < 1 else int(test_size)
    if k >= n:
        raise ValueError(f"test_size {test_size} leaves no train rows out of {n}")
    return k


def reward_parts(reward: Any) -> list[Any]:
    """The rewards `reward` names: a function, a list of functions or names, or a string of names joined by "+"
    (a regex:PATTERN is one reward, whatever its pattern holds)."""
    if callable(reward):
        return [reward]
    if isinstance(reward, str):
        text = reward.strip()
        return [text] if text.startswith("regex:") else [p.strip() for p in text.split("+")]
    if isinstance(reward, (list, tuple)) and reward and all(isinstance(r, str) or callable(r) for r in reward):
        return [r.strip() if isinstance(r, str) else r for r in reward]
    raise ValueError(f"reward must be a built-in verifier's name, 'module:function' or a function (or a list of "
                     f"functions), got {reward!r}")


def function_name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', fn)}"


#: rows of each split a data task's rewards are tried on before a model loads (`DatasetTask.validate`), in calls of
#: VALIDATE_CHUNK rows: every row of a file of usual size, bounded work for a large one or a costly reward (a reward
#: model, an API), and `get_task` validates at every build of the task (checks, trainer, each Ray worker)
VALIDATE_ROWS, VALIDATE_CHUNK = 1024, 256


@dataclass
class DatasetTask(Task):
    """The user's data and reward as a task (module docstring)."""

    source: str = ""
    """a data file (.jsonl, .json, .csv, .tsv) or a Hugging Face dataset name (owner/name or owner/name:config)"""
    prompt_field: str = "prompt"
    """column holding the user turn (text) or the whole chat (a list of {role, content} messages)"""
    answer_field: str = "answer"
    """column holding the gold answer (needed by the built-in verifiers; optional for a reward function)"""
    system_prompt: str | None = ""
    """system message put before the prompt (none when empty or None)"""
    reward: str | Callable[..., Any] | list[Any] = "exact"
    """exact, boxed, math, mcq, regex:PATTERN, or module:function with TRL's reward signature (esft.tasks.verifiers),
    or several such functions joined by "+" (combined by TRL's rule); through the Python API also such a function
    itself, or a list of functions or their names"""
    completion_format: str = "messages"
    """how a reward function gets completions: "messages" (as TRL for chat prompts) or "text" (plain strings)"""
    test_size: float = 0.2
    """held-out rows: a fraction (< 1) or a count, drawn with split_seed; ignored with test_file or test_split"""
    split_seed: int = SPLIT_SEED
    """seed of the held-out draw"""
    test_file: str | None = None
    """a separate held-out data file (then every row of source is train)"""
    train_split: str = "train"
    """hub datasets: split read as train"""
    test_split: str | None = None
    """hub datasets: split read as held-out (None = a test_size draw from train_split)"""
    _rows: dict[str, list[Example]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _columns: list[str] = field(default_factory=list, init=False, repr=False, compare=False)
    """the fields any row of either split has: the columns of the dataset TRL would read from these rows"""
    _verifier: Verifier | None = field(default=None, init=False, repr=False, compare=False)
    _reward_fns: list[tuple[str, Callable[..., Any]]] = field(default_factory=list, init=False, repr=False,
                                                              compare=False)
    _unscorable: list[int] = field(default_factory=lambda: [0, 0], init=False, repr=False, compare=False)
    """[completions no reward function scored, completions scored] by `score_batch`, for its warning"""

    def __post_init__(self) -> None:
        if not self.source:
            raise ValueError("a data task needs a source (a data file or a Hugging Face dataset name)")
        if not self.name:
            base = Path(self.source).name if is_data_file(self.source) else self.source.replace("/", "_")
            self.name = base.split(".")[0] or "data"
        if self.completion_format not in COMPLETION_FORMATS:
            raise ValueError(f"completion_format must be one of {', '.join(COMPLETION_FORMATS)}, "
                             f"got {self.completion_format!r}")
        if isinstance(self.reward, (list, tuple)) and self.reward and all(isinstance(r, str) for r in self.reward):
            self.reward = "+".join(r.strip() for r in self.reward)  # names: one string, as config.yaml records it
        parts = reward_parts(self.reward)
        if len(parts) == 1 and isinstance(parts[0], str):
            self._verifier = builtin_verifier(parts[0])
            if self._verifier is not None:
                return
        for part in parts:
            if callable(part):  # the function itself (Python API): messages name it by its import path
                self._reward_fns.append((function_name(part), part))
                continue
            if builtin_verifier(part) is not None:
                raise RewardError(f"reward {self.reward!r}: a built-in verifier ({part}) cannot be combined with "
                                 "other rewards; combine reward functions (module:function) only")
            if ":" not in part:
                raise RewardError(f"unknown reward {part!r}: use exact, boxed, math, mcq, regex:PATTERN, "
                                 "module:function (a TRL reward function) or several functions joined by '+'")
            try:
                fn = import_object(part, "reward")
            except ValueError as exc:
                raise RewardError(str(exc)) from None
            if not callable(fn):
                raise RewardError(f"reward {part!r} is {type(fn).__name__}, not a function")
            self._reward_fns.append((part, fn))

    @property
    def reward_name(self) -> str:
        """The reward as text: its spec, or the functions' `module:name` joined by "+"."""
        return self.reward if isinstance(self.reward, str) else "+".join(name for name, _ in self._reward_fns)

    def shown_name(self) -> str:
        """The data file or dataset name as the user gave it (the name drops the file's suffix)."""
        return str(self.source)

    # ---- data ---------------------------------------------------------------------------------------------------
    def _read(self) -> dict[str, list[Example]]:
        if self._rows:
            return self._rows
        if is_data_file(self.source):
            rows = read_rows(self.source)
            test = read_rows(self.test_file) if self.test_file else None
        else:
            try:
                rows = load_hub_rows(self.source, self.train_split)
                test = load_hub_rows(self.source, self.test_split) if self.test_split else None
            except RuntimeError as exc:  # no `datasets`, an unreachable hub: a bad task, reported as such
                raise ValueError(str(exc)) from None
            if not rows:
                raise ValueError(f"Hugging Face dataset {self.source!r} split {self.train_split!r} holds no rows")
        self._check_fields(self.source if is_data_file(self.source) else f"{self.source} ({self.train_split})", rows)
        if test is not None:
            self._check_fields(self.test_file or f"{self.source} ({self.test_split})", test)
        else:
            order = list(range(len(rows)))
            random.Random(self.split_seed).shuffle(order)
            k = split_sizes(len(rows), self.test_size)
            held = set(order[:k])
            test = [rows[i] for i in sorted(held)]
            rows = [r for i, r in enumerate(rows) if i not in held]
        self._rows = {"train": [dict(r) for r in rows], "test": [dict(r) for r in test]}
        self._columns = list(dict.fromkeys(k for split in self._rows.values() for r in split for k in r))
        if self._verifier is None and self.answer_field != "answer" and self.answer_field not in self._columns:
            # optional for a reward function, but one named and found in no row is a misspelt field: without it the
            # constant-answer baseline would be left out without a word
            self._rows = {}
            raise ValueError(f"{self.source}: no row has the field {self.answer_field!r} (answer_field); fields: "
                             f"{', '.join(map(str, self._columns))}")
        return self._rows

    def why_empty(self, split: str) -> str:
        """Why `split` holds no rows, naming the options that give it some ("" when it is not the test_size draw):
        a file of one or two rows holds none out at the default 0.2."""
        if split != "test" or self.test_file or self.test_split:
            return ""
        n = len(self._read()["train"])
        held = f"test_size {self.test_size:g} of its {n} row{'s' * (n != 1)} holds none out"
        if n < 2:  # a held-out row would leave none to train on
            return f"{held}: add rows, or give a separate test_file"
        if self.test_size == 0:
            return f"{held}: set test_size above 0 (a fraction, or a row count such as 1), or give a test_file"
        return f"{held}: add rows, or give test_size a row count (--task FILE:test_size=1) or a separate test_file"

    def _check_fields(self, where: str, rows: list[Example]) -> None:
        """Every row (numbered as in the file, from 1; a CSV's header not counted) has the fields the task reads."""
        needed = [("prompt_field", self.prompt_field)]
        if self._verifier is not None:
            needed.append(("answer_field", self.answer_field))
        for i, row in enumerate(rows):
            for option, name in needed:
                if name not in row:
                    raise ValueError(f"{where}: row {i + 1} has no field {name!r} ({option}); "
                                     f"fields: {', '.join(map(str, row)) or 'none'} (name the one to read with "
                                     f"--{option.replace('_', '-')}, or as a task option: FILE:{option}=FIELD)")
                if row[name] is None or (isinstance(row[name], str) and not row[name].strip()) or (
                        isinstance(row[name], float) and math.isnan(row[name])):  # JSON NaN: Python's missing value
                    what = "null, or a CSV row with fewer columns than the header" if row[name] is None else (
                        "NaN (a missing value)" if isinstance(row[name], float) else
                        "empty text (an empty prompt asks nothing; an empty answer would grade an empty reply right)")
                    raise ValueError(f"{where}: row {i + 1} has no value in field {name!r} ({option}): {what}")
                if option == "prompt_field":
                    self._check_chat(where, i, row[name])
                if option == "answer_field" and isinstance(row[name], (list, dict)):  # its text would never match
                    raise ValueError(f"{where}: row {i + 1} holds a {type(row[name]).__name__} in field {name!r} "
                                     f"({option}), not one answer: the built-in verifiers compare one gold answer; "
                                     "keep one per row, or score several accepted answers with a reward function "
                                     "(module:function)")
                if option == "answer_field" and self._is_mcq() and self.gold_key(row) not in LETTERS:
                    # the mcq verifier reads only A-D from a completion: such a row would score 0 whatever the reply
                    raise ValueError(f"{where}: row {i + 1} holds {row[name]!r} in field {name!r} ({option}), not "
                                     f"an answer letter: the mcq reward compares the letter (A-D) a reply gives with "
                                     "the gold letter; give each row's letter, or score other answers with another "
                                     "reward (exact, regex:PATTERN, module:function)")

    def _check_chat(self, where: str, i: int, value: Any) -> None:
        """A prompt is text, or a chat: a list of {role, content} messages (TRL's conversational format)."""
        fix = "a prompt is text, or a list of {role, content} messages (TRL's conversational format)"
        if isinstance(value, dict):
            raise ValueError(f"{where}: row {i + 1} holds a mapping in field {self.prompt_field!r} (prompt_field): "
                             f"{fix}")
        if not isinstance(value, list):
            return
        if not value:  # asks nothing, as an empty text does
            raise ValueError(f"{where}: row {i + 1} holds an empty list in field {self.prompt_field!r} "
                             f"(prompt_field), a chat of no messages: {fix}")
        for j, message in enumerate(value):
            missing = ([k for k in ("role", "content") if k not in message] if isinstance(message, dict)
                       else ["role", "content"])
            if missing:
                raise ValueError(f"{where}: row {i + 1}, message {j + 1} of field {self.prompt_field!r} "
                                 f"(prompt_field) has no {' or '.join(map(repr, missing))}: {fix}")

    def _load(self, split: str) -> list[Example]:
        return [dict(r) for r in self._read()[split]]

    def validate(self) -> None:
        """Read the data and call each reward on the rows of both splits (the first VALIDATE_ROWS of a larger split),
        VALIDATE_CHUNK rows per call, with the gold answers as completions: a missing field, an empty file, or a
        reward that raises on a row or returns the wrong shape fails here, before a model loads; a reward that
        failed only on a late row would otherwise stop the run after it (or in its first held-out evaluation).
        A reward that returned None for every row tried gets one warning naming it (`never_scored_warning`): TRL
        allows None, but a reward that applies to no row scores every completion 0."""
        scored = {name: 0 for name, _ in self._reward_fns}
        tried_count = 0
        for index, (split, rows) in enumerate(self._read().items()):
            tried = rows[:VALIDATE_ROWS]
            tried_count += len(tried)
            for start in range(0, len(tried), VALIDATE_CHUNK):
                chunk = tried[start:start + VALIDATE_CHUNK]
                texts = [str(r.get(self.answer_field, "")) for r in chunk]
                prompts = [self.prompt(r) for r in chunk]
                for name, fn in self._reward_fns:
                    try:
                        out = call_trl_reward(fn, name, texts, prompts, chunk, self.completion_format, self._columns)
                    except ValueError as exc:
                        where = self._failing_row(split, rows, start, chunk, fn, name, exc)
                        raise RewardError(f"{where}{exc}") from exc
                    scored[name] += len(out) - out.count(None)
                    if index == start == 0:  # once per reward: its first call
                        self._warn_if_read_as_text(name, fn, texts, prompts, chunk, out)
        never = [name for name, count in scored.items() if count == 0]
        if never and tried_count:
            warnings.warn(never_scored_warning(never, len(scored), tried_count, self.answer_field), stacklevel=2)

    def _warn_if_read_as_text(self, name: str, fn: Any, texts: list[str], prompts: list[Messages],
                              chunk: list[Example], out: list[float | None]) -> None:
        """Warn when a reward scores the gold answers higher given as plain strings than as the message lists it is
        given: it reads a completion as text (`answer in completion` is False for a list), so it would score every
        completion as a wrong one, silently. A reward that reads messages raises on text, and one that reads both
        scores them alike: neither is warned."""
        if self.completion_format == "text":
            return
        try:
            as_text = call_trl_reward(fn, name, texts, prompts, chunk, "text", self._columns)
        except ValueError:
            return
        given, text = (math.fsum(v for v in values if v is not None) / len(values) for values in (out, as_text))
        if text > given:
            warnings.warn(f"reward {name!r} scores the gold answers {text:.3g} on average as plain strings but "
                          f"{given:.3g} as the lists of one assistant message it is given (TRL's conversational "
                          "format): it reads a completion as text; read completion[0]['content'], or set the task "
                          "option completion_format=text (docs/custom-tasks.md)", stacklevel=4)

    def _failing_row(self, split: str, rows: list[Example], start: int, chunk: list[Example], fn: Any, name: str,
                     exc: ValueError) -> str:
        """Where the reward failed on `chunk` (rows[start:...] of `split`): the first row that fails alone when the
        reward raised (rows are tried one at a time, on this failure only), else the split (a wrong count or
        value, whose error says which)."""
        if exc.__cause__ is not None:
            for i, row in enumerate(chunk, start):
                try:
                    call_trl_reward(fn, name, [str(row.get(self.answer_field, ""))], [self.prompt(row)], [row],
                                    self.completion_format, self._columns)
                except ValueError:
                    return (f"{split} split, row {i + 1} of {len(rows)} "
                            f"({self.prompt_field}: {str(row[self.prompt_field])[:60]!r}): ")
        return f"{split} split ({len(rows)} rows): "

    # ---- prompting and scoring ----------------------------------------------------------------------------------
    def prompt(self, example: Example) -> Messages:
        value = example[self.prompt_field]
        if isinstance(value, list):  # a chat already (TRL conversational format)
            messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in value]
        else:
            messages = [{"role": "user", "content": str(value)}]
        if self.system_prompt and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def score(self, completion: str, example: Example) -> float:
        if self._verifier is not None:
            return self._verifier.score(completion_text(completion), str(example[self.answer_field]))
        return self.score_batch([completion_text(completion)], [example])[0]

    def score_batch(self, texts: list[str], examples: list[Example]) -> list[float]:
        """Rewards of several completions in one call of each reward function. A completion no function scored
        (`rewards` gives None) scores 0, TRL's nansum over no reward: ES fitness and accuracy need a number for
        every completion. A warning says so, each time the count of such completions reaches a power of two."""
        if not self._reward_fns:
            return [self.score(t, ex) for t, ex in zip(texts, examples)]
        out = self.rewards(texts, examples)
        unscored = out.count(None)
        before = self._unscorable[0]
        self._unscorable[0] += unscored
        self._unscorable[1] += len(out)
        if unscored and (self._unscorable[0]).bit_length() > before.bit_length():
            warnings.warn(unscorable_warning([name for name, _ in self._reward_fns], *self._unscorable), stacklevel=2)
        return [0.0 if r is None else r for r in out]

    def rewards(self, texts: list[str], examples: list[Example]) -> list[float | None]:
        """The reward functions' rewards of completions, combined as TRL combines its reward_funcs (esft.tasks.
        verifiers.combine_rewards): None where none applies."""
        prompts = [self.prompt(ex) for ex in examples]
        self._read()  # the dataset's columns: a reward gets each one, whichever rows a call holds
        return combine_rewards([call_trl_reward(fn, name, texts, prompts, examples, self.completion_format,
                                                self._columns)
                                for name, fn in self._reward_fns])

    @property
    def checks_format(self) -> bool:
        """A built-in verifier extracts an answer in a format; `exact` reads the whole completion as the answer (any
        text would be "well formed"), and a reward function's format is its own business."""
        return self._verifier is not None and self._verifier.name != "exact"

    def is_well_formed(self, completion: str, example: Example) -> bool:
        """A built-in verifier found an answer in the completion; always False with `exact` or a reward function
        (no format to check: `checks_format`)."""
        return self.checks_format and self._verifier.extract(completion) is not None

    def details(self, completion: str, example: Example) -> dict[str, Any]:
        """The extracted answer (none with `exact`) and maj@k's `vote_key`: the answer in the form the verifier
        compares (its digest where longer than DISPLAY_ANSWER_CHARS), so "0.5" and "\\frac12" are one vote."""
        if self._verifier is None:
            return {}
        exact, answer = self._verifier.name == "exact", self._verifier.extract(completion)
        text = None if answer is None else self._verifier.canonical(answer)
        if text is not None and len(text) > DISPLAY_ANSWER_CHARS:
            text = "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
        return {"vote_key": text or None} if exact else {"extracted": answer, "vote_key": text or None}

    def gold_key(self, example: Example) -> Any:
        """The gold answer in the form the verifier compares it ("Yes", "yes." and " yes" are one answer for
        `exact`, as one constant answer scores on all three); stripped text with a reward function."""
        answer = example.get(self.answer_field)
        if answer is None or isinstance(answer, (list, dict)):
            return None
        text = str(answer).strip()
        if self._verifier is not None:  # a gold answer with no canonical form ("$" for math) keeps its text
            text = self._verifier.canonical(text) or text
        return text or None

    def constant_baseline(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Task's with a built-in verifier; with a reward function, the best score under it of always giving one
        of the most frequent gold answers (partial credit counts: esft.tasks.labels.best_constant_answer)."""
        if self._verifier is not None:
            return super().constant_baseline(records)
        rows = self.evaluated_examples(records)
        golds = [self.gold_key(ex) for ex in rows]
        if not golds or None in golds:
            return {}
        try:
            return best_constant_answer(golds, lambda a: [r or 0.0 for r in self.rewards([a] * len(rows), rows)])
        except RewardError as exc:  # a reward may not take another row's gold answer: no baseline, not no run
            warnings.warn(f"no constant-answer baseline: {exc}", stacklevel=2)
            return {}

    def label_set(self) -> tuple[str, ...] | None:
        """With the `mcq` reward, the answer letters (A-D) the data's gold answers use: a multiple-choice data task
        is labelled as mmlu is (balanced evaluation, the balanced fitness rule, GRPO's class_balanced); None for
        any other reward (an open answer)."""
        if not self._is_mcq():
            return None
        rows = self._read()
        used = {self.gold_key(r) for split in ("train", "test") for r in rows[split]}
        return tuple(letter for letter in LETTERS if letter in used) or None

    def _is_mcq(self) -> bool:
        return self._verifier is not None and self._verifier.name == "mcq"

    def reward_function(self, format_bonus: float = 0.0) -> Callable[..., list[float | None]]:
        """TRL's signature, scoring a batch with one call of each of the user's functions (see
        Task.reward_function). A completion none of them scored gets None, so TRL treats it as its own
        reward_funcs' unscorable completions: left out of its group's baseline, advantage 0. (No format bonus: a
        reward function checks no format, `checks_format`.)"""
        if not self._reward_fns:
            return super().reward_function(format_bonus)

        def reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
            examples = kwargs.get("examples")
            if examples is None:
                examples = examples_from_kwargs(completions, kwargs)
            return self.rewards([completion_text(c) for c in completions], examples)

        reward.__name__ = f"{self.name}_reward"
        return reward


__all__ = ["DATA_SUFFIXES", "DatasetTask", "function_name", "is_data_file", "read_rows", "reward_parts", "split_sizes"]
