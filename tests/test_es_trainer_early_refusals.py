"""ES runs whose task object cannot train, refused by the trainer before the model loads (esft.es.trainer).

The command line and `esft.train_es` without a model or generate function check a task object with the config's
`check_task_fit`; a task object that reaches `ESTrainer` otherwise (`esft.es.train_es`, or `esft.train_es` with
a generate function) was checked only once the model had loaded.

Run: PYTHONPATH=src pytest -q tests/test_es_trainer_early_refusals.py   (a few seconds, CPU)
"""

from __future__ import annotations

import pytest

from es_tiny import one_thread  # noqa: F401  (autouse fixture)
from es_tiny import ToyTask, stub_generate, tiny_llama
from esft.es.es_config import ESConfig
from esft.es.trainer import ESTrainer


def cfg(tmp_path, **kw) -> ESConfig:
    base = dict(model="tiny", task="toy", population_size=4, sigma=0.05, alpha=0.02, batch_size=4, iterations=2,
                max_new_tokens=2, seed=5, output_dir=str(tmp_path / "run"), eval_every=1, eval_limit=4,
                checkpoint_every=0)
    base.update(kw)
    return ESConfig(**base)


def no_model_load(monkeypatch) -> None:
    monkeypatch.setattr("esft.models.load_model", lambda *a, **k: pytest.fail("the model loaded"))


@pytest.mark.parametrize("rule", ["mean", "dart"])
def test_an_empty_train_split_is_refused_before_the_model_loads(tmp_path, monkeypatch, rule):
    """A task object with no train examples loaded the model, logged a step-0 evaluation of train reward NaN (the
    mean of no example), then failed with a ZeroDivisionError in the first iteration's fitness (the mean reward
    of an empty batch; DART-ES: its fresh stream over 0 problems)."""
    no_model_load(monkeypatch)
    with pytest.raises(ValueError, match="its train split is empty"):
        ESTrainer(cfg(tmp_path, fitness_rule=rule), task=ToyTask(n_train=0), generate_fn=stub_generate,
                  progress=False)


def test_an_empty_train_split_is_refused_with_a_model_given(tmp_path):
    with pytest.raises(ValueError, match="its train split is empty"):
        ESTrainer(cfg(tmp_path), model=tiny_llama(), task=ToyTask(n_train=0), generate_fn=stub_generate,
                  progress=False)


def test_the_balanced_rule_on_a_task_without_labels_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    """fitness_rule 'balanced' on an unlabelled task object was refused only after the model had loaded, the masters
    were made and the executor built (an executor factory's workers started, and not closed by the refusal)."""
    no_model_load(monkeypatch)
    with pytest.raises(ValueError, match="fitness rule 'balanced' needs a task with labels"):
        ESTrainer(cfg(tmp_path, fitness_rule="balanced"), task=ToyTask(), generate_fn=stub_generate, progress=False)


def test_the_balanced_rule_refusal_builds_no_executor(tmp_path):
    built = []

    def factory(config, **parts):
        built.append(config)
        raise AssertionError("the executor was built")

    with pytest.raises(ValueError, match="fitness rule 'balanced' needs a task with labels"):
        ESTrainer(cfg(tmp_path, fitness_rule="balanced"), model=tiny_llama(), task=ToyTask(),
                  executor_factory=factory, progress=False)
    assert built == []
