"""IFEval checkers, loose variants and aggregation: the boundaries and parameters that each instruction's
definition (module docstrings, Zhou et al. 2023) fixes and that `test_tasks_ifeval.py` leaves open.

Run: PYTHONPATH=src pytest -q tests/test_ifeval_audit.py   (about 2 s; offline)
"""

from __future__ import annotations

import pytest

from esft.tasks.ifeval import IFEvalTask, evaluate, loose_variants, missing_params
from esft.tasks.ifeval.instructions import Result, check_instruction

SECTIONS = {"section_spliter": "SECTION", "num_sections": 3}
TWO_PARAGRAPHS_FIRST = {"first_word": "weekend", "num_paragraphs": 2, "nth_paragraph": 1}
PROMPT = "Write a haiku about moms."


@pytest.mark.parametrize("instruction_id,kwargs,response,expected", [
    # keywords are matched case-insensitively
    ("keywords:existence", {"keywords": ["Cat", "DOG"]}, "the cat and the dog", True),
    ("keywords:existence", {"keywords": ["cat", "dog"]}, "the CAT and the Dog", True),
    # the letter is counted case-insensitively, on both sides
    ("keywords:letter_frequency", {"letter": "T", "let_frequency": 3, "let_relation": "at least"}, "tot t", True),
    ("keywords:letter_frequency", {"letter": "t", "let_frequency": 3, "let_relation": "at least"}, "TOT T", True),
    ("keywords:letter_frequency", {"letter": "t", "let_frequency": 3, "let_relation": "less than"}, "TOT T", False),
    # nothing to detect a language from: passes, as in the reference evaluation
    ("language:response_language", {"language": "de"}, "12345 !!! ...", True),
    # exactly N paragraphs: more than N fails as fewer does
    ("length_constraints:nth_paragraph_first_word", TWO_PARAGRAPHS_FIRST, "Weekend plans.\n\nRest.", True),
    ("length_constraints:nth_paragraph_first_word", TWO_PARAGRAPHS_FIRST, "Weekend plans.\n\nRest.\n\nMore.", False),
    # the marker "P.S." ends with a period, so the postscript must have it; "P.P.S" has none to require
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Bye.\n\nP.S. Call me.", True),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Bye.\n\nP.S Call me.", False),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Bye.\n\nP.P.S Call me.", True),
    # every one of the three fixed options is accepted
    ("detectable_format:constrained_response", {}, "My answer is yes.", True),
    ("detectable_format:constrained_response", {}, "My answer is no.", True),
    ("detectable_format:constrained_response", {}, "My answer is maybe.", True),
    ("detectable_format:constrained_response", {}, "My answer is perhaps.", False),
    # at least N sections: N-1 fails, N and N+1 pass
    ("detectable_format:multiple_sections", SECTIONS, "SECTION 1\na\nSECTION 2\nb", False),
    ("detectable_format:multiple_sections", SECTIONS, "SECTION 1\na\nSECTION 2\nb\nSECTION 3\nc", True),
    ("detectable_format:multiple_sections", SECTIONS, "SECTION 1\na\nSECTION 2\nb\nSECTION 3\nc\nSECTION 4\nd", True),
    # exactly two responses; an empty chunk is tolerated before the first or after the last separator only
    ("combination:two_responses", {}, "One.\n******\nTwo.\n******\nThree.", False),
    ("combination:two_responses", {}, "One.\n******\nTwo.\n******\n", True),
    ("combination:two_responses", {}, "******\nOne.\n******\nTwo.", True),
    ("combination:two_responses", {}, "One.\n******\n \n******\nTwo.", False),
    # the request repeated word for word, after leading blank space, case ignored
    ("combination:repeat_prompt", {"prompt_to_repeat": PROMPT}, "\n  write a haiku about moms.\nMoms...", True),
    ("combination:repeat_prompt", {"prompt_to_repeat": PROMPT}, "Write a haiku about dads.", False),
    # an enclosing quotation mark does not hide the end phrase
    ("startend:end_checker", {"end_phrase": "Peace!"}, '"We stand together. Peace!"', True),
    # a lone quotation mark wraps nothing
    ("startend:quotation", {}, '"', False),
    ("startend:quotation", {}, '""', True),
    # lowercase but not English fails; cased text with no detectable language passes (as in the reference)
    ("change_case:english_lowercase", {}, "le chat est très content et il mange du poisson tous les jours", False),
    ("change_case:english_lowercase", {}, "ⓐⓑⓒ", True),
    ("change_case:english_capital", {}, "ⒶⒷⒸ", True),
])
def test_checker_boundaries(instruction_id, kwargs, response, expected):
    assert check_instruction(instruction_id, kwargs, response) is expected


