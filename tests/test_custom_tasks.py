"""Tasks from outside the package (esft.tasks.custom): a data file with a TRL reward function through the CLI
(eval, ES, GRPO), import paths, entry points, built-in verifiers, and the errors raised before any model loads."""

from __future__ import annotations

import json
import sys
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import numpy as np
import pytest

from conftest import importable_module, make_tiny_model
from esft.cli import main
from esft.tasks import get_task
from esft.tasks.custom import ENTRY_POINT_GROUP, TaskAdapter, external_kind, task_spec
from esft.tasks.dataset_task import DatasetTask, read_rows

REWARD_MODULE = '''
def contains_answer(completions, answer, **kwargs):
    """TRL reward signature: completions (chat messages) and the dataset's columns as keyword lists."""
    return [1.0 if str(a) in c[0]["content"] else 0.0 for c, a in zip(completions, answer)]

def length_bonus(completions, **kwargs):
    return [min(len(c[0]["content"]), 10) / 10 for c in completions]

def fails_on(completions, answer, **kwargs):
    if "70" in answer or "72" in answer:  # a late train row (What is 35 + 35?) and the last held-out row
        raise KeyError("no rule for " + "/".join(a for a in answer if a in ("70", "72")))
    return [1.0 for _ in completions]

def fails_on_test_row(completions, answer, **kwargs):
    return fails_on(completions, [a.replace("70", "0") for a in answer])

def one_value(completions, **kwargs):
    return [0.0]

def words(completions, **kwargs):
    return ["good" for _ in completions]

def as_strings(completions, **kwargs):
    return [float(c.strip() == "1") for c in completions]  # written for plain strings: fails on messages

class Echo:
    name = "echo"
    splits = ("train", "test")
    def load(self, split):
        return [{"q": f"say {i}", "a": str(i)} for i in range(6)]
    def prompt(self, example):
        return example["q"]
    def score(self, completion, example):
        return float(example["a"] in completion)
'''


@pytest.fixture()
def user_files(tmp_path, monkeypatch):
    """A 40-row JSONL task and a module of TRL-style reward functions importable as `user_rewards`."""
    importable_module(tmp_path, monkeypatch, "user_rewards", REWARD_MODULE)
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i), "level": i % 3})
                            + "\n" for i in range(40)))
    return tmp_path, data


def test_data_task_splits_prompts_and_trl_reward(user_files):
    _, data = user_files
    task = get_task(str(data), prompt_field="question", reward="user_rewards:contains_answer",
                    system_prompt="Answer with a number.")
    train, test = task.load("train"), task.load("test")
    assert (len(train), len(test)) == (32, 8)  # test_size 0.2, seeded
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    assert get_task(str(data), prompt_field="question", reward="exact").load("test") == test  # same draw
    ex = test[0]
    assert task.prompt(ex) == [{"role": "system", "content": "Answer with a number."},
                               {"role": "user", "content": ex["question"]}]
    assert task.score(f"It is {ex['answer']}.", ex) == 1.0 and task.score("no idea", ex) == 0.0
    # GRPO's path: one call of the user's function for the whole batch; a reward function checks no format, so a
    # format bonus adds nothing (it once rewarded any non-blank reply)
    reward = task.reward_function(format_bonus=0.5)
    assert reward([[{"role": "assistant", "content": ex["answer"]}], "x"], examples=[ex, ex]) == [1.0, 0.0]


def test_a_reward_function_checks_no_format(user_files):
    """Only tasks that check an answer format report a format rate and pay a format bonus (Task.checks_format)."""
    from esft.evaluation import completion_record
    from esft.generation import Generation
    from esft.tasks.base import checks_format, format_bonus_warning

    _, data = user_files
    scored = get_task(str(data), prompt_field="question", reward="user_rewards:contains_answer")
    boxed = get_task(str(data), prompt_field="question", reward="boxed")
    ex = scored.load("test")[0]
    reply = f"It is \\boxed{{{ex['answer']}}}"
    assert not checks_format(scored) and not scored.is_well_formed(reply, ex)
    assert checks_format(boxed) and boxed.is_well_formed(reply, ex) and not boxed.is_well_formed("no box", ex)
    assert boxed.reward_function(0.5)([reply, "no box"], examples=[ex, ex]) == [1.5, 0.0]
    assert "has no effect" in format_bonus_warning(scored, 0.1)
    assert format_bonus_warning(scored, 0.0) is None and format_bonus_warning(boxed, 0.1) is None
    gen = Generation(text=reply, completion_ids=[1], prompt_tokens=3, finished=True)
    assert "well_formed" not in completion_record(scored, ex, gen, {})
    assert completion_record(boxed, ex, gen, {})["well_formed"] is True
    assert "format_rate" not in scored.aggregate([completion_record(scored, ex, gen, {})])
    # `exact` reads the whole completion as the answer: every reply was "well formed" and earned the bonus
    exact = get_task(str(data), prompt_field="question", answer_field="answer", reward="exact")
    assert not checks_format(exact) and not exact.is_well_formed("To add 6 and 7,", ex)
    assert "the `exact` verifier" in format_bonus_warning(exact, 0.1)
    assert exact.reward_function(0.1)([f" {ex['answer']}.", "To add"], examples=[ex, ex]) == [1.0, 0.0]
    assert "format_rate" not in exact.aggregate([completion_record(exact, ex, gen, {})])
    # its maj@k votes on the normalised completion it compares (it had no vote key, so no maj@k)
    from esft.passk import answer_key

    key = answer_key(exact.details(" Forty  Two.", ex))
    assert key is not None and key == answer_key(exact.details("forty two", ex))
    # as `exact` compares: spaces collapsed, not removed ("newyork" scores apart from "new york", so votes apart)
    assert answer_key(exact.details("New York.", ex)) != answer_key(exact.details("newyork", ex))
    assert answer_key(exact.details("  ", ex)) is None  # no answer, no vote
    # a long completion votes by a digest: the record holds the completion already
    long = exact.details("word " * 100, ex)["vote_key"]
    assert long.startswith("sha256:") and len(long) == 23 and long != exact.details("word " * 101, ex)["vote_key"]
    # a task object: its own is_well_formed, or none
    echo = get_task("user_rewards:Echo")
    assert isinstance(echo, TaskAdapter) and not checks_format(echo) and not echo.is_well_formed("say 1", {})

    class Checked:
        name, splits = "checked", ("train", "test")
        load, prompt, score = (lambda self, s: []), (lambda self, e: "q"), (lambda self, c, e: 0.0)
        is_well_formed = staticmethod(lambda c, e: c == "ok")

    adapted = TaskAdapter(Checked())
    assert checks_format(adapted) and adapted.is_well_formed("ok", {}) and not adapted.is_well_formed("no", {})
    # an esft Task subclass: it checks a format when it defines is_well_formed (or says otherwise)
    from esft.tasks.base import Task

    class Plain(Task):
        def score(self, completion, example):
            return 1.0

    class Formed(Plain):
        def is_well_formed(self, completion, example):
            return True

    class Declined(Formed):
        checks_format = False

    assert not checks_format(Plain()) and "has no effect" in format_bonus_warning(Plain(), 0.1)
    assert checks_format(Formed()) and not checks_format(Declined())
    # and only a format it checks earns the bonus (ES records it through esft.es.executor, GRPO through the reward)
    from esft.es.executor import PopulationResult

    assert Formed().reward_function(0.5)(["x"], examples=[{}]) == [1.5]
    assert Declined().reward_function(0.5)(["x"], examples=[{}]) == [1.0]
    result = PopulationResult(scores=np.zeros((1, 2)), well_formed=np.zeros((1, 2), dtype=bool), texts=[[]])
    result.record(0, 0, Generation(text="x"), Formed(), {})
    result.record(0, 1, Generation(text="x"), Declined(), {})
    assert result.well_formed.tolist() == [[True, False]]
    assert get_task("countdown").checks_format and get_task("boolq").checks_format


