"""esft.tasks.custom at an edge the other custom-task tests leave open: a task object whose class its recorded
name does not import (a class a factory made under another class's name)."""

from __future__ import annotations

import pytest

from esft.tasks import get_task
from esft.tasks.custom import task_record, task_spec

MODULE = '''
class Tagged:
    def load(self, split):
        return [{"q": 1}]

    def prompt(self, example):
        return "q"

    def score(self, completion, example):
        return 0.0


def variant():
    """A class named Tagged too, scoring otherwise: `shadow_tasks:Tagged` imports the other one."""
    return type("Tagged", (Tagged,), {"score": lambda self, completion, example: 1.0})
'''


def test_a_task_object_whose_class_its_name_does_not_import_is_not_rebuilt_as_another(tmp_path, monkeypatch):
    (tmp_path / "shadow_tasks.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import shadow_tasks

    task = shadow_tasks.variant()()
    assert task_record(task) == ("shadow_tasks:Tagged", {"class": "<not recorded: not importable by this name>"})
    assert task_spec(task) is None
    with pytest.raises(ValueError, match="only the script that trained the run can build it"):
        get_task(*task_record(task)[:1], **task_record(task)[1])
    assert task_spec(shadow_tasks.Tagged()) == ("shadow_tasks:Tagged", {})  # the class its name imports
