"""Countdown task: safe expression scorer, solver/generator, splits, prompt.

Run: pytest tests/test_tasks_countdown.py -q
"""

from __future__ import annotations

import time
from fractions import Fraction

import pytest

from esft.tasks import get_task
from esft.tasks.countdown import CountdownTask, hub_row_to_example
from esft.tasks.countdown_expression import (
    check_expression, parse_expression, parse_ok, puzzle_key, reachable_values, solve_countdown,
)
from esft.tasks.countdown_variants import generate_countdown

EX = {"nums": [44, 19, 35], "target": 98}
EX4 = {"nums": [96, 7, 37, 74], "target": 55}  # test[0]


@pytest.fixture(scope="module")
def task() -> CountdownTask:
    return get_task("countdown")


def boxed(expr: str) -> str:
    return f"Let me think. 44 + 19 = 63, 63 + 35 = 98.\nSo the answer is \\boxed{{{expr}}}"


# ---- scoring ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("completion", [
    boxed("44 + 19 + 35"),
    boxed("35 + 44 + 19"),
    boxed("(44 + 19) + 35"),
    boxed("((44)) + (19 + (35))"),
    boxed("44+19+35"),
    boxed("  44 +19+ 35 "),
    "\\boxed{44 + 19 + 35}",
    "I first try \\boxed{44 * 19 - 35}, which is wrong. Final: \\boxed{19 + 35 + 44}",  # last box wins
    "\\boxed{-(-44) + 19 + 35}",  # unary minus is accepted, as eval-based reference scorers do
    "\\boxed{044 + 19 + 35}",  # leading zero: same number
    "\\fbox{44 + 19 + 35}",
])
def test_correct_answers_score_one(task, completion):
    assert task.score(completion, EX) == 1.0
    assert task.is_well_formed(completion, EX)


@pytest.mark.parametrize("completion, reason_part", [
    (boxed("44 + 19 - 35"), "value 28 != target 98"),
    (boxed("44 + 19"), "numbers used"),                        # a number missing
    (boxed("44 + 19 + 35 + 1 - 1"), "numbers used"),           # extra numbers
    (boxed("44 + 44 + 10"), "numbers used"),                   # a number used twice
    (boxed("98"), "numbers used"),                             # just the target
    (boxed("44 + 19 + 35 = 98"), "'='"),                       # equation, not expression
    (boxed("44 \\times 2 + 19 - 35"), "'\\\\'"),              # LaTeX operator
    (boxed("44 + 19 + 35.0"), "'.'"),                          # decimal point
    (boxed("44 ** 1 + 19 + 35"), "'**'"),
    (boxed("44 // 1 + 19 + 35"), "'//'"),
    (boxed("44 * * 19"), "'**'"),
    (boxed("__import__('os')"), "'_'"),
    (boxed("44 + 19 + 35 )"), "unexpected ')'"),
    (boxed("(44 + 19 + 35"), "unbalanced"),
    (boxed("44 + 19 * / 35"), "unexpected '/'"),              # an operator where a number belongs
    (boxed("() + 44 + 19 + 35"), "unexpected ')'"),           # empty parentheses
    (boxed("44 + 19 +"), "ends early"),
    (boxed(""), "empty"),
    (boxed("44 + 19 + 35 / 0"), "numbers used"),
    ("44 + 19 + 35", "no \\boxed"),
    ("\\boxed{44 + 19 + 35", "no \\boxed"),                   # unclosed box
    (boxed("４４ + 19 + 35"), "not allowed"),                  # full-width digits
    (boxed("44 + 19 + 35²"), "not allowed"),
    (boxed("44 − 19 + 35"), "not allowed"),                    # unicode minus
])
def test_wrong_or_malformed_answers_score_zero(task, completion, reason_part):
    assert task.score(completion, EX) == 0.0
    details = task.details(completion, EX)
    assert reason_part in details["error"], details


def test_four_numbers_and_division(task):
    ex = {"nums": [8, 21, 99, 87], "target": 14}
    assert task.score("\\boxed{(8 * 21) / (99 - 87)}", ex) == 1.0
    assert task.score("\\boxed{8 * 21 / (99 - 87)}", ex) == 1.0  # left-associative * and /
    assert task.score("\\boxed{8 * 21 / 99 - 87}", ex) == 0.0