def test_builtin_verifiers():
    ex = {"answer": "42"}
    cases = {"exact": ("42.", "it is 42"), "boxed": (r"so \boxed{42}", "42"),
             "math": (r"\boxed{42.0}", r"\boxed{41}"), "regex:answer: (\\d+)": ("answer: 42", "answer 42")}
    for reward, (good, bad) in cases.items():
        task = DatasetTask(source="x.jsonl", reward=reward)
        assert task.score(good, ex) == 1.0, reward
        assert task.score(bad, ex) == 0.0, reward
    mcq = DatasetTask(source="x.jsonl", reward="mcq")
    assert mcq.score('{"answer": "C"}', {"answer": "C"}) == 1.0 and mcq.score("A", {"answer": "C"}) == 0.0


def test_an_empty_box_is_no_answer_for_the_boxed_verifiers():
    """As the built-in MATH task reads it: `\\boxed{}` or `\\boxed{ }` is not a well-formed answer (it would earn
    a format bonus otherwise), while a boxed answer, right or wrong, is."""
    from esft.tasks import get_task

    ex = {"answer": "42"}
    for reward in ("math", "boxed"):
        task = DatasetTask(source="x.jsonl", reward=reward)
        assert not task.is_well_formed(r"so \boxed{}", ex) and not task.is_well_formed(r"\boxed{ }", ex), reward
        assert task.is_well_formed(r"\boxed{41}", ex) and task.score(r"\boxed{42}", ex) == 1.0, reward
        assert task.details(r"\boxed{}", ex)["extracted"] is None, reward
    math = get_task("math")
    assert not math.is_well_formed(r"\boxed{}", {"answer": "42"})


@pytest.mark.parametrize("options, words", [
    ({"prompt_field": "prompt"}, ["no field 'prompt'", "prompt_field", "question, answer, level"]),
    ({"prompt_field": "question", "answer_field": "gold"}, ["no field 'gold'", "answer_field"]),
    ({"prompt_field": "question", "reward": "user_rewards:one_value"}, ["train split (32 rows)", "returned 1 values for 32 completions"]),
    ({"prompt_field": "question", "reward": "user_rewards:words"}, ["'good'", "not a number"]),
    ({"prompt_field": "question", "reward": "no_such_module:f"}, ["cannot import module 'no_such_module'"]),
    ({"prompt_field": "question", "reward": "user_rewards:nothing"}, ["has no attribute 'nothing'"]),
    ({"prompt_field": "question", "reward": "bleu"}, ["unknown reward 'bleu'"]),
    ({"prompt_field": "question", "colour": "red"}, ["unknown option 'colour'"]),
    ({"prompt_field": "question", "test_size": "abc"}, ["bad value 'abc' for option 'test_size'"]),
    ({"prompt_field": ["question"]}, ["option 'prompt_field' takes text, got ['question']"]),
    ({"prompt_field": "question", "test_file": 3}, ["option 'test_file' takes text, got 3"]),
    ({"prompt_field": "question", "reward": "user_rewards:as_strings"},
     ["reward 'user_rewards:as_strings' raised AttributeError", "lists holding one assistant message"]),
])
def test_bad_input_is_a_clear_error(user_files, options, words):
    _, data = user_files
    with pytest.raises(ValueError) as exc:
        get_task(str(data), **options)
    for word in words:
        assert word in str(exc.value)


@pytest.mark.parametrize("reward, where", [
    ("fails_on", "train split, row 29 of 32 (question: 'What is 35 + 35?')"),
    ("fails_on_test_row", "test split, row 8 of 8 (question: 'What is 36 + 36?')"),
])
def test_a_reward_that_fails_on_a_late_row_fails_before_any_model_loads(user_files, reward, where):
    """The reward was tried on the first two train rows only, so one that raised on a later row (or a held-out
    row) passed and stopped the run after the model had loaded: every row of both splits is tried, and the error
    names the first row it fails on."""
    _, data = user_files
    with pytest.raises(ValueError) as exc:
        get_task(str(data), prompt_field="question", reward=f"user_rewards:{reward}")
    assert str(exc.value).startswith(f"{where}: reward 'user_rewards:{reward}' raised KeyError")


