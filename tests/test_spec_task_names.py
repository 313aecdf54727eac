"""Names in an experiment spec (esft.experiments.spec, spec_checks): the close matches a misspelt name is answered
with, tasks an installed package registers (entry points, esft.tasks.custom), the line an evaluated task's error
names, and blanks around a data file or module:Class name. No model loads.
"""

from __future__ import annotations

import json
import re
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from conftest import importable_module, load_spec_text
from esft.experiments import SpecError
from esft.experiments.spec_checks import did_you_mean
from esft.tasks.custom import ENTRY_POINT_GROUP

BASE = """\
name: names
kind: single-task
tasks: [countdown]
algorithms:
  es:
    iterations: 2
    eval_limit: 0
evaluation:
  limit: 3
  holdout: []
"""


def _edit(old: str, new: str) -> str:
    assert old in BASE
    return BASE.replace(old, new, 1)


def _refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(SpecError) as info:
        load_spec_text(tmp_path, text)
    return str(info.value)


# ---- did you mean: every close name, best first, none that is not close -------------------------------------------

def test_several_close_names_are_all_suggested_best_first(tmp_path):
    """`task:` in the evaluation block is close to three keys: the user sees all three, the closest first (one
    suggestion would hide the key they meant when it is not the closest)."""
    err = _refused(tmp_path, _edit("  limit: 3\n", "  limit: 3\n  task: [countdown]\n"))
    assert "spec.yaml:10: unknown key 'task' in evaluation (did you mean tasks, per_task, passk?); allowed: " in err
    err = _refused(tmp_path, _edit("tasks: [countdown]", "tasks: [countdown, 'countdown:numbers=2', "
                                                          "'countdown:numbers=4']\ntask_options: "
                                                          "{'countdown:numbers=3': {}}"))
    assert re.search(r"spec.yaml:4: task_options: unknown task 'countdown:numbers=3' \(did you mean "
                     r"countdown:numbers=[24], countdown:numbers=[24], countdown\?\)$", err), err


def test_at_most_three_suggestions():
    names = ["count", "countdown12", "countdow", "countdown1"]  # 0.71, 0.9, 0.94, 0.95 from countdown
    assert did_you_mean("countdown", names) == " (did you mean countdown1, countdow, countdown12?)"
    assert did_you_mean("countdown", []) == ""


@pytest.mark.parametrize("block,key,suggestion", [
    ("  limit: 3\n", "batch: 4", " (did you mean batch_size?)"),  # batch_size: ratio 0.667
    ("  limit: 3\n", "per_tsk: {}", " (did you mean per_task?)"),  # not tasks, passk, after_single_task (0.5)
    ("  limit: 3\n", "tasks_options: {}", ";"),  # generation_options (0.581) is no suggestion
])
def test_a_suggestion_needs_a_close_name(tmp_path, block, key, suggestion):
    """difflib's cutoff (0.6): a name at 0.667 is suggested, names at 0.5 and 0.58 are not."""
    name = key.partition(":")[0]
    err = _refused(tmp_path, _edit(block, f"{block}  {key}\n"))
    assert f"unknown key '{name}' in evaluation{suggestion}" in err, err


def test_a_misspelt_task_is_answered_with_the_closest_registered_task(tmp_path):
    err = _refused(tmp_path, _edit("tasks: [countdown]", "tasks: [countdown, chem]"))
    assert "spec.yaml:3: unknown task 'chem' in tasks (did you mean chemistry?); known: countdown, math" in err  # 0.615
    err = _refused(tmp_path, _edit("tasks: [countdown]", "tasks: [countdown, options]"))
    assert "unknown task 'options' in tasks; known: " in err  # countdown is 0.5 away


# ---- tasks an installed package registers (entry points) ----------------------------------------------------------

