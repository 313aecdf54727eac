"""`esft train es --task one.jsonl` records the data file by its absolute path (config.yaml rebuilds the task from
any folder), but its errors name the file as the user typed it (esft.cli_process.as_typed)."""

from __future__ import annotations

import json

import pytest

from esft.cli import main

ROWS = "".join(json.dumps({"question": f"{i}+{i}?", "answer": str(2 * i)}) + "\n" for i in range(4))


@pytest.fixture()
def data_dir(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "one.jsonl").write_text(ROWS)
    (tmp_path / "data" / "bad.jsonl").write_text(ROWS + "not json\n" + ROWS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("command", [["train", "es"], ["train", "grpo"]])
def test_a_data_file_error_names_the_path_as_typed(data_dir, capsys, command):
    assert main([*command, "--task", "data/one.jsonl", "--prompt-field", "q", "--reward", "exact",
                 "--output-dir", "run"]) == 2
    err = capsys.readouterr().err
    assert ("task = 'data/one.jsonl' is not accepted; expected a task esft can build from it: data/one.jsonl: "
            "row 1 has no field 'q' (prompt_field)") in err
    assert str(data_dir) not in err
    assert not (data_dir / "run").exists()


def test_a_test_file_option_and_a_flag_with_its_value_are_named_as_typed(data_dir, capsys):
    assert main(["train", "es", "--task=data/one.jsonl:test_file=data/bad.jsonl", "--prompt-field", "question",
                 "--reward", "exact", "--output-dir", "run"]) == 2
    err = capsys.readouterr().err
    assert "task = 'data/one.jsonl:test_file=data/bad.jsonl' is not accepted" in err
    assert "data/bad.jsonl:5: not a JSON object" in err and str(data_dir) not in err


def test_the_config_still_records_the_absolute_path(data_dir):
    from esft.es.es_config import ESConfig

    assert ESConfig(task="data/one.jsonl:test_file=data/bad.jsonl").task == (
        f"{data_dir / 'data' / 'one.jsonl'}:test_file={data_dir / 'data' / 'bad.jsonl'}")


def test_a_data_file_in_a_config_file_is_named_as_typed(data_dir, capsys):
    (data_dir / "run.yaml").write_text("task: data/one.jsonl:prompt_field=q,reward=exact\n")
    assert main(["train", "es", "--config", "run.yaml", "--output-dir", "run"]) == 2
    err = capsys.readouterr().err
    assert "run.yaml:1: task = 'data/one.jsonl:prompt_field=q,reward=exact' is not accepted" in err
    assert "data/one.jsonl: row 1 has no field 'q'" in err and str(data_dir) not in err


def test_the_first_file_of_an_equals_sign_comma_list_is_named_as_typed(data_dir):
    from esft.cli_process import typed_data_files

    (data_dir / "data" / "two.jsonl").write_text((data_dir / "data" / "one.jsonl").read_text())
    found = typed_data_files(["--tasks=data/one.jsonl,data/two.jsonl"])
    assert sorted(found.values()) == ["data/one.jsonl", "data/two.jsonl"]


def test_only_the_whole_path_is_named_as_typed_not_the_tail_of_a_longer_one(data_dir):
    from esft.cli_process import as_typed

    absolute = str(data_dir / "data" / "one.jsonl")
    message = f"{absolute}: bad row; /mnt{absolute} is another file"
    assert as_typed(message, ["data/one.jsonl"]) == f"data/one.jsonl: bad row; /mnt{absolute} is another file"