def test_the_reward_is_tried_in_bounded_calls_on_at_most_the_first_rows_of_each_split(user_files, monkeypatch):
    """Every build of a data task validates it (checks, trainer, each Ray worker): the reward gets calls of at most
    VALIDATE_CHUNK rows, on at most VALIDATE_ROWS rows per split, and a failure in a later call names its row."""
    import esft.tasks.dataset_task as DT

    _, data = user_files
    monkeypatch.setattr(DT, "VALIDATE_ROWS", 30)
    monkeypatch.setattr(DT, "VALIDATE_CHUNK", 8)
    sizes, real = [], DT.call_trl_reward

    def counted(fn, name, texts, *args):
        sizes.append(len(texts))
        return real(fn, name, texts, *args)

    monkeypatch.setattr(DT, "call_trl_reward", counted)
    get_task(str(data), prompt_field="question", reward="user_rewards:contains_answer")
    # train: 30 of its 32 rows (its first call twice: again as plain strings, the text-reading check); test: its 8
    assert sizes == [8, 8, 8, 8, 6, 8]
    monkeypatch.setattr(DT, "VALIDATE_ROWS", 28)  # train row 29 (the one that fails) is past the rows tried
    with pytest.raises(ValueError, match=r"^test split, row 8 of 8"):
        get_task(str(data), prompt_field="question", reward="user_rewards:fails_on")
    monkeypatch.setattr(DT, "VALIDATE_ROWS", 32)  # now it is tried, in the fourth call of 8 rows
    with pytest.raises(ValueError, match=r"^train split, row 29 of 32 \(question: 'What is 35 \+ 35\?'\)"):
        get_task(str(data), prompt_field="question", reward="user_rewards:fails_on")


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="holds no rows"):
        get_task(str(tmp_path / "empty.jsonl"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        get_task(str(tmp_path / "absent.csv"))


@pytest.mark.parametrize("argv, flag", [(["train", "es"], "--task"), (["train", "grpo"], "--task"),
                                        (["eval"], "--task")])
def test_a_missing_data_file_is_located_at_its_flag_before_any_model_loads(tmp_path, monkeypatch, capsys, argv, flag):
    import esft.models
    from esft.cli import main

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(esft.models, "load_model", refuse)
    absent = tmp_path / "absent.jsonl"
    out = [] if argv == ["eval"] else ["--output-dir", str(tmp_path / "run")]
    assert main([*argv, flag, str(absent), *out]) == 2
    err = capsys.readouterr().err
    assert f"command line ({flag}): " in err and f"task data file {absent} does not exist" in err, err
    assert not (tmp_path / "run").exists()
    data = tmp_path / "exact.jsonl"  # an option's value inside the path blames no option
    assert main([*argv, flag, str(data), "--task-options", "{reward: exact}", *out]) == 2
    assert f"command line ({flag}): " in capsys.readouterr().err
    data.write_text('{"prompt": "1+1?", "answer": "2"}\n' * 4)
    assert main([*argv, flag, str(data), "--task-options", f"{{test_file: {absent}}}", *out]) == 2
    err = capsys.readouterr().err  # the missing file is the option's
    assert "command line (--task-options): task_options = " in err and f"{absent} does not exist" in err, err


def test_file_encodings_and_layouts(tmp_path):
    """A spreadsheet's UTF-8 CSV (byte-order mark, quoted line breaks) reads as written; a file that is not UTF-8,
    a broken JSON list or a short CSV row is an error naming the file and the row."""
    path = tmp_path / "qa.csv"
    path.write_bytes("\ufeffq,a\r\n".encode() + b"".join(f'"say\r\n{i}",{i}\r\n'.encode() for i in range(5)))
    assert read_rows(path)[0] == {"q": "say\r\n0", "a": "0"}
    (tmp_path / "latin.jsonl").write_bytes('{"q": "a", "a": "1"}\n{"q": "caf\u00e9", "a": "2"}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin.jsonl:2: not UTF-8 text"):
        read_rows(tmp_path / "latin.jsonl")
    (tmp_path / "list.json").write_text('[{"q": "a", "a": "1"},\n {"q": "b" "a": "2"}]')
    with pytest.raises(ValueError, match=r"list.json:2: not a JSON list of objects"):
        read_rows(tmp_path / "list.json")
    (tmp_path / "short.csv").write_text("q,a\n" + "".join(f"say {i},{i}\n" for i in range(6)) + "say 6\n")
    with pytest.raises(ValueError, match=r"short.csv: row 7 has no value in field 'a' \(answer_field\)"):
        get_task(str(tmp_path / "short.csv"), prompt_field="q", answer_field="a")


def test_csv_and_options_in_the_name(tmp_path):
    path = tmp_path / "qa.csv"
    path.write_text("q,a\n" + "".join(f"say {i},{i}\n" for i in range(10)))
    task = get_task(f"{path}:prompt_field=q,answer_field=a,test_size=3")
    assert len(task.load("test")) == 3 and task.score("7", {"q": "", "a": "7"}) == 1.0


def test_import_path_entry_point_and_spec(user_files, monkeypatch):
    assert external_kind("user_rewards:Echo") == "import" and external_kind("countdown:numbers=2") is None
    task = get_task("user_rewards:Echo")
    assert isinstance(task, TaskAdapter)  # a duck-typed object gets the Task defaults
    assert task.prompt({"q": "say 1"}) == [{"role": "user", "content": "say 1"}]
    assert task.load("test", limit=2) == [{"q": "say 0", "a": "0"}, {"q": "say 1", "a": "1"}]
    mcq = get_task("esft.tasks.mcq:MMLUTask")
    assert type(mcq).__name__ == "MMLUTask" and task_spec(mcq) == ("esft.tasks.mcq:MMLUTask", {})
    ep = EntryPoint(name="echo", value="user_rewards:Echo", group=ENTRY_POINT_GROUP)
    monkeypatch.setattr("esft.tasks.custom.entry_points", lambda group: [ep] if group == ENTRY_POINT_GROUP else [])
    assert get_task("Echo").name == "echo"
    with pytest.raises(ValueError, match="installed: echo"):
        get_task("nosuch")


TAGGED_MODULE = '''
from __future__ import annotations

from dataclasses import dataclass

from esft.tasks import Task


@dataclass
class Tagged(Task):
    name: str = "tagged"
    tag: str | None = "x"
    note: str = "plain"
    count: int | None = 3
    strict: bool = True
    ids: tuple[int, ...] = (1,)

    def _load(self, split):
        return [{"q": "say 1", "answer": "1"}]

    def prompt(self, example):
        return [{"role": "user", "content": example["q"]}]

    def score(self, completion, example):
        return 0.0
'''


def test_text_options_of_a_dataclass_task_class_are_read_by_the_field_type(tmp_path, monkeypatch):
    """Task options given as text (`--task-options '{tag: none}'`, task_options in a spec: YAML reads `none` as
    text) reach a dataclass task named by its import path as its fields' types read them, as they do for an
    installed plug-in and in a name's `key=value`: `none` is None for a field that may be None and stays text for a
    `str` field, `false` is False, `5` is 5. The import path passed the text itself: tag 'none', strict 'false'
    (which is true)."""
    importable_module(tmp_path, monkeypatch, "tagged_tasks", TAGGED_MODULE)
    ep = EntryPoint(name="tagged", value="tagged_tasks:Tagged", group=ENTRY_POINT_GROUP)
    monkeypatch.setattr("esft.tasks.custom.entry_points", lambda group: [ep] if group == ENTRY_POINT_GROUP else [])
    for name in ("tagged_tasks:Tagged", "tagged"):
        task = get_task(name, tag="none", note="none", count="null", strict="false")
        assert (task.tag, task.note, task.count, task.strict) == (None, "none", None, False), name
        task = get_task(name, tag="y", count="5", strict="yes", ids="2,3")
        assert (task.tag, task.count, task.strict, task.ids) == ("y", 5, True, (2, 3)), name
        assert get_task(name, tag=None, count=7).count == 7  # values that are not text pass as they are
        with pytest.raises(ValueError, match=r"bad value 'many' for option 'count'"):
            get_task(name, count="many")
    assert get_task("tagged:tag=none,count=none").tag is None  # the name's own options, for comparison
    assert task_spec(get_task("tagged_tasks:Tagged", tag="none")) == ("tagged_tasks:Tagged", {"tag": None})


def _tiny_model_dir(root: Path, tokenizer) -> Path:
    folder = root / "tiny"
    make_tiny_model(hidden=32, layers=2).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_cli_eval_es_grpo_on_a_jsonl_task(user_files, tokenizer, capsys):
    """The acceptance path: a 40-row JSONL task, a TRL reward function in a module of the user's, three commands."""
    root, data = user_files
    model = str(_tiny_model_dir(root, tokenizer))
    task = ["--prompt-field", "question", "--answer-field", "answer", "--reward", "user_rewards:contains_answer",
            "--system-prompt", "Answer with a number."]
    assert main(["eval", "--model", model, "--task", str(data), *task, "--limit", "5", "--max-new-tokens", "4",
                 "--device", "cpu", "--output-dir", str(root / "eval")]) == 0
    summary = json.loads((root / "eval" / "summary.json").read_text())
    (result,) = summary["results"].values()
    assert result["n"] == 5 and 0.0 <= result["accuracy"] <= 1.0 and len(result["ci95"]) == 2
    assert "format_rate" not in result  # a reward function checks no format

    es_dir = root / "es"
    with pytest.warns(UserWarning, match="format bonus 0.1 has no effect"):
        assert main(["train", "es", "--model", model, "--task", str(data), *task, "--iterations", "2",
                     "--population-size", "2", "--batch-size", "4", "--max-new-tokens", "4", "--eval-every", "1",
                     "--eval-limit", "4", "--device", "cpu", "--dtype", "float32", "--format-bonus", "0.1",
                     "--output-dir", str(es_dir)]) == 0
    metrics = _read_jsonl(es_dir / "metrics.jsonl")
    assert all(r["format_rate"] is None for r in metrics if r["kind"] == "train")
    assert all(r["test_format_rate"] is None for r in metrics if r["kind"] == "eval")
    # no format checked: no format flag in the rows either (esft.sample_rows), as in GRPO's and `esft eval`'s
    assert all("well_formed" not in r for r in _read_jsonl(es_dir / "samples" / "eval_000000.jsonl"))
    assert [r["step"] for r in metrics if r["kind"] == "train"] == [1, 2]
    assert [r["step"] for r in metrics if r["kind"] == "eval"] == [0, 1, 2]
    assert all(r["test_n"] == 4 for r in metrics if r["kind"] == "eval")
    saved = (es_dir / "config.yaml").read_text()
    assert "user_rewards:contains_answer" in saved and "prompt_field: question" in saved  # resume rebuilds it
    assert (es_dir / "checkpoints" / "final" / "config.json").exists()

    grpo_dir = root / "grpo"
    assert main(["train", "grpo", "--model", model, "--task", str(data), *task, "--max-steps", "1",
                 "--prompts-per-step", "2", "--num-generations", "2", "--per-device-train-batch-size", "4",
                 "--max-completion-length", "4", "--eval-every", "1", "--eval-limit", "2", "--device", "cpu",
                 "--precision", "fp32", "--output-dir", str(grpo_dir)]) == 0
    grpo = _read_jsonl(grpo_dir / "metrics.jsonl")
    train = [r for r in grpo if r.get("kind") == "train"]
    assert len(train) == 1 and train[0]["step"] == 1 and "format_rate" not in train[0]
    assert any(r.get("kind") == "eval" for r in grpo)
    assert all(r["test_format_rate"] is None for r in grpo if r.get("kind") == "eval")


def test_cli_errors_before_the_model_loads(user_files, monkeypatch, capsys):
    _, data = user_files

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the task was checked")

    monkeypatch.setattr("esft.models.load_model", no_model)
    assert main(["train", "es", "--task", str(data), "--prompt-field", "nope", "--output-dir", "x"]) == 2
    err = capsys.readouterr().err
    # what is wrong with the file, not the list of built-in tasks
    assert "no field 'nope'" in err and "a task esft can build from it" in err and "countdown" not in err
    assert main(["train", "grpo", "--task", str(data), "--prompt-field", "question", "--reward",
                 "user_rewards:one_value", "--output-dir", "x"]) == 2
    assert "returned 1 values" in capsys.readouterr().err
    assert main(["eval", "--task", str(data), "--prompt-field", "question", "--reward", "missing_mod:f"]) == 2
    assert "cannot import module 'missing_mod'" in capsys.readouterr().err
    assert main(["train", "es", "--task", "boolq", "--reward", "math"]) == 2  # flags a built-in task ignores
    assert "--reward: only for a task read from a data file" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["train", "es"], ["train", "grpo"], ["eval"]])
@pytest.mark.parametrize("reward, problem", [
    ("missing_mod:f", "(cannot import module 'missing_mod'"),
    ("user_rewards:one_value", "(train split (32 rows): reward 'user_rewards:one_value' returned 1 values"),
    ("exactt", "(unknown reward 'exactt'"),
])
def test_a_bad_reward_is_named_at_the_flag_or_line_that_gave_it(user_files, capsys, tmp_path, command, reward,
                                                               problem):
    """A reward that does not import, raises or returns the wrong count is the reward's fault: the error names
    `--reward` (or the config file's task_options line), not `--task` and the data file."""
    _, data = user_files
    out = [] if command == ["eval"] else ["--output-dir", str(tmp_path / "run")]
    assert main([*command, "--task", str(data), "--prompt-field", "question", "--reward", reward, *out]) == 2
    err = capsys.readouterr().err
    assert f"command line (--reward): reward = {reward!r} is not accepted; expected a valid reward " \
           f"{problem}" in err, err
    assert "--task" not in err
    cfg = tmp_path / "run.yaml"
    key = "tasks: [" + str(data) + "]" if command == ["eval"] else f"task: {data}"
    cfg.write_text(f"{key}\ntask_options:\n  prompt_field: question\n  reward: {reward}\n")
    assert main([*command, "--config", str(cfg), *out]) == 2
    err = capsys.readouterr().err
    assert f"{cfg}:2: task_options = " in err and f"expected a valid reward {problem}" in err, err


USER_TASKS = '''
from dataclasses import dataclass
from esft.tasks import Task

@dataclass
class TrainOnly(Task):
    name: str = "train-only"
    splits: tuple = ("train",)
    count: int = 4
    def _load(self, split):
        return [{"n": n} for n in range(self.count)]
    def prompt(self, example):
        return [{"role": "user", "content": str(example["n"])}]
    def score(self, completion, example):
        return 0.0

@dataclass
class NoRows(TrainOnly):
    splits: tuple = ("train", "test")
    count: int = 0

class Broken(TrainOnly):
    def __init__(self):
        raise RuntimeError("no settings file")

@dataclass
class BadScore(TrainOnly):
    splits: tuple = ("train", "test")
    def score(self, completion, example):
        return float(example["answer"] == completion)

@dataclass
class NanScore(BadScore):
    def score(self, completion, example):
        return float("nan")

@dataclass
class TextPrompt(BadScore):
    def prompt(self, example):
        return "What is " + str(example["n"]) + "?"

@dataclass
class NoneScore(BadScore):
    def score(self, completion, example):
        return None
'''


def test_cli_checks_a_task_class_before_the_model_loads(user_files, monkeypatch, capsys):
    """A task class without the split a command reads, with no train rows, whose constructor, _load, prompt or
    score fails (or score is not a finite number), or malformed --task-options: a one-line error before any model
    loads and before the output folder exists."""
    root, _ = user_files
    importable_module(root, monkeypatch, "user_tasks", USER_TASKS)

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the task was checked")

    monkeypatch.setattr("esft.models.load_model", no_model)
    out = str(root / "run")
    tiny = root / "two.jsonl"
    tiny.write_text('{"prompt": "1+1?", "answer": "2"}\n{"prompt": "2+2?", "answer": "4"}\n')
    typo = root / "typo.jsonl"  # a chat template renders any role: "User" would reach the model as plain text
    typo.write_text("".join(json.dumps({"prompt": [{"role": "User", "content": f"{k}+1?"}], "answer": str(k + 1)})
                            + "\n" for k in range(10)))
    grpo = ["train", "grpo", "--eval-every", "1", "--eval-limit", "2", "--output-dir", out]
    cases = [(["train", "es", "--task", "user_tasks:TrainOnly", "--output-dir", out],
              "the split(s) test (task 'train-only' has train)"),
             # named as typed, not by the name its class declares ('train-only')
             (["eval", "--task", "user_tasks:TrainOnly", "--output-dir", out],
              "tasks = 'user_tasks:TrainOnly' is not accepted; expected a task with the split(s) test"),
             (["train", "es", "--task", "ifeval", "--output-dir", out], "the split(s) train (task 'ifeval' has test)"),
             ([*grpo, "--task", "user_tasks:TrainOnly"], "the split(s) test"),
             ([*grpo, "--task", "user_tasks:NoRows"], "its train split is empty"),
             (["train", "es", "--task", "user_tasks:NoRows", "--output-dir", out], "its train split is empty"),
             (["train", "es", "--task", "user_tasks:TrainOnly", "--task-options", "{count: [4]}", "--eval-limit",
               "0", "--output-dir", out], "train split loads (task 'train-only': TypeError"),
             (["train", "es", "--task", "user_tasks:TrainOnly", "--task-options", "{count: many}", "--eval-limit",
               "0", "--output-dir", out], "bad value 'many' for option 'count': invalid literal for int()"),
             (["eval", "--task", "user_tasks:Broken"], "cannot build Broken: RuntimeError: no settings file"),
             (["eval", "--task", str(root / "sums.jsonl"), "--task-options", "prompt_field: q: x"],
              "command line (--task-options): task_options = 'prompt_field: q: x' is not accepted; expected a "
              "mapping such as {key: value} (the text is not a YAML / JSON mapping"),
             (["train", "es", "--task", str(root / "sums.jsonl"), "--task-options", "prompt_field: q: x"],
              "is not a YAML / JSON mapping"),
             # two rows leave no held-out row (test_size 0.2): an evaluation of n = 0 or a run without held-out
             # numbers is refused; training alone (--eval-limit 0) needs only the train split
             (["eval", "--task", str(tiny), "--reward", "exact"], "its test split is empty"),
             (["train", "es", "--task", str(tiny), "--reward", "exact", "--output-dir", out],
              "its test split is empty"),
             # the user's prompt and score run once on the first example, so their errors come before the model
             (["train", "es", "--task", "user_tasks:BadScore", "--output-dir", out],
              "can score its first train example (task 'train-only': score raised KeyError: 'answer')"),
             ([*grpo, "--task", "user_tasks:BadScore"], "score raised KeyError"),
             (["eval", "--task", "user_tasks:BadScore"], "tasks = 'user_tasks:BadScore' is not accepted; expected "
              "a task that can score its first test example (task 'train-only'"),
             (["eval", "--task", "user_tasks:NanScore"], "returns a finite number (task 'train-only' scored an "
              "empty completion float nan)"),
             (["eval", "--task", "user_tasks:NoneScore"], "scored an empty completion NoneType None"),
             (["train", "es", "--task", str(typo), "--reward", "exact", "--output-dir", out],
              f"chat messages with the roles system, user, assistant, tool (task '{typo}' gave the role 'User')"),
             (["train", "es", "--task", "user_tasks:TextPrompt", "--output-dir", out],
              "returns chat messages, a list of {'role': ..., 'content': ...} (task 'train-only' returned str "
              "'What is 0?')")]
    for argv, words in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, (argv, err)
        assert not (root / "run").exists(), argv


def test_debug_shows_the_error_of_the_users_code(user_files, monkeypatch):
    """--debug shows the user's own exception behind a one-line error, not only esft's ConfigError."""
    import traceback

    from esft.config import ConfigError

    root, _ = user_files
    importable_module(root, monkeypatch, "user_tasks", USER_TASKS)
    with pytest.raises(ConfigError) as info:
        main(["eval", "--task", "user_tasks:BadScore", "--debug"])
    shown = "".join(traceback.format_exception(info.value))
    assert "KeyError: 'answer'" in shown and 'return float(example["answer"] == completion)' in shown, shown


def test_python_api_records_the_task(user_files, tmp_path):
    from esft.api import with_task
    from esft.es import ESConfig

    _, data = user_files
    task = get_task(str(data), prompt_field="question", reward="boxed")
    config, obj = with_task(ESConfig(output_dir=str(tmp_path)), task)
    assert obj is task and config.task == str(data)
    assert config.task_options == {"prompt_field": "question", "reward": "boxed"}
    assert get_task(config.task, **config.task_options).load("test") == task.load("test")
    config, obj = with_task(ESConfig(), "user_rewards:Echo")
    assert obj is None and config.task == "user_rewards:Echo"


def test_spec_accepts_a_data_task(user_files):
    from esft.experiments.spec import parse_spec
    from esft.experiments.yamlines import load as load_text

    _, data = user_files
    text = textwrap.dedent(f"""\
        kind: single-task
        model: smollm2-135m
        tasks: [{data}]
        algorithms: {{es: {{preset: cpu, iterations: 1, report_to: tensorboard}}}}
        task_options: {{{data}: {{prompt_field: question, reward: "user_rewards:contains_answer"}}}}
        evaluation: {{limit: 2, holdout: []}}
        """)
    spec = parse_spec(load_text(text), "spec.yaml")
    assert spec.tasks == [str(data)]
    comp = spec.methods[0].components[0]
    cfg = spec.config(comp, str(data), 42, output_dir="<x>")
    assert cfg.task == str(data) and cfg.task_options["reward"] == "user_rewards:contains_answer"
    assert cfg.report_to == "tensorboard"


def test_a_data_tasks_path_is_recorded_absolute(tmp_path, monkeypatch):
    """config.yaml rebuilds a data task from any directory: ES and GRPO configs hold its file's absolute path
    (options kept); built-in tasks, absolute paths and missing files (reported later by name) are unchanged."""
    from esft.es.es_config import ESConfig, read_run_config, resume_config, save_yaml
    from esft.grpo.grpo_config import GRPOConfig

    work = tmp_path / "work"
    work.mkdir()
    (work / "sums.jsonl").write_text('{"prompt": "1+1?", "answer": "2"}\n')
    monkeypatch.chdir(work)
    full = str(work / "sums.jsonl")
    assert ESConfig(task="sums.jsonl").task == full
    assert GRPOConfig(task="sums.jsonl:reward=exact").task == full + ":reward=exact"
    assert ESConfig(task="countdown:numbers=2,ops=+*").task == "countdown:numbers=2,ops=+*"
    assert ESConfig(task="missing.jsonl").task == "missing.jsonl"
    run = tmp_path / "run"
    run.mkdir()
    save_yaml(ESConfig(task="sums.jsonl", output_dir=str(run)), run / "config.yaml")
    monkeypatch.chdir(tmp_path)
    assert read_run_config(run)[0].task == full
    monkeypatch.chdir(work)  # the same file named relative again on a resume is no change
    assert resume_config(run, {"task": "sums.jsonl", "iterations": 5}).iterations == 5


def test_the_api_resumes_a_run_of_a_data_task_object_named_relative(user_files, tmp_path, monkeypatch):
    """A DatasetTask built from a relative path records the file's absolute path; resuming with the same object
    keeps it (the recorded text and the object's spec compare as absolute paths)."""
    from esft.api import with_task
    from esft.es import ESConfig
    from esft.es.es_config import save_yaml

    _, data = user_files
    monkeypatch.chdir(data.parent)
    task = get_task(data.name, prompt_field="question", reward="boxed")
    run = tmp_path / "run"
    run.mkdir()
    config, _ = with_task(ESConfig(output_dir=str(run)), task)
    assert config.task == str(data.resolve())
    save_yaml(config, run / "config.yaml")
    resumed, obj = with_task(ESConfig(output_dir=str(run), resume=True), task)
    assert obj is task and resumed.task == str(data.resolve())
    assert resumed.task_options == {"prompt_field": "question", "reward": "boxed"}


def test_a_task_object_of_a_scripts_class_is_recorded_by_its_class(tmp_path, capsys):
    """config.yaml recorded the config's default task (boolq) for a task object whose class the script itself
    defines, so `esft train es --resume RUN` went on training boolq without a word; it now records the class, and
    a resume from the command line says to continue from the script."""
    from dataclasses import dataclass

    from esft.api import with_task
    from esft.es import ESConfig
    from esft.es.es_config import save_yaml
    from esft.tasks import Task

    @dataclass
    class Local(Task):
        name: str = "local"

        def _load(self, split):
            return [{"n": 1}]

        def prompt(self, example):
            return [{"role": "user", "content": "Say 1."}]

        def score(self, completion, example):
            return float("1" in completion)

    run = tmp_path / "run"
    run.mkdir()
    config, obj = with_task(ESConfig(output_dir=str(run)), Local())
    assert config.task == f"{__name__}:{Local.__qualname__}" and config.task_options == {}
    with pytest.raises(ValueError, match="class of the script that trained the run .defined inside a function."):
        get_task(config.task)
    save_yaml(config, run / "config.yaml")
    assert main(["train", "es", "--resume", str(run), "--iterations", "2"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "continue the run from that script" in err
    resumed, _ = with_task(ESConfig(output_dir=str(run), resume=True), obj)  # the script itself resumes it
    assert resumed.task == config.task
    missing = "__main__:NoSuchTask"
    with pytest.raises(ValueError, match=r"'__main__:NoSuchTask' is a class of the script .* \(its __main__\)"):
        get_task(missing)


def test_a_wrapped_task_object_is_recorded_by_the_users_class(user_files):
    """An object with load / prompt / score that is not a Task is wrapped in a TaskAdapter; config.yaml recorded
    the wrapper, `esft.tasks.custom:TaskAdapter`, which no resume can build."""
    from esft.api import with_task
    from esft.es import ESConfig
    from esft.tasks.custom import instantiate

    import user_rewards

    task = instantiate(user_rewards.Echo(), "echo", {})
    config, obj = with_task(ESConfig(), task)
    assert obj is task and config.task == "user_rewards:Echo"
    assert get_task(config.task).load("test") == task.load("test")


def test_an_option_a_user_task_class_does_not_take_is_refused_with_the_options_it_takes():
    """`--task my_tasks:Doubling --task-options '{cont: 5}'` said only "TypeError: Doubling.__init__() got an
    unexpected keyword argument 'cont'"; the refusal now names the unknown option and lists what the constructor
    takes, in a built-in task's words ("task 'countdown': unknown option ...").
    The class's own errors (a TypeError too, where the options fit), and a constructor that takes any keyword, are
    reported as they are."""
    from esft.tasks.custom import instantiate

    class Doubling:
        def __init__(self, count: int = 3, *, scale: float = 1.0):
            self.count = count

    class Open:
        def __init__(self, **options):
            raise TypeError("wants a 'size'")

    class Bare:
        def __init__(self):
            raise RuntimeError("no settings file")

    class Own:
        def __init__(self, size: int = 3):
            raise TypeError("size must be a power of two")

    class Positional:
        def __init__(self, path, /, count: int = 3):
            self.path = path

    with pytest.raises(ValueError, match=r"^task 'my:Doubling': unknown option 'cont'; options: count, scale$"):
        instantiate(Doubling, "my:Doubling", {"cont": 5})
    with pytest.raises(ValueError, match=r"^task 'my:Open': cannot build Open: TypeError: wants a 'size'$"):
        instantiate(Open, "my:Open", {"x": 1})
    with pytest.raises(ValueError, match=r"^task 'my:Bare': unknown option 'x'; it takes no options$"):
        instantiate(Bare, "my:Bare", {"x": 1})
    with pytest.raises(ValueError, match=r"^task 'my:Bare': cannot build Bare: RuntimeError: no settings file$"):
        instantiate(Bare, "my:Bare", {})
    for options in ({}, {"size": 5}):
        with pytest.raises(ValueError, match=r"^task 'my:Own': cannot build Own: TypeError: size must be a power of "
                                             r"two$"):
            instantiate(Own, "my:Own", options)
    with pytest.raises(ValueError, match=r"^task 'my:Positional': cannot build Positional: TypeError: .*; it needs "
                                         r"positional arguments \(path\), which task options cannot give$"):
        instantiate(Positional, "my:Positional", {"count": 2})


def test_saved_key_lines_reads_top_level_and_task_option_keys(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("model: m\ntask: d.jsonl\ntask_options:\n  prompt_field: q\n  reward: r:f\n  model: inner\n")
    from esft.validation import saved_key_lines

    assert saved_key_lines(path) == {"model": 1, "task": 2, "task_options": 3, "prompt_field": 4, "reward": 5}
    path.write_text("[unclosed\n")
    assert saved_key_lines(path) == {}


@pytest.mark.parametrize("trainer", ["es", "grpo"])
def test_a_resume_that_cannot_rebuild_its_task_names_the_saved_config_line(user_files, monkeypatch, capsys, tmp_path,
                                                                         trainer):
    """Resuming from a folder where the run's reward module or data file cannot be found: the error names the
    line of the run's config.yaml that records it (it named no file at all)."""
    from esft.config import save_yaml
    from esft.es import ESConfig
    from esft.grpo import GRPOConfig

    _, data = user_files
    run = tmp_path / "run"
    run.mkdir()
    cls = ESConfig if trainer == "es" else GRPOConfig
    save_yaml(cls(task=str(data), task_options={"prompt_field": "question", "reward": "user_rewards:contains_answer"},
                  output_dir=str(run)), run / "config.yaml")
    resume = ["train", "es", "--resume", str(run)] if trainer == "es" else \
        ["train", "grpo", "--resume", "--output-dir", str(run)]
    lines = (run / "config.yaml").read_text().splitlines()
    reward_line = lines.index("  reward: user_rewards:contains_answer") + 1
    monkeypatch.delitem(sys.modules, "user_rewards", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    monkeypatch.chdir(run)  # resumed from another folder: the reward module is not found from here
    assert main(resume) == 2
    err = capsys.readouterr().err
    assert f"esft: error: {run / 'config.yaml'}:{reward_line}: reward = 'user_rewards:contains_answer' is not " \
           f"accepted; expected a valid reward (cannot import module 'user_rewards'" in err, err
    text = (run / "config.yaml").read_text().replace(str(data), str(tmp_path / "moved.jsonl"))
    (run / "config.yaml").write_text(text.replace("user_rewards:contains_answer", "exact"))
    assert main(resume) == 2
    err = capsys.readouterr().err
    task_line = [line.split(":")[0] for line in lines].index("task") + 1
    assert f"esft: error: {run / 'config.yaml'}:{task_line}: task = '{tmp_path / 'moved.jsonl'}' is not accepted" in err


def test_an_unknown_option_of_a_data_or_class_task_is_named_at_task_options(user_files, capsys, tmp_path):
    """An option the task does not take is the options' fault: it was refused at `--task` (the task's name), as
    though the data file or class were wrong."""
    _, data = user_files
    for task, option in ((str(data), "prompt_fild"), ("user_rewards:Echo", "sise")):
        assert main(["eval", "--task", task, "--task-options", f"{{{option}: 4}}"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"esft: error: command line (--task-options): task_options = {{{option!r}: 4}} is not "
                              f"accepted; expected options of task {task!r} (task ") and \
            f": unknown option {option!r}; " in err, err
        if task == str(data):  # a data-task flag's value is not shown as the user's task_options
            assert main(["eval", "--task", task, "--task-options", f"{{{option}: 4}}", "--prompt-field", "q"]) == 2
            err = capsys.readouterr().err
            assert f"task_options = {{{option!r}: 4}} is not accepted" in err and "'q'" not in err, err
        cfg = tmp_path / "eval.yaml"
        cfg.write_text(f"tasks: [{task}]\ntask_options: {{{option}: 4}}\n")
        assert main(["eval", "--config", str(cfg)]) == 2
        assert capsys.readouterr().err.startswith(f"esft: error: {cfg}:2: task_options = "), err


@pytest.mark.parametrize("algorithm", ["es", "grpo"])
def test_a_resume_refuses_data_task_flags_that_change_the_task_in_the_words_of_other_options(
        user_files, monkeypatch, capsys, algorithm):
    """`--reward exact` on a resume of a run scored by a reward function was refused only by the trainer, as "config
    differs from the original run in {'task_options': (...)}"; now before the model loads, as any other option a
    resume may not change. The flags repeated unchanged pass."""
    import argparse

    import yaml

    import esft.models
    from esft import cli
    from esft.es.es_config import ESConfig, save_yaml
    from esft.grpo import GRPOConfig

    root, data = user_files
    run = root / "run"
    run.mkdir()
    options = {"prompt_field": "question", "reward": "user_rewards:contains_answer"}
    if algorithm == "es":
        save_yaml(ESConfig(task=str(data), task_options=options, output_dir=str(run)), run / "config.yaml")
        resume = ["train", "es", "--resume", str(run)]
    else:
        saved = GRPOConfig(task=str(data), task_options=options, output_dir=str(run), prompts_per_step=4)
        (run / "config.yaml").write_text(yaml.safe_dump({**saved.to_dict(), "_run": {}}, sort_keys=False))
        resume = ["train", "grpo", "--resume", "--output-dir", str(run)]
    monkeypatch.setattr(esft.models, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    assert main([*resume, "--reward", "exact"]) == 2
    err = capsys.readouterr().err
    assert f"cannot change ['task_options'] when resuming {run} (the run has task_options=" in err, err
    assert "'reward': 'exact'" in err and "another --output-dir" in err
    config = ESConfig(task=str(data), task_options=options)
    same = argparse.Namespace(prompt_field="question", answer_field=None, system_prompt=None,
                              reward="user_rewards:contains_answer")
    assert cli._task_flags(config, same, str(run)) == config  # unchanged: accepted
    assert cli._task_flags(config, argparse.Namespace(reward="exact"), None).task_options["reward"] == "exact"


def test_maj_at_k_of_a_data_task_votes_on_the_answer_its_verifier_compares():
    """A data task's vote key is the verifier's canonical answer: with `math`, "0.5" and "\\frac12" are one answer
    (two votes, beating "3" and "4"; they voted apart, a four-way tie scoring 1/2); with `boxed`, "Yes" and "yes."
    are one answer, and "a b" is not "ab" (the verifier scores them apart, so they vote apart)."""
    from esft.passk import answer_key, majority_score

    math = DatasetTask(source="x.jsonl", reward="math")
    ex = {"answer": "\\dfrac{1}{2}"}
    texts = ["\\boxed{0.5}", "\\boxed{\\frac12}", "\\boxed{3}", "\\boxed{4}"]
    keys = [answer_key(math.details(t, ex)) for t in texts]
    assert majority_score(keys, [math.score(t, ex) for t in texts]) == 1.0
    assert math.details("\\boxed{0.5}", ex)["extracted"] == "0.5"
    boxed = DatasetTask(source="x.jsonl", reward="boxed")
    assert answer_key(boxed.details("\\boxed{Yes}", ex)) == answer_key(boxed.details("\\boxed{ yes. }", ex))
    assert answer_key(boxed.details("\\boxed{a b}", ex)) != answer_key(boxed.details("\\boxed{ab}", ex))
    assert answer_key(boxed.details("no box", ex)) is None
