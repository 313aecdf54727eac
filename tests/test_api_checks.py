"""The Python API checks what `esft train` checks before any model loads: the config's class, a task object's
splits and first example, numpy scalars and paths in a config; and it stops on SIGTERM as the command line does."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
import yaml

import esft
from esft.api import check_config
from esft.config import ConfigError
from esft.es.es_config import ESConfig
from esft.grpo.grpo_config import GRPOConfig


class Plain:
    """A task of the user's: load / prompt / score, eight rows a split."""

    def load(self, split):
        return [{"q": f"{i} + {i}", "answer": str(2 * i)} for i in range(8)]

    def prompt(self, example):
        return example["q"]

    def score(self, completion, example):
        return float(completion.strip() == example["answer"])


class NoTest(Plain):
    def load(self, split):
        if split == "test":
            raise KeyError("test")
        return super().load(split)


class TextScore(Plain):
    def score(self, completion, example):
        return "1.0"


@pytest.fixture()
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr("esft.models.load_model", refuse)


def test_a_dict_or_the_other_trainers_config_is_a_type_error_naming_the_class(tmp_path):
    with pytest.raises(TypeError, match=r"train_es takes an esft.ESConfig, not a dict: build one with "
                                        r"ESConfig\(\*\*your_dict\)"):
        esft.train_es({"output_dir": str(tmp_path)})
    with pytest.raises(TypeError, match=r"train_grpo takes an esft.GRPOConfig, not a ESConfig"):
        esft.train_grpo(ESConfig(output_dir=str(tmp_path)))
    check_config(GRPOConfig(), GRPOConfig, "train_grpo")


@pytest.mark.parametrize("task, words", [(NoTest(), "a task whose test split loads"),
                                         (TextScore(), "score returned text '1.0', not a number")])
@pytest.mark.parametrize("train", ["es", "grpo"])
def test_a_task_object_is_checked_before_the_model_loads(tmp_path, no_model_load, task, words, train):
    """Through the API a task object reached load_model unchecked (the command line checks the task it builds)."""
    if train == "es":
        config = ESConfig(iterations=1, population_size=2, batch_size=2, eval_every=1, eval_limit=2,
                          output_dir=str(tmp_path / "r"))
        call = esft.train_es
    else:
        config = GRPOConfig(max_steps=1, prompts_per_step=2, num_generations=2, per_device_train_batch_size=2,
                            eval_every=1, eval_limit=2, output_dir=str(tmp_path / "r"))
        call = esft.train_grpo
    with pytest.raises(ConfigError, match=words):
        call(config, task=task)


@pytest.mark.parametrize("train", ["es", "grpo"])
def test_a_task_string_in_a_scripts_config_is_checked_before_the_model_loads(tmp_path, no_model_load, train):
    """A config naming its task by string, from a script (no command line to check it): the trainer checks the
    task it builds as `esft train` does (here a class-balanced rule on math, which has no labels) before the
    weights load, not after."""
    if train == "es":
        config = ESConfig(task="math", fitness_rule="balanced", iterations=1, population_size=2, batch_size=2,
                          output_dir=str(tmp_path / "r"))
        call, words = esft.train_es, "fitness_rule = 'balanced' is not accepted"
    else:
        config = GRPOConfig(task="math", class_balanced=True, scale_rewards="batch", max_steps=1,
                            prompts_per_step=2, num_generations=2, per_device_train_batch_size=2, precision="fp32",
                            device="cpu", output_dir=str(tmp_path / "r"))
        call, words = esft.train_grpo, "class_balanced"
    with pytest.raises(ConfigError, match=words):
        call(config)
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_numpy_scalars_and_paths_in_a_config_are_plain_values(tmp_path):
    """A sweep's np.linspace value passed every check and failed after the model loaded, writing config.yaml."""
    config = ESConfig(sigma=np.float64(0.0015), iterations=np.int64(2), output_dir=tmp_path / "run",
                      include=[np.str_("mlp")])
    assert type(config.sigma) is float and type(config.iterations) is int and config.output_dir == str(tmp_path / "run")
    assert yaml.safe_load(yaml.safe_dump(config.to_dict()))["sigma"] == 0.0015 and config.include == ["mlp"]
    with pytest.raises(ConfigError, match="population_size"):
        ESConfig(population_size=np.float64(2.5))


def test_sigterm_stops_a_run_as_ctrl_c_and_the_default_comes_back():
    from esft.sigterm import sigterm_interrupts

    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(KeyboardInterrupt):
            with sigterm_interrupts():
                os.kill(os.getpid(), signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        mine = lambda *a: None  # noqa: E731  a script's own handler is left alone
        signal.signal(signal.SIGTERM, mine)
        with sigterm_interrupts():
            assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_path_is_accepted_where_text_is(tmp_path):
    assert GRPOConfig(output_dir=Path(tmp_path)).output_dir == str(tmp_path)


def test_an_evaluation_config_of_a_task_object_says_how_to_evaluate_one():
    """EvalConfig(tasks=[obj]) failed as "unknown task '<Plain object at 0x...>'", read as a name."""
    from esft.eval_config import EvalConfig

    with pytest.raises(ConfigError, match=r"tasks = <.*Plain object.* expected task names, `module:Class` or data "
                                          r"files \(text\): evaluate a task object with esft.evaluation.evaluate_task"):
        EvalConfig(tasks=[Plain()])
    assert EvalConfig(tasks=["boolq", "countdown"]).tasks == ["boolq", "countdown"]
