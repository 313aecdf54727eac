"""Every scorer of the six tasks stays fast on hostile 100,000-character completions.

A scorer runs on every sampled completion of training and evaluation, three times (`score`, `is_well_formed`,
`details`), so one super-linear corner (a regex that backtracks over a run of spaces, a quadratic loop, a
huge-number evaluation) costs seconds per call. Each call below must take under 100 ms on completions built to hit
such corners: runs of whitespace, brackets (`{{{{`, `\\boxed{` repeated, unbalanced), repeated fragments and
digit/operator soup, each 100,000 characters long. (The slowest calls, IFEval's sentence count and language
detection over the whole completion, are linear and took 52-53 ms on a 2-core Zen 4 VM; a super-linear corner
costs seconds.)

A call's time is the CPU time of the process during the call (other processes on a shared machine do not
count), the fastest of up to three runs with the scorers' memos cleared before each: the test fails only when
every run of one call is slow. Run with `-s` to see the slowest call of each task.

Run: pytest tests/test_tasks_fuzz.py -q -s
"""

from __future__ import annotations

import random
import time

import pytest

from esft.tasks import get_task
from esft.tasks.ifeval import IFEvalTask
from esft.tasks.ifeval.text import clear_caches

N = 100_000
BUDGET_S = 0.100
METHODS = ("score", "is_well_formed", "details")


