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
