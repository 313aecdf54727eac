"""The built-in scorers pinned where a slip would leave their own test files passing. In esft a task's reward is
its evaluation, so each case here is a completion that would silently be scored the other way: a number used
twice while the *set* of numbers still matches (Countdown), MATH normalisation steps that only a non-numeric
answer exercises, the exact/regex/mcq verifiers' normalisation and "last match" rule, a JSON letter outside A-D,
and BoolQ's trailing "!".

Run: pytest -q tests/test_scorers_audit.py   (~2 s)
"""

from __future__ import annotations

import pytest

from esft.tasks.boolq import parse_yes_no
from esft.tasks.countdown import CountdownTask
from esft.tasks.countdown_expression import check_expression
from esft.tasks.hendrycks_math import answers_match, normalize_answer
from esft.tasks.mcq import extract_letter
from esft.tasks.verifiers import builtin_verifier, normalize


# ---- Countdown: each number exactly once, as a multiset -------------------------------------------------------
@pytest.mark.parametrize("expr, nums, target", [
    ("25 + 3 * 7 + 3 - 3", [3, 7, 25], 46),   # 3 used three times: same set of numbers, right value
    ("5 * 2", [5, 5, 2], 10),                 # one of the two 5s left unused
    ("5 * 2 * 5 / 5 + 5 - 5", [5, 5, 2], 10),  # 5 used four times where it is given twice
])
def test_countdown_counts_repeats_of_a_number(expr, nums, target):
    ok, _, reason = check_expression(expr, nums, target)
    assert not ok and reason.startswith("numbers used")
    assert CountdownTask().score(f"\\boxed{{{expr}}}", {"nums": nums, "target": target}) == 0.0


def test_countdown_accepts_a_repeated_number_used_as_often_as_given():
    assert check_expression("5 * 2 + 5 - 5", [5, 5, 2, 5], 10)[0]


@pytest.mark.parametrize("expr", ["25 + 3 * 7(", "25 + 3(7)", "(25 + 3 * 7"])
def test_countdown_rejects_a_stray_parenthesis_after_a_number(expr):
    assert not check_expression(expr, [3, 7, 25], 46)[0]


# ---- MATH normalisation ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("prediction, gold, expected", [
    (r"\text{Evelyn}.", "Evelyn", True),   # a trailing full stop after a word (numbers parse "5." anyway)
    ("Evelyn.", r"\text{Evelyn}", True),
    ("1234,567", "1234567", False),       # not a thousands separator: the first group has four digits
    ("12,34", "1234", False),
])
def test_math_normalisation_of_non_numbers_and_separators(prediction, gold, expected):
    assert answers_match(prediction, gold) is expected


def test_math_unit_stripped_is_the_last_wrapper():
    """Only the trailing `\\text{ cm}` is a unit; an earlier wrapper joining two numbers stays."""
    assert normalize_answer(r"2\text{ by }3\text{ cm}") == normalize_answer(r"2\text{ by }3") == "2by3"


@pytest.mark.parametrize("answer, normalized", [
    ("x==5", "x==5"),        # an equation, not a variable assignment: `x=` is dropped only before a value
    ("x=5", "5"),
    ("{a}{b}", "{a}{b}"),    # two groups: the outer braces are not one pair
    ("{5}", "5"),
])
def test_math_normalize_prefix_and_outer_braces(answer, normalized):
    assert normalize_answer(answer) == normalized


# ---- verifiers of data-file tasks ------------------------------------------------------------------------------
def test_verifier_normalize_drops_one_final_period_and_case():
    assert normalize("  Paris  Texas. ") == "paris texas"
    assert normalize("42..") == "42."   # one final period only, as documented
    exact = builtin_verifier("exact")
    assert exact.score("PARIS.", "paris") == 1.0
    assert exact.score("42..", "42") == 0.0


def test_a_module_whose_name_starts_with_regex_is_not_the_regex_verifier():
    assert builtin_verifier("regex_rewards:score") is None


def test_regex_verifier_reads_the_last_match():
    regex = builtin_verifier(r"regex:answer: (\d+)")
    assert regex.score("answer: 41, no wait, answer: 42", "42") == 1.0
    assert regex.score("answer: 42, no wait, answer: 41", "42") == 0.0


def test_mcq_verifier_reads_a_lower_case_or_padded_gold_letter():
    mcq = builtin_verifier("mcq")
    assert mcq.score('{"answer": "C"}', "c") == 1.0
    assert mcq.score('{"answer": "C"}', " C ") == 1.0
    assert mcq.score('{"answer": "C"}', "b") == 0.0


# ---- MCQ letters outside A-D -----------------------------------------------------------------------------------
@pytest.mark.parametrize("text, letter, level", [
    ('Answer: B\n{"answer": "E"}', "B", 2),   # an out-of-range JSON letter is no level-1 answer
    ('{"answer": "E"}', None, None),
    ('{"answer": "F"} so C', "C", 3),
])
def test_json_letters_outside_a_to_d_do_not_count(text, letter, level):
    assert extract_letter(text) == (letter, level)


# ---- BoolQ --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("boxed, expected", [
    ("yes!", True), (r"\text{No!}", False), ("No.!", False), ("yes?", None),
])
def test_boolq_trailing_exclamation_is_punctuation(boxed, expected):
    assert parse_yes_no(boxed) is expected


# ---- the per-process cache of bundled data ---------------------------------------------------------------------
def test_bundled_rows_are_a_shared_immutable_sequence():
    """Every task reads its split from this one cached object: a caller appending to it would change every later
    split of the process."""
    from esft.tasks.common import bundled

    rows = bundled("boolq_dev.jsonl.gz")
    assert rows is bundled("boolq_dev.jsonl.gz")
    with pytest.raises(AttributeError):
        rows.append({})
