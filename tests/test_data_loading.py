"""Data-task loading: file layouts, the held-out split, field checks and their errors (esft.tasks.dataset_task).

Run: pytest tests/test_data_loading.py -q
"""

from __future__ import annotations

import gzip
import json
import sys
import types
from pathlib import Path

import pytest

from esft.tasks import get_task
from esft.tasks.dataset_task import DatasetTask, read_rows, split_sizes

ROWS = [{"prompt": f"q{i}", "answer": str(i)} for i in range(10)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_gzip_file_is_read_whatever_the_case_of_its_suffix(tmp_path):
    for name in ("rows.jsonl.gz", "ROWS.JSONL.GZ", "rows.json.Gz"):
        path = tmp_path / name
        path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in ROWS).encode()))
        assert read_rows(path) == ROWS, name


@pytest.mark.parametrize("test_size, words", [
    (float("inf"), "finite"), (float("nan"), "finite"), (-0.5, ">= 0"), (1.5, "whole number"), (2.25, "whole number"),
])
def test_a_test_size_that_is_no_fraction_nor_count_is_refused(test_size, words):
    with pytest.raises(ValueError, match=words):
        split_sizes(10, test_size)


def test_split_sizes_fraction_count_and_limits():
    assert split_sizes(10, 0.2) == 2
    assert split_sizes(10, 0.25) == 2      # round half to even: 2.5 -> 2
    assert split_sizes(10, 0.35) == 4      # a fraction is rounded, not truncated
    assert split_sizes(10, 0) == 0
    assert split_sizes(10, 1) == 1         # 1 is a count, not "all of it"
    assert split_sizes(10, 1.0) == 1
    assert split_sizes(10, 9) == 9         # one row left for train is enough
    with pytest.raises(ValueError, match="leaves no train rows out of 10"):
        split_sizes(10, 10)


def test_a_bad_test_size_in_the_task_name_is_a_value_error(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    for text in ("inf", "nan", "1.5"):
        with pytest.raises(ValueError, match="test_size"):
            get_task(f"{path}:test_size={text}")


def test_the_held_out_draw_is_seeded_kept_in_file_order_and_disjoint(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    task = DatasetTask(source=str(path), test_size=3)
    train, test = task.load("train"), task.load("test")
    assert len(train) == 7 and len(test) == 3
    assert sorted(r["prompt"] for r in train + test) == sorted(r["prompt"] for r in ROWS)
    for split in (train, test):  # each split keeps the file's order
        assert [int(r["answer"]) for r in split] == sorted(int(r["answer"]) for r in split)
    assert DatasetTask(source=str(path), test_size=3).load("test") == test  # same seed, same draw
    other = {tuple(r["prompt"] for r in DatasetTask(source=str(path), test_size=3, split_seed=s).load("test"))
             for s in range(5)}
    assert len(other) > 1  # the seed moves the draw
    # the default seed is the shared SPLIT_SEED 42: the held-out rows are fixed across releases
    assert [r["prompt"] for r in test] == [r["prompt"] for r in DatasetTask(source=str(path), test_size=3,
                                                                             split_seed=42).load("test")]


def test_a_test_file_replaces_the_draw_and_is_checked(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    held = write_jsonl(tmp_path / "h.jsonl", [{"prompt": "x", "answer": "1"}])
    task = DatasetTask(source=str(path), test_file=str(held))
    assert len(task.load("train")) == 10 and task.load("test") == [{"prompt": "x", "answer": "1"}]
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "x"}])
    with pytest.raises(ValueError, match=r"bad.jsonl: row 1 has no field 'answer' \(answer_field\)"):
        DatasetTask(source=str(path), test_file=str(bad)).load("test")


def test_field_checks_name_the_row_and_only_need_the_answer_with_a_verifier(tmp_path):
    rows = ROWS[:3] + [{"prompt": "q3"}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(ValueError, match=r"row 4 has no field 'answer' \(answer_field\); fields: prompt"):
        DatasetTask(source=str(path)).load("train")
    path = write_jsonl(tmp_path / "n.jsonl", ROWS[:2] + [{"prompt": None, "answer": "2"}])
    with pytest.raises(ValueError, match=r"row 3 has no value in field 'prompt' \(prompt_field\)"):
        DatasetTask(source=str(path)).load("train")
    # empty text: a prompt that asks nothing, an answer that grades an empty reply right
    for field, row in (("prompt", {"prompt": "  ", "answer": "2"}), ("answer", {"prompt": "q", "answer": ""})):
        path = write_jsonl(tmp_path / f"{field}.jsonl", ROWS[:2] + [row])
        with pytest.raises(ValueError, match=rf"row 3 has no value in field '{field}' \({field}_field\): empty text"):
            DatasetTask(source=str(path)).load("train")
    empty_row = write_jsonl(tmp_path / "e.jsonl", ROWS[:2] + [{}])
    with pytest.raises(ValueError, match=r"row 3 has no field 'prompt' \(prompt_field\); fields: none \(name the "
                                         r"one to read with --prompt-field, or as a task option: "
                                         r"FILE:prompt_field=FIELD\)"):
        DatasetTask(source=str(empty_row)).load("train")


@pytest.mark.parametrize("text, words", [
    ('[{"prompt": "a"}, 3]', "row 2 is int, not an object of fields"),
    ("[]", "holds no rows"),
    ('{"prompt": "a"}\n[1]\n', "row 2 is list"),
    ('{"prompt": "a"}\n{"prompt": \n', "d.json:2: not a JSON object"),
])
def test_bad_json_layouts_name_the_file_and_row(tmp_path, text, words):
    path = tmp_path / "d.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=words):
        read_rows(path)


def test_tsv_is_split_on_tabs_and_blank_jsonl_lines_are_skipped(tmp_path):
    (tmp_path / "d.tsv").write_text("q\ta\nsay, 1\t1\n")
    assert read_rows(tmp_path / "d.tsv") == [{"q": "say, 1", "a": "1"}]
    (tmp_path / "d.jsonl").write_text('\n{"q": 1}\n  \n{"q": 2}\n')
    assert read_rows(tmp_path / "d.jsonl") == [{"q": 1}, {"q": 2}]
    with pytest.raises(ValueError, match=r"d2.jsonl:3: not a JSON object"):
        (tmp_path / "d2.jsonl").write_text('{"q": 1}\n\n{"q": \n')
        read_rows(tmp_path / "d2.jsonl")


def test_a_large_held_out_draw_keeps_the_file_order(tmp_path):
    """Enough rows that a set of their indices no longer iterates in order: both splits keep the file's order."""
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(1000)]
    task = DatasetTask(source=str(write_jsonl(tmp_path / "d.jsonl", rows)))
    train, test = task.load("train"), task.load("test")
    assert (len(train), len(test)) == (800, 200)
    for split in (train, test):
        order = [int(r["answer"]) for r in split]
        assert order == sorted(order)