@pytest.mark.parametrize("instruction_id,kwargs,error", [
    ("keywords:letter_frequency", {"letter": "a", "let_frequency": 1, "let_relation": "about"}, ValueError),
    ("change_case:capital_word_frequency", {"capital_frequency": 1, "capital_relation": "exactly"}, ValueError),
    ("length_constraints:number_words", {"num_words": True, "relation": "at least"}, TypeError),
])
def test_bad_parameters_raise_whatever_the_response(instruction_id, kwargs, error):
    # a data bug surfaces even on a blank response, which never reaches the checker
    for response in ("", "some text"):
        with pytest.raises(error):
            check_instruction(instruction_id, kwargs, response)


def test_a_needed_parameter_set_to_none_is_missing():
    # the Hugging Face copy fills unused parameters with None; a None in a used one is a missing parameter
    assert missing_params("keywords:frequency", {"keyword": "x", "frequency": None, "relation": "at least"}) == [
        "frequency"]
    with pytest.raises(ValueError, match="lacks frequency"):
        check_instruction("keywords:frequency", {"keyword": "x", "frequency": None, "relation": "at least"}, "x")


def test_loose_variants_strip_what_is_left_after_cutting_lines():
    assert loose_variants("Sure\n  body  \nBye") == [
        "Sure\n  body  \nBye", "body  \nBye", "Sure\n  body", "body",
        "Sure\n  body  \nBye", "body  \nBye", "Sure\n  body", "body"]


def test_loose_checks_the_response_without_its_first_line():
    # only that variant has two "***" paragraphs: the first line adds one, the last line holds both, and
    # removing "*" removes the divider
    example = {"instruction_id_list": ["length_constraints:number_paragraphs"], "kwargs": [{"num_paragraphs": 2}]}
    result = evaluate("Sure ***\nOne *** Two", example)
    assert result.strict == (False,) and result.loose == (True,)


def test_prompt_level_needs_every_instruction():
    result = Result(("a", "b"), strict=(True, False), loose=(True, False))
    assert result.prompt_strict is False and result.prompt_loose is False
    # a real example: quotation fails in every variant, no-comma passes
    example = {"instruction_id_list": ["startend:quotation", "punctuation:no_comma"], "kwargs": [{}, {}]}
    result = evaluate("Not quoted at all.", example)
    assert result.strict == result.loose == (False, True)
    assert result.prompt_strict is False and result.prompt_loose is False


def test_aggregate_reads_loose_lists_and_bare_scores():
    task = IFEvalTask()
    records = [
        {"score": 0.0, "strict": [False, False], "loose": [True, False]},  # no prompt_loose: all of "loose"
        {"score": 0.0, "strict": [False, True], "loose": [True, True]},
        {"score": 1.0},  # a bare passing score: every instruction passed, strict hence loose
        {"score": 0.0},
    ]
    agg = task.aggregate(records)
    assert agg["prompt_strict"] == pytest.approx(1 / 4)
    assert agg["prompt_loose"] == pytest.approx(2 / 4)
    assert agg["n_instructions"] == 4
    assert agg["instruction_strict"] == pytest.approx(1 / 4)
    assert agg["instruction_loose"] == pytest.approx(3 / 4)


def test_a_blank_reply_is_not_well_formed():
    task = IFEvalTask()
    assert task.is_well_formed("  \n\t", {}) is False
    assert task.is_well_formed(None, {}) is False
    assert task.is_well_formed("hi", {}) is True
