"""What a newcomer bringing their own task meets first (docs/custom-tasks.md): each mistake is refused in one line
before any model loads, and that line names the fix: a data file too small to hold a row out or holding its rows
by column, a reward module not found from the folder the command runs in or a misspelt function in it, a reward
function written for another signature, a format bonus the task cannot earn, a data-task flag on a built-in task;
and every `--help` states each option's default once.

    pytest -q tests/test_custom_tasks_newcomer.py
"""

from __future__ import annotations

import argparse
import json

import pytest

from conftest import importable_module
from esft.cli import build_parser, main
from esft.tasks import get_task
from esft.tasks.base import Task, format_bonus_warning
from esft.tasks.dataset_task import read_rows


@pytest.fixture()
def no_model(monkeypatch):
    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the task was checked")

    monkeypatch.setattr("esft.models.load_model", load)


def test_a_two_row_data_file_names_the_options_that_give_it_a_held_out_row(tmp_path, monkeypatch, capsys, no_model):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sums.csv").write_text("question,answer\nWhat is 1+1?,2\nWhat is 2+2?,4\n")
    assert main(["eval", "--task", "sums.csv", "--prompt-field", "question", "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "its test split is empty" in err
    assert "tasks = 'sums.csv' is not accepted" in err  # the task as typed, not the --split the user never gave
    assert "test_size 0.2 of its 2 rows holds none out" in err and "test_size=1" in err and "test_file" in err
    # the fix it names works: one row held out by count
    task = get_task("sums.csv", prompt_field="question", test_size=1)
    assert len(task.load("test")) == 1 and len(task.load("train")) == 1
    separate = get_task("sums.csv", prompt_field="question", test_file="sums.csv")
    assert task.why_empty("train") == "" and separate.why_empty("test") == ""
    assert get_task("boolq").why_empty("test") == ""  # the Task hook's default: nothing to add


def test_the_empty_split_hint_names_only_fixes_that_work(tmp_path, monkeypatch):
    """One row cannot hold one out (split_sizes refuses test_size=1 there), and test_size 0 holds none by request."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "one.csv").write_text("question,answer\nWhat is 1+1?,2\n")
    one = get_task("one.csv", prompt_field="question").why_empty("test")
    assert one.endswith("of its 1 row holds none out: add rows, or give a separate test_file")
    (tmp_path / "sums.csv").write_text("question,answer\n" + "".join(f"q{i},{i}\n" for i in range(5)))
    zero = get_task("sums.csv", prompt_field="question", test_size=0)
    assert zero.load("test") == [] and "set test_size above 0" in zero.why_empty("test")
    assert "add rows" not in zero.why_empty("test")


@pytest.mark.parametrize("content", [
    {"question": ["q0", "q1", "q2"], "answer": ["0", "1", "2"]},  # by column
    {"question": {"0": "q0", "1": "q1"}, "answer": {"0": "0", "1": "1"}},  # pandas' default to_json
    {"data": [{"question": "q0", "answer": "0"}, {"question": "q1", "answer": "1"}]},  # rows under a key
])
def test_a_json_file_of_columns_is_not_read_as_one_row(tmp_path, monkeypatch, capsys, no_model, content):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sums.json").write_text(json.dumps(content))
    assert main(["eval", "--task", "sums.json", "--prompt-field", "question"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not rows" in err and "orient='records', lines=True" in err
    # one row written as a JSON object is still one row, and its rows as a list are read
    (tmp_path / "one.json").write_text(json.dumps({"question": "q0", "answer": "0"}))
    assert read_rows(tmp_path / "one.json") == [{"question": "q0", "answer": "0"}]
    (tmp_path / "rows.json").write_text(json.dumps([{"question": f"q{i}", "answer": str(i)} for i in range(3)]))
    assert len(read_rows(tmp_path / "rows.json")) == 3


def test_a_reward_module_not_found_names_where_modules_are_looked_for(tmp_path, monkeypatch, capsys, no_model):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sums.jsonl").write_text("".join(f'{{"question": "q{i}", "answer": "{i}"}}\n' for i in range(10)))
    assert main(["eval", "--task", "sums.jsonl", "--prompt-field", "question", "--reward",
                 "my_rewards_nowhere:correct_sum"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No module named 'my_rewards_nowhere'" in err
    assert "run from the folder holding my_rewards_nowhere.py or add that folder to PYTHONPATH" in err
    # a module that is found but fails on an import of its own: that import is the problem, not the folder
    (tmp_path / "broken_rewards.py").write_text("import not_installed_dependency_xyz\n")
    with pytest.raises(ValueError) as info:
        get_task(str(tmp_path / "sums.jsonl"), prompt_field="question", reward="broken_rewards:f")
    assert "not_installed_dependency_xyz" in str(info.value) and "PYTHONPATH" not in str(info.value)


SIGNATURE_MISTAKES = '''
def no_kwargs(completions):
    return [0.0 for _ in completions]

def strings(completions, answer, **kwargs):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]
'''


def _sums_with_mistakes(tmp_path, monkeypatch):
    """A ten-row data file beside an importable module of reward functions with newcomers' mistakes."""
    importable_module(tmp_path, monkeypatch, "signature_mistakes", SIGNATURE_MISTAKES)
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(f'{{"question": "q{i}", "answer": "{i}"}}\n' for i in range(10)))
    return data


def test_a_misspelt_function_or_class_name_is_told_the_name_it_meant(tmp_path, monkeypatch):
    data = _sums_with_mistakes(tmp_path, monkeypatch)
    with pytest.raises(ValueError) as info:
        get_task(str(data), prompt_field="question", reward="signature_mistakes:string")
    assert "has no attribute 'string' (did you mean strings?)" in str(info.value)
    with pytest.raises(ValueError) as info:
        get_task(str(data), prompt_field="question", reward="signature_mistakes:zzz")
    assert str(info.value).endswith("has no attribute 'zzz'")  # nothing close: no guess


def test_a_reward_written_for_another_signature_is_told_the_change_it_needs(tmp_path, monkeypatch):
    data = _sums_with_mistakes(tmp_path, monkeypatch)
    with pytest.raises(ValueError) as info:
        get_task(str(data), prompt_field="question", reward="signature_mistakes:no_kwargs")
    assert "unexpected keyword argument" in str(info.value) and "end its parameters with **kwargs" in str(info.value)
    with pytest.raises(ValueError) as info:
        get_task(str(data), prompt_field="question", reward="signature_mistakes:strings")
    assert "'list' object has no attribute 'strip'" in str(info.value)
    assert "read completion[0]['content']" in str(info.value) and "completion_format=text" in str(info.value)
    # the fix it names works: plain strings in, one reward per completion out
    task = get_task(str(data), prompt_field="question", reward="signature_mistakes:strings", completion_format="text")
    example = task.load("test")[0]
    assert task.score(example["answer"], example) == 1.0 and task.score("no", example) == 0.0


def test_the_format_bonus_warning_names_the_setting_that_silences_it():
    class Doubling(Task):  # a task class without is_well_formed, as docs/custom-tasks.md's example
        name = "doubling"

        def score(self, completion, example):
            return 1.0

    warning = format_bonus_warning(Doubling(), 0.1)
    assert "--format-bonus 0" in warning and "format_bonus: 0" in warning and "is_well_formed" in warning


def test_a_data_task_flag_on_a_built_in_task_reads_as_a_sentence(capsys):
    assert main(["eval", "--task", "countdown", "--prompt-field", "question"]) == 2
    err = capsys.readouterr().err
    assert "--prompt-field: only for a task read from a data file or dataset (--task data.jsonl), not for " \
           "countdown" in err


def test_a_data_file_named_without_its_suffix_is_an_unknown_task_not_a_misplaced_flag(capsys):
    """`--task sums` for sums.jsonl: the name is what is wrong (the flag error sent users to the wrong fix)."""
    for command in (["eval"], ["train", "es"]):
        assert main([*command, "--task", "sums", "--prompt-field", "question"]) == 2
        err = capsys.readouterr().err
        assert "unknown task 'sums'; available tasks:" in err and "only for a task read" not in err


def _parsers(parser: argparse.ArgumentParser, path: str = "esft"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_help_line_states_its_default_once():
    seen = 0
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            seen += 1
            assert (action.help or "").count("(default") <= 1, (path, action.option_strings, action.help)
    assert seen > 250  # every sub-command's options were built and read


@pytest.mark.parametrize("command", [["eval", "--limit", "2"], ["train", "es", "--output-dir", "run"],
                                     ["train", "grpo", "--output-dir", "run"]])
@pytest.mark.parametrize("name, exists", [("sums.parquet", True), ("data/sums.parquet", False), ("sums.txt", True)])
def test_a_data_file_of_a_format_esft_does_not_read_is_named_as_such(tmp_path, monkeypatch, capsys, no_model,
                                                                      command, name, exists):
    """Before, `--task sums.parquet --prompt-field question` answered "--prompt-field: only for a task read from a
    data file", without --prompt-field "unknown task 'sums.parquet'", and `data/sums.parquet` was looked up on the
    Hugging Face hub: never that the file's format is the problem."""
    monkeypatch.chdir(tmp_path)
    if exists:
        (tmp_path / name).write_text('{"question": "1 + 1?", "answer": "2"}\n' * 10)
    for flags in (["--prompt-field", "question"], []):
        assert main([*command, "--task", name, *flags]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"task data file {name}: esft reads .jsonl, .json, .csv and .tsv" in err
        assert f"not {name[name.rindex('.'):]}: convert it to JSONL" in err
    if name.endswith(".parquet"):
        assert "pd.read_parquet(" in err


@pytest.mark.parametrize("kind", ["es", "grpo"])
def test_a_separate_test_file_is_recorded_so_that_the_run_rebuilds_its_task_from_any_folder(tmp_path, monkeypatch,
                                                                                           kind):
    """Before, config.yaml recorded the data file by its absolute path but `test_file` as typed: `esft train es
    --resume RUN` (or report, replay) from another folder stopped with "task data file held.jsonl does not exist"."""
    from esft.config import build_config
    from esft.validation import check_names
    from esft.es import ESConfig
    from esft.grpo import GRPOConfig
    from esft.tasks.custom import absolute_data_task, task_record
    from esft.tasks.dataset_task import DatasetTask

    data = tmp_path / "data"
    data.mkdir()
    (data / "sums.jsonl").write_text("".join(json.dumps({"q": f"{i} + {i}?", "answer": str(2 * i)}) + "\n"
                                             for i in range(10)))
    (data / "held.jsonl").write_text('{"q": "100 + 100?", "answer": "200"}\n')
    monkeypatch.chdir(data)
    cls = ESConfig if kind == "es" else GRPOConfig
    extra = {} if kind == "es" else {"prompts_per_step": 2, "num_generations": 2, "per_device_train_batch_size": 4}
    in_name = build_config(cls, overrides={"task": "sums.jsonl:prompt_field=q,test_file=held.jsonl", **extra},
                           check=check_names)
    as_option = build_config(cls, overrides={"task": "sums.jsonl", "task_options": {"prompt_field": "q",
                                                                                     "test_file": "held.jsonl"},
                                             **extra}, check=check_names)
    name, options = task_record(DatasetTask(source="sums.jsonl", prompt_field="q", test_file="held.jsonl"))
    recorded = absolute_data_task(name), options  # the Python API's record (esft.api), as config.yaml holds it
    monkeypatch.chdir(tmp_path)  # another folder: what config.yaml records must still name the files
    assert in_name.task == f"{data / 'sums.jsonl'}:prompt_field=q,test_file={data / 'held.jsonl'}"
    assert as_option.task_options["test_file"] == str(data / "held.jsonl")
    assert recorded[1]["test_file"] == str(data / "held.jsonl")
    for name, options in ((in_name.task, in_name.task_options), (as_option.task, as_option.task_options), recorded):
        assert get_task(name, **options).load("test") == [{"q": "100 + 100?", "answer": "200"}]


def test_a_misspelt_answer_field_beside_a_reward_function_is_refused(tmp_path, monkeypatch, capsys, no_model):
    """The answer field is optional for a reward function (the function reads what it wants), but one named that no
    row has is a typo. Before, `--answer-field answr` was taken without a word and the constant-answer baseline
    silently left out of every evaluation."""
    monkeypatch.chdir(tmp_path)
    importable_module(tmp_path, monkeypatch, "byot_typo", "def r(completions, **kwargs):\n"
                                                           "    return [0.0] * len(completions)\n")
    (tmp_path / "sums.jsonl").write_text("".join(json.dumps({"question": f"{i} + {i}?", "answer": str(2 * i)}) + "\n"
                                                 for i in range(10)))
    assert main(["eval", "--task", "sums.jsonl", "--prompt-field", "question", "--answer-field", "answr",
                 "--reward", "byot_typo:r", "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sums.jsonl: no row has the field 'answr' (answer_field); fields: question, " \
                                   "answer" in err
    # the default field may be absent (the baseline is then left out), and a field some rows have is accepted
    (tmp_path / "bare.jsonl").write_text("".join(json.dumps({"question": f"{i}?", **({"gold": "1"} if i else {})})
                                                 + "\n" for i in range(10)))
    assert get_task("bare.jsonl", prompt_field="question", reward="byot_typo:r").load("test")
    assert get_task("bare.jsonl", prompt_field="question", answer_field="gold", reward="byot_typo:r").load("test")


def test_a_list_of_accepted_answers_under_a_built_in_verifier_is_refused(tmp_path, monkeypatch, capsys, no_model):
    """Before, `{"answer": ["6", "6.0"]}` was compared as the text "['6', '6.0']": the right answer scored 0 in
    every evaluation and as every reward, without a word."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "alias.jsonl").write_text("".join(json.dumps({"question": f"{i} + {i}?", "answer": [str(2 * i)]})
                                                  + "\n" for i in range(10)))
    assert main(["eval", "--task", "alias.jsonl", "--prompt-field", "question", "--reward", "math",
                 "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "alias.jsonl: row 1 holds a list in field 'answer' (answer_field), not one answer" in err
    assert "reward function" in err


def test_a_reward_file_named_as_a_standard_module_is_told_it_is_hidden(tmp_path, monkeypatch):
    """`code.py` of code rewards beside the data: the `esft` console script imports the standard library's `code`
    instead. Before, the error said only "module 'code' has no attribute 'code_reward'"."""
    import code  # noqa: F401  (the standard library's, as the console script finds it first)

    monkeypatch.chdir(tmp_path)
    (tmp_path / "code.py").write_text("def code_reward(completions, **kwargs):\n    return [0.0] * len(completions)\n")
    (tmp_path / "sums.jsonl").write_text('{"question": "1 + 1?", "answer": "2"}\n' * 10)
    with pytest.raises(ValueError) as caught:
        get_task("sums.jsonl", prompt_field="question", reward="code:code_reward")
    assert str(caught.value).startswith("reward 'code:code_reward': module 'code' has no attribute 'code_reward'; "
                                        "'code' was imported from ")
    assert str(caught.value).endswith("which hides code.py of the current folder: give your file another name")
    # a module of the folder that is the one imported, and a misspelt name in it, get no such hint
    importable_module(tmp_path, monkeypatch, "byot_own", "def r(completions, **kwargs):\n    return [0.0]\n")
    with pytest.raises(ValueError, match=r"has no attribute 'rr' \(did you mean r\?\)$"):
        get_task("sums.jsonl", prompt_field="question", reward="byot_own:rr")


@pytest.mark.parametrize("prompt, says", [
    ([{"role": "user", "text": "7 + 7?"}], "row 8, message 1 of field 'prompt' (prompt_field) has no 'content'"),
    ([{"role": "system", "content": "Be brief."}, "7 + 7?"],
     "row 8, message 2 of field 'prompt' (prompt_field) has no 'role' or 'content'"),
    ({"role": "user", "content": "7 + 7?"}, "row 8 holds a mapping in field 'prompt' (prompt_field)"),
])
def test_a_malformed_chat_prompt_is_named_before_the_model_loads(tmp_path, monkeypatch, capsys, no_model, prompt,
                                                                 says):
    """Before, a chat message without `content` in row 8 stopped `esft eval` with a KeyError traceback when that row
    was prompted, and a single message given as a mapping was sent to the model as the text of a dict."""
    monkeypatch.chdir(tmp_path)
    rows = [{"prompt": [{"role": "user", "content": f"{i} + {i}?"}], "answer": str(2 * i)} for i in range(20)]
    rows[7]["prompt"] = prompt
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["eval", "--task", "chat.jsonl", "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"chat.jsonl: {says}: a prompt is text, or a list of {{role, content}} " \
                                     "messages" in err
