"""IFEval checkers on hand-made responses whose verdicts follow from the published checkers' semantics
(google-research `instruction_following_eval`): the counting rules, relation boundaries and the loose variants
that the other IFEval tests do not pin down.

Run: PYTHONPATH=src pytest -q tests/test_ifeval_reference_cases.py   (a few seconds; offline)
"""

from __future__ import annotations

import pytest

from esft.tasks.ifeval import evaluate
from esft.tasks.ifeval.instructions import check_instruction
from esft.tasks.ifeval.text import count_sentences, count_words

WORDS_LT_4 = {"relation": "less than", "num_words": 4}
WORDS_AL_4 = {"relation": "at least", "num_words": 4}
SENT_LT_2 = {"relation": "less than", "num_sentences": 2}
CAPS_LT_2 = {"capital_relation": "less than", "capital_frequency": 2}
LETTER_LT_3 = {"letter": "e", "let_relation": "less than", "let_frequency": 3}


@pytest.mark.parametrize("text,words", [
    ("don't", 2),  # words are runs of word characters: "don", "t"
    ("state-of-the-art", 4),
    ("snake_case 42", 2),  # "_" and digits are word characters
    ("*** --- !!!", 0),
])
def test_words_are_runs_of_word_characters(text, words):
    assert count_words(text) == words


@pytest.mark.parametrize("text,sentences", [
    ("I went home. \u201c", 1),  # a lone opening curly quote after the last sentence is realigned onto it
    ("Hi. \u201cYes.\u201d No.", 3),
    ("Line one\nline two.", 1),  # a line break alone ends no sentence
])
def test_sentences_as_the_reference_tokenizer_counts_them(text, sentences):
    assert count_sentences(text) == sentences


@pytest.mark.parametrize("instruction_id,kwargs,response,expected", [
    # "less than N" fails at exactly N, "at least N" passes at exactly N
    ("length_constraints:number_words", WORDS_LT_4, "one two three", True),
    ("length_constraints:number_words", WORDS_LT_4, "one two three four", False),
    ("length_constraints:number_words", WORDS_AL_4, "don't stop me", True),  # don, t, stop, me
    ("length_constraints:number_sentences", SENT_LT_2, "One sentence only.", True),
    ("length_constraints:number_sentences", SENT_LT_2, "One. Two.", False),
    ("change_case:capital_word_frequency", CAPS_LT_2, "Only NASA shouts.", True),
    ("change_case:capital_word_frequency", CAPS_LT_2, "NASA and ESA shout.", False),
    ("keywords:letter_frequency", LETTER_LT_3, "tree", True),
    ("keywords:letter_frequency", LETTER_LT_3, "Eerie", False),
    # keyword frequency counts substrings; forbidden words need word boundaries ("-" is one, "s" is not)
    ("keywords:frequency", {"keyword": "cat", "relation": "at least", "frequency": 2}, "A cat concatenates.", True),
    ("keywords:forbidden_words", {"forbidden_words": ["rock"]}, "Rocks are hard.", True),
    ("keywords:forbidden_words", {"forbidden_words": ["rock"]}, "A rock-solid plan.", False),
    # a placeholder ends at the first "]" on its line
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "[a [b] c]", False),
    ("detectable_content:number_placeholders", {"num_placeholders": 1}, "[name\n]", False),
    # every line starting with "-" counts as a bullet, a markdown rule "---" too; "**bold**" lines do not
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "Intro\n---\n  * one\n**Bold** end", True),
    # "**x**" is one highlight (the single-star scan sees only empty pairs), "*x* *y*" two
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "**Bold** text", False),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*x* and *y*", True),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 1}, "* *", False),
    # the section splitter may be followed by a space or not, and by any number
    ("detectable_format:multiple_sections", {"section_spliter": "Day", "num_sections": 2}, "Day1: a\nDay 7: b", True),
    # "***" dividers: surrounding blank space is part of the divider
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "One ***Two", True),
    ("detectable_format:json_format", {}, "```\n[1, 2]\n```", True),
    ("detectable_format:json_format", {}, "null", True),
    # a title runs from the first "<<" of a line to its last ">>"
    ("detectable_format:title", {}, "<<  >>", False),
    ("detectable_format:title", {}, "<<  >> and <<>>", True),
    ("detectable_format:title", {}, "<<<Title>>>", True),
    ("combination:two_responses", {}, "Same.\n******\n  Same.  ", False),
    ("startend:end_checker", {"end_phrase": "Peace!"}, "We stand together. peace!\n\n", True),
    ("punctuation:no_comma", {}, "Full-width \uff0c is no ASCII comma.", True),
])
def test_reference_verdicts(instruction_id, kwargs, response, expected):
    assert check_instruction(instruction_id, kwargs, response) is expected


def test_loose_tries_the_response_without_both_lines_and_stars():
    # only the last variant (first and last line removed, then "*" removed) is a quoted text
    example = {"instruction_id_list": ["startend:quotation"], "kwargs": [{}]}
    result = evaluate('Sure\n"Quoted"**\nBye', example)
    assert result.strict == (False,) and result.loose == (True,)