def test_precedence_and_associativity():
    assert check_expression("2 + 3 * 4", [2, 3, 4], 14)[0]
    assert check_expression("10 - 4 - 3", [10, 4, 3], 3)[0]      # (10 - 4) - 3, not 10 - (4 - 3)
    assert check_expression("24 / 4 / 2", [24, 4, 2], 3)[0]
    assert check_expression("-3 + 5", [3, 5], 2)[0]
    assert check_expression("- - 3 + 5", [3, 5], 8)[0]
    assert check_expression("+3 + +5", [3, 5], 8)[0]            # unary plus is accepted too


def test_exact_fraction_arithmetic_and_tolerance():
    # 1/3 * 3 is exactly 1 with Fractions; floating point would give 0.9999999999999999.
    ok, value, _ = check_expression("1 / 3 * 3 + 9", [1, 3, 3, 9], 10)
    assert ok and value == Fraction(10)
    ok, value, _ = check_expression("7 / 3", [7, 3], 2)
    assert not ok and value == Fraction(7, 3)
    # the paper's tolerance is "< 1e-5": a value exactly 1e-5 from the target is wrong, a closer one is right
    assert not check_expression("7 + 1 / 100000", [7, 1, 100000], 7)[0]
    assert check_expression("7 + 1 / 100001", [7, 1, 100001], 7)[0]


def test_division_by_zero_is_zero_not_an_error(task):
    ex = {"nums": [5, 3, 3], "target": 10}
    assert task.score("\\boxed{5 / (3 - 3)}", ex) == 0.0
    assert "division by zero" in task.details("\\boxed{5 / (3 - 3)}", ex)["error"]


def test_parse_expression_postfix():
    assert parse_expression("(1 + 2) * 3") == ["1", "2", "+", "3", "*"]
    assert parse_expression("-(4)") == ["4", "neg"]


# ---- adversarial inputs: fast, never raise ---------------------------------------------------------------------
ADVERSARIAL = [
    "\\boxed{9**9**9**9}",
    "\\boxed{9 ** 9 ** 9}",
    "\\boxed{" + "9" * 5000 + "}",
    "\\boxed{" + "9" * 7 + " + 1}",
    "\\boxed{" + "(" * 10_000 + "44" + ")" * 10_000 + "}",
    "\\boxed{" + "-" * 901 + "44 + 19 + 35}",  # odd number of unary minus: -44 + 19 + 35
    "\\boxed{" + "44 + " * 300 + "1}",
    "\\boxed{" + "1 / " * 249 + "1}",
    "\\boxed{__import__('os').system('echo hi')}",
    "\\boxed{exec('1')}",
    "\\boxed{lambda: 0}",
    "\\boxed{1e308 * 1e308}",
    "\\boxed{\\boxed{44 + 19 + 35}}",  # nested: the inner box is the last balanced one (see last_boxed)
    "\\boxed{{44 + 19 + 35}}",
    "\\boxed{}" * 1000,
    "\\boxed{" * 50_000,
    "}" * 50_000 + "\\boxed{",
    "x" * 1_000_000 + "\\boxed{44 + 19 + 35}",
    "\\boxed{" + "4" * 1_000_000 + "}",
    "\\boxed{😀 + 19 + 35}",
    "\\boxed{44\u200b + 19 + 35}",
    "\x00\\boxed{\x00}",
]


