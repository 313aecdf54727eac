"""A researcher's own task, continued (tests/test_custom_tasks.py has the acceptance path): a reward function passed
itself through the Python API, a reward that gives no number for some completions (None, as TRL allows: the
multi-function cases are in tests/test_custom_task_none_rewards.py), and multiple-choice data whose answer letters
are labels (balanced evaluation, the balanced fitness rule, GRPO's class_balanced)."""

from __future__ import annotations

import json

import pytest

from conftest import importable_module
from esft.cli import main
from esft.config import ConfigError, build_config
from esft.tasks import get_task
from esft.tasks.custom import TaskAdapter, task_record, task_spec
from esft.tasks.dataset_task import DatasetTask
from esft.tasks.labels import wilson_interval
from esft.tasks.verifiers import builtin_verifier
from esft.validation import check_names

REWARDS = '''
import re

def last_number(completions, answer, **kwargs):
    out = []
    for c, a in zip(completions, answer):
        numbers = re.findall(r"-?\\d+", c[0]["content"])
        out.append(1.0 if numbers and numbers[-1] == str(a) else 0.0)
    return out

def none_when_long(completions, **kwargs):
    return [None if len(c[0]["content"]) > 6 else 0.5 for c in completions]

def nan_when_long(completions, **kwargs):
    return [float("nan") if len(c[0]["content"]) > 6 else 0.5 for c in completions]

class Letters:
    """A duck-typed multiple-choice task with its own labels."""
    name = "letters"
    def load(self, split):
        return [{"q": f"Pick {x}.", "gold": x} for x in "ABAB"]
    def prompt(self, example):
        return example["q"]
    def score(self, completion, example):
        return float(completion.strip() == example["gold"])
    def label_set(self):
        return ("A", "B")
    def gold_key(self, example):
        return example["gold"]
'''


@pytest.fixture()
def files(tmp_path, monkeypatch):
    """sums.jsonl (numbers), mcq.jsonl (letters A-D, lower-case in the file for some rows), a reward module."""
    importable_module(tmp_path, monkeypatch, "byot_rewards", REWARDS)
    sums = tmp_path / "sums.jsonl"
    sums.write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(20)))
    mcq = tmp_path / "mcq.jsonl"
    rows = [{"question": f"Which is {i}?\nA. {i}\nB. {i + 1}\nC. {i + 2}\nD. {i + 3}",
             "answer": "ABCD"[i % 4] if i % 3 else "abcd"[i % 4]} for i in range(40)]
    mcq.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_a_reward_function_passed_itself(files):
    """DatasetTask(reward=fn) failed with "AttributeError: 'function' object has no attribute 'strip'"."""
    import byot_rewards

    task = get_task(str(files / "sums.jsonl"), prompt_field="question", reward=byot_rewards.last_number)
    assert task.score("It is 8", {"question": "What is 4 + 4?", "answer": "8"}) == 1.0
    assert task.reward_function()([[{"role": "assistant", "content": "2"}]], question=["1 + 1?"], answer=["2"]) == [1.0]
    # recorded by its import path: config.yaml rebuilds the same task
    name, options = task_spec(task)
    assert options == {"prompt_field": "question", "reward": "byot_rewards:last_number"}
    assert get_task(name, **options).score("8", {"question": "4 + 4?", "answer": "8"}) == 1.0
    # a lambda has none: recorded as not recorded, which a resume from config.yaml refuses
    anonymous = DatasetTask(source=str(files / "sums.jsonl"), prompt_field="question",
                            reward=lambda completions, **kwargs: [0.0] * len(completions))
    name, options = task_record(anonymous)
    assert task_spec(anonymous) is None and options["reward"] == "<not recorded: function>"
    with pytest.raises(ValueError, match=r"\(reward: function\), so only the script that trained the run"):
        get_task(name, **options)
    with pytest.raises(ValueError, match="reward must be a built-in verifier's name, 'module:function' or a function"):
        DatasetTask(source=str(files / "sums.jsonl"), reward=3)


@pytest.mark.parametrize("reward", ["none_when_long", "nan_when_long"])
def test_a_reward_without_a_number_for_a_completion_is_read_as_trl_reads_it(files, reward):
    """A reward returning None (or NaN) for a completion stopped the run ("returned None for completion 0: every
    completion needs a score"), though TRL's GRPOTrainer takes None as "this reward does not apply". With one
    function, such a completion is one no reward applies to: TRL leaves it out of its group's baseline (advantage
    0), so the GRPO path gives TRL None; ES fitness and accuracy count it 0 (nansum over no reward), with a warning
    naming the reward and the count."""
    task = get_task(str(files / "sums.jsonl"), prompt_field="question", reward=f"byot_rewards:{reward}")
    example = task.load("train", limit=1)[0]
    assert task.score("short", example) == 0.5
    with pytest.warns(UserWarning, match=rf"reward 'byot_rewards:{reward}' returned None for 1 of 2 completions "
                                         r"scored so far: no reward applies to them, so ES fitness and accuracy "
                                         r"count each as 0"):
        assert task.score("a long completion", example) == 0.0
    completions = [[{"role": "assistant", "content": t}] for t in ("short", "a long completion")]
    assert task.reward_function()(completions, examples=[example, example]) == [0.5, None]


