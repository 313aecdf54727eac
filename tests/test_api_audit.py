"""esft.api: what train_es / es_trainer / train_grpo hand on (config, task objects, keyword seams), and that bad
input is refused before Ray joins or a model loads."""

from __future__ import annotations

from pathlib import Path

import pytest

import esft.api as api
from esft.api import es_trainer, train_es, train_grpo, with_task
from esft.es import ESConfig
from esft.grpo import GRPOConfig
from esft.rundir import RunInterrupted, TrainResult


class Recorder:
    """Stands in for ESTrainer: records what it was built with."""

    built: list = []

    def __init__(self, config, **kwargs):
        Recorder.built.append((config, kwargs))
        self.config, self.kwargs = config, kwargs
        self.task = kwargs.get("task")

    def train(self):
        return TrainResult(Path(self.config.output_dir), 3, None, {"accuracy": 0.5})


@pytest.fixture()
def recorded(monkeypatch):
    Recorder.built = []
    monkeypatch.setattr(api, "ESTrainer", Recorder)
    monkeypatch.setattr("esft.es.curve.plot_run", lambda out: None)
    return Recorder.built


def test_with_task_none_and_strings():
    base = ESConfig(output_dir="unused")
    assert with_task(base, None) == (base, None)
    config, obj = with_task(base, "countdown:numbers=2")
    assert obj is None and config.task == "countdown:numbers=2" and base.task != config.task


def test_with_task_builds_a_class_and_records_its_options(user_tasks):
    config, obj = with_task(ESConfig(output_dir="unused"), user_tasks.Weighted)
    assert isinstance(obj, user_tasks.Weighted) and obj.count == 6
    assert config.task == "obj_tasks:Weighted" and config.task_options == {}
    config, obj = with_task(GRPOConfig(output_dir="unused"), user_tasks.Weighted(count=3))
    assert config.task == "obj_tasks:Weighted" and config.task_options == {"count": 3}


def test_with_task_validates_a_task_object_first(user_tasks):
    class Broken(user_tasks.Weighted):
        def validate(self):
            raise ValueError("bad data file")

    with pytest.raises(ValueError, match="bad data file"):
        with_task(ESConfig(output_dir="unused"), Broken())


def test_es_trainer_with_an_executor_passes_every_seam_through(recorded, monkeypatch, user_tasks):
    monkeypatch.setattr(api, "connect", lambda config: pytest.fail("Ray joined with an executor given"))
    seams = dict(model="M", tokenizer="T", executor="E", generate_fn="G", fitness_rule="F", progress=False)
    task = user_tasks.Weighted(count=4)
    es_trainer(ESConfig(executor="ray", output_dir="unused", sigma=0.25), task=task, **seams)
    config, kwargs = recorded[0]
    assert kwargs == {**seams, "task": task}
    assert config.sigma == 0.25 and config.task == "obj_tasks:Weighted" and config.task_options == {"count": 4}


def test_es_trainer_builds_the_executor_factory_and_leaves_ray_on_failure(recorded, monkeypatch, tmp_path):
    joined, left = [], []
    monkeypatch.setattr(api, "connect", lambda config: joined.append(config) or True)
    monkeypatch.setattr(api, "disconnect_ray", lambda: left.append(1))
    es_trainer(ESConfig(output_dir=str(tmp_path / "run")), model="M")
    config, kwargs = recorded[0]
    factory = kwargs["executor_factory"]
    assert factory.func is api.make_executor and factory.keywords == {"owns_ray": True}
    assert kwargs["model"] == "M" and kwargs["task"] is None and joined == [config] and left == []

    def failing(config, **kwargs):
        raise RuntimeError("model failed")

    monkeypatch.setattr(api, "ESTrainer", failing)
    with pytest.raises(RuntimeError, match="model failed"):
        es_trainer(ESConfig(output_dir=str(tmp_path / "run")))
    assert left == [1]                                   # the connection it made is closed
    monkeypatch.setattr(api, "connect", lambda config: False)
    with pytest.raises(RuntimeError, match="model failed"):
        es_trainer(ESConfig(output_dir=str(tmp_path / "run")))
    assert left == [1]                                   # a connection it did not make is left alone
    monkeypatch.setattr(api, "ESTrainer", Recorder)
    es_trainer(ESConfig(output_dir=str(tmp_path / "run")))
    assert recorded[-1][1]["executor_factory"].keywords == {"owns_ray": False}


def test_es_trainer_refuses_bad_output_dir_and_options_before_ray(recorded, monkeypatch, tmp_path):
    monkeypatch.setattr(api, "connect", lambda config: pytest.fail("Ray joined before the checks"))
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(NotADirectoryError):
        es_trainer(ESConfig(output_dir=str(afile)))
    with pytest.raises(ValueError, match="unknown executor_options"):
        es_trainer(ESConfig(executor="ray", output_dir=str(tmp_path / "r"), executor_options={"bogus": 1}))
    assert recorded == []