def test_a_jsonl_file_holds_one_object_per_line_not_a_list(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('[{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]\n')
    with pytest.raises(ValueError, match="row 1 is list, not an object of fields"):
        read_rows(path)


class FakeHub(types.ModuleType):
    """`datasets` with load_dataset over in-memory tables; an unknown table is an unreachable hub (an OSError)."""

    def __init__(self, tables: dict[tuple[str, str | None, str], list[dict]]):
        super().__init__("datasets")
        self.tables, self.calls = tables, []

    def load_dataset(self, name, config=None, split=None):
        self.calls.append((name, config, split))
        if (name, config, split) not in self.tables:
            raise ConnectionError("hub unreachable")
        return self.tables[(name, config, split)]


def test_a_hub_data_task_reads_its_train_and_test_splits(monkeypatch):
    train = [{"prompt": f"t{i}", "answer": str(i)} for i in range(10)]
    test = [{"prompt": "h", "answer": "1"}]
    hub = FakeHub({("me/qa", "cfg", "train"): train, ("me/qa", "cfg", "validation"): test,
                   ("me/qa", None, "dev"): train, ("me/empty", None, "train"): []})
    monkeypatch.setitem(sys.modules, "datasets", hub)
    task = DatasetTask(source="me/qa:cfg", test_split="validation")
    assert task.load("train") == train and task.load("test") == test
    assert hub.calls == [("me/qa", "cfg", "train"), ("me/qa", "cfg", "validation")]
    drawn = DatasetTask(source="me/qa", train_split="dev", test_size=2)  # no test_split: a draw from train_split
    assert (len(drawn.load("train")), len(drawn.load("test"))) == (8, 2)
    assert ("me/qa", None, "validation") not in hub.calls[2:]
    with pytest.raises(ValueError, match=r"Hugging Face dataset 'me/empty' split 'train' holds no rows"):
        DatasetTask(source="me/empty").load("train")
    with pytest.raises(ValueError, match=r"could not load Hugging Face dataset 'me/absent'.*hub unreachable"):
        DatasetTask(source="me/absent").load("train")  # a ValueError: a bad task, not a crash
    bad = FakeHub({("me/qa", None, "train"): [{"question": "q", "answer": "1"}],
                   ("me/ok", None, "train"): train, ("me/ok", None, "test"): [{"answer": "1"}]})
    monkeypatch.setitem(sys.modules, "datasets", bad)
    with pytest.raises(ValueError, match=r"me/qa \(train\): row 1 has no field 'prompt'"):
        DatasetTask(source="me/qa").load("train")
    with pytest.raises(ValueError, match=r"me/ok \(test\): row 1 has no field 'prompt'"):
        DatasetTask(source="me/ok", test_split="test").load("test")


def test_a_gzipped_csv_or_tsv_task_file_is_a_data_task(tmp_path, monkeypatch):
    """The task spec's pattern takes data.csv.gz and data.tsv.gz (esft.tasks.custom), and read_rows reads them;
    they must also count as data files, or a bare name is an unknown task and a path one is tried on the hub."""
    from esft.tasks import get_task
    from esft.tasks.dataset_task import is_data_file

    monkeypatch.chdir(tmp_path)
    body = {"csv": "question,answer\n" + "".join(f"q{i},a{i}\n" for i in range(10)),
            "tsv": "question\tanswer\n" + "".join(f"q{i}\ta{i}\n" for i in range(10))}
    for kind, text in body.items():
        name = f"data.{kind}.gz"
        (tmp_path / name).write_bytes(gzip.compress(text.encode()))
        assert is_data_file(name) and is_data_file(name.upper())
        task = get_task(f"{name}:prompt_field=question,answer_field=answer,test_size=2")
        rows = task.load("train") + task.load("test")
        assert sorted(r["question"] for r in rows) == [f"q{i}" for i in range(10)], kind
