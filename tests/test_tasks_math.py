"""MATH task: boxed-answer extraction, normalisation, numeric fallback, splits, prompt.

Run: pytest tests/test_tasks_math.py -q
"""

from __future__ import annotations

import time

import pytest

from esft.tasks import get_task
from esft.tasks.hendrycks_math import (
    MathTask, answers_match, hub_row_to_example, normalize_answer, parse_number, strip_unit,
)


@pytest.fixture(scope="module")
def task() -> MathTask:
    return get_task("math")


def ex(answer: str) -> dict:
    return {"problem": "...", "answer": answer}


# ---- equivalences the normaliser must find (gold, prediction) ----------------------------------------------------
@pytest.mark.parametrize("gold, pred", [
    ("\\dfrac{17}{50}", "\\frac{17}{50}"),
    ("\\dfrac{17}{50}", "0.34"),                        # numeric fallback
    ("\\frac{3}{56}", "\\tfrac{3}{56}"),
    ("\\frac43", "\\frac{4}{3}"),                        # short \frac forms
    ("\\frac9{19}", "9/19"),
    ("\\frac{270}7\\text{ degrees}", "\\frac{270}{7}"),  # units in \text{ ...}
    ("864 \\mbox{ inches}^2", "864"),
    ("15\\mbox{ cm}^2", "15 \\text{ cm}^2"),
    ("90^\\circ", "90"),
    ("90^\\circ", "90^{\\circ}"),
    ("145^\\circ", "145°"),
    ("\\$18.90", "18.90"),
    ("\\$18.90", "\\$18.9"),
    ("\\$36", "$36$"),
    ("10,\\!080", "10080"),                             # thousands separator with \!
    ("11,\\! 111,\\! 111,\\! 100", "11111111100"),
    ("58,500", "58500"),
    ("x=5", "5"),
    ("5", "x = 5"),
    ("y = 2x + 3", "2x+3"),
    ("\\text{Evelyn}", "Evelyn"),
    ("\\text{(C)}", "C"),
    ("\\text{(C)}", "(C)"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
    ("\\left[ \\frac{\\pi^2}{8}, \\frac{5 \\pi^2}{4} \\right]", "[\\frac{\\pi^2}{8},\\frac{5\\pi^2}{4}]"),
    ("11\\sqrt2", "11\\sqrt{2}"),
    ("6 - 5i", "6-5i"),
    ("-\\frac{1}{2}", "-0.5"),
    ("-\\frac{1}{2}", "\\frac{-1}{2}"),
    ("-\\frac{1}{2}", "-1/2"),
    (".35625", "0.35625"),
    ("0", "0.0"),
    ("-9", "-9."),                                       # trailing period
    ("12", "12\\%"),
    ("1/3", "0.3333333"),                                # within 1e-6
    ("284", "+284"),                                     # a leading plus sign: still the number
    ("\\frac{3}{56}", "+\\frac{3}{56}"),
    ("0.5", "+ 1/2"),
    ("1000", "+1,000"),
    ("\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}", "\\begin{pmatrix}-1&0\\\\0&-1\\end{pmatrix}"),
    ("1.85", "1.85\\ \\text{USD}"),                      # a unit of capitals (strip_unit's docstring)
    ("2.5", "2.5\\text{ US Dollars}"),                    # a unit of two capitalised words
    ("5", "5 \\text{m}"),                                  # a one-letter unit set off by a space before it
    ("5", "5\\text{ m}"),                                  # ... or inside the braces
    ("5", "5\\text{cm}"),                                  # two letters need no space
    ("1000", "1\\,000"),                                    # a thin space
    ("(1,2)", "(1,\\quad 2)"),
    ("90", "90\\degree"),
    ("5", "{5}"),                                            # one pair of outer braces
    ("12", "{12}"),
])
def test_equivalent_answers_match(task, gold, pred):
    assert task.score(f"The answer is $\\boxed{{{pred}}}$.", ex(gold)) == 1.0, (normalize_answer(gold), normalize_answer(pred))


@pytest.mark.parametrize("gold, pred", [
    ("\\frac{1}{2}", "\\frac{1}{3}"),
    ("1/3", "0.3333"),                                   # off by 3.3e-5 > 1e-6
    ("5", "-5"),
    ("-5", "+5"),
    ("-5", "+-5"),                                       # not a number
    ("5", "55"),
    ("\\sqrt{2}", "\\sqrt{3}"),
    ("\\sqrt{2}", "1.41421356"),                         # irrational gold: no numeric fallback
    ("(3,\\frac{\\pi}{2})", "(3,\\frac{\\pi}{3})"),
    ("\\text{Evelyn}", "Bob"),
    ("10", ""),
    ("0", "\\text{}"),
    ("3", "3,4"),
    ("\\begin{pmatrix} -1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} -1 & 2 \\end{pmatrix}"),  # column vs row
    ("24", "2x=4"),                                      # only a leading "x=" is a variable prefix
    ("10001", "1,0001"),                                 # not a thousands separator
])
def test_different_answers_do_not_match(task, gold, pred):
    assert task.score(f"\\boxed{{{pred}}}", ex(gold)) == 0.0


@pytest.mark.parametrize("gold, pred", [
    ("30", "{30^\\circ}"),                                 # the degree sign takes a brace only as a pair ...
    ("\\frac{180}{\\pi}", "\\frac{180^\\circ}{\\pi}"),    # ... not the closing brace of what holds it
    ("(30,60)", "(30^\\circ, 60^{\\circ})"),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{3}}2"),       # short \frac whose numerator holds braces
    ("\\frac{\\sqrt{3}}{2}", "\\dfrac{\\sqrt{3}}2"),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}2"),
    ("5", "5\\ "),                                        # a trailing control space is spacing, not a backslash
    ("5", "5 \\ "),
])
def test_degrees_braced_short_fractions_and_a_trailing_control_space_match(task, gold, pred):
    assert task.score(f"The answer is $\\boxed{{{pred}}}$.", ex(gold)) == 1.0, (normalize_answer(gold),
                                                                                 normalize_answer(pred))