def test_multiple_choice_data_has_labels(files):
    """A data task scored by the `mcq` verifier had no labels: --eval-balanced was ignored without a word, and
    --fitness-rule balanced / --class-balanced were refused as for an open-answer task."""
    task = get_task(str(files / "mcq.jsonl"), prompt_field="question", reward="mcq")
    assert task.label_set() == ("A", "B", "C", "D")
    assert {task.gold_key(r) for r in task.load("train")} == {"A", "B", "C", "D"}  # "b" in the file is B
    assert get_task(str(files / "sums.jsonl"), prompt_field="question").label_set() is None
    from esft.es import ESConfig
    from esft.grpo import GRPOConfig

    options = {"task": str(files / "mcq.jsonl"), "task_options": {"prompt_field": "question", "reward": "mcq"},
               "eval_limit": 4, "eval_balanced": True}
    build_config(ESConfig, overrides={**options, "fitness_rule": "balanced"}, check=check_names)
    build_config(GRPOConfig, overrides={**options, "class_balanced": True, "scale_rewards": "batch",
                                        "prompts_per_step": 8}, check=check_names)  # the file has 32 train rows
    adapter = get_task("byot_rewards:Letters")
    assert isinstance(adapter, TaskAdapter) and adapter.label_set() == ("A", "B")
    assert adapter.aggregate([{"score": 0.0, "example": r} for r in adapter.load("test")])["constant_baseline"] == 0.5


def test_eval_balanced_refuses_a_subset_that_does_not_exist_before_the_model_loads(files, monkeypatch, capsys):
    """`esft eval --balanced` found a split without some label, or too few examples, only after the model loaded."""
    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the balanced subset was checked")

    monkeypatch.setattr("esft.models.load_model", no_model)
    data = files / "mcq.jsonl"
    one_letter = files / "one.jsonl"
    one_letter.write_text("".join(json.dumps({"question": f"q{i}", "answer": "A"}) + "\n" for i in range(10))
                          + json.dumps({"question": "q", "answer": "B"}) + "\n")
    args = ["eval", "--prompt-field", "question", "--reward", "mcq", "--balanced", "--limit", "4"]
    assert main([*args, "--task", f"{one_letter}:test_size=2"]) == 2
    assert "expected a balanced held-out set that exists (cannot balance: no example has label 'B')" in \
        capsys.readouterr().err
    assert main([*args[:-1], "400", "--task", str(data), "--split", "train"]) == 2
    assert "expected a balanced set of split 'train' that exists (a balanced subset of 400" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="a balanced held-out set that exists"):
        from esft.eval_config import EvalConfig

        build_config(EvalConfig, overrides={"tasks": ["boolq"], "balanced": True, "limit": 100000},
                     check=check_names)


def test_a_run_directory_given_as_the_model_names_its_checkpoints(tmp_path, capsys):
    """`esft eval --model RUN` said only "RUN has no config.json"."""
    run = tmp_path / "run"
    (run / "checkpoints" / "final").mkdir(parents=True)
    (run / "config.yaml").write_text("task: boolq\n")
    assert main(["eval", "--model", str(run), "--tasks", "boolq", "--limit", "1"]) == 2
    assert f"{run} is a run directory: its model is a checkpoint folder, e.g. {run}/checkpoints/final" in \
        capsys.readouterr().err


def test_a_regex_reward_without_a_group_compares_the_whole_match():
    task = DatasetTask(source="x.jsonl", reward="regex:\\d+$")
    assert task.score("so it is 42", {"answer": "42"}) == 1.0
    assert task.score("42, or 41", {"answer": "42"}) == 0.0


def test_a_bad_regex_reward_is_refused_when_it_is_named():
    with pytest.raises(ValueError, match="bad regular expression"):
        builtin_verifier("regex:(")


WORDS = ["Yes", "yes.", " yes", "No", "no", "yes", "Yes", "maybe"]
NUMBERS = ["0.5", "1/2", "\\frac12", "\\dfrac{1}{2}", "5", "\\$5", "5", "7"]


@pytest.mark.parametrize("reward, shown, golds", [
    ("exact", "{}", WORDS), ("boxed", r"\boxed{{{}}}", WORDS), (r"regex:answer: (\S+)", "answer: {}", WORDS),
    ("math", r"\boxed{{{}}}", NUMBERS),
])
def test_the_constant_answer_baseline_is_the_best_constant_answer_under_the_tasks_own_verifier(tmp_path, reward,
                                                                                               shown, golds):
    """Gold answers the verifier reads as one ("Yes", "yes." and " yes" for exact; "0.5", "1/2" and "\\frac12" for
    math) are one constant answer. Before, the baseline counted them apart: 0.375 for "Yes" where always answering
    it scores 0.625, a baseline below what a constant answer earns on the same examples."""
    data = tmp_path / "golds.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": g}) + "\n" for i, g in enumerate(golds)))
    task = DatasetTask(source=str(data), reward=reward, test_size=0.5)
    examples = task.load("train") + task.load("test")
    best = max(sum(task.score(shown.format(g.strip()), ex) for ex in examples) / len(examples) for g in golds)
    assert best >= 0.5  # the most frequent gold text alone is 0.25 of them
    summary = task.constant_baseline([{"index": i, "example": ex} for i, ex in enumerate(examples)])
    assert summary["constant_baseline"] == best
    answer = shown.format(summary["constant_answer"])
    assert sum(task.score(answer, ex) for ex in examples) / len(examples) == best


