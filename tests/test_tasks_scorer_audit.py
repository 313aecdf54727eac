"""Scorer and user-task cases found by an audit of esft.tasks: each failed before its fix.

Run: pytest tests/test_tasks_scorer_audit.py -q
"""

from __future__ import annotations

import pytest

from esft.tasks.boolq import parse_yes_no
from esft.tasks.mcq import extract_letter


# ---- multiple choice: a letter glued to a unit or formula sign is part of it, not an answer ----------------------
@pytest.mark.parametrize("text, letter", [
    ("The answer is B.\nThe reaction is run at 25 °C.", "B"),          # degree Celsius
    ("The answer is B, since it boils at 100°C", "B"),
    ("So the answer is D. Benzene is C₆H₆.", "D"),                       # a subscript digit after the letter
    ("The answer is A: diborane, B₂H₆, is electron deficient.", "A"),
    ("So D: the ¹³C NMR spectrum shows four peaks", "D"),               # a superscript digit before it
    ("I pick A; the ion is B³⁺", "A"),
    ("B is right: it draws 5 µA", "B"),                                 # a micro sign before it
])
def test_a_letter_glued_to_a_unit_or_formula_sign_is_no_answer(text, letter):
    # ASCII digits already glue a letter into a formula ("C6H6", "13C", "H2O" contribute nothing); their superscript
    # and subscript forms and the degree sign made the C of "°C" or "C₆H₆" the last standalone letter
    assert extract_letter(text) == (letter, 3)


@pytest.mark.parametrize("text, letter", [
    ("At 25 °C the answer is C", "C"),
    ("C₆H₆ is benzene, so (B)", "B"),
    ("The answer is C.", "C"),
])
def test_a_letter_beside_such_a_sign_elsewhere_still_counts(text, letter):
    assert extract_letter(text) == (letter, 3)


# ---- BoolQ: a wrapper and trailing punctuation together ------------------------------------------------------------
@pytest.mark.parametrize("boxed, label", [
    ("\\text{Yes}.", True),
    ("\\textbf{No}!", False),
    (" \\text{yes} . ", True),
    ("\\text{Yes.}", True),        # already read before
    ("\\text{maybe}.", None),
])
def test_boolq_reads_a_wrapped_answer_with_a_full_stop_after_the_wrapper(boxed, label):
    # the docstring: a \text{...}-style wrapper and trailing punctuation inside the box are ignored; with the full
    # stop after the wrapper's brace the wrapper was not recognised and the answer read as none
    assert parse_yes_no(boxed) is label