def test_degree_and_short_fraction_rules_leave_other_braces_and_row_breaks_alone():
    assert normalize_answer("{30^\\circ}") == "30"
    assert normalize_answer("\\frac{180^\\circ}{\\pi}") == "\\frac{180}{\\pi}"
    assert normalize_answer("\\frac{\\sqrt{3}}{2}3") == "\\frac{\\sqrt{3}}{2}3"   # \frac{a}{b} then a digit
    assert normalize_answer("\\frac{\\sqrt{3}}2") == "\\frac{\\sqrt{3}}{2}"
    assert normalize_answer("1 \\\\ ") == "1\\\\"                                   # a trailing row break stays
    assert not answers_match("{30^\\circ", "30") and not answers_match("\\frac{\\sqrt{3}}{2}3", "\\frac{\\sqrt{3}}{2}")


def test_last_box_with_nested_braces_wins(task):
    completion = "First guess \\boxed{3}. Actually $\\boxed{\\frac{\\sqrt{3}}{2}}$."
    assert task.score(completion, ex("\\frac{\\sqrt{3}}{2}")) == 1.0
    assert task.score(completion, ex("3")) == 0.0
    assert task.details(completion, ex("3"))["extracted"] == "\\frac{\\sqrt{3}}{2}"


def test_no_box_scores_zero_and_is_not_well_formed(task):
    assert task.score("The answer is 5.", ex("5")) == 0.0
    assert not task.is_well_formed("The answer is 5.", ex("5"))
    assert not task.is_well_formed("\\boxed{ }", ex("5"))
    assert task.is_well_formed("\\boxed{5}", ex("6"))


