"""The opt-in class-balanced fitness rule (esft.es.fitness.ClassBalancedMean, `fitness_rule: balanced`)."""

from __future__ import annotations

import numpy as np
import pytest

from esft.es.build import make_fitness_rule
from esft.es.executor import PopulationResult
from esft.es.fitness import ClassBalancedMean, MeanReward
from esft.tasks import get_task


def _result(scores):
    scores = np.asarray(scores, dtype=np.float64)
    return PopulationResult(scores=scores, well_formed=np.ones_like(scores, dtype=bool), texts=[])


def test_majority_prior_earns_nothing_over_the_minority_prior():
    boolq = get_task("boolq")
    batch = [{"answer": True}] * 6 + [{"answer": False}] * 2  # 6 yes, 2 no
    always_yes = [1.0] * 6 + [0.0] * 2
    always_no = [0.0] * 6 + [1.0] * 2
    both = _result([always_yes, always_no])
    assert MeanReward()(both, batch).tolist() == [0.75, 0.25]  # the plain mean rewards the prior
    balanced = make_fitness_rule("balanced", task=boolq)
    assert isinstance(balanced, ClassBalancedMean)
    assert balanced(both, batch).tolist() == [0.5, 0.5]
    # built directly, the rule adds no format bonus unless given one (the paper's rule has none)
    assert ClassBalancedMean(boolq.balance_key, boolq.label_set())(both, batch).tolist() == [0.5, 0.5]
    # a member right on every "no" and half the "yes" beats the always-yes prior under the balanced rule only
    skilled = _result([[1, 1, 1, 0, 0, 0, 1, 1]])
    assert balanced(skilled, batch)[0] == pytest.approx(0.75) and MeanReward()(skilled, batch)[0] == 0.625


def test_countdown_variant_balances_over_the_target_operator_and_format_bonus_is_kept():
    task = get_task("countdown:numbers=2,max_number=50,ops=+*")
    batch = [{"nums": [3, 5], "target": 8}] * 3 + [{"nums": [3, 5], "target": 15}]
    rule = make_fitness_rule("balanced", 0.1, task=task)
    # the bonus follows well_formed, not the score: the third "+" answer is wrong but well formed, the second is
    # right but not well formed, and the "*" answer is wrong and well formed
    res = PopulationResult(scores=np.array([[1.0, 1.0, 0.0, 0.0]]), well_formed=np.array([[True, False, True, True]]),
                           texts=[])
    # "+" mean ((1.1 + 1.0 + 0.1) / 3), "*" mean (0.1): balanced = their mean
    assert rule(res, batch)[0] == pytest.approx(((1.1 + 1.0 + 0.1) / 3 + 0.1) / 2)


def test_balanced_rule_needs_a_labelled_task():
    with pytest.raises(ValueError, match=r"needs a task with labels \(.*a data task scored by mcq, a task class "
                                         r"whose label_set names its labels\); 'math' has none$"):
        make_fitness_rule("balanced", task=get_task("math"))
    with pytest.raises(ValueError, match="takes no fitness_options"):
        make_fitness_rule("balanced", options={"x": 1}, task=get_task("boolq"))


def test_examples_outside_the_label_set_do_not_count():
    """x * 1 is also x / 1: its target has no single operator ("other") and must not become a heavy class."""
    task = get_task("countdown:numbers=2,max_number=50,ops=+*")
    batch = [{"nums": [3, 5], "target": 8}] * 2 + [{"nums": [3, 5], "target": 15}] * 2 + [{"nums": [7, 1], "target": 7}]
    assert task.balance_key(batch[-1]) == "other"
    rule = make_fitness_rule("balanced", task=task)
    right_on_other_only = _result([[0, 0, 0, 0, 1]])
    right_on_sums = _result([[1, 1, 0, 0, 0]])
    assert rule(right_on_other_only, batch)[0] == 0.0
    assert rule(right_on_sums, batch)[0] == pytest.approx(0.5)
    # a batch with no labelled example falls back to the plain mean, per member
    assert rule(_result([[1.0, 0.0], [1.0, 1.0]]), batch[-1:] * 2).tolist() == [0.5, 1.0]


# ---- GRPO: the same opt-in as a reward weighting (esft.grpo.trl_trainer.balanced_rewards) --------------------------

def test_grpo_balanced_rewards_weigh_each_label_the_same():
    from esft.grpo.trl_trainer import balanced_rewards

    labels = ["yes"] * 6 + ["no"] * 2
    always_yes = [1.0] * 6 + [0.0] * 2
    always_no = [0.0] * 6 + [1.0] * 2
    assert np.mean(balanced_rewards(always_yes, labels, ("yes", "no"))) == pytest.approx(0.5)
    assert np.mean(balanced_rewards(always_no, labels, ("yes", "no"))) == pytest.approx(0.5)
    # a label outside the set keeps its reward as is
    assert balanced_rewards([1.0, 1.0, 1.0], ["+", "*", "other"], ("+", "*")) == [1.0, 1.0, 1.0]
    assert balanced_rewards([1.0, 0.0, 0.0, 1.0], ["+", "+", "+", "*"], ("+", "*")) == [2 / 3, 0.0, 0.0, 2.0]


def test_grpo_class_balanced_needs_batch_scaling_and_labels(tmp_path, capsys):
    from esft.cli import main
    from esft.config import ConfigError
    from esft.grpo import GRPOConfig

    with pytest.raises(ConfigError, match="scale_rewards.*: give --scale-rewards batch, or leave out --class-balanced"):
        GRPOConfig(class_balanced=True, scale_rewards="group")
    assert GRPOConfig(class_balanced=True, scale_rewards="batch").class_balanced
    assert main(["train", "grpo", "--preset", "cpu", "--task", "math", "--class-balanced", "--scale-rewards", "batch",
                 "--output-dir", str(tmp_path / "g")]) == 2
    assert "class_balanced" in capsys.readouterr().err


def test_grpo_task_reward_applies_the_weights_only_when_asked():
    from esft.grpo.ledger import StepLedger
    from esft.grpo.trl_trainer import TaskReward

    boolq = get_task("boolq")
    examples = [{"question": "q", "passage": "p", "answer": a} for a in (True, True, True, False)]
    completions = ["\\boxed{yes}"] * 4  # the always-yes prior: right on 3 of 4
    plain = TaskReward(boolq, examples, 0.0, StepLedger)(completions, example_index=[0, 1, 2, 3])
    balanced = TaskReward(boolq, examples, 0.0, StepLedger, class_balanced=True)(completions, example_index=[0, 1, 2, 3])
    assert np.mean(plain) == 0.75 and np.mean(balanced) == pytest.approx(0.5)