@pytest.mark.parametrize("completion", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_adversarial_inputs_are_fast_and_safe(task, completion):
    start = time.perf_counter()
    score = task.score(completion, EX)
    task.details(completion, EX)
    task.is_well_formed(completion, EX)
    assert time.perf_counter() - start < 1.0
    # Only the two boxes that really hold "44 + 19 + 35" (and the 1 MB prefix case) are correct.
    expected = 1.0 if completion in (ADVERSARIAL[12], ADVERSARIAL[17]) else 0.0
    assert score == expected


def test_scorer_limits_reject_only_past_them():
    """1,000 characters, 6-digit literals and parentheses nested 50 deep are read; one more is a rejection with
    the limit as its reason (the limits are written out: they are the scorer's contract, not its constants)."""
    expr = "44 + 19 + 35"
    assert check_expression(expr + " " * (1000 - len(expr)), [44, 19, 35], 98)[0]
    ok, _, reason = check_expression(expr + " " * (1001 - len(expr)), [44, 19, 35], 98)
    assert not ok and "longer than 1000 characters" in reason
    assert check_expression("123456 - 123400 + 42", [123456, 123400, 42], 98)[0]
    ok, _, reason = check_expression("1234567 - 1234500 + 31", [1234567, 1234500, 31], 98)
    assert not ok and "longer than 6 digits" in reason
    assert check_expression("(" * 50 + "44" + ")" * 50 + " + 19 + 35", [44, 19, 35], 98)[0]
    ok, _, reason = check_expression("(" * 51 + "44" + ")" * 51 + " + 19 + 35", [44, 19, 35], 98)
    assert not ok and "nested deeper than 50" in reason
    # nesting depth, not the number of parentheses: 60 of them, 30 deep, are fine
    wide = "(" * 30 + "44" + ")" * 30 + " + " + "(" * 30 + "19" + ")" * 30 + " + 35"
    assert check_expression(wide, [44, 19, 35], 98)[0]
    assert not check_expression("(44) + " + "(" * 51 + "19" + ")" * 51 + " + 35", [44, 19, 35], 98)[0]  # 51 deep
    # under 1,000 characters but far too deep for the recursive parser: a rejection, not a RecursionError
    ok, _, reason = check_expression("(" * 450 + "44" + ")" * 450, [44], 44)
    assert not ok and "nested deeper" in reason


def test_well_formed_and_parse_ok_are_bools(task):
    # evaluation records store `well_formed` and average it: None would not read as False there
    assert parse_ok("44 +") is False and parse_ok("44 + 1") is True
    assert task.is_well_formed("\\boxed{44 +}", EX) is False
    assert task.is_well_formed("no box", EX) is False
    assert task.is_well_formed("\\boxed{1 + 2}", EX) is True


def test_details_cut_the_extracted_box_at_200_characters(task):
    long_box = "1 + " * 50                                                  # exactly 200 characters
    assert task.details(f"\\boxed{{{long_box}}}", EX)["extracted"] == long_box
    assert task.details(f"\\boxed{{{long_box}2}}", EX)["extracted"] == long_box + "..."


def test_double_braces_are_not_an_expression(task):
    # `\boxed{{...}}`: the content is "{44 + 19 + 35}", and braces are not allowed characters.
    assert task.score("\\boxed{{44 + 19 + 35}}", EX) == 0.0


@pytest.mark.parametrize("example, error", [
    ({"nums": None, "target": 3}, TypeError),
    ({}, KeyError),
    ({"nums": [1, 2]}, KeyError),
    ({"nums": ["1", "2"], "target": 3}, TypeError),
    ({"nums": [1.0, 2.0], "target": 3}, TypeError),
    ({"nums": [1, 2], "target": None}, TypeError),
    ({"nums": [1, 2], "target": "3"}, TypeError),
])
def test_malformed_example_raises(task, example, error):
    # A data bug must surface, not read as a wrong answer: score, details and the checker all raise.
    for completion in ("\\boxed{1 + 2}", "no box"):
        with pytest.raises(error):
            task.score(completion, example)
        with pytest.raises(error):
            task.details(completion, example)
    if "nums" in example and "target" in example:
        with pytest.raises(error):
            check_expression("1 + 2", example["nums"], example["target"])


def test_non_string_completion_scores_zero(task):
    assert task.score(None, EX) == 0.0  # type: ignore[arg-type]
    assert task.details(None, EX) == {"extracted": None, "error": "no \\boxed{} answer"}  # type: ignore[arg-type]


@pytest.mark.parametrize("completion", [
    "\\boxed{\n(40 + 74) - 58\n}",
    "\\boxed{\n  (40 + 74)\n  - 58\n}",
    "\\boxed{(40\t+\t74)\t-\t58}",
    "\\boxed{\r\n(40 + 74) - 58\r\n}",
    "\\boxed{(40 +\n74) -\f58\v}",
])
def test_any_whitespace_inside_the_box_is_whitespace(task, completion):
    ex = {"nums": [40, 74, 58], "target": 56}
    assert task.score(completion, ex) == 1.0
    assert task.is_well_formed(completion, ex)
    assert "error" not in task.details(completion, ex)


@pytest.mark.parametrize("expr", ["40 *\n* 74 - 58", "40 /\t/ 74 - 58"])
def test_double_operators_split_by_whitespace_are_still_rejected(expr):
    ok, _, reason = check_expression(expr, [40, 74, 58], 56)
    assert not ok and reason == "'**' and '//' are not allowed"


def test_non_ascii_whitespace_is_not_whitespace(task):
    ex = {"nums": [40, 74, 58], "target": 56}
    for space in ("\u00a0", "\u2003", "\u200b"):
        assert task.score(f"\\boxed{{(40{space}+ 74) - 58}}", ex) == 0.0
        assert "not allowed" in task.details(f"\\boxed{{(40{space}+ 74) - 58}}", ex)["error"]


def test_is_well_formed_is_syntax_only(task):
    assert task.is_well_formed("\\boxed{1 + 2}", EX)          # wrong numbers, but a valid expression
    assert not task.is_well_formed("\\boxed{expression}", EX)  # the format copied literally
    assert not task.is_well_formed("98", EX)


# ---- solver and generator --------------------------------------------------------------------------------------
def test_solver_finds_solutions_the_scorer_accepts(task):
    for ex in task.load("test", limit=40) + task.load("train", limit=40):
        expr = solve_countdown(ex["nums"], ex["target"])
        assert expr is not None, ex  # SOURCE.md: every bundled task is solvable
        assert task.score(f"\\boxed{{{expr}}}", ex) == 1.0, (ex, expr)


def test_solver_reports_unsolvable():
    assert solve_countdown([1, 1, 1], 100) is None


def test_generator_is_deterministic_valid_and_varied(task):
    a = generate_countdown(300, seed=7)
    assert a == generate_countdown(300, seed=7)
    assert a != generate_countdown(300, seed=8)
    assert len({(r["target"], tuple(sorted(r["nums"]))) for r in a}) == 300  # no duplicates
    counts = {3: 0, 4: 0}
    for r in a:
        counts[len(r["nums"])] += 1
        assert all(1 <= x <= 99 for x in r["nums"]) and 10 <= r["target"] <= 100
        assert task.score(f"\\boxed{{{r['solution']}}}", r) == 1.0
    assert counts[3] > 100 and counts[4] > 100  # both sizes well represented
    for r in a[:20]:
        assert solve_countdown(r["nums"], r["target"]) is not None  # independent exact check


def test_generator_respects_exclude():
    first = generate_countdown(5, seed=3)
    banned = {(r["target"], tuple(sorted(r["nums"]))) for r in first}
    again = generate_countdown(5, seed=3, exclude=banned)
    assert not banned & {(r["target"], tuple(sorted(r["nums"]))) for r in again}


# ---- splits --------------------------------------------------------------------------------------------------------
def test_split_sizes(task):
    assert len(task.load("train")) == 200
    assert len(task.load("test")) == 2000
    assert len(task.load("train_pool")) == 7996  # 8,001 minus 5 that repeat a test puzzle
    assert len(task.load("test", limit=10)) == 10


def test_splits_are_deterministic_and_disjoint(task):
    fresh = CountdownTask()
    assert fresh.load("train") == task.load("train")
    assert [r["hf_row"] for r in task.load("test", limit=3)] == [8001, 8002, 8003]
    assert task.load("train")[0] == {"id": "train/5239", "nums": [51, 16, 12], "target": 68, "hf_row": 5239}
    train, test = {puzzle_key(r) for r in task.load("train_pool")}, {puzzle_key(r) for r in task.load("test")}
    assert not train & test  # as multisets: the raw files share 5 puzzles with reordered numbers
    assert {r["hf_row"] for r in task.load("train")} <= {r["hf_row"] for r in task.load("train_pool")}


def test_generated_split_avoids_test_puzzles():
    t = CountdownTask(generated_size=200, generated_seed=1)
    gen = t.load("generated")
    assert len(gen) == 200
    test = {(r["target"], tuple(sorted(r["nums"]))) for r in t.load("test")}
    assert not test & {(r["target"], tuple(sorted(r["nums"]))) for r in gen}


def test_generated_split_follows_its_seed_and_excludes_test_puzzles_it_would_draw():
    """`generated_seed` picks the puzzles, and the test set is excluded: seed 0's first 700 draws hold a test
    puzzle (draw 637) that the split must skip."""
    seed0 = CountdownTask(generated_size=700).load("generated")
    test = {puzzle_key(r) for r in CountdownTask().load("test")}
    assert {puzzle_key(r) for r in generate_countdown(700, 0)} & test      # the draw itself would leak
    assert len(seed0) == 700 and not {puzzle_key(r) for r in seed0} & test
    seed1 = CountdownTask(generated_size=5, generated_seed=1).load("generated")
    assert [r["id"] for r in seed1] == [f"generated/1/{i}" for i in range(5)] and seed1 != seed0[:5]


def test_loaded_examples_are_fresh_copies(task):
    task.load("train")[0]["nums"].append(1000)
    assert 1000 not in task.load("train")[0]["nums"]


def test_unknown_split_raises(task):
    with pytest.raises(ValueError, match="no split"):
        task.load("validation")


# ---- prompt and hub mapping ------------------------------------------------------------------------------------
def test_prompt_states_the_format(task):
    msgs = task.prompt(EX4)
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert "\\boxed{" in msgs[0]["content"] and "exactly once" in msgs[0]["content"]
    # the example in the system prompt uses other numbers, and is itself a correct answer
    assert "[3, 7, 25]" in msgs[0]["content"] and check_expression("25 + 3 * 7", [3, 7, 25], 46)[0]
    assert "[96, 7, 37, 74]" in msgs[1]["content"] and "55" in msgs[1]["content"]


def test_hub_row_mapping():
    ex = hub_row_to_example({"target": "98", "nums": [44, 19, 35], "extra": 1}, 12)
    assert ex == {"id": "hf/12", "nums": [44, 19, 35], "target": 98, "hf_row": 12}
    assert hub_row_to_example({"target": 7, "nums": ["3", "4"]}, 0)["nums"] == [3, 4]  # numbers as text too


# ---- the exact solver against a brute force ----------------------------------------------------------------------
def brute_force_values(nums: list[Fraction]) -> set[Fraction]:
    """Every value of a binary expression tree over all of `nums` (pick two, combine, recurse): independent of
    reachable_values' bitmask dynamic programme."""
    if len(nums) == 1:
        return {nums[0]}
    out: set[Fraction] = set()
    for i in range(len(nums)):
        for j in range(len(nums)):
            if i != j:
                a, b, rest = nums[i], nums[j], [x for k, x in enumerate(nums) if k not in (i, j)]
                for v in {a + b, a - b, a * b} | ({a / b} if b else set()):
                    out |= brute_force_values(rest + [v])
    return out


@pytest.mark.parametrize("nums", [[7], [1, 2], [2, 3, 5], [0, 4, 4], [6, 6, 1], [1, 3, 4, 6], [0, 2, 5, 9]])
def test_reachable_values_are_exactly_the_brute_force_values(nums):
    reach = reachable_values(nums)
    assert set(reach) == brute_force_values([Fraction(x) for x in nums])
    for value, expr in reach.items():  # each witness uses every number once and has its value
        ok, got, reason = check_expression(expr, nums, value)  # the scorer's own check, exact for fractions too
        assert ok and got == value, (nums, value, expr, got, reason)


def test_reachable_values_of_two_numbers():
    assert set(reachable_values([1, 2])) == {3, 2, -1, 1, Fraction(1, 2)}
    assert set(reachable_values([0, 5])) == {5, 0, -5}  # no division by zero


def test_solver_strips_only_an_outer_pair_of_parentheses():
    assert solve_countdown([3, 5], 8) == "3 + 5"
    assert solve_countdown([9], 9) == "9" and solve_countdown([123], 123) == "123"  # "2" is no strip of "123"
    # the solver's (deterministic) answer for 25 here joins two groups: their parentheses are no outer pair
    expr = solve_countdown([1, 2, 3, 4], 25)
    assert expr == "(2 + 3) * (1 + 4)" and check_expression(expr, [1, 2, 3, 4], 25)[0]
    assert solve_countdown((2, 2), Fraction(1)) == "2 / 2"  # any sequence and any exact target
    assert solve_countdown([3, 5], 9) is None


def test_puzzle_key_ignores_the_order_of_the_numbers():
    assert puzzle_key({"target": 10, "nums": [5, 3, 2]}) == puzzle_key({"target": 10.0, "nums": [2, 5, 3]}) == (
        10, (2, 3, 5))
    assert puzzle_key({"target": 10, "nums": [5, 3, 2]}) != puzzle_key({"target": 11, "nums": [5, 3, 2]})


@pytest.mark.parametrize("nums, target", [
    ({1, 2}, 3),            # a set: not a list of the puzzle's numbers
    ((x for x in (1, 2)), 3),
    ([1, "2"], 3),          # one text number among integers
    ([True, 2], 3),
    ([1, 2], True),         # a boolean target
])
def test_check_puzzle_refuses_each_malformed_part(nums, target):
    with pytest.raises(TypeError, match="malformed Countdown example"):
        check_expression("1 + 2", nums, target)
