"""Task names and options (esft.tasks): a text option converted by its field's type, option pieces continuing
the task they follow (not the first of the list), a reward regex cut at a comma anywhere in the list.

Run: PYTHONPATH=src pytest -q tests/test_tasks_mutmutmisc.py   (< 1 s)
"""

from __future__ import annotations

import pytest

from esft.tasks import get_task, split_task_list


def test_an_option_given_as_text_is_read_by_its_type():
    assert get_task("boolq", max_passage_chars="400").max_passage_chars == 400
    assert get_task("boolq", max_passage_chars=300).max_passage_chars == 300


def test_option_pieces_continue_the_task_just_before_them():
    assert split_task_list("boolq,countdown:numbers=2,ops=+") == ["boolq", "countdown:numbers=2,ops=+"]
    with pytest.raises(ValueError, match="does not follow a task name with options"):
        split_task_list("countdown:numbers=2,boolq,numbers=3")


def test_a_reward_regex_cut_at_a_comma_is_refused_after_another_task():
    with pytest.raises(ValueError, match="--reward"):
        split_task_list("countdown,data.jsonl:reward=regex:(a,b)")