@pytest.mark.parametrize("gold, pred, expected", [
    ("\\frac{1}{23426}", "\\frac{1}{23427}", False),      # bundled train golds: a tiny gold is not "within 1e-6"
    (".0000672", "0.000067", False),                      # of every small number
    ("-\\frac{2}{39203}", "0", False),
    ("0", "0.0000001", False),
    ("\\frac{1}{2048}", "0.00048828125", True),          # exact
    ("\\frac{1}{3}", "0.3333333", True),                  # below 1: within 1e-6 of the gold's size
    ("1000000", "1000000.0000005", True),                # from 1 up: within 1e-6
    ("1000000", "1000000.5", False),
    ("1", "1.000001", False),                             # exactly 1e-6 away: the paper's tolerance is "< 1e-6"
    ("1", "0.9999991", True),
    ("0.5", "0.5000005", False),                          # exactly 1e-6 of the gold's size
    ("0.0", "0", True),                                   # equal numbers, however written (a gold 0 included)
    ("1", "1.0000009999995", True),                       # just under 1e-6
    ("1.5", "1.5000014", False),                          # from 1 up the tolerance is 1e-6, not 1e-6 of the gold
])
def test_numeric_tolerance_is_relative_below_one(gold, pred, expected):
    assert answers_match(pred, gold) is expected


def test_parse_number():
    assert parse_number("3") == 3 and parse_number("-2.5") == -2.5 and parse_number(".5") == 0.5
    assert parse_number("\\frac{3}{4}") == 0.75 and parse_number("-\\frac{3}{4}") == -0.75
    assert parse_number("1,000,000") == 1_000_000
    assert parse_number("1/0") is None and parse_number("\\frac{1}{0}") is None
    assert parse_number("٣") is None            # non-ASCII digits are not numbers here
    assert parse_number("1" * 100) is None      # too long to bother
    assert parse_number("(1,2)") is None and parse_number("x") is None
    assert parse_number("+3") == 3 and parse_number("+\\frac{3}{4}") == 0.75 and parse_number("+.5") == 0.5
    assert parse_number("+") is None and parse_number("+-3") is None and parse_number("++3") is None


def test_size_limits_are_exact():
    """Predictions of up to 1,000 characters are read, numbers of up to 60 characters are compared numerically."""
    assert answers_match("5" + " " * 999, "5") and not answers_match("5" + " " * 1000, "5")
    assert parse_number("1" * 60) == int("1" * 60) and parse_number("1" * 61) is None


def test_many_wrappers_do_not_break_normalisation():
    # `_unwrap` stops after 64 wrappers; the rest stay as text, and the answer is still a string
    assert normalize_answer("\\text{a}" * 70) == "a" * 64 + "\\text{a}" * 6
    assert not answers_match("\\text{a}" * 70, "a" * 70)


def test_normalize_keeps_row_breaks():
    assert normalize_answer("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}") == "\\begin{pmatrix}1\\\\2\\end{pmatrix}"


def test_two_empty_answers_do_not_match():
    assert not answers_match("", "")
    assert not answers_match("\\text{ }", "")


# ---- adversarial ------------------------------------------------------------------------------------------------
ADVERSARIAL = [
    "\\boxed{" + "{" * 10_000 + "5" + "}" * 10_000 + "}",
    "\\boxed{" + "\\text{" * 5000 + "5" + "}" * 5000 + "}",
    "\\boxed{" + "9" * 100_000 + "}",
    "\\boxed{" + "1" * 500 + "}",
    "\\boxed{" * 100_000,
    "x" * 1_000_000,
    "\\boxed{5}" * 20_000,  # many boxes; the last is 5
    "\\boxed{\\frac{1}{0}}",
    "\\boxed{1/0}",
    "\\boxed{\\frac{" + "9" * 5000 + "}{7}}",
    "\\boxed{\\text{\\text{\\text{}}}}",
    "\\boxed{\\left\\right\\left}",
    "\\boxed{😀 ∞ ½}",
    "\\boxed{\x00\x01}",
    "\\boxed{1e999999}",
    "\\boxed{" + "\\!" * 50_000 + "}",
]


