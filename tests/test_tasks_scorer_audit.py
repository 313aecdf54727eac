"""Scorer and user-task cases found by an audit of esft.tasks: each failed before its fix.

Run: pytest tests/test_tasks_scorer_audit.py -q
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from esft.config import ConfigError
from esft.tasks import Task
from esft.tasks.boolq import parse_yes_no
from esft.tasks.mcq import extract_letter
from esft.validation import check_splits


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


@pytest.mark.parametrize("text, found", [
    ("Answer: C₆H₆", (None, None)),       # a formula after "answer:" names no letter ...
    ("Answer: C6H6", (None, None)),                 # ... as its ASCII spelling names none
    ("Answer: C₆H₆, which is option B", ("B", 3)),
    ("Answer: C", ("C", 2)),
])
def test_a_formula_after_answer_is_no_answer_letter_either(text, found):
    assert extract_letter(text) == found


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


# ---- a user's task: its optional methods are tried before any model loads -----------------------------------------
@dataclass
class _Sums(Task):
    name: str = "sums"

    def _load(self, split):
        return [{"q": "1 + 1", "gold": "2"}]

    def prompt(self, example):
        return [{"role": "user", "content": example["q"]}]

    def score(self, completion, example):
        return float(example["gold"] in completion)


class _FormatReadsAMissingField(_Sums):
    def is_well_formed(self, completion, example):
        return example["answer"] in completion


class _FormatNeedsAWord(_Sums):
    def is_well_formed(self, completion, example):
        return completion.split()[-1].isdigit()


class _DetailsReadAMissingField(_Sums):
    def details(self, completion, example):
        return {"gold": example["answer"]}


class _DetailsNotADict(_Sums):
    def details(self, completion, example):
        return "no box"


class _GoldKeyReadsAMissingField(_Sums):
    def gold_key(self, example):
        return example["label"]


class _GoldKeyAList(_Sums):
    def gold_key(self, example):
        return [example["gold"]]


@pytest.mark.parametrize("cls, words", [
    (_FormatReadsAMissingField, r"is_well_formed raised KeyError: 'answer'"),
    (_FormatNeedsAWord, r"is_well_formed takes its first test example and an empty completion .*IndexError"),
    (_DetailsReadAMissingField, r"details raised KeyError: 'answer'"),
    (_DetailsNotADict, r"details\(completion, example\) returns a dict .*returned str 'no box'"),
    (_GoldKeyReadsAMissingField, r"gold_key raised KeyError: 'label'"),
    (_GoldKeyAList, r"gold_key\(example\) returns a hashable value .*returned list \['2'\]"),
])
def test_optional_methods_that_fail_on_the_first_example_are_refused_before_the_model_loads(cls, words):
    # every completion's record calls is_well_formed and details, and the held-out evaluation's constant-answer
    # baseline calls gold_key on each example: such an error ended a run after the model had loaded and generated
    with pytest.raises(ConfigError, match=words):
        check_splits("task", "m:C", cls(), ("test",))


def test_a_task_whose_optional_methods_take_the_first_example_passes():
    class Fine(_Sums):
        def is_well_formed(self, completion, example):
            return bool(completion.strip())

        def details(self, completion, example):
            return {"gold": example["gold"]}

        def gold_key(self, example):
            return example["gold"]

    assert check_splits("task", "m:C", Fine(), ("train", "test")) == {"train": 1, "test": 1}


# ---- a task list: a data file in a folder whose name holds '=' --------------------------------------------------
def test_a_data_file_whose_folder_name_holds_an_equals_sign_is_a_task_of_its_own(tmp_path):
    # sweep folders are often named key=value; the list read any piece with '=' before its first ':' as an option
    # of the task before it: the file alone was refused, after boolq too, and after a task with options it became
    # that task's unknown option
    from esft.tasks import get_task, split_task_list

    folder = tmp_path / "lr=0.1"
    folder.mkdir()
    data = folder / "sums.jsonl"
    data.write_text("".join(f'{{"question": "{i} + {i}?", "answer": "{2 * i}"}}\n' for i in range(10)))
    assert split_task_list(str(data)) == [str(data)]
    assert split_task_list(f"boolq,{data}:prompt_field=question,reward=math") == [
        "boolq", f"{data}:prompt_field=question,reward=math"]
    assert split_task_list(f"countdown:numbers=2,ops=+,{data},mmlu") == [
        "countdown:numbers=2,ops=+", str(data), "mmlu"]
    assert split_task_list(["countdown:numbers=2", "ops = +*", "boolq"]) == ["countdown:numbers=2,ops = +*", "boolq"]
    task = get_task(split_task_list(f"boolq,{data}:prompt_field=question,reward=math")[1])
    assert task.score("\\boxed{4}", {"question": "2 + 2?", "answer": "4"}) == 1.0