TAGGED_MODULE = '''
from __future__ import annotations

from dataclasses import dataclass

from esft.tasks import Task


@dataclass
class Tagged(Task):
    name: str = "tagged"
    tag: str = "x"

    def _load(self, split):
        return [{"q": f"say {i}", "answer": str(i)} for i in range(8)]

    def prompt(self, example):
        return [{"role": "user", "content": example["q"]}]

    def score(self, completion, example):
        return float(example["answer"] in completion)
'''


@pytest.fixture()
def plugin(tmp_path, monkeypatch):
    """An installed package registering the dataclass task `Tagged` as `tagged`."""
    importable_module(tmp_path, monkeypatch, "tagged_tasks", TAGGED_MODULE)
    ep = EntryPoint(name="tagged", value="tagged_tasks:Tagged", group=ENTRY_POINT_GROUP)
    monkeypatch.setattr("esft.tasks.custom.entry_points", lambda group: [ep] if group == ENTRY_POINT_GROUP else [])


def _built(spec, task: str):
    from esft.tasks import get_task

    config = spec.config(spec.method("es").components[0], task, 42)
    return config, get_task(config.task, **config.task_kwargs())


def test_an_installed_task_is_a_task_of_the_spec(tmp_path, plugin):
    """Named as registered (any case), it trains and is evaluated like a built-in task, and the stage builds it."""
    spec = load_spec_text(tmp_path, _edit("tasks: [countdown]", "tasks: [countdown, Tagged]"))
    assert spec.tasks == ["countdown", "tagged"] and spec.evaluation.all_tasks == ["countdown", "tagged"]
    config, task = _built(spec, "tagged")
    assert config.task == "tagged" and type(task).__name__ == "Tagged" and task.tag == "x"


def test_an_installed_task_takes_options_in_its_name_and_from_task_options(tmp_path, plugin):
    """`tagged:tag=y`, as `esft train --task tagged:tag=y` takes it; a holdout installed task takes its
    task_options (evaluation builds every evaluated task with them)."""
    spec = load_spec_text(tmp_path, _edit("tasks: [countdown]", "tasks: ['Tagged:tag=y']"))
    assert spec.tasks == ["tagged:tag=y"] and _built(spec, "tagged:tag=y")[1].tag == "y"
    spec = load_spec_text(tmp_path, _edit("  holdout: []\n", "  holdout: [tagged]\ntask_options: {tagged: {tag: z}}\n"))
    assert spec.evaluation.holdout == ["tagged"] and spec.task_options == {"tagged": {"tag": "z"}}
    err = _refused(tmp_path, _edit("tasks: [countdown]", "tasks: ['tagged:nope=1']"))
    assert "'nope'" in err and "tagged:nope=1" in err, err


def test_a_misspelt_installed_task_is_suggested(tmp_path, plugin):
    err = _refused(tmp_path, _edit("tasks: [countdown]", "tasks: [taged]"))
    assert "spec.yaml:3: unknown task 'taged' in tasks (did you mean tagged?); known: countdown, " in err, err
    assert err.endswith("ifeval, tagged"), err


@pytest.mark.parametrize("name", ["tagged", "'countdown:numbers=2'", "'tagged_tasks:Tagged'"])
def test_pass_at_k_samples_only_evaluated_tasks(tmp_path, plugin, name):
    """passk.tasks picks from the evaluated tasks: a task the spec does not evaluate was accepted and never
    sampled."""
    err = _refused(tmp_path, _edit("  holdout: []\n", f"  holdout: []\n  passk: {{samples: 2, tasks: [{name}]}}\n"))
    assert re.search(rf"spec.yaml:11: task {re.escape(repr(name.strip(chr(39))))} in evaluation.passk.tasks is not "
                     rf"evaluated by this spec( \(did you mean countdown\?\))?; evaluated: countdown$", err), err
    spec = load_spec_text(tmp_path, _edit("  holdout: []\n", f"  holdout: [{name}]\n  passk: {{samples: 2, tasks: [{name}]}}\n"))
    assert spec.evaluation.passk.tasks == spec.evaluation.holdout == [name.strip("'")]


