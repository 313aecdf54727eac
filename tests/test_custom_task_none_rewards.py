"""Reward functions that return None where they do not apply, read by TRL's rule (TRL >= 1.16, GRPOTrainer): several
functions sum over those that apply to a completion (nansum, weights 1); a completion none applies to is unscorable,
which TRL leaves out of its group's baseline with advantage 0, and which ES fitness and accuracy count as 0.

Every expected value below is worked out by hand from the functions' definitions."""

from __future__ import annotations

import json
import math
import warnings

import pytest

from conftest import importable_module
from esft.tasks import get_task
from esft.tasks.custom import task_spec
from esft.tasks.dataset_task import DatasetTask
from esft.tasks.verifiers import check_rewards

REWARDS = '''
def math_only(completions, kind, answer, **kwargs):
    """math rows: 1 for the answer, -0.5 otherwise; None on other rows"""
    return [None if k != "math" else (1.0 if c[0]["content"].strip() == a else -0.5)
            for c, k, a in zip(completions, kind, answer)]

def code_only(completions, kind, **kwargs):
    """code rows: 2 with a def, 0.25 without; None on other rows"""
    return [None if k != "code" else (2.0 if "def " in c[0]["content"] else 0.25) for c, k in zip(completions, kind)]

def brevity(completions, kind, **kwargs):
    """math and code rows: 0.125 for at most 8 characters, else 0; NaN (TRL reads it as None) on poem rows"""
    return [float("nan") if k == "poem" else (0.125 if len(c[0]["content"]) <= 8 else 0.0)
            for c, k in zip(completions, kind)]

def never(completions, **kwargs):
    return [None] * len(completions)
'''

ROWS = [{"question": "2 + 2?", "kind": "math", "answer": "4"}, {"question": "3 + 1?", "kind": "math", "answer": "4"},
        {"question": "Write f.", "kind": "code", "answer": ""}, {"question": "Print.", "kind": "code", "answer": ""},
        {"question": "A haiku.", "kind": "poem", "answer": ""}]
TEXTS = ["4", "it is 5 for sure", "def f(): pass", "print", "leaves fall"]
# math_only + code_only + brevity, by hand (None = does not apply):
#   math "4"           1.0  + None + 0.125 = 1.125
#   math "it is 5.."  -0.5  + None + 0.0   = -0.5
#   code "def f()..."  None + 2.0  + 0.0   = 2.0    (13 characters)
#   code "print"       None + 0.25 + 0.125 = 0.375
#   poem               None + None + NaN   -> no reward applies: None for TRL, 0 for ES fitness and accuracy
TRL_REWARDS = [1.125, -0.5, 2.0, 0.375, None]
SCORES = [1.125, -0.5, 2.0, 0.375, 0.0]
NAMES = "byot_multi:math_only, byot_multi:code_only, byot_multi:brevity"


@pytest.fixture()
def multi(tmp_path, monkeypatch):
    importable_module(tmp_path, monkeypatch, "byot_multi", REWARDS)
    data = tmp_path / "multi.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS * 4))
    return data


def test_trl_rule_on_columns():
    from esft.tasks.verifiers import combine_rewards

    assert combine_rewards([[1.0, None, None, -0.5], [0.5, 2.0, None, None]]) == [1.5, 2.0, None, -0.5]
    assert combine_rewards([[None, 3.0]]) == [None, 3.0]
    assert check_rewards([None, float("nan"), 1, True], 4, "r") == [None, None, 1.0, 1.0]
    with pytest.raises(ValueError, match=r"reward 'r' returned inf for completion 0: rewards must be finite"):
        check_rewards([math.inf], 1, "r")
    with pytest.raises(ValueError, match=r"reward 'r' returned 'x' \(str\) for completion 0: not a number"):
        check_rewards(["x"], 1, "r")


