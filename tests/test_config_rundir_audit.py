"""Mutation audit of config building (esft.config), run-directory files (esft.rundir), trackers (esft.tracking) and
label-balanced subsets (esft.tasks.labels): each test pins a rule that a small change to the code left unnoticed
by the other tests."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest

from esft.config import ConfigHooks, build_config


@dataclass
class Demo(ConfigHooks):
    lr: float = 0.1
    """Step size."""
    steps: int = 3
    """How many steps."""


PRESETS = {"small": {"steps": 5}, "big": {"steps": 100}}


def test_an_explicit_preset_wins_over_the_config_files_preset_key(tmp_path):
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("preset: big\nlr: 0.5\n")
    assert (build_config(Demo, PRESETS, None, str(cfg_file), {}).steps) == 100
    cfg = build_config(Demo, PRESETS, "small", str(cfg_file), {})
    assert (cfg.steps, cfg.lr) == (5, 0.5)


def test_resume_refuses_an_empty_config_and_the_other_algorithms_run(tmp_path):
    from esft.saved_config import read_saved_config

    (tmp_path / "config.yaml").write_text("")
    with pytest.raises(ValueError, match="is empty"):
        read_saved_config(tmp_path, "es")
    (tmp_path / "config.yaml").write_text("population_size: 8\n")
    assert read_saved_config(tmp_path, "es") == {"population_size": 8}
    with pytest.raises(ValueError, match=r"holds an ES run, not a GRPO one .*esft train es --resume"):
        read_saved_config(tmp_path, "grpo")


def test_check_not_busy_refuses_a_locked_folder_and_creates_nothing(tmp_path):
    from esft.rundir import RunDirBusy, RunLock, check_not_busy

    fresh = tmp_path / "fresh"
    check_not_busy(fresh)
    assert not fresh.exists()
    with RunLock(tmp_path / "run"):
        with pytest.raises(RunDirBusy, match="another esft process"):
            check_not_busy(tmp_path / "run")
    check_not_busy(tmp_path / "run")


@pytest.mark.parametrize("state", ["[3]", "null", '{"step": null}', '{"step": [3]}'])
def test_a_checkpoint_whose_state_is_not_a_step_record_is_skipped(tmp_path, state):
    from esft.rundir import list_checkpoints

    good, bad = tmp_path / "checkpoints" / "iter_000002", tmp_path / "checkpoints" / "iter_000003"
    good.mkdir(parents=True)
    bad.mkdir()
    (good / "state.json").write_text(json.dumps({"step": 2}))
    (bad / "state.json").write_text(state)
    assert list_checkpoints(tmp_path, "state.json") == [(2, good)]


def test_an_unknown_preset_in_a_config_file_is_named_at_its_line(tmp_path):
    from esft.config import ConfigError

    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("lr: 0.5\npreset: huge\n")
    where = re.escape(f"{cfg_file}:2: ")
    with pytest.raises(ConfigError, match=where + "preset = 'huge' is not accepted; expected one of small, big"):
        build_config(Demo, PRESETS, None, str(cfg_file), {})
