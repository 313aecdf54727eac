"""A data-file task is named in errors as the user gave it (`sums.jsonl`), not by the name that keys its result files
(`sums`, the file name without its suffix), which the user never typed. No model (a second).

Run: PYTHONPATH=src pytest -q tests/test_data_task_names.py
"""

from __future__ import annotations

import json

import pytest

from conftest import importable_module
from esft.cli import main
from esft.es.build import make_fitness_rule
from esft.tasks import get_task
from esft.tasks.base import format_bonus_warning


@pytest.fixture()
def sums(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("esft.models.load_model", lambda *a, **k: pytest.fail("the model loaded before the check"))
    (tmp_path / "sums.jsonl").write_text("".join(json.dumps({"q": f"{i} + 1?", "answer": str(i + 1)}) + "\n"
                                                 for i in range(10)))
    (tmp_path / "one.jsonl").write_text(json.dumps({"q": "1 + 1?", "answer": "2"}) + "\n")
    return get_task("sums.jsonl", prompt_field="q")


def test_eval_errors_name_the_file_the_user_gave(sums, capsys):
    assert main(["eval", "--tasks", "sums.jsonl", "--prompt-field", "q", "--split", "validation"]) == 2
    err = capsys.readouterr().err
    assert "(task 'sums.jsonl' has train, test)" in err and "'sums'" not in err
    assert main(["eval", "--tasks", "one.jsonl:prompt_field=q,boolq"]) == 2
    err = capsys.readouterr().err
    assert "tasks = 'one.jsonl:prompt_field=q' is not accepted" in err and "(task 'one.jsonl': its test split" in err
    assert "'one'" not in err


def test_the_task_and_training_messages_name_the_file(sums):
    assert sums.name == "sums"  # result files stay keyed by it
    with pytest.raises(ValueError, match=r"^task 'sums.jsonl' has no split 'validation'"):
        sums.load("validation")
    with pytest.raises(ValueError, match=r"; 'sums.jsonl' has none$"):
        make_fitness_rule("balanced", 0.0, {}, sums)


def test_the_format_bonus_warning_names_the_file(sums, tmp_path, monkeypatch):
    importable_module(tmp_path, monkeypatch, "sums_reward", "def one(completions, **kw):\n"
                      "    return [1.0] * len(completions)\n")
    task = get_task("sums.jsonl", prompt_field="q", reward="sums_reward:one")
    assert "task 'sums.jsonl' checks no answer format" in format_bonus_warning(task, 0.1)
