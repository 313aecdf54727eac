"""esft.tasks.dataset_task where the mutation audit of 2026-12-05 (mutcanon) found no test: labels only for the
`mcq` reward, no format bonus unless asked, and the unscorable-completion warning's cadence when some completions
are scored.

Run: PYTHONPATH=src pytest -q tests/test_dataset_task_mutmutcanon.py   (seconds)
"""

from __future__ import annotations

import json
import re
import warnings

import pytest

from conftest import importable_module
from esft.tasks.dataset_task import DatasetTask


def rows_file(tmp_path, rows, name="data.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


LETTERS = [{"question": f"q{i}", "answer": "AB"[i % 2]} for i in range(10)]


def test_letter_answers_are_labels_only_with_the_mcq_reward(tmp_path):
    """Gold answers A and B make a labelled (multiple-choice) task with `mcq`; with another verifier they are open
    answers that happen to be letters: no label set (so no balanced evaluation or balanced fitness rule). `math`
    keeps a gold "A" as "A" (exact lowercases it), so its answers would pass for labels if any verifier gave some."""
    data = rows_file(tmp_path, LETTERS)
    assert DatasetTask(source=data, prompt_field="question", reward="mcq").label_set() == ("A", "B")
    for reward in ("math", "exact"):
        assert DatasetTask(source=data, prompt_field="question", reward=reward).label_set() is None, reward


def test_a_built_in_verifiers_reward_function_adds_no_format_bonus_by_default(tmp_path):
    """reward_function() is the paper's reward (format_bonus 0): a well-formed right answer scores 1, a well-formed
    wrong one 0; only an explicit bonus adds to a well-formed answer."""
    task = DatasetTask(source=rows_file(tmp_path, [{"question": f"q{i}", "answer": str(i)} for i in range(10)]),
                       prompt_field="question", reward="boxed")
    ex = {"question": "q", "answer": "7"}
    replies = ["so \\boxed{7}", "so \\boxed{8}", "no box"]
    assert task.reward_function()(replies, examples=[ex] * 3) == [1.0, 0.0, 0.0]
    assert task.reward_function(0.5)(replies, examples=[ex] * 3) == [1.5, 0.5, 0.0]


def test_the_unscorable_warning_comes_when_the_count_of_unscored_completions_reaches_a_power_of_two(tmp_path,
                                                                                                   monkeypatch):
    """One completion in four gets no reward: after batches 1, 2, 3, 4 the unscored counts are 1, 2, 3, 4, so the
    warning comes after batches 1, 2 and 4 (the count of completions scored, 4, 8, 12, 16, does not decide)."""
    importable_module(tmp_path, monkeypatch, "mutcanon_rewards", (
        "def first_none(completions, **kwargs):\n"
        "    return [None if i == 0 else 1.0 for i in range(len(completions))]\n"))
    data = rows_file(tmp_path, [{"question": f"q{i}", "answer": str(i)} for i in range(10)])
    task = DatasetTask(source=data, prompt_field="question", reward="mutcanon_rewards:first_none")
    examples = task.load("train")[:4]
    warned = []
    for _ in range(4):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert task.score_batch(["a", "b", "c", "d"], examples) == [0.0, 1.0, 1.0, 1.0]
        warned.append([str(w.message).split(": ")[0] for w in caught])
    shown = "reward 'mutcanon_rewards:first_none' returned None for {} of {} completions scored so far"
    assert warned == [[shown.format(1, 4)], [shown.format(2, 8)], [], [shown.format(4, 16)]]


def test_the_mcq_reward_refuses_gold_answers_that_are_not_letters(tmp_path):
    """`mcq` reads a letter A-D from a reply, so a row whose gold is "E", "0" or "A) Paris" scores 0 whatever the
    model writes: such data (five choices, answer indices, the choice's text) was evaluated and trained on at 0
    accuracy without a word. It is refused when the task is built, naming the row; letters in any case pass."""
    from esft.tasks import get_task

    rows = [{"question": f"q{i}", "answer": "abcd"[i % 4]} for i in range(9)]
    assert DatasetTask(source=rows_file(tmp_path, rows), prompt_field="question", reward="mcq").label_set() \
        == ("A", "B", "C", "D")
    for gold in ("E", "0", "A) Paris"):
        data = rows_file(tmp_path, rows + [{"question": "q9", "answer": gold}])
        with pytest.raises(ValueError, match=rf"row 10 holds {re.escape(repr(gold))} in field 'answer' \(answer_field"
                                             r"\), not an answer letter: the mcq reward"):
            get_task(data, prompt_field="question", reward="mcq")
        # another verifier compares any text
        get_task(data, prompt_field="question", reward="exact")
