"""A reward regex holding a comma inside a task string (`data.jsonl:reward=regex:(a,b)`): options are split at
commas, so the regex was cut there and its rest read as another option or another task, with an error about
something else (a bad regex, an unknown task '3}'). It is refused, pointing to `--reward`, which takes it whole.
No model (a second).

Run: PYTHONPATH=src pytest -q tests/test_custom_task_regex_commas.py
"""

from __future__ import annotations

import json

import pytest

from esft.tasks import get_task, split_task_list


@pytest.fixture()
def data(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"q": f"pair {i}?", "answer": f"{i},{i + 1}"}) + "\n" for i in range(6)))
    return str(path)


@pytest.mark.parametrize("regex", ["(a,b)", "a{1,3}", "[a,b]", r"(\d+,\d+)"])
def test_a_comma_inside_a_task_strings_regex_is_refused_pointing_to_reward(data, regex):
    task = f"{data}:prompt_field=q,reward=regex:{regex}"
    with pytest.raises(ValueError, match="split at commas") as exc:
        get_task(task)
    assert f"--reward 'regex:{regex}'" in str(exc.value) and str(exc.value).startswith(f"task {task!r}")
    with pytest.raises(ValueError, match="split at commas") as exc:  # a list of tasks (--tasks, specs)
        split_task_list(f"{data}:reward=regex:{regex},prompt_field=q,boolq")
    assert f"--reward 'regex:{regex}'" in str(exc.value)


def test_regexes_without_a_comma_and_the_reward_option_keep_working(data):
    assert split_task_list(rf"{data}:reward=regex:(\d+),prompt_field=q,boolq") == [
        rf"{data}:reward=regex:(\d+),prompt_field=q", "boolq"]
    assert split_task_list(rf"{data}:reward=regex:\d{{2}},boolq") == [rf"{data}:reward=regex:\d{{2}}", "boolq"]
    braced = rf"{data}:reward=regex:[{{](\d+)"  # a '{' of the regex itself, not an open quantifier
    assert split_task_list(f"{braced},prompt_field=q,boolq") == [f"{braced},prompt_field=q", "boolq"]
    assert get_task(f"{braced},prompt_field=q").reward == r"regex:[{](\d+)"
    later = get_task(f"{data}:reward=regex:x,system_prompt={{,prompt_field=q")  # a '{' of a later option
    assert later.reward == "regex:x" and later.system_prompt == "{"
    whole = get_task(data, prompt_field="q", reward=r"regex:(\d+,\d+)")  # what --reward passes
    assert whole.score("so it is 2,3", {"answer": "2,3"}) == 1.0
    assert whole.score("so it is 2", {"answer": "2,3"}) == 0.0


def test_a_regex_with_inline_flags_followed_by_another_option_is_read_whole(data):
    # `(?i)` must open the pattern: the check compiles the reward's own pattern, not the option text around it
    task = get_task(rf"{data}:reward=regex:(?i)pair (\d+),prompt_field=q")
    assert task.reward == r"regex:(?i)pair (\d+)" and task.score("PAIR 4", {"answer": "4"}) == 1.0
    assert split_task_list(rf"{data}:reward=regex:(?i)(\d+),boolq") == [rf"{data}:reward=regex:(?i)(\d+)", "boolq"]
