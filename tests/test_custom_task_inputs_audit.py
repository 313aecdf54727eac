"""Bad input of a user's data task, found by following docs/custom-tasks.md with one's own data and reward: each is
refused with the row or value named, when the task is built (before any model loads), not as a vague error from
deep inside the csv module, the reward call or the chat template.

Run: pytest tests/test_custom_task_inputs_audit.py -q
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from esft.tasks.dataset_task import DatasetTask, read_rows
from esft.tasks.verifiers import RewardError, check_rewards


def test_a_csv_row_with_more_cells_than_the_header_is_refused_naming_the_row(tmp_path):
    # an unquoted comma in a field: csv.DictReader keys the extra cell by None, which a reward function's keyword
    # columns then held (a TypeError "expected str instance, NoneType found" when the task was built)
    path = tmp_path / "d.csv"
    path.write_text("question,answer\nq1,1\nWhat is 1,000 + 1?,1001\nq3,3\n")
    with pytest.raises(ValueError, match=r"d.csv: row 2 has 3 cells, more than the header's 2 columns: quote"):
        read_rows(path)
    (tmp_path / "ok.csv").write_text('question,answer\nq1,1\n"What is 1,000 + 1?",1001\n')
    assert read_rows(tmp_path / "ok.csv")[1] == {"question": "What is 1,000 + 1?", "answer": "1001"}


def test_an_empty_chat_prompt_is_refused_in_any_row(tmp_path):
    # the command's check prompts only a split's first example: an empty chat in a later row reached the model
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(9)] + [{"question": [], "answer": "9"}]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"row 10 holds an empty list in field 'question' \(prompt_field\), a chat "
                                         r"of no messages"):
        DatasetTask(source=str(path), prompt_field="question").load("train")


def test_a_nan_gold_answer_is_a_missing_value_as_null_is(tmp_path):
    # json.dumps writes a pandas/numpy missing value as NaN, which Python's json reads back: the gold answer was
    # the text 'nan', graded right for a reply of "nan"
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": float("nan") if i == 3 else str(i)}) + "\n"
                            for i in range(10)))
    with pytest.raises(ValueError, match=r"row 4 has no value in field 'answer' \(answer_field\): NaN"):
        DatasetTask(source=str(path), prompt_field="question").load("train")


@pytest.mark.parametrize("values, words", [
    (np.ones((2, 1)), r"returned array\(\[1\.\]\) \(ndarray\) for completion 0: not a number"),
    ([10 ** 400, 1], r"returned inf for completion 0: rewards must be finite"),
])
def test_a_reward_value_float_cannot_read_is_a_reward_error(values, words):
    # a (n, 1) array (a reward model's logits) and an int beyond a float's range raised numpy's TypeError and an
    # OverflowError, which the task builder did not read as the reward's fault
    with pytest.raises(RewardError, match=words):
        check_rewards(values, 2, "m:f")
    assert check_rewards(np.ones(2), 2, "m:f") == [1.0, 1.0]


class _StringRows:
    """A duck-typed task whose load returns text rows: prompt and score take them, the baseline did not."""

    def load(self, split):
        return ["a", "b", "c"]

    def prompt(self, example):
        return example

    def score(self, completion, example):
        return 0.0


class _DictLoad(_StringRows):
    def load(self, split):
        return {"q": "a", "answer": "1"}  # one row, not a list of rows: list() made its keys the examples


@pytest.mark.parametrize("cls, words", [
    (_StringRows, r"task '_StringRows': row 1 of split 'test' is str 'a', not an example \(a dict of fields\)"),
    (_DictLoad, r"_DictLoad.load\('test'\) returned dict, not a list of examples"),
])
def test_a_task_object_whose_rows_are_not_examples_fails_its_split_check(cls, words):
    # the string rows passed the command's first-example check and ended, once the model had loaded and generated,
    # in an AttributeError traceback from the constant-answer baseline; the dict's keys became examples
    from esft.config import ConfigError
    from esft.tasks.custom import TaskAdapter
    from esft.validation import check_splits

    with pytest.raises(ConfigError, match=r"a task whose test split loads .*" + words):
        check_splits("tasks", "m:C", TaskAdapter(cls()), ("test",))


def test_a_data_file_path_that_is_a_folder_is_called_one(tmp_path):
    # the error said the folder "does not exist", which the user could see it did
    (tmp_path / "held").mkdir()
    with pytest.raises(FileNotFoundError, match=r"task data file .*held is a folder"):
        read_rows(tmp_path / "held")
    with pytest.raises(FileNotFoundError, match=r"task data file .*absent.jsonl does not exist"):
        read_rows(tmp_path / "absent.jsonl")


def test_a_sys_exit_in_reward_code_is_the_rewards_error_not_a_silent_exit(tmp_path, monkeypatch):
    """`sys.exit(5)` when the reward module is imported, or inside the reward, ended esft with status 5 and no word."""
    from esft.tasks.verifiers import call_trl_reward, import_object

    monkeypatch.chdir(tmp_path)
    (tmp_path / "exits_now.py").write_text("import sys\nsys.exit(5)\n")
    with pytest.raises(ValueError, match=r"cannot import module 'exits_now': SystemExit: 5"):
        import_object("exits_now:score", "reward")

    def quits(completions, **kwargs):
        raise SystemExit(3)

    with pytest.raises(RewardError, match=r"reward 'quits' raised SystemExit: 3"):
        call_trl_reward(quits, "quits", ["a"], [[{"role": "user", "content": "q"}]], [{"answer": "a"}], "text")


def test_options_after_a_task_class_say_where_a_class_takes_them():
    """`--task my_tasks:Doubling:count=3` (the built-in tasks' form) said only "unknown task"."""
    from esft.tasks import get_task

    with pytest.raises(ValueError, match=r"a task class takes its options from --task-options .*: my_tasks:Doubling "
                                         r"with --task-options '\{count: 3, x: a\}'"):
        get_task("my_tasks:Doubling:count=3,x=a")
    with pytest.raises(ValueError) as plain:
        get_task("nosuchtask")
    assert "--task-options" not in str(plain.value)
