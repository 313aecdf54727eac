"""Experiment-spec option checks (esft.experiments.spec_checks), pinned where a mutation audit found them untested."""

from __future__ import annotations

import pytest

from esft.experiments import SpecError
from esft.experiments.algorithms import get_algorithm
from esft.experiments.spec_checks import SpecContext, check_options
from esft.experiments.yamlines import load


def _options(text: str, algo: str = "es", **kwargs):
    return check_options(SpecContext("spec.yaml"), load(text), get_algorithm(algo), f"algorithms.{algo}", **kwargs)


def test_a_bad_budget_in_a_block_list_is_refused_at_its_own_line():
    """A budget list written one item per line names the line of the bad item, not the line of its key."""
    with pytest.raises(SpecError, match=r"^spec\.yaml:4: algorithms\.es\.iterations must be >= 1, got 0$"):
        _options("sigma: 0.01\niterations:\n  - 2\n  - 0\n", allow_budget_list=True)
    assert _options("iterations:\n  - 2\n  - 4\n", allow_budget_list=True) == {"iterations": [2, 4]}


@pytest.mark.parametrize("value, stored", [("[tensorboard]", "tensorboard"), ("[]", "none"),
                                           ("tensorboard", "tensorboard")])
def test_report_to_given_as_a_list_in_a_spec_is_stored_as_the_comma_text(value, stored):
    """TRL's configs take `report_to` as a list: a spec may write it so, and the stage's config holds the text."""
    assert _options(f"report_to: {value}\n") == {"report_to": stored}


def test_a_stages_task_fit_is_checked_with_the_task_as_the_spec_names_it():
    """Each task a stage's config builds is fitted with the name the spec gave it (for messages: a task class by
    its `module:Class`, not the name its class declares), and built once per name and options."""
    from esft.experiments.spec_checks import check_task_fit

    class Config:
        fitted: list = []

        def task_checks(self):
            return [("task", "countdown:numbers=2", {}), ("eval_task", "boolq", {})]

        def check_task_fit(self, task, name=None):
            self.fitted.append((task.name, name))

    built: dict = {}
    check_task_fit(Config(), built)
    check_task_fit(Config(), built)
    assert Config.fitted == [("countdown", "countdown:numbers=2"), ("boolq", "boolq")] * 2 and len(built) == 2
