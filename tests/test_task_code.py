"""config.yaml's `_run.task_code`: the files of the user's code a task runs and their digest, and the warning of a
resume after that code changed (esft.tasks.task_code)."""

from __future__ import annotations

import re
import warnings

import pytest
import yaml

from esft.tasks import get_task
from esft.tasks.task_code import task_code

REWARD = "def score(completions, **kwargs):\n    return [{value}] * len(completions)\n"


def test_a_resume_after_the_reward_code_changed_says_so(tmp_path, es_cli, monkeypatch):
    """A resume after an edit of the reward module went on silently, scoring its steps with the new code: the
    run's curve then joined two rewards without a word (a data file's edit is refused: `_run.train_sha256`)."""
    monkeypatch.chdir(tmp_path)
    module = tmp_path / "rw_code.py"
    module.write_text(REWARD.format(value=0.0))
    out = tmp_path / "run"
    assert es_cli(out, "--reward", "rw_code:score") == 0
    recorded = yaml.safe_load((out / "config.yaml").read_text())["_run"]["task_code"]
    assert recorded["files"] == [str(module.resolve())] and len(recorded["sha256"]) == 64
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*task code changed")
        assert es_cli(out, "--reward", "rw_code:score", "--iterations", "3", "--resume") == 0
    module.write_text(REWARD.format(value=1.0))
    changed = re.escape(f"with task code changed since the run started ({module.resolve()})")
    with pytest.warns(UserWarning, match=changed):
        assert es_cli(out, "--reward", "rw_code:score", "--iterations", "4", "--resume") == 0


def test_esfts_own_tasks_and_verifiers_record_no_user_code(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+1?", "answer": "2"}\n')
    assert task_code(get_task("boolq")) is None and task_code(get_task(str(data), reward="math")) is None


def test_a_grpo_run_records_its_tasks_code_as_es_does(tmp_path, tokenizer):
    pytest.importorskip("trl")
    import grpo_tiny
    from esft.grpo import train_grpo
    from grpo_tiny import ParityTask, tiny_config
    from conftest import make_tiny_model

    out = tmp_path / "run"
    train_grpo(tiny_config(out, max_steps=1, eval_every=0), model=make_tiny_model(hidden=32, layers=2),
               tokenizer=tokenizer, task=ParityTask(), progress=False)
    recorded = yaml.safe_load((out / "config.yaml").read_text())["_run"]["task_code"]
    assert recorded == task_code(ParityTask()) and recorded["files"] == [grpo_tiny.__file__]
