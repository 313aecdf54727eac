"""esft.grpo.interrupt with transformers' own TrainerState: the RNG states saved with an interrupt checkpoint
restore every generator, and StepBoundary names a step to save only when its records are written, it has no
checkpoint yet and the weights are not mid-update."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from transformers import TrainerControl, TrainerState  # noqa: E402

from esft.grpo.interrupt import StepBoundary, rng_states, set_rng_states  # noqa: E402


def _draw():
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_rng_states_restore_python_numpy_and_torch():
    saved = rng_states()
    first = _draw()
    _draw()
    set_rng_states(saved)
    assert _draw() == first


def test_a_step_is_saved_once_finished_and_never_mid_update():
    b, state, control = StepBoundary(), TrainerState(global_step=0, max_steps=4), TrainerControl()
    b.on_train_begin(None, state, control)
    assert b.unsaved_step(state) is None  # nothing trained yet
    for step in (1, 2):
        b.on_pre_optimizer_step(None, state, control)
        state.global_step = step
        assert b.unsaved_step(state) is None  # updated, its records not written
        b.on_log(None, state, control, logs={"loss": 0.5})
        after_log = _draw()
        assert b.unsaved_step(state) == step
    # the RNG states are those of step 2's end (not step 1's, not the draws after it)
    set_rng_states(b.rng)
    assert _draw() == after_log
    b.on_pre_optimizer_step(None, state, control)
    assert b.unsaved_step(state) is None  # inside step 3's update: the weights are no step's
    state.global_step = 3
    b.on_log(None, state, control, logs={"loss": 0.5})
    b.on_save(None, state, control)
    assert b.unsaved_step(state) is None  # has its checkpoint already


def test_a_step_counted_but_not_logged_is_not_saved():
    b, state, control = StepBoundary(), TrainerState(global_step=0, max_steps=4), TrainerControl()
    b.on_train_begin(None, state, control)
    state.global_step = 1
    b.on_log(None, state, control, logs={"loss": 0.5})
    state.global_step = 2  # step 2's records not written yet
    assert b.unsaved_step(state) is None


def test_a_resumed_run_has_nothing_to_save_before_its_first_step():
    b, state, control = StepBoundary(), TrainerState(global_step=2, max_steps=4), TrainerControl()
    b.on_train_begin(None, state, control)
    assert (b.finished, b.saved, b.unsaved_step(state)) == (2, 2, None)


def test_the_rng_states_saved_are_those_after_the_steps_evaluation_once_it_ran():
    """The step-end mark (right after the train record) keeps the step if the evaluation is cut short; once the
    evaluation and the other callbacks ran, the boundary's own on_log takes the RNG states again: a reward that
    draws random numbers at evaluation moved them, and a scheduled checkpoint of the step holds the moved ones."""
    b, state, control = StepBoundary(), TrainerState(global_step=0, max_steps=4), TrainerControl()
    b.on_train_begin(None, state, control)
    recorded = b.recorded()
    state.global_step = 1
    recorded.on_log(None, state, control, logs={"loss": 0.5})
    before_eval = b.rng
    assert b.unsaved_step(state) == 1  # an interrupt during the evaluation keeps step 1
    _draw()  # the evaluation draws
    b.on_log(None, state, control, logs={"loss": 0.5})
    after_eval = _draw()
    set_rng_states(b.rng)
    assert _draw() == after_eval and b.rng is not before_eval
