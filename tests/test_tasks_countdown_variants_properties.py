"""Properties of esft.tasks.countdown_variants checked against independent brute force: the puzzle space a variant
draws from, the train/held-out partition, the options' bounds, the operator labels and the stop rule."""

from __future__ import annotations

import inspect
import random
from collections import Counter
from fractions import Fraction
from itertools import permutations

import pytest

from esft.tasks.countdown_expression import check_expression, eval_postfix, parse_expression, puzzle_key
from esft.tasks.countdown_variants import (
    HELDOUT_SHARE, MAX_COUNT, MAX_MISSES, VARIANT_DEFAULTS, generate_countdown, generate_variant, int_option,
    is_heldout, operator_breakdown, parse_count_range, random_expression, target_operator, variant_options,
)


def apply(a: Fraction, op: str, b: Fraction) -> Fraction | None:
    if op == "/" and b == 0:
        return None
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[op]


def _combine(items: list[Fraction], ops: str) -> set[Fraction]:
    if len(items) == 1:
        return {items[0]}
    out: set[Fraction] = set()
    for i, j in permutations(range(len(items)), 2):
        rest = [x for k, x in enumerate(items) if k not in (i, j)]
        for op in ops:
            value = apply(items[i], op, items[j])
            if value is not None:
                out |= _combine(rest + [value], ops)
    return out


def puzzle_space(counts: range, lo: int, hi: int, ops: str) -> set[tuple[int, tuple[int, ...]]]:
    """All (target, sorted numbers) puzzles of a variant: a positive integer value of some tree over the numbers."""
    space = set()
    for count in counts:
        for nums in _multisets(count, lo, hi):
            space |= {(int(v), nums) for v in _combine([Fraction(x) for x in nums], ops)
                      if v >= 1 and v.denominator == 1}
    return space


def _multisets(count: int, lo: int, hi: int) -> list[tuple[int, ...]]:
    if count == 0:
        return [()]
    return [(a,) + rest for a in range(lo, hi + 1) for rest in _multisets(count - 1, a, hi)]


def split_keys(split: str, **kw) -> list[tuple[int, tuple[int, ...]]]:
    return [puzzle_key(r) for r in generate_variant(10**6, split, **kw)]


# ---- random_expression ---------------------------------------------------------------------------------------
def test_random_expression_value_is_the_value_of_its_text():
    """The returned value is what the returned expression evaluates to (operands in the written order), the
    expression uses only `ops` and each number once, and two numbers need no parentheses."""
    rng = random.Random(5)
    for trial in range(400):
        nums = [rng.randint(1, 12) for _ in range(rng.randint(2, 4))]
        ops = "+-*/"[trial % 4:] if trial % 8 < 4 else "+-*/"
        made = random_expression(nums, rng, ops)
        if made is None:
            continue
        value, expr = made
        assert eval_postfix(parse_expression(expr)) == value, (nums, expr)
        literals = expr.replace("(", " ").replace(")", " ").split()
        assert set(expr) <= set(ops + "0123456789 ()")
        assert sorted(int(t) for t in literals if t.isdigit()) == sorted(nums)
        if len(nums) == 2:
            assert "(" not in expr and ")" not in expr
    assert random_expression([7], rng) == (Fraction(7), "7")
    assert random_expression([0, 0], random.Random(0), "/") is None      # division by zero is a miss, not a raise


def test_random_expression_default_ops_are_all_four():
    """Without `ops` every operator is used (the bundled `generated` split's recipe)."""
    rng = random.Random(0)
    used = "".join(e for e in (random_expression([4, 2, 8], rng) for _ in range(300)) if e for e in e[1])
    assert set("+-*/") <= set(used)


# ---- generate_countdown ---------------------------------------------------------------------------------------
def test_generate_countdown_defaults_and_ranges():
    """The defaults are the documented recipe (3-4 numbers in 1-99, targets 10-100); targets reach both ends of
    `target_range`, numbers both ends of `num_range`; ids name the seed and the position."""
    a = generate_countdown(70, seed=2)
    assert a == generate_countdown(70, seed=2, min_count=3, max_count=4, num_range=(1, 99), target_range=(10, 100))
    assert {10, 100} <= {r["target"] for r in a}                       # both ends of the default target range
    assert [r["id"] for r in a[:3]] == ["generated/2/0", "generated/2/1", "generated/2/2"]
    assert generate_countdown(40, seed=2) == a[:40]                     # a longer run extends a shorter one
    # 2 numbers in 1..20 and targets 10..12: 50 puzzles (enumerated below), half of them drawn
    small = generate_countdown(25, seed=1, min_count=2, max_count=2, num_range=(1, 20), target_range=(10, 12))
    keys = [puzzle_key(r) for r in small]
    assert len(set(keys)) == 25 and set(keys) <= {k for k in puzzle_space(range(2, 3), 1, 20, "+-*/")
                                                   if 10 <= k[0] <= 12}
    numbers = {x for _, nums in keys for x in nums}
    assert {t for t, _ in keys} == {10, 11, 12} and min(numbers) == 1 and max(numbers) == 20


