"""Mutation audit of the "bring your own task" path (esft.tasks.custom, esft.tasks.dataset_task): each test pins a
rule that a small change to the code left unnoticed by the other tests (an option given twice, an object given
options, an object that cannot score, ...)."""

from __future__ import annotations

import json

import pytest

from conftest import importable_module
from esft.tasks import get_task

OBJECTS = '''
class Echo:
    def load(self, split):
        return [{"q": f"say {i}", "a": str(i)} for i in range(4)]
    def prompt(self, example):
        return example["q"]
    def score(self, completion, example):
        return float(example["a"] in completion)

class NoScore:
    def load(self, split):
        return [{"q": "x"}]
    def prompt(self, example):
        return example["q"]

ECHO = Echo()
'''


@pytest.fixture()
def data(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(10)))
    return path


@pytest.fixture()
def objects(tmp_path, monkeypatch):
    importable_module(tmp_path, monkeypatch, "audit_task_objects", OBJECTS)
    return "audit_task_objects"


def test_a_data_task_option_in_the_name_and_as_an_option_is_an_error(data):
    with pytest.raises(ValueError, match="'prompt_field' is set in the name and as an option"):
        get_task(f"{data}:prompt_field=question", prompt_field="answer")


def test_a_task_object_takes_no_options(objects):
    assert get_task(f"{objects}:ECHO").score("say 3", {"a": "3"}) == 1.0
    with pytest.raises(ValueError, match="is an object, not a class: it takes no options"):
        get_task(f"{objects}:ECHO", limit=3)


def test_an_object_without_score_is_not_a_task(objects):
    with pytest.raises(ValueError, match="it has no score"):
        get_task(f"{objects}:NoScore")


def test_an_existing_local_folder_named_like_owner_slash_name_is_not_a_hub_dataset(tmp_path, monkeypatch):
    from esft.tasks.custom import external_kind

    monkeypatch.chdir(tmp_path)
    assert external_kind("owner/name") == "hub"
    (tmp_path / "owner" / "name").mkdir(parents=True)
    assert external_kind("owner/name") is None


def test_system_prompt_is_not_added_to_a_chat_that_has_its_own(tmp_path):
    from esft.tasks.dataset_task import DatasetTask

    chat = [{"role": "system", "content": "own"}, {"role": "user", "content": "hi"}]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"prompt": chat if i % 2 else "plain", "answer": "x"}) + "\n"
                            for i in range(4)))
    task = DatasetTask(source=str(path), system_prompt="default")
    assert task.prompt({"prompt": chat}) == chat
    assert task.prompt({"prompt": "plain"}) == [{"role": "system", "content": "default"},
                                                {"role": "user", "content": "plain"}]


def test_a_list_of_reward_names_is_recorded_as_one_plus_joined_string(data, tmp_path, monkeypatch):
    from esft.tasks.custom import task_spec
    from esft.tasks.dataset_task import DatasetTask

    importable_module(tmp_path, monkeypatch, "audit_rewards",
                      "def ones(completions, **kw):\n    return [1.0] * len(completions)\n"
                      "def zeros(completions, **kw):\n    return [0.0] * len(completions)\n")
    task = DatasetTask(source=str(data), prompt_field="question", reward=[" audit_rewards:ones", "audit_rewards:zeros"])
    assert task.reward == "audit_rewards:ones+audit_rewards:zeros"
    assert task_spec(task) == (str(data), {"prompt_field": "question",
                                           "reward": "audit_rewards:ones+audit_rewards:zeros"})


def test_a_negative_load_limit_is_an_error_not_a_shorter_split(objects):
    task = get_task(f"{objects}:Echo")
    assert len(task.load("train", limit=2)) == 2
    with pytest.raises(ValueError, match="limit must be >= 0"):
        task.load("train", limit=-1)


def test_completion_text_of_a_conversation_is_its_last_message():
    from esft.tasks.base import completion_text

    turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "the answer"}]
    assert completion_text(turns) == "the answer"


def test_trl_reward_columns_are_only_the_lists_as_long_as_the_completions():
    from esft.tasks.base import examples_from_kwargs

    kwargs = {"answer": ["1", "2"], "trainer_state": [{"step": 3}], "completion_ids": [[1], [2]], "flag": True}
    assert examples_from_kwargs(["a", "b"], kwargs) == [{"answer": "1", "completion_ids": [1]},
                                                       {"answer": "2", "completion_ids": [2]}]


def test_a_data_task_is_named_after_its_file_or_dataset(data):
    from esft.tasks.dataset_task import DatasetTask

    assert DatasetTask(source=str(data)).name == "qa"
    assert DatasetTask(source="owner/set.v2").name == "owner_set"
    assert DatasetTask(source=str(data), name="mine").name == "mine"


def test_an_unknown_option_of_a_builtin_task_is_named_with_the_tasks_options():
    """A spec's `task_options: {mmlu: {max_passage_chars: 100}}` was refused with the constructor's TypeError
    ("MMLUTask.__init__() got an unexpected keyword argument ..."); it is named as a name option's would be."""
    with pytest.raises(ValueError, match=r"task 'mmlu': unknown option 'max_passage_chars'; options: .*shuffle"):
        get_task("mmlu", max_passage_chars=100)
    assert get_task("boolq", max_passage_chars=100).max_passage_chars == 100
