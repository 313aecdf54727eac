"""Rewards of tasks read from a data file: built-in verifiers, or a Python function with TRL's reward signature.

A reward is named by a string so that it survives `config.yaml` (resume, replay, experiments):

    exact         the whole completion equals the gold answer (case, surrounding space and a final period ignored)
    boxed         the last \\boxed{...} of the completion equals the gold answer (same normalisation)
    math          the last \\boxed{...} is mathematically equal to the gold answer (esft.tasks.hendrycks_math rules)
    mcq           the answer letter the MMLU / chemistry scorer extracts equals the gold letter (esft.tasks.mcq)
    regex:PATTERN the last match of PATTERN (its first group when it has one) equals the gold answer
    module:func   a function `func(completions, **kwargs) -> list[float]` exactly as TRL's GRPOTrainer calls it
    m:f+m:g       several such functions, combined as TRL's GRPOTrainer combines its reward_funcs

A TRL reward function receives `completions` (one per example; with esft's chat prompts each is a list holding one
assistant message, as TRL passes them for conversational datasets), `prompts` (the chat messages) and every other
column of the data as a keyword list. It returns one value per completion: a number, or None (NaN alike) where the
reward does not apply, as in TRL. Several functions combine by TRL's rule (`combine_rewards`, TRL >= 1.16,
GRPOTrainer._calculate_rewards and _generate_and_score_completions): a completion's reward is the sum of the
rewards that apply to it (TRL's nansum with its default weights of 1); when none applies it is unscorable (None).
"""

from __future__ import annotations

import importlib
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from esft.tasks.base import Example, Messages, last_boxed
from esft.tasks.hendrycks_math import answers_match, canonical_answer
from esft.tasks.mcq import extract_letter


class RewardError(ValueError):
    """A data task's reward cannot be used: it does not import, is not a function, raises, or returns something
    other than one number (or None) per completion. Its own class so that a command names the `--reward` it came
    from, not the data (esft.validation.check_task)."""

BUILTIN_VERIFIERS = ("exact", "boxed", "math", "mcq", "regex:PATTERN")
#: completions as TRL passes them for chat prompts ("messages") or as plain strings ("text")
COMPLETION_FORMATS = ("messages", "text")


def normalize(text: Any) -> str:
    """Text compared by the exact-match verifiers: case-folded, inner space collapsed, ends stripped of space and
    of one final period."""
    out = " ".join(str(text).split()).casefold()
    return out[:-1].rstrip() if out.endswith(".") else out


