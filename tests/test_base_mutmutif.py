"""The task interface (esft.tasks.base): edge cases of loading, completion text and task names that the other task
tests leave open, found by a mutation audit of the module.

Run: PYTHONPATH=src pytest -q tests/test_base_mutmutif.py   (about 2 s; offline)
"""

from __future__ import annotations

import hashlib

import pytest

from esft.tasks import get_task
from esft.tasks.base import answer_digest, completion_text, extracted_fields, format_bonus_warning, task_name


def test_load_with_limit_zero_is_empty_and_negative_is_refused():
    task = get_task("boolq")
    assert task.load("test", limit=0) == []
    assert len(task.load("test", limit=3)) == 3
    with pytest.raises(ValueError, match="limit must be >= 0"):
        task.load("test", limit=-1)


def test_completion_text_of_what_is_no_conversation_is_its_text():
    # an empty list or a list of plain strings holds no message: its text is str() of it, never an error
    assert completion_text([]) == "[]"
    assert completion_text(["4", "5"]) == "['4', '5']"
    assert completion_text([{"role": "assistant", "content": "4"}]) == "4"
    # the last message is the completion, even when an earlier item is no message
    assert completion_text(["note", {"role": "assistant", "content": "4"}]) == "4"
    assert completion_text([{"role": "assistant", "content": "4"}, "note"]) == str([{"role": "assistant",
                                                                                    "content": "4"}, "note"])


def test_task_name_of_an_object_that_is_no_task():
    class Named:
        name = "sums"

    class Plain:
        pass

    assert task_name(Named()) == "sums"
    assert task_name(Plain()) == "Plain"  # no name: its class's, as the TaskAdapter wrapping it is named
    assert task_name(get_task("boolq")) == "boolq"


def test_aggregate_of_no_records_is_zero_accuracy():
    summary = get_task("boolq").aggregate([])
    assert summary["n"] == 0
    assert summary["accuracy"] == 0.0


def test_answer_digest_is_16_hex_digits_of_the_sha256_without_whitespace():
    expected = hashlib.sha256("x=1,y=2".encode("utf-8")).hexdigest()[:16]
    assert answer_digest(" x = 1,\n y = 2 ") == expected
    assert answer_digest(" \n\t") is None
    long = "7" * 250
    fields = extracted_fields(long)
    assert fields["extracted"] == "7" * 200 + "..."
    assert fields["extracted_digest"] == hashlib.sha256(long.encode("utf-8")).hexdigest()[:16]
    assert extracted_fields("7" * 200) == {"extracted": "7" * 200}


def test_format_bonus_warning_for_an_object_that_is_no_task_names_it():
    # a task object scored by its own `score`, with no `is_well_formed` and no `shown_name`: the warning names it
    # by its `name` (or its class's) and does not fail on what the object lacks
    class Echo:
        def score(self, completion, example):
            return 1.0

    class Named(Echo):
        name = "echo-task"

    assert "task 'Echo' checks no answer format" in format_bonus_warning(Echo(), 0.1)
    assert "task 'echo-task' checks no answer format" in format_bonus_warning(Named(), 0.1)
    assert format_bonus_warning(Echo(), 0.0) is None


def test_a_subclass_that_declares_no_format_check_gets_no_format_bonus():
    """`checks_format` may be set False by a subclass that still has an `is_well_formed` (documented on the
    property): its reward function then adds no format bonus, as `format_bonus_warning` tells the user."""
    from dataclasses import dataclass

    from esft.tasks.base import Task

    @dataclass
    class NoFormat(Task):  # a dataclass, as docs/custom-tasks.md writes a task: its `name` is the instance's
        name: str = "no-format"
        checks_format = False

        def score(self, completion, example):
            return 1.0 if completion == example["answer"] else 0.0

        def is_well_formed(self, completion, example):
            return True

    reward = NoFormat().reward_function(format_bonus=0.1)
    assert reward(["4", "5"], answer=["4", "4"]) == [1.0, 0.0]
    assert format_bonus_warning(NoFormat(), 0.1).startswith(
        "format bonus 0.1 has no effect: task 'no-format' checks no answer format")


def test_a_subclass_without_dataclass_keeps_the_fields_it_sets_as_class_attributes():
    """`class Sums(Task): name = "sums"; system_prompt = "..."` (plain Python, no @dataclass) inherits Task's
    __init__, which assigned Task's defaults over them: the name read '' and the system prompt was dropped. Values
    given to the constructor, and a dataclass subclass's own defaults, stay as given."""
    from dataclasses import dataclass

    from esft.tasks.base import Task

    class Sums(Task):
        name = "sums"
        splits = ("train", "test", "extra")
        system_prompt = "Answer with a number."

    task = Sums()
    assert (task.name, task.splits, task.system_prompt) == ("sums", ("train", "test", "extra"), "Answer with a number.")
    assert Sums(name="other", system_prompt="Be brief.").name == "other"
    assert Sums(system_prompt="Be brief.").system_prompt == "Be brief."

    @dataclass
    class Declared(Task):
        name: str = "declared"

    assert Declared().name == "declared" and Declared(name="mine").name == "mine" and Declared().system_prompt == ""
