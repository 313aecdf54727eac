"""BoolQ task: boxed yes/no scoring, splits carved from dev, prompt with the format in the user turn.

Run: pytest tests/test_tasks_boolq.py -q
"""

from __future__ import annotations

import time

import pytest

from esft.tasks import get_task
from esft.tasks.boolq import BoolQTask, gold_label, hub_row_to_example, parse_yes_no, truncate_passage

YES = {"question": "is the sky blue", "title": "Sky", "passage": "The sky is blue.", "answer": True}
NO = dict(YES, answer=False)


@pytest.fixture(scope="module")
def task() -> BoolQTask:
    return get_task("boolq")


@pytest.mark.parametrize("boxed, value", [
    ("yes", True), ("Yes", True), ("YES", True), (" yes ", True), ("true", True), ("True", True), ("1", True),
    ("no", False), ("No", False), ("false", False), ("FALSE", False), ("0", False),
    ("\\text{yes}", True), ("\\textbf{No}", False), ("yes.", True),
    ("maybe", None), ("yes or no", None), ("y", None), ("", None), ("2", None), ("oui", None),
    ("yes, because", None), ("\\text{yes} \\text{no}", None), ("{yes}", None), ("yes" * 100, None),
    ("\\text{yes} indeed", None),                       # the wrapper must hold the whole box
    (" " * 97 + "yes", True), (" " * 98 + "yes", None),  # boxes of up to 100 characters are read
])
def test_parse_yes_no(boxed, value):
    assert parse_yes_no(boxed) is value


@pytest.mark.parametrize("completion, gold, score", [
    ("The passage says so. \\boxed{yes}", YES, 1.0),
    ("\\boxed{Yes}", YES, 1.0),
    ("\\boxed{no}", YES, 0.0),
    ("\\boxed{no}", NO, 1.0),
    ("\\boxed{false}", NO, 1.0),
    ("\\boxed{yes} ... wait, actually \\boxed{no}", NO, 1.0),   # last box wins
    ("\\boxed{no} ... wait, actually \\boxed{yes}", NO, 0.0),
    ("Yes.", YES, 0.0),                                          # unboxed answers do not count
    ("\\boxed{yes", YES, 0.0),
    ("\\boxed{\\boxed{yes}}", YES, 1.0),
    ("\\boxed{maybe}", NO, 0.0),
    ("\\boxed{yes}", dict(YES, answer="yes"), 1.0),               # string gold labels are understood
    ("\\boxed{yes}", dict(YES, answer="False"), 0.0),
])
def test_score(task, completion, gold, score):
    assert task.score(completion, gold) == score


@pytest.mark.parametrize("boxed, value", [
    ("**yes**", True), ("**No**", False), ("*yes*", True), ("__no__", False), ("***Yes***", True),
    ("**Yes.**", True), ("**no**.", False), ("\\text{**Yes**}", True), ("**\\text{No}**", False),
    ("**maybe**", None), ("**yes", None), ("**yes*", None), ("**yes** or **no**", None), ("****", None),
])
def test_markdown_emphasis_around_the_answer_is_ignored(boxed, value):
    assert parse_yes_no(boxed) is value


def test_a_bold_boxed_answer_scores_as_its_word(task):
    assert task.score("So the answer is \\boxed{**yes**}", YES) == 1.0
    assert task.score("\\boxed{**No**}", NO) == 1.0 and task.score("\\boxed{**No**}", YES) == 0.0
    assert task.details("\\boxed{**No**}", YES) == {"extracted": "no", "boxed": "**No**"}


def test_well_formed_and_details(task):
    assert task.is_well_formed("\\boxed{No}", YES)
    assert not task.is_well_formed("\\boxed{maybe}", YES) and not task.is_well_formed("no", YES)
    assert task.details("\\boxed{TRUE}", YES) == {"extracted": "yes", "boxed": "TRUE"}
    assert task.details("nothing", YES) == {"extracted": None, "boxed": None}


@pytest.mark.parametrize("completion", [
    "\\boxed{" + "y" * 1_000_000 + "}",
    "\\boxed{" * 100_000,
    "x" * 1_000_000,
    "\\boxed{" + "{" * 10_000 + "yes" + "}" * 10_000 + "}",
    "\\boxed{\x00yes}",
    "\\boxed{ｙｅｓ}",
])
def test_adversarial_inputs_are_fast_and_zero(task, completion):
    start = time.perf_counter()
    assert task.score(completion, YES) == 0.0
    task.details(completion, YES)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("example, error", [
    ({}, KeyError),
    ({"question": "q", "passage": "p"}, KeyError),
    ({"answer": None}, ValueError),
    ({"answer": "maybe"}, ValueError),
    ({"answer": 2}, ValueError),
    ({"answer": [True]}, ValueError),
])
def test_malformed_example_raises(task, example, error):
    # A data bug must surface, not read as a wrong answer.
    for completion in ("\\boxed{yes}", "no box at all"):
        with pytest.raises(error):
            task.score(completion, example)


@pytest.mark.parametrize("answer, label", [(True, True), (False, False), (1, True), (0, False), ("Yes", True),
                                           ("false", False)])
def test_gold_labels_that_are_understood(task, answer, label):
    assert gold_label(answer) is label
    assert task.score("\\boxed{yes}", {"answer": answer}) == (1.0 if label else 0.0)
    assert task.score("\\boxed{no}", {"answer": answer}) == (0.0 if label else 1.0)
    assert task.score("\\boxed{maybe}", {"answer": answer}) == 0.0