def digits_credit(completions, **kwargs):
    """Partial credit whatever the gold: a tenth per digit, at most 1 (the reward of a user's report)."""
    return [min(1.0, sum(ch.isdigit() for ch in c) / 10) for c in completions]


def option_index(completions, options, **kwargs):
    """Credit by the position of the answer among the row's own options: a letter outside them raises."""
    return [1.0 - o.index(c) / len(o) for c, o in zip(completions, options)]


def distance(completions, answer, **kwargs):
    """Minus the distance to the gold number: a reward outside [0, 1]."""
    return [-abs(float(c) - float(a)) for c, a in zip(completions, answer)]


def test_a_reward_functions_constant_answer_baseline_is_what_always_giving_it_scores(tmp_path):
    """With a reward function the baseline is the reward of always answering a gold answer, the best of the most
    frequent ones. Before, it was the most frequent answer's share of the golds: 0.5 for '51' on two examples,
    where the reward gives '51' 0.2 on each."""
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": a}) + "\n" for i, a in enumerate(["51", "7"])))
    records = lambda task: [{"index": i, "example": ex} for i, ex in enumerate(task.load("train") + task.load("test"))]
    digits = DatasetTask(source=str(data), reward=digits_credit, test_size=0.5, completion_format="text")
    assert digits.constant_baseline(records(digits)) == {
        "constant_baseline": pytest.approx(0.2), "constant_baseline_ci95": pytest.approx(list(wilson_interval(0.4, 2))),
        "constant_answer": "51"}
    # the best of the candidates, not the most frequent: '1' earns 0.1 on each row, '1234567890' 1
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": a}) + "\n"
                            for i, a in enumerate(["1", "1", "1234567890", "1"])))
    digits = DatasetTask(source=str(data), reward=digits_credit, test_size=0.5, completion_format="text")
    summary = digits.constant_baseline(records(digits))
    assert summary["constant_answer"] == "1234567890" and summary["constant_baseline"] == 1.0
    # a reward that cannot score another row's gold answer: no baseline (and a warning), not a failed evaluation
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": a, "options": o}) + "\n"
                            for i, (a, o) in enumerate([("A", "AB"), ("A", "AB"), ("E", "ABCDE")])))
    picky = DatasetTask(source=str(data), reward=option_index, test_size=0.5, completion_format="text")
    with pytest.warns(UserWarning, match="no constant-answer baseline: reward .*option_index.* raised ValueError"):
        assert picky.constant_baseline(records(picky)) == {}
    # a reward on another scale: no share to show
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": a}) + "\n" for i, a in enumerate(["2", "4"])))
    far = DatasetTask(source=str(data), reward=distance, test_size=0.5, completion_format="text")
    assert far.constant_baseline(records(far)) == {}


def reads_text(completions, answer, **kwargs):
    return [float(a in c) for c, a in zip(completions, answer)]


def reads_messages(completions, answer, **kwargs):
    return [float(a in c[0]["content"]) for c, a in zip(completions, answer)]


def reads_both(completions, answer, **kwargs):
    return [float(a in (c if isinstance(c, str) else c[0]["content"])) for c, a in zip(completions, answer)]


@pytest.mark.parametrize("reward, completion_format, warned", [
    (reads_text, "messages", True),
    (reads_messages, "messages", False),
    (reads_both, "messages", False),
    (reads_text, "text", False),
])
def test_a_reward_that_reads_a_message_list_as_text_is_warned(files, recwarn, reward, completion_format, warned):
    """`answer in completion` on TRL's conversational completions (a list of messages) is False for every row: such a
    reward scored every completion 0 without a word. Comparing its scores of the gold answers as text and as
    messages when the task is checked finds it; a reward that reads messages, or both, is not warned."""
    task = DatasetTask(source=str(files / "sums.jsonl"), prompt_field="question", reward=reward,
                       completion_format=completion_format)
    task.validate()
    found = [str(w.message) for w in recwarn if "reads a completion as text" in str(w.message)]
    assert found == ([f"reward '{__name__}:reads_text' scores the gold answers 1 on average as plain strings but 0 "
                      "as the lists of one assistant message it is given (TRL's conversational format): it reads a "
                      "completion as text; read completion[0]['content'], or set the task option "
                      "completion_format=text (docs/custom-tasks.md)"] if warned else [])
