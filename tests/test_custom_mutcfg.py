"""Task strings and task objects from outside the registry (esft.tasks.custom), pinned where a mutation audit found
them untested."""

from __future__ import annotations

import sys

import pytest

from esft.tasks.custom import TaskAdapter, _import_path, split_options


@pytest.mark.parametrize("spec, parts", [
    ("owner/ds", ("owner/ds", "")),
    ("owner/ds:prompt_field=q", ("owner/ds", "prompt_field=q")),
    ("owner/ds:main:prompt_field=q,answer_field=a", ("owner/ds:main", "prompt_field=q,answer_field=a")),
    ("owner/ds:main", ("owner/ds:main", "")),  # a hub config has no '='
    ("data.jsonl:reward=regex:(a|b)", ("data.jsonl", "reward=regex:(a|b)")),
])
def test_a_hub_dataset_name_keeps_its_config_and_its_options_begin_at_the_first_key_value(spec, parts):
    assert split_options(spec) == parts


class _Labelled:
    def load(self, split):
        return [{"q": "x", "a": "yes"}]

    def prompt(self, example):
        return example["q"]

    def score(self, completion, example):
        return 1.0

    def label_set(self):
        return ("no", "yes")


class _OwnAnswers(_Labelled):
    def answer_labels(self):
        return ("yes",)


class _BalancedElsewhere(_Labelled):
    def balance_key(self, example):
        return "+"


@pytest.mark.parametrize("obj, labels", [(_Labelled(), ("no", "yes")), (_OwnAnswers(), ("yes",)),
                                         (_BalancedElsewhere(), None)])
def test_a_task_objects_answer_labels(obj, labels):
    """An object's own answer_labels win; else its label set, unless it balances over something of its own (then
    its labels are not answers a guess could give: no chance curve)."""
    assert TaskAdapter(obj).answer_labels() == labels


def test_a_reward_function_of_a_script_is_not_recorded_by_an_import_path(monkeypatch):
    """A function of the script's __main__ imports there, but config.yaml read by another process (a resume, a Ray
    worker) cannot import it: it has no import path to record."""
    def reward(completions, **kwargs):
        return [0.0] * len(completions)

    reward.__module__, reward.__qualname__ = "__main__", "audit_reward"
    monkeypatch.setattr(sys.modules["__main__"], "audit_reward", reward, raising=False)
    assert _import_path(reward) is None


@pytest.mark.parametrize("text", ["prompt_field", "=q", "prompt_field=", "prompt_field=q,answer_field"])
def test_an_option_without_its_key_its_value_or_its_equals_sign_is_refused(text):
    """Each option of `data.jsonl:key=value,...` needs all three parts: a lone word, `=q` or `key=` is a typo, and
    a default used in its place would go unnoticed."""
    from esft.tasks.custom import parse_options

    with pytest.raises(ValueError, match=r"is not key=value"):
        parse_options(f"data.jsonl:{text}", text)
    assert parse_options("data.jsonl:Prompt_Field = q ", "Prompt_Field = q ") == {"prompt_field": "q"}


def test_a_task_objects_balance_key_is_its_own_else_its_gold_label():
    example = {"q": "x", "a": "yes", "answer": "yes"}
    assert TaskAdapter(_BalancedElsewhere()).balance_key(example) == "+"
    plain = TaskAdapter(_Labelled())
    assert plain.balance_key(example) == plain.gold_key(example)


def _dataclass_task():
    import dataclasses

    @dataclasses.dataclass
    class Words(_Labelled):
        words: list = dataclasses.field(default_factory=lambda: ["a"])
        pair: tuple = (1, 2)

    return Words


def test_a_dataclass_tasks_record_leaves_out_values_equal_to_their_default_factorys():
    """A field left at its default_factory's value is not recorded (the class rebuilds it); a changed one is."""
    from esft.tasks.task_values import constructor_values as _constructor_values

    Words = _dataclass_task()
    assert _constructor_values(Words()) == {}
    assert _constructor_values(Words(words=["b"])) == {"words": ["b"]}


def test_yaml_lists_become_tuples_only_for_tuple_fields():
    """config.yaml holds a tuple as a list: building the task again gives a tuple field its tuple back, and leaves
    a list field's list a list."""
    from esft.tasks.custom import instantiate

    task = instantiate(_dataclass_task(), "words", {"words": ["x", "y"], "pair": [3, 4]})
    assert task.obj.words == ["x", "y"] and task.obj.pair == (3, 4)


def test_a_script_class_has_no_task_spec():
    """A task object of a class defined in the script (__main__) cannot be rebuilt from config.yaml elsewhere."""
    from esft.tasks.custom import task_spec

    class Scripted(_Labelled):
        pass

    Scripted.__module__ = "__main__"
    assert task_spec(Scripted()) is None


@pytest.mark.parametrize("value", [{"f": len}, {"k": [1, object()]}, {1: "a"}])
def test_a_mapping_holding_what_yaml_cannot_hold_is_not_recorded(value):
    """A constructor value that is a mapping is recorded only when every key is text and every value is plain."""
    from esft.tasks.task_values import recordable as _recordable

    assert _recordable(value) == "<not recorded: dict>"
    assert _recordable({"k": [1, "a", None]}) == {"k": [1, "a", None]}


@pytest.mark.parametrize("key", ["split_seed", "test_size", "prompt_field", "reward"])
def test_a_data_task_option_that_may_not_be_none_refuses_null(tmp_path, monkeypatch, key):
    """`task_options: {split_seed: null}` drew the held-out rows with an unseeded shuffle: another split in every
    process (training, `esft eval`, a resume), so held-out rows were trained on. An option whose type has no None
    refuses null; one that has (test_file; system_prompt, None for none) takes it."""
    import json

    from esft.tasks import get_task

    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"q": f"{i}+{i}?", "answer": str(2 * i)}) + "\n"
                                              for i in range(6)))
    with pytest.raises(ValueError, match=rf"option '{key}' may not be null"):
        get_task("d.jsonl", **{"prompt_field": "q", key: None})
    assert get_task("d.jsonl", prompt_field="q", test_file=None).load("test")
    assert get_task("d.jsonl", prompt_field="q", system_prompt=None).system_prompt is None  # as before: no system turn