def test_targets_are_exact_not_within_the_scorers_tolerance():
    """A near-integer value (999991 / 999990 is 1.000001, within the scorer's 1e-5 of 1) is no puzzle: every
    witness equals its target exactly, in both generators."""
    big = {"num_range": (999_990, 999_999)}
    rows = generate_countdown(10, min_count=2, max_count=2, target_range=(1, 2), **big)
    rows += generate_variant(50, "train", numbers=(2, 2), ops="/", max_misses=2000, **big)
    assert len(rows) > 10
    assert all(eval_postfix(parse_expression(r["solution"])) == r["target"] for r in rows)


def test_generate_countdown_pins_the_bundled_generated_recipe():
    """The `generated` split is data runs report on: its first puzzles for seed 0 stay what they are."""
    assert [(r["nums"], r["target"]) for r in generate_countdown(2, seed=0)] == [
        ([91, 86, 81, 1], 95), ([76, 81, 43], 38)]


# ---- generate_variant against the brute-force puzzle space -----------------------------------------------------
@pytest.mark.parametrize("ops", ["+-*/", "-", "*/"])
def test_a_small_variant_covers_its_whole_puzzle_space_split_by_the_hash(ops):
    """2 numbers in 2..7: train and test together are exactly the puzzles an independent enumeration finds,
    train the non-held-out ones and test the held-out ones, with the default stop rule."""
    kw = {"numbers": (2, 2), "num_range": (2, 7), "ops": ops}
    space = puzzle_space(range(2, 3), 2, 7, ops)
    train, test = split_keys("train", **kw), split_keys("test", **kw)
    assert len(set(train)) == len(train) and len(set(test)) == len(test)
    assert set(train) == {k for k in space if not is_heldout(k)}
    assert set(test) == {k for k in space if is_heldout(k)}


def test_three_number_puzzles_lie_in_the_space_and_both_counts_are_drawn():
    """numbers=2..3: every puzzle is in the enumerated space, and both counts appear in each split."""
    kw = {"numbers": (2, 3), "num_range": (1, 4), "ops": "+-*"}
    space = puzzle_space(range(2, 4), 1, 4, "+-*")
    for split in ("train", "test"):
        rows = generate_variant(300, split, **kw)
        assert {puzzle_key(r) for r in rows} <= space
        assert Counter(len(r["nums"]) for r in rows).keys() == {2, 3}
        assert all(check_expression(r["solution"], r["nums"], r["target"])[0] for r in rows)


def test_heldout_share_and_partition_are_stable():
    """About one puzzle in HELDOUT_SHARE is held out, and the hash that picks them does not change (every
    variant's reported held-out set depends on it)."""
    keys = [(t, (a, b)) for a in range(1, 40) for b in range(a, 40) for t in (a + b, a * b)]
    share = sum(map(is_heldout, keys)) / len(keys)
    assert HELDOUT_SHARE == 4 and 0.23 < share < 0.27
    assert [k for k in [(t, (1, b)) for b in range(1, 4) for t in range(1, 8)] if is_heldout(k)][:5] == [
        (3, (1, 1)), (6, (1, 1)), (1, (1, 2)), (1, (1, 3)), (2, (1, 3))]


def test_variant_streams_are_pinned_by_split_and_seed():
    """Each split's stream is seeded by its name and the seed: the first puzzles of a four-operator variant stay
    what the reported runs used, a new seed changes them, and ids name split, seed and position."""
    kw = {"numbers": (2, 3), "num_range": (1, 30), "ops": "+-*/"}
    test = generate_variant(3, "test", **kw)
    assert [(r["id"], r["nums"], r["target"]) for r in test] == [
        ("test/0/0", [23, 30, 19], 13110), ("test/0/1", [21, 5, 20], 85), ("test/0/2", [2, 30], 28)]
    assert [(r["id"], r["nums"], r["target"]) for r in generate_variant(3, "train", **kw)] == [
        ("train/0/0", [23, 7, 25], 414), ("train/0/1", [12, 16, 23], 51), ("train/0/2", [8, 21], 29)]
    other = generate_variant(3, "test", seed=3, **kw)
    assert [r["id"] for r in other] == ["test/3/0", "test/3/1", "test/3/2"]
    assert [puzzle_key(r) for r in other] != [puzzle_key(r) for r in test]