@pytest.mark.parametrize("completion", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_adversarial_inputs_are_fast_and_safe(task, completion):
    start = time.perf_counter()
    score = task.score(completion, ex("5"))
    task.details(completion, ex("5"))
    task.is_well_formed(completion, ex("5"))
    assert time.perf_counter() - start < 1.0
    assert score == (1.0 if completion == ADVERSARIAL[6] else 0.0)


@pytest.mark.parametrize("example, error", [
    ({}, KeyError),
    ({"problem": "p"}, KeyError),
    ({"answer": None}, TypeError),
    ({"answer": ["5"]}, TypeError),
    ({"answer": True}, TypeError),
])
def test_malformed_example_raises(task, example, error):
    # A data bug must surface, not read as a wrong answer.
    for completion in ("\\boxed{5}", "no box"):
        with pytest.raises(error):
            task.score(completion, example)
    with pytest.raises(error):
        task.details("\\boxed{5}", example)


def test_odd_completions_score_zero(task):
    assert task.score(None, ex("5")) == 0.0  # type: ignore[arg-type]
    assert task.score(5, ex("5")) == 0.0  # type: ignore[arg-type]
    assert task.score("\\boxed{5}", {"answer": 5}) == 1.0  # a numeric gold is written out


# ---- splits -----------------------------------------------------------------------------------------------------
def test_split_sizes(task):
    assert len(task.load("test")) == 500
    assert len(task.load("train")) == 200
    assert len(task.load("train_pool")) == 7498  # the 7,500 MATH train problems less the two EMPTY_GOLD


def test_splits_deterministic_disjoint_and_mixed(task):
    assert MathTask().load("train") == task.load("train")
    assert task.load("test")[0]["id"] == "test/precalculus/807.json"
    test = {r["problem"] for r in task.load("test")}
    assert not test & {r["problem"] for r in task.load("train_pool")}
    train = task.load("train")
    assert len({r["id"] for r in train}) == 200
    assert len({r["subject"] for r in train}) == 7  # the seeded sample spans both train parts' subjects


# Two train problems have an empty gold answer (their solution's last box is empty); nothing can match them, so
# train_pool leaves them out (the seeded 200 of `train` never held them: drawn from all 7,500, they stay as drawn).
EMPTY_GOLD = {"train/number_theory/7115.json", "train/number_theory/7117.json"}


def test_every_bundled_gold_answer_matches_itself(task):
    rows = task.load("test") + task.load("train_pool")
    assert len(rows) == 7998 and not EMPTY_GOLD & {r["id"] for r in rows + task.load("train")}
    assert all(task.score(f"\\boxed{{{r['answer']}}}", r) == 1.0 for r in rows)
    assert {r["id"] for r in task._source("train") if not r["answer"].strip()} == EMPTY_GOLD


@pytest.mark.parametrize("gold, pred, expected", [
    # words that join answers are content, not a unit: a hedge or a list never matches one of its items
    ("2", "2\\text{ and }3", 0.0),
    ("5", "5 \\text{ or } 7", 0.0),
    ("5", "5 \\text{ or more}", 0.0),
    ("-2 \\text{ or } -12", "-2", 0.0),                   # a train gold: its first solution alone is not enough
    ("-2 \\text{ or } -12", "-2, -12", 1.0),              # the two solutions as a list are
    ("-2 \\text{ or } -12", "-2 \\text{ or } -12", 1.0),
    ("2, 3, \\text{ and } 4", "2, 3, 4", 1.0),
    ("2, 3, \\text{ and } 4", "2, 3", 0.0),
    ("6, 8\\text{, and }10", "6, 8, 10", 1.0),
    ("-12 \\text{ or } -30", "-30", 0.0),
    # a trailing unit after a quantity is dropped, on either side
    ("12\\sqrt{13}\\text{ feet}", "12\\sqrt{13}", 1.0),
    ("164 \\pi \\mbox{ square feet}", "164\\pi", 1.0),
    ("1.85\\ \\text{USD}", "1.85", 1.0),
    ("34\\text{ sq. units}", "34", 1.0),
    ("7\\text{ hours}.", "7", 1.0),
    ("10", "10\\text{ cm}", 1.0),
    ("10", "10 \\text{cm}^2", 1.0),
    ("4\\!:\\!51\\!:\\!06 \\text{ p.m.}", "4:51:06", 1.0),
    # a wrapper that is not a unit keeps its content
    ("5", "5\\text{i}", 0.0),
    ("\\text{(C)}", "\\text{(D)}", 0.0),
    ("\\text{two lines}", "two lines", 1.0),
    ("\\text{east}", "\\text{ west}", 0.0),
])
def test_units_are_stripped_only_where_they_are_units(task, gold, pred, expected):
    assert task.score(f"\\boxed{{{pred}}}", ex(gold)) == expected, (normalize_answer(gold), normalize_answer(pred))


@pytest.mark.parametrize("answer, stripped", [
    ("15\\mbox{ cm}^2", "15"),
    ("864 \\mbox{ inches}^2", "864"),
    ("\\frac{11}{15}\\text{ days}", "\\frac{11}{15}"),
    ("2\\text{ and }3", "2\\text{ and }3"),
    ("\\text{ east}", "\\text{ east}"),          # no quantity before it
    ("\\text{A5}_{11}", "\\text{A5}_{11}"),      # not at the end
    ("5\\text{i}", "5\\text{i}"),                 # one letter glued to the number: a symbol, not a unit
    ("x \\text{ cm}", "x \\text{ cm}"),           # not after a number
])
def test_strip_unit(answer, stripped):
    assert strip_unit(answer) == stripped


# ---- prompt and hub mapping -------------------------------------------------------------------------------------
def test_prompt_states_the_format(task):
    msgs = task.prompt(task.load("test")[0])
    assert msgs[0]["role"] == "system" and "\\boxed{" in msgs[0]["content"]
    assert msgs[1] == {"role": "user", "content": task.load("test")[0]["problem"]}


def test_hub_row_mapping():
    row = {"problem": "p", "solution": "s", "answer": "3", "subject": "Algebra", "level": 2, "unique_id": "test/a/1.json"}
    assert hub_row_to_example(row, 0) == {"id": "test/a/1.json", "problem": "p", "answer": "3",
                                          "subject": "Algebra", "level": 2}
    # hendrycks_math-style mirrors have no `answer`: it comes from the last box of the solution
    row = {"problem": "p", "solution": "so $\\boxed{\\frac{1}{2}}$", "type": "Geometry", "level": "Level 3"}
    assert hub_row_to_example(row, 4) == {"id": "hf/4", "problem": "p", "answer": "\\frac{1}{2}",
                                          "subject": "Geometry", "level": "Level 3"}


def test_an_unclosed_wrapper_keeps_the_rest_of_the_answer():
    # `\text{5` has no closing brace: its content runs to the end of the answer (no IndexError past the end)
    assert normalize_answer("\\text{5") == "5"
    assert normalize_answer("x=\\mathrm{12") == "12"
    assert answers_match("5", "\\text{5")


def test_an_empty_pair_of_braces_is_no_answer():
    # outer braces are dropped, so `{}` is the empty answer, and two empty answers do not match
    assert normalize_answer("{}") == ""
    assert normalize_answer("{7}") == "7"
    assert not answers_match("{}", "{}")


def test_a_wrapper_keeps_its_nested_braces():
    # the wrapper ends at its own closing brace, not at the first `}` inside it
    assert normalize_answer("\\text{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert answers_match("\\mathrm{\\frac{1}{2}}", "0.5")


# ---- the constant-answer baseline ------------------------------------------------------------------------------
def test_constant_baseline_counts_gold_answers_the_scorer_reads_as_one(task):
    """Always answering 1/2 scores on the golds "\\frac12", "0.5" and "\\dfrac{1}{2}" alike: the baseline is that
    constant's accuracy (3 of 5), not the share of the most frequent gold *string* ("3", 2 of 5)."""
    examples = [ex(g) for g in ("3", "3", "\\frac12", "0.5", "\\dfrac{1}{2}")]
    baseline = task.constant_baseline([{"index": i, "example": e} for i, e in enumerate(examples)])
    assert baseline["constant_baseline"] == pytest.approx(0.6)
    answer = baseline["constant_answer"]
    assert sum(task.score(f"\\boxed{{{answer}}}", e) for e in examples) / len(examples) == pytest.approx(0.6)
    assert task.gold_key(ex("x=5")) == task.gold_key(ex("5")) and task.gold_key(ex("")) is None
    assert task.gold_key(ex(" \\$ ")) == "\\$"  # no canonical form: its text, so the baseline is still counted