def test_each_function_scores_its_own_kind_of_example(multi):
    """A multi-task data file scored by one function per kind of row (and one for two kinds): before, a reward
    could not return None and only one reward could be named, so such a task could not be built."""
    task = get_task(str(multi), prompt_field="question", reward="byot_multi:math_only+byot_multi:code_only+"
                                                                 "byot_multi:brevity")
    completions = [[{"role": "assistant", "content": t}] for t in TEXTS]
    # GRPO path: TRL gets None for the unscorable completion, as from its own reward_funcs
    assert task.reward_function()(completions, examples=ROWS) == TRL_REWARDS
    columns = {k: [r[k] for r in ROWS] for k in ROWS[0]}
    assert task.reward_function()(completions, **columns) == TRL_REWARDS  # the columns as TRL passes them
    with pytest.warns(UserWarning, match=rf"every reward function \({NAMES}\) returned None for 1 of 5 completions "
                                         r"scored so far"):
        assert task.score_batch(TEXTS, ROWS) == SCORES
    # ES fitness and evaluation score one completion at a time: the same numbers
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert [task.score(t, r) for t, r in zip(TEXTS, ROWS)] == SCORES


def test_grpo_reward_gives_trl_none_and_logs_only_scorable_rewards(multi):
    from esft.grpo.ledger import StepLedger
    from esft.grpo.trl_trainer import TaskReward, balanced_rewards

    task = get_task(str(multi), prompt_field="question",
                    reward=["byot_multi:math_only", "byot_multi:code_only", "byot_multi:brevity"])
    ledger = StepLedger()
    completions = [[{"role": "assistant", "content": t}] for t in TEXTS]
    with pytest.warns(UserWarning, match="returned None for 1 of 5 completions"):  # esft's accuracy, per completion
        assert TaskReward(task, ROWS, 0.0, lambda: ledger)(completions, example_index=[0, 1, 2, 3, 4]) == TRL_REWARDS
    assert ledger.rewards == TRL_REWARDS[:4]  # TRL's reward metric leaves unscorable completions out too
    assert ledger.scores == SCORES
    # class weights n / (K * count) with n = 4, K = 3: a and c 4/3, b 2/3; the unscorable one stays None
    assert balanced_rewards([1.0, 3.0, None, 2.0], ["a", "b", "b", "c"], None) == [4 / 3, 2.0, None, 8 / 3]


def test_all_none_scores_zero_with_a_warning_at_each_power_of_two(multi):
    """No function applies to any completion: each scores 0 (TRL's nansum over no reward; TRL's own GRPO leaves
    it out of the baseline) and the warning says which functions and how many, without one line per completion."""
    with pytest.warns(UserWarning, match="returned None for every one of the 20 rows tried"):  # when it is built
        task = get_task(str(multi), prompt_field="question", reward="byot_multi:never")
    with pytest.warns(UserWarning) as caught:
        assert [task.score(t, r) for t, r in zip(TEXTS, ROWS)] == [0.0] * 5
    assert [str(w.message).split(": ")[0] for w in caught] == [
        f"reward 'byot_multi:never' returned None for {k} of {k} completions scored so far" for k in (1, 2, 4)]
    assert task.reward_function()([[{"role": "assistant", "content": "x"}]], examples=ROWS[:1]) == [None]


def test_the_start_up_probe_of_the_first_example_does_not_warn_as_the_run_will(multi):
    """The check before the model loads scores an empty completion once; its None warned "1 of 1" and the run's
    own count started again at 1, so `esft eval` printed that line twice."""
    from esft.validation import check_first_example

    with pytest.warns(UserWarning, match="returned None for every one"):
        task = get_task(str(multi), prompt_field="question", reward="byot_multi:never")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_first_example("tasks", str(multi), task, "test")
    assert [str(w.message) for w in caught] == []


def never_scored(caught) -> list[str]:
    return [str(w.message) for w in caught if "for every one of the" in str(w.message)]