def import_object(spec: str, what: str) -> Any:
    """The object `module.path:attr.sub` names. A module in the current folder is found even when the current folder
    is not on sys.path (the `esft` console script does not put it there). Any failure is a ValueError saying so."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{what} {spec!r}: expected module:name (e.g. my_rewards:correctness)")
    try:
        module = _import_module(module_name)
    except (Exception, SystemExit) as exc:  # user code's import-time error or sys.exit(): said, not a silent exit
        top = module_name.partition(".")[0]
        where = (f" (modules are found in the current folder, installed packages and PYTHONPATH: run from the folder "
                 f"holding {top}.py or add that folder to PYTHONPATH)"
                 if isinstance(exc, ModuleNotFoundError) and exc.name == top else "")
        raise ValueError(f"{what} {spec!r}: cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
                         f"{where}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            from esft.names import close_names

            public = [n for n in dir(obj) if not n.startswith("_")]
            close = close_names(part, public)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise ValueError(f"{what} {spec!r}: module {module_name!r} has no attribute {attr!r}{hint}"
                             f"{_hidden_local_module(module_name)}")
        obj = getattr(obj, part)
    return obj


def _hidden_local_module(name: str) -> str:
    """Why a module of the current folder was not the one imported: another module of its name (the standard
    library's `code`, `test`, `types`, an installed package) comes first on sys.path; "" when none is hidden."""
    top = name.partition(".")[0]
    local = Path.cwd() / f"{top}.py"
    found = getattr(sys.modules.get(top), "__file__", None)
    if not local.is_file() or found is None or Path(found).resolve() == local.resolve():
        return ""
    return (f"; {top!r} was imported from {found}, which hides {local.name} of the current folder: give your file "
            "another name")


def _import_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        top = name.partition(".")[0]
        cwd = Path.cwd()
        local = (cwd / f"{top}.py").exists() or (cwd / top / "__init__.py").exists()
        if exc.name != top or not local or str(cwd) in sys.path:
            raise
        sys.path.append(str(cwd))
        return importlib.import_module(name)


def _regex_extract(pattern: re.Pattern[str], text: str) -> str | None:
    last = None
    for m in pattern.finditer(text):
        last = m
    if last is None:
        return None
    return last.group(1) if pattern.groups else last.group(0)


@dataclass
class Verifier:
    """A built-in verifier: `extract(completion)` (None = no answer in the completion) and `match(pred, gold)`.
    `canonical(gold)` is the form `match` compares a gold answer in, so that gold answers one constant answer
    matches share it (the constant-answer baseline counts them as one answer)."""

    name: str
    extract: Callable[[str], str | None]
    match: Callable[[str, str], bool]
    canonical: Callable[[str], str] = str.strip

    def score(self, completion: str, gold: str) -> float:
        pred = self.extract(completion)
        return 1.0 if pred is not None and self.match(pred, gold) else 0.0


def _boxed_answer(text: str) -> str | None:
    """The last \\boxed{...}'s content; None when there is none or it is empty (no answer, as the MATH task
    reads it)."""
    pred = last_boxed(text)
    return pred if pred is not None and pred.strip() else None


def _same(pred: str, gold: str) -> bool:
    return normalize(pred) == normalize(gold)


def builtin_verifier(spec: str) -> Verifier | None:
    """The verifier `spec` names, None when `spec` is not a built-in (then it is a `module:function`)."""
    name = spec.strip()
    if name == "exact":
        return Verifier("exact", lambda text: text, _same, normalize)
    if name == "boxed":
        return Verifier("boxed", _boxed_answer, _same, normalize)
    if name == "math":
        return Verifier("math", _boxed_answer, answers_match, canonical_answer)
    if name == "mcq":
        return Verifier("mcq", lambda text: extract_letter(text)[0], lambda p, g: p == str(g).strip().upper(),
                        lambda g: g.strip().upper())
    if name.startswith("regex:"):
        try:
            pattern = re.compile(name[len("regex:"):])
        except re.error as exc:
            raise RewardError(f"reward {spec!r}: bad regular expression: {exc}") from None
        return Verifier("regex", lambda text: _regex_extract(pattern, text), _same, normalize)
    return None


#: where a task string's reward option holds a regex (`data.jsonl:reward=regex:PATTERN`)
_REGEX_OPTION = re.compile(r"(?:^|[:,])reward=(regex:.*)$", re.IGNORECASE | re.DOTALL)


def regex_cut_at_comma(option_text: str) -> bool:
    r"""Whether the last option of a task string's option text is a regex reward that a comma has cut: a pattern
    that does not compile, or one ending in an open quantifier `{m` (Python reads `a{1` as text, so `a{1,3}` cut at
    its comma compiles; a `{` elsewhere, as in `[{](\d+)`, is the user's). Options are split at commas, so the rest
    of such a regex became the next option or task."""
    found = _REGEX_OPTION.search(option_text)
    pattern = found.group(1)[len("regex:"):] if found else ","
    if "," in pattern:  # the reward is not the last option: the options after it were read as options
        return False
    if re.search(r"(?<!\\)\{\d*$", pattern):
        return True
    try:
        re.compile(pattern)
    except re.error:
        return True
    return False


def regex_comma_error(task: str) -> ValueError:
    """The refusal of a regex reward with a comma inside a task string, which splits its options at commas."""
    found = _REGEX_OPTION.search(task)
    regex = found.group(1) if found else "regex:PATTERN"
    return ValueError(f"task {task!r}: a task string's options are split at commas, so a reward regex cannot hold one "
                      f"there; give the reward with --reward '{regex}' (or `reward:` in --task-options, a config's or "
                      "spec's task_options) and the task without it")


def as_completions(texts: list[str], completion_format: str) -> list[Any]:
    """Completions in the form a TRL reward function gets them (see COMPLETION_FORMATS)."""
    if completion_format == "text":
        return list(texts)
    return [[{"role": "assistant", "content": t}] for t in texts]


def trl_columns(examples: list[Example], columns: Sequence[str] | None = None) -> dict[str, list[Any]]:
    """Every column of the examples as a keyword list, as TRL passes dataset columns (its `prompt` column goes as
    `prompts` instead, so a column of that name is left out here): the dataset's `columns` and any other field of
    `examples`, None for an example without it. The dataset TRL reads from rows of several kinds holds each kind's
    fields for every row, so a reward sees its column whichever rows a call gets."""
    left_out = ("prompt", "prompts", "completion", "completions")
    keys = dict.fromkeys(k for k in [*(columns or ()), *(k for ex in examples for k in ex)] if k not in left_out)
    return {k: [ex.get(k) for ex in examples] for k in keys}


def call_trl_reward(fn: Callable[..., Any], name: str, texts: list[str], prompts: list[Messages],
                    examples: list[Example], completion_format: str,
                    columns: Sequence[str] | None = None) -> list[float | None]:
    """`fn` called as TRL calls a reward function (with the dataset's `columns` too, see `trl_columns`), its result
    checked: one finite number, or None where the reward does not apply, per completion (`check_rewards`)."""
    kwargs = trl_columns(examples, columns)
    try:
        out = fn(completions=as_completions(texts, completion_format), prompts=prompts, **kwargs)
    except (Exception, SystemExit) as exc:  # the user's code (a sys.exit() in it too, else a silent exit): say whose
        kind = "plain strings" if completion_format == "text" else "lists holding one assistant message"
        names = ", ".join(kwargs) or "none"
        raise RewardError(f"reward {name!r} raised {type(exc).__name__}: {exc} (called with {len(texts)} "
                         f"completions as {kind}, prompts, and the columns {names}){_call_fix(exc, kind)}") from exc
    return check_rewards(out, len(texts), name)


def _call_fix(exc: Exception, kind: str) -> str:
    """The change a reward function written for another signature needs, for the two mistakes its error shows."""
    if isinstance(exc, TypeError) and "unexpected keyword argument" in str(exc):
        return "; end its parameters with **kwargs, as TRL passes every column by name"
    if isinstance(exc, AttributeError) and str(exc).startswith("'list' object") and kind != "plain strings":
        return ("; a completion is a list of messages (read completion[0]['content']), or set the task option "
                "completion_format=text")
    return ""


def check_rewards(out: Any, n: int, name: str) -> list[float | None]:
    """`out` as a list of n finite floats, None where the reward returned None or NaN (TRL reads both as "this
    reward does not apply": it turns None into NaN); a ValueError naming the reward when it is not one value per
    completion, or a value is not a number or infinite."""
    try:
        values = list(out)
    except TypeError:
        raise RewardError(f"reward {name!r} returned {type(out).__name__} {out!r}, not a list of numbers "
                         f"(TRL's reward signature: completions, **kwargs -> list[float])") from None
    if len(values) != n:
        raise RewardError(f"reward {name!r} returned {len(values)} values for {n} completions "
                         "(it must return one number, or None, per completion)")
    result: list[float | None] = []
    for i, v in enumerate(values):
        if v is None:
            result.append(None)
            continue
        try:  # numpy scalars and bools count; an array of one row per completion does not
            if isinstance(v, (str, bytes)) or not hasattr(v, "__float__"):
                raise TypeError
            f = float(v)
        except OverflowError:  # an int beyond a float's range: not finite, as the check below says
            f = math.inf
        except (TypeError, ValueError):
            raise RewardError(f"reward {name!r} returned {v!r} ({type(v).__name__}) for completion {i}: not a number "
                             "(or None where the reward does not apply)") from None
        if not math.isfinite(f) and not math.isnan(f):
            raise RewardError(f"reward {name!r} returned {f} for completion {i}: rewards must be finite")
        result.append(None if math.isnan(f) else f)
    return result


def combine_rewards(columns: Sequence[Sequence[float | None]]) -> list[float | None]:
    """One reward per completion from each function's column (None = does not apply), by TRL's rule: the sum of
    the rewards that apply (nansum, weights 1), None where none does (TRL's "unscorable" completion, which it
    leaves out of its group's baseline and gives advantage 0)."""
    out: list[float | None] = []
    for row in zip(*columns, strict=True):
        applied = [r for r in row if r is not None]
        out.append(math.fsum(applied) if applied else None)  # fsum: the same sum whatever the order of the terms
    return out


def unscorable_warning(names: list[str], unscored: int, scored: int) -> str:
    """The warning of `DatasetTask.score_batch` when completions got no reward (TRL warns alike)."""
    who = f"reward {names[0]!r}" if len(names) == 1 else f"every reward function ({', '.join(names)})"
    return (f"{who} returned None for {unscored} of {scored} completions scored so far: no reward applies to them, "
            "so ES fitness and accuracy count each as 0 (TRL's nansum over no reward) and GRPO gives TRL None, "
            "which leaves them out of their group's baseline with advantage 0 (docs/custom-tasks.md)")


def never_scored_warning(names: list[str], functions: int, rows: int, answer_field: str) -> str:
    """The warning of `DatasetTask.validate` when reward functions returned None for every row they were tried on."""
    who = f"reward {', '.join(map(repr, names))}" + (f" (of {functions} reward functions)" if functions > 1 else "")
    effect = ("no row could be scored, so every completion will score 0 (ES fitness, accuracy) and be unscorable "
              "(None) to GRPO" if len(names) == functions else "the other reward functions score alone")
    return (f"{who} returned None for every one of the {rows} rows tried, given each row's {answer_field!r} field "
            f"(its gold answer) as the completion: {effect}. TRL allows None where a reward does not apply, so this "
            "is no error; check the reward's conditions and the columns it reads (docs/custom-tasks.md)")


__all__ = ["BUILTIN_VERIFIERS", "COMPLETION_FORMATS", "RewardError", "Verifier", "as_completions", "builtin_verifier",
           "never_scored_warning", "unscorable_warning",
           "call_trl_reward", "check_rewards", "combine_rewards", "import_object", "normalize", "regex_comma_error",
           "regex_cut_at_comma", "trl_columns"]
