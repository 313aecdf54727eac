"""The experiment runner's decisions that the mutation audit of 2026-12-05 (mutexp) found untested: when a GRPO
stage is handed its parent's optimizer state. No training (a stand-in trainer records its call; seconds).

Run: pytest tests/test_runner_mutmutexp.py -q
"""

from __future__ import annotations

import dataclasses

from conftest import load_spec_text
from esft.experiments.plan import build_plan

SPEC = """\
kind: sequential
tasks: [countdown, boolq]
algorithms:
  grpo: {max_steps: 2}
evaluation:
  limit: 3
  holdout: [mmlu]
sequential: {carry_optimizer_state: true}
"""


def test_the_optimizer_state_is_carried_into_the_first_step_when_the_parent_saved_one(tmp_path, monkeypatch):
    """carry_optimizer_state: GRPO stage 2's trainer gets the callback that loads stage 1's AdamW moments when
    stage 1's checkpoint holds optimizer.pt; without that file, or for a later step, it gets no callback."""
    from esft.experiments import algorithms
    from esft.experiments.runner import Hooks, _run_step, _step_configs

    calls = []
    monkeypatch.setitem(algorithms.ALGORITHMS, "grpo", dataclasses.replace(
        algorithms.ALGORITHMS["grpo"], train=lambda config, **kwargs: calls.append(kwargs)))
    spec = load_spec_text(tmp_path, SPEC)
    smap, root = {s.key: s for s in build_plan(spec)}, tmp_path / "out"
    stage = smap["seed-42/sequential/grpo/2-boolq"]
    (config,) = _step_configs(spec, stage, root, smap)
    parent_final = root / smap[stage.parent].model_dir()
    parent_final.mkdir(parents=True)

    def callbacks(first):
        calls.clear()
        _run_step(spec, stage, stage.steps[0], config, root, smap, Hooks(progress=False), first=first)
        (kwargs,) = calls
        return [type(c).__name__ for c in kwargs.get("callbacks", [])]

    assert callbacks(first=True) == []  # the parent left no optimizer.pt
    (parent_final / "optimizer.pt").write_bytes(b"")
    assert callbacks(first=True) == ["CarryOptimizerState"]
    assert callbacks(first=False) == []


def test_the_dry_run_plan_of_a_spec_without_a_folder_is_the_plan_itself(tmp_path):
    """plan_text without an experiment folder (or with one that does not exist yet) describes the plan: nothing
    was trained, so nothing is compared."""
    from esft.experiments.plan import describe
    from esft.experiments.runner import plan_text

    spec = load_spec_text(tmp_path, SPEC)
    expected = describe(build_plan(spec))
    assert plan_text(spec) == expected
    assert plan_text(spec, tmp_path / "not-yet") == expected


def test_a_stage_runs_its_steps_in_order_and_only_the_first_may_take_the_parents_optimizer_state(tmp_path,
                                                                                                  monkeypatch):
    """run_stage hands each step its config in the chain's order, with first=True for the first step alone (the
    one a carried optimizer state may enter), then marks the stage trained and done."""
    from esft.experiments import runner
    from esft.experiments.stage_eval import read_json

    spec = load_spec_text(tmp_path, SPEC.replace("  grpo: {max_steps: 2}\n",
                                                 "  grpo->es: {grpo: {max_steps: 1}, es: {iterations: 1}}\n"))
    smap, root = {s.key: s for s in build_plan(spec)}, tmp_path / "out"
    stage = smap["seed-42/sequential/grpo-to-es/2-boolq"]
    calls = []
    monkeypatch.setattr(runner, "_run_step", lambda spec, stage, step, config, root, stages, hooks, first:
                        calls.append((step.run_dir, config.output_dir, first)))
    monkeypatch.setattr(runner, "evaluate_stage", lambda *a, **k: {})
    monkeypatch.setattr(runner, "_stage_record", lambda *a, **k: {"key": stage.key})
    runner.run_stage(spec, stage, root, smap, runner.Hooks(progress=False, collect_garbage=False))
    assert calls == [(st.run_dir, str((root / st.run_dir).resolve()), i == 0) for i, st in enumerate(stage.steps)]
    assert [c[0].rsplit("/", 1)[1] for c in calls] == ["run-1-grpo", "run-2-es"]
    status = read_json(root / stage.key / runner.STATUS)
    assert status["status"] == "done" and status["trained"] is True and status["attempts"] == 1