def test_a_reward_that_scores_no_row_warns_once_when_the_task_is_built(multi):
    """`never` returns None even given each row's gold answer: TRL allows that, so the task builds, but once, naming
    the function, a warning says that no row could be scored (20 rows in two splits, tried in two calls)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        get_task(str(multi), prompt_field="question", reward="byot_multi:never")
    assert never_scored(caught) == [
        "reward 'byot_multi:never' returned None for every one of the 20 rows tried, given each row's 'answer' field "
        "(its gold answer) as the completion: no row could be scored, so every completion will score 0 (ES fitness, "
        "accuracy) and be unscorable (None) to GRPO. TRL allows None where a reward does not apply, so this is no "
        "error; check the reward's conditions and the columns it reads (docs/custom-tasks.md)"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        get_task(str(multi), prompt_field="question", reward="byot_multi:math_only+byot_multi:never")
        get_task(str(multi), prompt_field="question", reward="byot_multi:math_only+byot_multi:code_only")
    assert [m.split(": ")[0] for m in never_scored(caught)] == [
        "reward 'byot_multi:never' (of 2 reward functions) returned None for every one of the 20 rows tried, given "
        "each row's 'answer' field (its gold answer) as the completion"]
    assert "the other reward functions score alone" in never_scored(caught)[0]


def test_several_rewards_are_named_and_recorded(multi):
    import byot_multi

    task = DatasetTask(source=str(multi), prompt_field="question", reward=[byot_multi.math_only, byot_multi.code_only])
    assert task.reward_name == "byot_multi:math_only+byot_multi:code_only"
    name, options = task_spec(task)
    rebuilt = get_task(name, **options)
    assert rebuilt.reward == "byot_multi:math_only+byot_multi:code_only"
    assert rebuilt.score_batch(TEXTS[:4], ROWS[:4]) == [1.0, -0.5, 2.0, 0.25]
    # in a task string (a regex's "+" stays in its pattern)
    assert get_task(f"{multi}:prompt_field=question,reward=byot_multi:math_only+byot_multi:code_only").reward_name \
        == "byot_multi:math_only+byot_multi:code_only"
    # a built-in verifier needs every row's gold answer (multi.jsonl's code and poem rows have none)
    sums = multi.with_name("sums.jsonl")
    sums.write_text("".join(json.dumps({"question": f"{i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(20)))
    assert get_task(str(sums), prompt_field="question", reward=r"regex:(\d+)").score("44", {"answer": "44"}) == 1.0
    with pytest.raises(ValueError, match=r"multi.jsonl: row 3 has no value in field 'answer' \(answer_field\)"):
        get_task(str(multi), prompt_field="question", reward=r"regex:(\d+)")
    with pytest.raises(ValueError, match=r"a built-in verifier \(exact\) cannot be combined with other rewards"):
        DatasetTask(source=str(multi), prompt_field="question", reward="exact+byot_multi:math_only")


KIND_REWARDS = '''
def sums(completions, solution, **kwargs):
    return [None if s is None else float(c[0]["content"].strip() == s) for c, s in zip(completions, solution)]

def code(completions, tests, **kwargs):
    return [None if t is None else float(t in c[0]["content"]) for c, t in zip(completions, tests)]
'''


def test_a_field_of_one_kind_of_row_reaches_its_reward_whatever_rows_a_call_holds(tmp_path, monkeypatch):
    """Rows of two kinds, each with a field of its own (`solution`, `tests`), as TRL reads them from a dataset whose
    rows lack the other kind's column (None there). Before, the columns were the first row's fields: building the
    task stopped with "code() missing 1 required positional argument: 'tests'", and a call on sums rows alone (a
    training batch, one held-out example) would too."""
    importable_module(tmp_path, monkeypatch, "byot_kinds", KIND_REWARDS)
    rows = [{"prompt": "1 + 1?", "solution": "2"}, {"prompt": "Write f returning 3.", "tests": "return 3"}] * 5
    data = tmp_path / "kinds.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = get_task(str(data), reward="byot_kinds:sums+byot_kinds:code")  # validated: each reward on every row
    assert task.score_batch(["2", "def f(): return 3"], rows[:2]) == [1.0, 1.0]
    assert task.score_batch(["2", "3"], [rows[0], rows[0]]) == [1.0, 0.0]  # sums rows only: tests is None
    assert task.score("def f(): return 3", rows[1]) == 1.0
    completions = [[{"role": "assistant", "content": "2"}]]
    assert task.reward_function()(completions, examples=rows[:1]) == [1.0]