def test_a_local_run_trains_a_task_object_ray_could_not_rebuild(recorded, monkeypatch, user_tasks, tmp_path):
    monkeypatch.setattr(api, "connect", lambda config: False)
    task = user_tasks.Weighted(scorer=lambda c, ex: 0.0)
    es_trainer(ESConfig(executor="local", output_dir=str(tmp_path / "run")), task=task)
    assert recorded[0][1]["task"] is task


def test_train_es_returns_the_trainers_result_and_draws_the_curve(recorded, monkeypatch, tmp_path, capsys):
    drawn = []
    monkeypatch.setattr(api, "connect", lambda config: False)
    monkeypatch.setattr("esft.es.curve.plot_run", lambda out: drawn.append(out))
    result = train_es(ESConfig(output_dir=str(tmp_path / "run")), task="countdown")
    assert result.steps == 3 and drawn == [tmp_path / "run"] and recorded[0][0].task == "countdown"

    def no_figure(out):
        raise ValueError("no backend")

    monkeypatch.setattr("esft.es.curve.plot_run", no_figure)
    assert train_es(ESConfig(output_dir=str(tmp_path / "run"))).steps == 3
    assert "curve.png not drawn: ValueError: no backend" in capsys.readouterr().err


def test_train_grpo_hands_config_and_task_object_on(monkeypatch, user_tasks, tmp_path):
    seen = []

    def fake(config, **kwargs):
        seen.append((config, kwargs))
        return TrainResult(Path(config.output_dir), 1, None, None)

    drawn = []
    monkeypatch.setattr("esft.grpo.run.train_grpo", fake)
    monkeypatch.setattr("esft.es.curve.plot_run", lambda out: drawn.append(out))
    task = user_tasks.Weighted(count=2)
    result = train_grpo(GRPOConfig(output_dir=str(tmp_path / "g"), learning_rate=3e-6), task=task, model="M")
    config, kwargs = seen[0]
    assert result.steps == 1 and kwargs == {"task": task, "model": "M"} and drawn == [tmp_path / "g"]
    assert config.learning_rate == 3e-6 and config.task == "obj_tasks:Weighted" and config.task_options == {"count": 2}


def test_an_interruption_of_a_rebuildable_task_keeps_its_message(monkeypatch, user_tasks, tmp_path):
    msg = "interrupted: resume with `esft train grpo --resume --output-dir X`"

    def interrupted(config, **kwargs):
        raise RunInterrupted(msg)

    monkeypatch.setattr("esft.grpo.run.train_grpo", interrupted)
    with pytest.raises(RunInterrupted) as info:                      # config.yaml rebuilds this one
        # a model given (the stand-in "M"): the run's own set-up, whose task is not checked again here
        train_grpo(GRPOConfig(output_dir=str(tmp_path / "g")), task=user_tasks.Weighted(count=2), model="M")
    assert str(info.value) == msg
    with pytest.raises(RunInterrupted) as info:                      # a task string: the CLI resumes it
        train_grpo(GRPOConfig(output_dir=str(tmp_path / "g")), task="countdown", model="M")
    assert str(info.value) == msg
    with pytest.raises(RunInterrupted) as info:                      # a function field: only the script can
        train_grpo(GRPOConfig(output_dir=str(tmp_path / "g")), task=user_tasks.Weighted(scorer=lambda c, e: 0.0),
                   model="M")
    assert "esft train" not in str(info.value) and "`esft.train_grpo(config.replace(resume=True)" in str(info.value)


def test_an_executor_factory_alone_skips_the_ray_connection(recorded, monkeypatch):
    monkeypatch.setattr(api, "connect", lambda config: pytest.fail("Ray joined with an executor_factory given"))
    es_trainer(ESConfig(executor="ray", output_dir="unused"), executor_factory="F")
    assert recorded[0][1]["executor_factory"] == "F"


def test_ray_refuses_a_class_defined_in_the_script(user_tasks, monkeypatch):
    monkeypatch.setattr(api, "connect", lambda config: pytest.fail("Ray joined before the task was checked"))

    class Local(user_tasks.Weighted):                               # plain values, but only this script has it
        pass

    with pytest.raises(ValueError, match="its class is defined in the script"):
        es_trainer(ESConfig(executor="ray", output_dir="unused"), task=Local())


def test_a_fresh_run_records_its_own_task_over_an_old_config_yaml(user_tasks, tmp_path):
    """Only a resume keeps what config.yaml recorded; a fresh run into the same folder records the task given."""
    import yaml

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"task": "countdown", "task_options": {}}))
    config, _ = with_task(ESConfig(output_dir=str(run)), user_tasks.Weighted(count=5))
    assert config.task == "obj_tasks:Weighted" and config.task_options == {"count": 5}
