"""The experiment plan's decisions that the mutation audit of 2026-12-05 (mutexp) found untested: where a chain's
recorded start model lies once the experiment folder has moved. No training (seconds).

Run: pytest tests/test_plan_mutmutexp.py -q
"""

from __future__ import annotations

import shutil

from conftest import load_spec_text
from esft.experiments.plan import _inside, build_plan
from test_plan_audit import CHAIN_ONLY, _interrupted_shared_chain


def test_inside_gives_the_path_relative_to_the_experiment_folder_moved_or_not(tmp_path):
    root = tmp_path / "exp"
    key = "seed-42/sequential/grpo-to-es/2-math"
    run = "seed-42/sequential/es/1-countdown/run/checkpoints/final"
    assert _inside(root, f"{root.resolve().as_posix()}/{run}", key) == run
    # recorded under the folder's old place: found from the stage key's `seed-N/kind/`
    assert _inside(root, f"/elsewhere/old-exp/{run}", key) == run
    assert _inside(root, "/elsewhere/old-exp/seed-7/sequential/es/run", key) is None
    assert _inside(root, "/elsewhere/models/smollm2", key) is None


def test_an_unfinished_chain_in_a_moved_folder_keeps_the_shared_run(tmp_path):
    """The interrupted chain's status.json records its ES step's start as an absolute path under the folder's old
    place: after a move, the plan still finds that run (the owner label's), as before the move."""
    root, key, owner_run = _interrupted_shared_chain(tmp_path)
    moved = tmp_path / "moved-experiment-folder"
    shutil.move(str(root), str(moved))
    chain = {s.key: s for s in build_plan(load_spec_text(tmp_path, CHAIN_ONLY), moved)}[key]
    run_dir = owner_run.relative_to(root).as_posix()
    assert [(st.run_dir, st.owner, st.snapshot) for st in chain.steps] == [(run_dir, "grpo", False),
                                                                          (f"{key}/run-2-es", None, False)]


def test_an_unfinished_chain_whose_start_was_its_own_first_run_plans_that_run(tmp_path):
    """status.json says the chain's ES step started from the chain's own first run (no other label trained it):
    the plan keeps the chain's own run, with no owner, even where that folder is gone (it is trained again), and
    never points the user to a label to add back."""
    from esft.experiments.runner import STATUS, _fingerprint, _step_configs
    from esft.experiments.stage_eval import write_json

    spec = load_spec_text(tmp_path, CHAIN_ONLY)
    root = tmp_path / "out"
    smap = {s.key: s for s in build_plan(spec, root)}
    key = "seed-42/single-task/boolq/grpo-to-es"
    chain = smap[key]
    assert chain.steps[0].run_dir == f"{key}/run-1-grpo"
    (root / key).mkdir(parents=True)
    write_json(root / key / STATUS, {"status": "stopped", "attempts": 1, "trained": False,
                                     "fingerprint": _fingerprint(spec, chain, _step_configs(spec, chain, root, smap),
                                                                 smap)})
    again = {s.key: s for s in build_plan(spec, root)}[key]
    assert [(st.run_dir, st.owner) for st in again.steps] == [(f"{key}/run-1-grpo", None), (f"{key}/run-2-es", None)]


def test_a_label_whose_run_folder_is_another_labels_shared_run_is_refused(tmp_path):
    """`es!` (folder name `es`) trains in seed-42/single-task/boolq/es/run, the run that the budget tracks of `es`
    share (their stage folders are es@1 and es@2): only the run folders clash, and the plan refuses it."""
    import pytest

    from esft.experiments import SpecError

    text = CHAIN_ONLY.replace("algorithms:\n", "algorithms:\n  es: {preset: cpu, iterations: [1, 2]}\n"
                                               "  es!: {algorithm: es, preset: cpu, iterations: 1}\n")
    spec = load_spec_text(tmp_path, text)
    with pytest.raises(SpecError, match=r"algorithms\.es! would train in the folder "
                                        r"seed-42/single-task/boolq/es/run, which is algorithms\.es's"):
        build_plan(spec)
    build_plan(load_spec_text(tmp_path, text.replace("es!:", "es2:")))  # its own folder: accepted


def test_a_finished_chain_keeps_the_recorded_shared_run_only_while_that_run_exists(tmp_path):
    """A finished chain's result.json says another label's run trained its first step: with that label gone from
    the spec, the plan keeps that run (a snapshot where the record names an iter_ folder) while its folder exists,
    and falls back to the chain's own first run once it is gone."""
    from esft.experiments.stage_eval import write_json

    spec = load_spec_text(tmp_path, CHAIN_ONLY)
    root = tmp_path / "out"
    key = "seed-42/single-task/boolq/grpo-to-es"
    shared = "seed-42/single-task/boolq/grpo/run"
    (root / shared).mkdir(parents=True)

    def first_step(model_dir):
        write_json(root / key / "result.json", {"steps": [{"run_dir": shared, "model_dir": model_dir,
                                                           "trained_by": "grpo"}]})
        step = {s.key: s for s in build_plan(spec, root)}[key].steps[0]
        return step.run_dir, step.owner, step.snapshot

    assert first_step(f"{shared}/checkpoints/final") == (shared, "grpo", False)
    assert first_step(f"{shared}/checkpoints/iter_000001") == (shared, "grpo", True)
    shutil.rmtree(root / shared)
    assert first_step(f"{shared}/checkpoints/final") == (f"{key}/run-1-grpo", None, False)


def test_every_es_step_of_a_chain_draws_its_own_noise_stream(tmp_path):
    """Stage k's j-th ES step draws stream (k - 1) * (ES steps per stage) + j: with two ES steps per stage the
    streams run 0, 1 then 2, 3, never one stream twice."""
    spec = load_spec_text(tmp_path, """\
kind: sequential
tasks: [countdown, boolq]
algorithms:
  es->es: {es: {preset: cpu, iterations: 1}}
evaluation:
  limit: 3
""")
    stages = [s for s in build_plan(spec) if s.kind == "train"]
    assert [[(st.run_dir.rsplit("/", 1)[1], st.noise_stream) for st in s.steps] for s in stages] == [
        [("run-1-es", 0), ("run-2-es", 1)], [("run-1-es", 2), ("run-2-es", 3)]]


def test_a_task_name_that_does_not_read_back_gets_the_six_hex_digits_of_its_sha1():
    """The folder names of existing experiments hold this suffix: its length is part of the layout."""
    import hashlib

    from esft.experiments.plan import task_slug

    name = "countdown:numbers=2,ops=+*,note=a.b"
    digest = hashlib.sha1(name.encode()).hexdigest()
    assert task_slug(name) == f"countdown.numbers=2.ops=plustimes.note=a.b-{digest[:6]}"
    assert task_slug("countdown:numbers=2,ops=+*") == "countdown.numbers=2.ops=plustimes"