# ---- splits -------------------------------------------------------------------------------------------------------
def test_split_sizes(task):
    assert len(task.load("test")) == 2000
    assert len(task.load("train")) == 200
    assert len(task.load("train_pool")) == 1270


def test_splits_deterministic_and_disjoint(task):
    test = task.load("test")
    assert [r["id"] for r in test[:2]] == ["dev/0", "dev/1"] and test[-1]["id"] == "dev/1999"
    train = task.load("train")
    assert [r["id"] for r in BoolQTask().load("train")] == [r["id"] for r in train]
    assert train[0]["id"] == "dev/2228"  # pinned: random.Random(42) sample of dev[2000:]
    assert not {r["id"] for r in train} & {r["id"] for r in test}
    assert {r["id"] for r in train} <= {r["id"] for r in task.load("train_pool")}
    assert 0.5 < sum(r["answer"] for r in test) / 2000 < 0.75  # the known ~62% yes rate
    assert all(isinstance(r["answer"], bool) for r in train)


# ---- prompt -----------------------------------------------------------------------------------------------------
def test_prompt_states_the_format_in_system_and_user_turn(task):
    system, user = task.prompt(YES)
    assert "\\boxed{yes}" in system["content"] and "\\boxed{no}" in system["content"]
    assert user["content"].endswith("Answer with \\boxed{yes} or \\boxed{no}.")
    assert "Question: Is the sky blue?" in user["content"]
    assert "Passage: The sky is blue." in user["content"] and "Title: Sky" in user["content"]


def test_truncate_passage():
    text = "alpha beta gamma delta"
    assert truncate_passage(text, None) == text
    assert truncate_passage(text, 100) == text
    assert truncate_passage(text, 13) == "alpha beta ..."      # never cuts a word in half
    assert truncate_passage(text, 3) == "alp ..."             # a single long word is cut
    assert truncate_passage("a" * 500, 400) == "a" * 400 + " ..."


def test_max_passage_chars_option():
    short = get_task("boolq", max_passage_chars=400)
    ex = short.load("test")[0]
    assert len(ex["passage"]) > 400  # data untouched; only the prompt is cut
    user = short.prompt(ex)[1]["content"]
    passage = user.split("Passage: ", 1)[1].split("\n\nQuestion:", 1)[0]
    assert passage.endswith(" ...") and len(passage) <= 404
    assert ex["passage"].startswith(passage[:-4])
    with pytest.raises(ValueError):
        BoolQTask(max_passage_chars=0)


def test_hub_row_mapping():
    row = {"question": "is it", "answer": True, "passage": "p"}
    assert hub_row_to_example(row, 3) == {"id": "hf/3", "question": "is it", "title": "", "passage": "p",
                                          "answer": True}


@pytest.mark.parametrize("answer, label", [("False", False), ("false", False), ("no", False), (0, False),
                                           ("True", True), (1, True)])
def test_hub_answer_given_as_text_or_number_keeps_its_label(answer, label):
    row = {"question": "is it", "answer": answer, "passage": "p"}
    assert hub_row_to_example(row, 0)["answer"] is label


def test_hub_answer_that_is_not_yes_or_no_is_refused():
    with pytest.raises(ValueError, match="not yes/no"):
        hub_row_to_example({"question": "is it", "answer": "maybe", "passage": "p"}, 0)


def test_aggregate_reports_box_rate_and_majority_baseline(task):
    examples = [YES, YES, YES, NO]
    completions = ["\\boxed{yes}", "\\boxed{yes}", "no box", "\\boxed{yes}"]
    records = []
    for c, ex in zip(completions, examples):
        rec = {"score": task.score(c, ex), "well_formed": task.is_well_formed(c, ex), "example": ex}
        rec.update(task.details(c, ex))
        records.append(rec)
    summary = task.aggregate(records)
    assert summary["accuracy"] == 0.5 and summary["format_rate"] == 0.75
    assert summary["boxed_rate"] == 0.75
    assert summary["accuracy_among_boxed"] == pytest.approx(2 / 3)
    assert summary["yes_rate_among_boxed"] == 1.0   # an all-"yes" model shows up here
    assert summary["majority_baseline"] == 0.75
    bare = task.aggregate([{"score": 0.0}])           # records without details still aggregate
    assert bare["boxed_rate"] == 0.0 and bare["accuracy_among_boxed"] is None and "majority_baseline" not in bare


def test_truncate_passage_cuts_at_a_space_right_after_the_first_word():
    assert truncate_passage("a bcdefgh", 5) == "a ..."   # cut "a bcd": the space at index 1 is a word boundary


def test_majority_baseline_is_the_larger_class_also_when_it_is_no(task):
    records = [{"score": 0.0, "example": ex} for ex in (YES, NO, NO, NO)]
    assert task.aggregate(records)["majority_baseline"] == 0.75   # always "no": 3 of 4


def test_majority_baseline_needs_every_records_gold_answer(task):
    # one record without its example: the baseline of a part of the records would be misleading, so none is given
    records = [{"score": 0.0, "example": YES}, {"score": 0.0, "example": NO}, {"score": 1.0}]
    assert "majority_baseline" not in task.aggregate(records)


def test_details_shows_a_long_box_cut_at_100_characters(task):
    assert task.details("\\boxed{" + "x" * 100 + "}", YES)["boxed"] == "x" * 100           # 100: shown whole
    assert task.details("\\boxed{" + "x" * 101 + "}", YES)["boxed"] == "x" * 100 + "..."   # 101: cut, marked