# ---- the line an evaluated task's error names ---------------------------------------------------------------------

def _data_file(tmp_path: Path) -> str:
    """A data task with no test examples (it trains; its evaluation fails)."""
    path = tmp_path / "six.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+{i}?", "answer": str(2 * i)}) + "\n" for i in range(6)))
    return f"'{path}:reward=exact,test_size=0'"


def test_a_training_task_that_is_also_a_holdout_is_named_at_the_line_that_evaluates_it(tmp_path):
    """Evaluated as a training task (the top-level tasks line) when the evaluation takes the training tasks; when
    evaluation.tasks leaves it out, it is evaluated as a holdout: the holdout line, not evaluation.tasks (which
    does not name it)."""
    data = _data_file(tmp_path)
    both = _edit("tasks: [countdown]", f"tasks: [countdown, {data}]").replace("  holdout: []\n",
                                                                            f"  holdout: [{data}]\n")
    err = _refused(tmp_path, both)
    assert re.search(r"spec.yaml:3: evaluation of .*six.jsonl:.*its test split is empty", err), err
    err = _refused(tmp_path, both.replace("  limit: 3\n", "  limit: 3\n  tasks: [countdown]\n"))
    assert re.search(r"spec.yaml:11: evaluation of .*six.jsonl:.*its test split is empty", err), err
    err = _refused(tmp_path, both.replace("  limit: 3\n", f"  limit: 3\n  tasks: [countdown, {data}]\n"))
    assert re.search(r"spec.yaml:10: evaluation of .*six.jsonl:.*its test split is empty", err), err


# ---- blanks around a data file or module:Class ---------------------------------------------------------------------

def test_blanks_around_an_external_task_name_are_not_part_of_it(tmp_path, plugin):
    """A quoted name with blanks is the task without them: its task_options apply, and it is the same task as the
    name without blanks."""
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"question": f"{i}+{i}?", "answer": str(2 * i)}) + "\n" for i in range(20)))
    spec = load_spec_text(tmp_path, _edit("tasks: [countdown]", f"tasks: [' {path} ', '  tagged_tasks:Tagged ']\n"
                                                       f"task_options: {{'{path}': {{prompt_field: question}}, "
                                                       f"'tagged_tasks:Tagged': {{tag: w}}}}"))
    assert spec.tasks == [str(path), "tagged_tasks:Tagged"]
    assert _built(spec, str(path))[0].task_options == {"prompt_field": "question"}
    assert _built(spec, "tagged_tasks:Tagged")[1].tag == "w"
    err = _refused(tmp_path, _edit("tasks: [countdown]", "tasks: [tagged_tasks:Tagged, ' tagged_tasks:Tagged']"))
    assert "spec.yaml:3: task ' tagged_tasks:Tagged' appears twice in tasks" in err, err
    err = _refused(tmp_path, _edit("tasks: [countdown]", "tasks: ['tagged_tasks : Tagged']"))
    assert "spec.yaml:3: unknown task 'tagged_tasks : Tagged' in tasks" in err, err


def test_an_abbreviation_is_answered_with_the_names_it_begins():
    """`temp` is too far from temperature for difflib (ratio 0.53); a name of 3+ characters that begins names is
    answered with them. Two characters are too few to guess from."""
    from esft.names import close_names

    keys = ["temperature", "top_p", "max_new_tokens", "description"]
    assert close_names("temp", keys) == ["temperature"]
    assert close_names("DESC", keys) == ["description"]
    assert close_names("te", keys) == [] and close_names("zzz", keys) == []
    assert did_you_mean("temp", keys) == " (did you mean temperature?)"
    long = ["embedding_scale", "embedding_dtype", "embedding_rows", "embedding_seed"]  # ratios 0.5 from "embed"
    assert close_names("embed", long) == long[:3]
