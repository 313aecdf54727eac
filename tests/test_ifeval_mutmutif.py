"""IFEval checkers and counters: known values from the instruction definitions (Zhou et al. 2023, the reference
evaluation's checkers) that the other IFEval tests leave open, found by a mutation audit of
`esft.tasks.ifeval.checkers` and `esft.tasks.ifeval.text`.

Run: PYTHONPATH=src pytest -q tests/test_ifeval_mutmutif.py   (a few seconds; offline)
"""

from __future__ import annotations

import pytest

from esft.tasks.ifeval.instructions import check_instruction
from esft.tasks.ifeval.text import count_capital_words


@pytest.mark.parametrize("instruction_id,kwargs,response,expected", [
    # "P.P.S" is p, p and s with a period after each of the first two: "P.P." alone is no such postscript
    # (the reference's pattern is `\s*p\.\s?p\.\s?s.*$`)
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Bye.\n\nP.P. Call me.", False),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Bye.\n\nP. P. S. Call me.", True),
    # both ends must be a quotation mark, not just one of them
    ("startend:quotation", {}, '"We stand together.', False),
    ("startend:quotation", {}, 'We stand together."', False),
    ("startend:quotation", {}, '  "We stand together."  ', True),
])
def test_checker_known_values(instruction_id, kwargs, response, expected):
    assert check_instruction(instruction_id, kwargs, response) is expected


def test_capital_words_stop_at_the_threshold_across_pieces():
    # Text long enough to be tokenised in several pieces (about 4,096 characters each): the count with `stop` is
    # min(full count, stop) even when the count reaches `stop` exactly at the end of a piece.
    first = "NASA and ESA " + "plain words here " * 300  # two capital words in the first piece
    text = first + "\n" + "USA UK EU " * 50  # 150 more in the next piece
    full = count_capital_words(text)
    assert full == 152
    for stop in (1, 2, 3, 151, 152, 153, 1000):
        assert count_capital_words(text, stop) == min(full, stop), stop