def fill(piece: str, n: int = N) -> str:
    return (piece * (n // len(piece) + 1))[:n]


def boxed(inner: str) -> str:
    return "\\boxed{" + inner[: N - 8] + "}"


def _random(seed: int, alphabet: list[str]) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < N:
        out.append(rng.choice(alphabet))
        size += len(out[-1])
    return "".join(out)[:N]


_DIGITS_OPS = list("0123456789") + list("+-*/()") + [" ", ".", " = ", "\n", "9" * 8]
_PROSE = ["the", "cat", "sat", "He", "NASA", "Dr.", "e.g.", "A", "B", "answer", "yes", "no", " ", " ", "\n", ". ",
          "! ", "? ", ", ", "*", "**", "[", "]", "<<", ">>", '"', "'", "P.S.", "SECTION 1", "1.", "...", "\\boxed{",
          "}", "{", "\\text{ ", "Answer:", '{"answer": "C"}', "é", "日本語", "हिन्दी"]

INPUTS = {
    # whitespace
    "spaces": " " * N,
    "newlines": "\n" * N,
    "mixed-whitespace": fill(" \t\n \r\n"),
    "answer-then-spaces": "Answer:" + " " * (N - 7),
    "answer-spaces-x": "Answer:" + " " * (N - 8) + "x",
    "json-key-then-spaces": '"answer":' + " " * (N - 10) + '"',
    "boxed-spaces": boxed(" " * N),
    "boxed-newlines": boxed(fill("\n \t")),
    # brackets
    "open-braces": "{" * N,
    "close-braces": "}" * N,
    "balanced-braces": "{" * (N // 2) + "}" * (N // 2),
    "boxed-repeated": fill("\\boxed{"),
    "boxed-unbalanced": "\\boxed{" + "{" * (N - 7),
    "boxed-nested-balanced": "\\boxed{" * (N // 16) + "5" + "}" * (N // 16),
    "boxed-text-wrappers": boxed(fill("\\text{ ")),
    "text-wrappers-closed": fill("\\text{ cm}"),
    "square-brackets": "[" * N,
    "parens": "(" * N,
    "boxed-parens": boxed("(" * (N // 2) + "44" + ")" * (N // 2)),
    "angle-brackets": fill("<<"),
    # repeated fragments
    "capital-A": fill("A "),
    "articles": fill(". A a"),
    "answer-colon": fill("answer: "),
    "json-fragments": fill('"answer": "'),
    "json-answers": fill('{"answer": "B"}\n'),
    "boxed-yes": fill("\\boxed{yes}"),
    "stars": "*" * N,
    "bold-lines": fill("**bold** text\n"),
    "capital-words": fill("WORD "),
    "abbreviations": fill("Mr. "),
    "initials": fill("J. "),
    "ellipses": fill("a... "),
    "exclamations": fill("a! "),
    "sentences": fill("The cat sat. "),
    "postscripts": fill("P.S. "),
    "sections": fill("SECTION 1\n"),
    "dividers": fill("***\n"),
    "bullets": fill("- item\n"),
    "titles": fill("<< >>\n"),
    "paragraphs": fill("\n\n"),
    "placeholders": fill("[a][b"),
    # digits and operators
    "digits": "9" * N,
    "boxed-digits": boxed("9" * N),
    "products": fill("9*"),
    "boxed-products": boxed(fill("9*")),
    "boxed-sum": boxed(fill("44 + ") + "1"),
    "arithmetic": fill("1+2-3*4/5 "),
    "numbered": "".join(f"{i}. " for i in range(1, 20_000))[:N],
    "decimals": fill("12.5 + 3.25 = "),
    "random-digits-ops": _random(1, _DIGITS_OPS),
    # a random mix of the fragments the scorers look for
    "random-mix": _random(2, _PROSE),
}


def _ifeval_examples() -> dict[str, dict]:
    """One single-instruction example per instruction type, with the data's parameters (the largest threshold
    when the type occurs several times: counting goes furthest)."""
    best: dict[str, tuple[int, dict]] = {}
    for row in IFEvalTask().load("test"):
        for iid, kwargs in zip(row["instruction_id_list"], row["kwargs"]):
            size = max([v for v in kwargs.values() if isinstance(v, int)] or [0])
            if iid not in best or size > best[iid][0]:
                best[iid] = (size, {"instruction_id_list": [iid], "kwargs": [kwargs]})
    return {iid: ex for iid, (_, ex) in sorted(best.items())}


EXAMPLES = {
    "countdown": {"plain": {"nums": [44, 19, 35], "target": 98}},
    "math": {"plain": {"problem": "p", "answer": "5"}},
    "chemistry": {"plain": {"question": "q", "choices": ["w", "x", "y", "z"], "answer": "B"}},
    "mmlu": {"plain": {"question": "q", "choices": ["w", "x", "y", "z"], "answer": "B", "subject": "anatomy"}},
    "boolq": {"plain": {"question": "q", "passage": "p", "answer": True}},
    "ifeval": None,  # filled from the bundled data
}


def _cold_call(method, completion: str, example: dict) -> float:
    clear_caches()
    start = time.process_time()
    method(completion, example)
    return time.process_time() - start


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_every_scorer_call_is_fast_on_hostile_completions(name):
    task = get_task(name)
    examples = EXAMPLES[name] or _ifeval_examples()
    for example in examples.values():  # warm up: models, profiles and lookup tables load on first use
        for m in METHODS:
            getattr(task, m)("Warm up. \\boxed{1} A", example)
    slowest = (0.0, "")
    slow: list[str] = []
    for ex_name, example in examples.items():
        for input_name, completion in INPUTS.items():
            for m in METHODS:
                method = getattr(task, m)
                best = _cold_call(method, completion, example)
                if best > BUDGET_S / 4:  # re-run only calls that look slow: the fastest run is the call's time
                    best = min(best, *(_cold_call(method, completion, example) for _ in range(2)))
                where = f"{m}({input_name}" + (f", {ex_name})" if len(examples) > 1 else ")")
                slowest = max(slowest, (best, where))
                if best >= BUDGET_S:
                    slow.append(f"{where}: {best * 1000:.0f} ms")
    print(f"\n{name}: slowest call {slowest[1]} {slowest[0] * 1000:.1f} ms")
    assert not slow, f"calls over {BUDGET_S * 1000:.0f} ms:\n" + "\n".join(slow)