def test_the_stop_rule_counts_misses_in_a_row():
    """`max_misses` bounds the draws in a row that add nothing, not the draws in all: a large space with a small
    bound still fills a long split; no allowed miss draws nothing; the default is MAX_MISSES."""
    kw = {"numbers": (2, 2), "num_range": (1, 99), "ops": "+"}
    assert len(generate_variant(300, "train", max_misses=40, **kw)) == 300
    assert generate_variant(5, "train", max_misses=0, **kw) == []
    assert inspect.signature(generate_variant).parameters["max_misses"].default == MAX_MISSES == 20_000


# ---- options -----------------------------------------------------------------------------------------------
def test_variant_option_defaults_and_bounds():
    """Unset options take VARIANT_DEFAULTS; each bound is inclusive; floats and booleans are not integers."""
    assert variant_options({}) == {"numbers": (3, 4), "ops": "+-*/", "min_number": 1, "max_number": 99,
                                   "data_seed": 0, "train_size": 1000, "test_size": 500}
    assert VARIANT_DEFAULTS["numbers"] == (3, 4)
    top = variant_options({"min_number": 999_999, "max_number": "999999", "test_size": 7})
    assert (top["min_number"], top["max_number"], top["test_size"], top["train_size"]) == (999_999, 999_999, 7, 1000)
    assert variant_options({"min_number": 5, "max_number": 5})["max_number"] == 5
    for bad in ({"min_number": 0}, {"min_number": 1_000_000, "max_number": 1_000_000}, {"train_size": 0},
                {"data_seed": -1}, {"max_number": 1_000_000}, {"test_size": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            variant_options(bad)
    assert int_option("x", 3, 3, 3) == 3 and int_option("x", " 4 ", 0) == 4
    with pytest.raises(ValueError, match="x must be an integer"):
        int_option("x", True, 0)                                          # a bool in range is still refused
    for bad in (True, 2.0, None, "2.5", 2, 6):
        with pytest.raises(ValueError, match="x must be"):
            int_option("x", bad, 3, 5)
    assert parse_count_range(MAX_COUNT) == (6, 6) and parse_count_range("2..6") == (2, 6)
    assert parse_count_range(" 2..3 ") == (2, 3) and parse_count_range((3, 3)) == (3, 3)
    for bad in ([2, 3, 4], (2, 3, 4), False, "7"):
        with pytest.raises(ValueError, match="numbers"):
            parse_count_range(bad)


# ---- operator labels -------------------------------------------------------------------------------------------
def test_target_operator_matches_a_brute_force_over_orders():
    """For every 2- and 3-number puzzle of a small space, the label is the one operator whose left-to-right rule
    reaches the target in some order of the numbers, else "other"."""
    for target, nums in sorted(puzzle_space(range(2, 4), 1, 5, "+-*/")):
        hits = {op for op in "+-*/" for order in permutations(nums)
                if _fold(order, op) == target}
        want = hits.pop() if len(hits) == 1 else "other"
        assert target_operator({"nums": list(nums), "target": target}) == want, (target, nums)


def _fold(order: tuple[int, ...], op: str) -> Fraction | None:
    value: Fraction | None = Fraction(order[0])
    for x in order[1:]:
        value = apply(value, op, Fraction(x)) if value is not None else None
    return value


def test_operator_breakdown_ignores_missing_boxes_and_gives_other_no_box_count():
    """A record without an extracted box counts as a puzzle but boxes nothing; "other" has no operator to box."""
    examples = [{"nums": [3, 5], "target": 8}, {"nums": [2, 2], "target": 4}]
    records = [{"index": 0, "score": 0.0, "extracted": None}, {"index": 1, "score": 1.0, "extracted": "other"},
               {"index": 0, "score": 1.0}]
    assert operator_breakdown(examples, records) == {"+": {"puzzles": 2, "solved": 1, "boxed": 0},
                                                     "other": {"puzzles": 1, "solved": 1, "boxed": 0}}
