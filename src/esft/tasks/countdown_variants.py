"""Countdown puzzles made on the fly: the `generated` split's generator and the procedural variants
(`countdown:numbers=2,max_number=20,ops=+*`), their option parsing, and the worked puzzle `ask_format` shows.

A variant's puzzles come from `generate_variant`: train and test are disjoint by a hash of each puzzle
(`is_heldout`), so no seed or size makes them share one. Every puzzle's witness expression is re-checked by the
scorer's own checker (esft.tasks.countdown_expression), so every puzzle is solvable.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from fractions import Fraction
from typing import Any

from esft.tasks.countdown_expression import (
    MAX_LITERAL_DIGITS, OPS, Example, check_expression, eval_postfix, parse_expression, puzzle_key,
)


def random_expression(nums: list[int], rng: random.Random, ops: str = OPS) -> tuple[Fraction, str] | None:
    """Combine `nums` in a random binary tree with operators drawn from `ops`; None on division by zero."""
    items = [(Fraction(v), str(v)) for v in nums]
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        (a, ea), (b, eb) = items[i], items[j]
        op = rng.choice(ops)
        if op == "/" and b == 0:
            return None
        value = a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b
        items = [it for k, it in enumerate(items) if k not in (i, j)] + [(value, f"({ea} {op} {eb})")]
    value, expr = items[0]
    return value, (expr[1:-1] if len(nums) > 1 else expr)


def generate_countdown(
    n: int,
    seed: int = 0,
    *,
    min_count: int = 3,
    max_count: int = 4,
    num_range: tuple[int, int] = (1, 99),
    target_range: tuple[int, int] = (10, 100),
    exclude: set[tuple[int, tuple[int, ...]]] | None = None,
) -> list[Example]:
    """`n` solvable puzzles, deterministic in `seed` (the recipe of the dataset's SOURCE.md).

    Draw 3-4 numbers, combine them in a random expression tree with random operators, keep the puzzle when
    the exact value is an integer in `target_range`. The witness expression is then re-checked by the same
    exact checker the scorer uses, so every puzzle is solvable and its `solution` scores 1.0. (Drawing the
    target uniformly from all reachable values with `reachable_values` would be ~20x slower.) `exclude` holds
    (target, sorted nums) pairs to avoid, e.g. the test set; duplicates within the output are skipped too.
    """
    rng = random.Random(seed)
    seen = set(exclude or ())
    lo_t, hi_t = target_range
    out: list[Example] = []
    count = rng.randint(min_count, max_count)  # drawn per puzzle, kept across retries: 4-number draws are
    while len(out) < n:                        # rejected more often and would otherwise be under-represented
        nums = [rng.randint(*num_range) for _ in range(count)]
        made = random_expression(nums, rng)
        if made is None or made[0].denominator != 1 or not lo_t <= made[0] <= hi_t:
            continue
        target, expr = int(made[0]), made[1]
        key = puzzle_key({"target": target, "nums": nums})
        if key in seen or not check_expression(expr, nums, target)[0]:
            continue
        seen.add(key)
        out.append({"id": f"generated/{seed}/{len(out)}", "nums": nums, "target": target, "solution": expr})
        count = rng.randint(min_count, max_count)
    return out


# ---- procedural variants ----------------------------------------------------------------------------------------
def int_option(name: str, value: Any, low: int, high: int | None = None) -> int:
    """An integer option (a number, or its text in a task name) in [low, high]; anything else raises ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if number < low or (high is not None and number > high):
        raise ValueError(f"{name} must be >= {low}" + (f" and <= {high}" if high is not None else "")
                         + f", got {value!r}")
    return number


#: Defaults of a procedural variant for the options it does not set (the bundled data's shape: 3-4 numbers, 1-99).
VARIANT_DEFAULTS = {"numbers": (3, 4), "min_number": 1, "max_number": 99, "ops": OPS, "data_seed": 0,
                    "train_size": 1000, "test_size": 500}
MAX_COUNT = 6
#: One puzzle in HELDOUT_SHARE, chosen by a hash of its key, belongs to the held-out split.
HELDOUT_SHARE = 4
#: A variant split stops early (with fewer puzzles) after this many draws in a row add nothing: the puzzle space
#: of a small variant (2 numbers in 1-20 with + only has 210 puzzles) can run out.
MAX_MISSES = 20_000


def parse_count_range(value: Any) -> tuple[int, int]:
    """How many numbers a puzzle has: 2, "2", "2..3" or [2, 3] -> (low, high), with 2 <= low <= high <= 6."""
    try:
        if isinstance(value, str):
            lo_text, sep, hi_text = value.strip().partition("..")
            lo, hi = (int(lo_text), int(hi_text)) if sep else (int(lo_text), int(lo_text))
        elif isinstance(value, (list, tuple)) and len(value) == 2:
            lo, hi = int(value[0]), int(value[1])
        elif isinstance(value, int) and not isinstance(value, bool):
            lo = hi = value
        else:
            raise TypeError
    except (TypeError, ValueError):
        raise ValueError(f"numbers must be a count or a range like 2..3, got {value!r}") from None
    if not 2 <= lo <= hi <= MAX_COUNT:
        raise ValueError(f"numbers must lie in 2..{MAX_COUNT} with low <= high, got {value!r}")
    return lo, hi


def variant_options(given: dict[str, Any]) -> dict[str, Any]:
    """A variant's seven options (VARIANT_DEFAULTS' keys) parsed and checked, those not `given` at their
    defaults; a bad value raises ValueError."""
    opts = {**VARIANT_DEFAULTS, **given}
    out = {"numbers": parse_count_range(opts["numbers"]), "ops": parse_ops(opts["ops"])}
    out["min_number"] = int_option("min_number", opts["min_number"], 1, 10**MAX_LITERAL_DIGITS - 1)
    out["max_number"] = int_option("max_number", opts["max_number"], out["min_number"], 10**MAX_LITERAL_DIGITS - 1)
    out["data_seed"] = int_option("data_seed", opts["data_seed"], 0)
    out["train_size"] = int_option("train_size", opts["train_size"], 1)
    out["test_size"] = int_option("test_size", opts["test_size"], 1)
    return out


def parse_ops(value: Any) -> str:
    """The operators a variant's targets are built with, e.g. "+*", in the order + - * /."""
    text = str(value).replace(" ", "")
    bad = sorted(set(text) - set(OPS))
    if not text or bad:
        raise ValueError(f"ops must be a non-empty string of + - * /, got {value!r}")
    return "".join(op for op in OPS if op in text)


def is_heldout(key: tuple[int, tuple[int, ...]]) -> bool:
    """Whether a puzzle belongs to a variant's held-out split: a hash of its key, the same for every seed and
    size, so train and test never share a puzzle."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % HELDOUT_SHARE == 0


def generate_variant(n: int, split: str, *, numbers: tuple[int, int], num_range: tuple[int, int], ops: str,
                     seed: int = 0, max_misses: int = MAX_MISSES) -> list[Example]:
    """Up to `n` distinct puzzles of a procedural variant's `split` ("train" or "test"), deterministic in `seed`.

    Each draw takes a count in `numbers`, that many integers in `num_range`, and a random expression tree over
    them with operators from `ops` (esft's generator recipe); its value is the target when it is a positive
    integer. Train and test draw from separate streams (`random.Random("countdown/<split>/<seed>")`) and keep only
    puzzles on their side of `is_heldout`, so they are disjoint; within a split no puzzle (target and multiset
    of numbers) repeats. Fewer than `n` come back when `max_misses` draws in a row add nothing.
    """
    if split not in ("train", "test"):
        raise ValueError(f"a Countdown variant has the splits train and test, got {split!r}")
    rng = random.Random(f"countdown/{split}/{seed}")
    heldout = split == "test"
    seen: set[tuple[int, tuple[int, ...]]] = set()
    out: list[Example] = []
    misses = 0
    while len(out) < n and misses < max_misses:
        misses += 1
        nums = [rng.randint(*num_range) for _ in range(rng.randint(*numbers))]
        made = random_expression(nums, rng, ops)
        if made is None or made[0].denominator != 1 or made[0] < 1:
            continue
        target, expr = int(made[0]), made[1]
        key = puzzle_key({"target": target, "nums": nums})
        if key in seen or is_heldout(key) != heldout or not check_expression(expr, nums, target)[0]:
            continue
        seen.add(key)
        out.append({"id": f"{split}/{seed}/{len(out)}", "nums": nums, "target": target, "solution": expr})
        misses = 0
    return out


#: With `ask_format` the prompt shows the answer format on one worked puzzle, a user turn and an answer in that
#: format, before the real one. Probed on SmolLM2-135M (greedy, 2 numbers in 1-20, + only): with the system prompt
#: alone it writes equations like "17 + 16 = 33" but boxes none; a user turn that adds "e.g. \boxed{3 + 5}" gets
#: every answer boxed, as "\boxed{3 + 5}" copied; after the worked puzzle it boxes every answer with its own numbers.
FORMAT_SHOT_NUMBERS = {"+": [3, 5, 2, 4, 6, 1], "-": [20, 5, 3, 2, 1, 1], "*": [3, 5, 2, 4, 1, 2],
                       "/": [48, 2, 3, 2, 2, 1]}


def format_shot(ops: str, count: int) -> tuple[list[int], int, str]:
    """(numbers, target, expression) of the worked puzzle: `count` numbers joined by the first of `ops`."""
    op = ops[0]
    nums = FORMAT_SHOT_NUMBERS[op][:count]
    expr = f" {op} ".join(str(x) for x in nums)
    return nums, int(eval_postfix(parse_expression(expr))), expr


# ---- the operator prior ---------------------------------------------------------------------------------------------
def fixed_rule_value(nums: list[int], op: str) -> Fraction | None:
    """nums[0] op nums[1] op ... evaluated left to right, in the order the prompt gives (None on division by 0)."""
    value = Fraction(nums[0])
    for x in nums[1:]:
        if op == "/" and x == 0:
            return None
        value = value + x if op == "+" else value - x if op == "-" else value * x if op == "*" else value / x
    return value


def fixed_rule_baselines(examples: list[Example]) -> dict[str, float]:
    """Accuracy of each fixed-operator rule ("always add", ...) on Countdown examples: the prior a model can learn
    without choosing anything, a stronger baseline than the best constant answer on a variant like `ops=+*`."""
    if not examples:
        raise ValueError("fixed_rule_baselines: no examples (an accuracy over none is undefined)")
    return {op: sum(fixed_rule_value(list(e["nums"]), op) == Fraction(e["target"]) for e in examples) / len(examples)
            for op in OPS}


def target_operator(example: Example) -> str:
    """The single operator that reaches the target from the numbers taken in some order ("+", "*", "-" for
    50 - 26 = 24 given [26, 50], ...), or "other" when none or several do."""
    target = Fraction(example["target"])
    orders = set(itertools.permutations(example["nums"]))
    ops = [op for op in OPS if any(fixed_rule_value(list(o), op) == target for o in orders)]
    return ops[0] if len(ops) == 1 else "other"


def operator_breakdown(examples: list[Example], records: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per target operator (`target_operator`): puzzles, puzzles solved, and answers whose box uses that operator
    (over all records), from evaluation records (`index` into `examples`, `score`, `extracted`).

    A model that picks its operator without looking at the target solves each operator's puzzles at most at the
    rate it writes that operator; solving more of every kind than such a blind mix would is a choice that follows
    the target."""
    out: dict[str, dict[str, int]] = {}
    for r in records:
        op = target_operator(examples[r["index"]])
        row = out.setdefault(op, {"puzzles": 0, "solved": 0, "boxed": 0})
        row["puzzles"] += 1
        row["solved"] += r["score"] == 1.0
    for op in out:
        if op != "other":
            out[op]["boxed"] = sum(op in (r.get("extracted") or "") for r in records)
    return out
