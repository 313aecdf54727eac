"""The experiment plan (esft.experiments.plan) on small specs: which stage snapshots a shared run, how a single
budget names its folders, and the folder-clash guard on hand-made stages. No training (a few seconds).

Run: pytest tests/test_plan_audit.py -q
"""

from __future__ import annotations

import pytest

from conftest import load_spec_text
from esft.experiments import SpecError
from esft.experiments.plan import Stage, Step, build_plan

SPEC = """\
name: t
kind: single-task
tasks: [countdown]
seeds: [42]
algorithms:
  es:
    preset: cpu
    iterations: [2, 4, 6]
evaluation:
  limit: 3
"""


def test_single_task_budgets_snapshot_every_budget_but_the_largest(tmp_path):
    """The shared run is continued past each smaller budget, so only those keep an iter_ snapshot; the largest
    budget's stage evaluates the run's final weights (no continuation would ever reach past it)."""
    stages = {s.key: s for s in build_plan(load_spec_text(tmp_path, SPEC))}
    keys = [f"seed-42/single-task/countdown/es@{b}" for b in (2, 4, 6)]
    assert [stages[k].steps[0].snapshot for k in keys] == [True, True, False]
    assert [stages[k].model_dir().rsplit("/", 1)[1] for k in keys] == ["iter_000002", "iter_000004", "final"]
    assert len({stages[k].steps[0].run_dir for k in keys}) == 1


@pytest.mark.parametrize("kind,key", [("single-task", "seed-42/single-task/countdown/es"),
                                      ("sequential", "seed-42/sequential/es/1-countdown")])
def test_a_one_budget_list_names_the_track_by_its_label_alone(tmp_path, kind, key):
    """`iterations: [4]` is one track: its folders are the label's, as with `iterations: 4`, not `es@4`."""
    text = SPEC.replace("[2, 4, 6]", "[4]").replace("single-task", kind)
    stages = {s.key: s for s in build_plan(load_spec_text(tmp_path, text))}
    assert key in stages, sorted(stages)
    stage = stages[key]
    assert stage.track == "es" and stage.budget == 4
    assert stage.steps[0].run_dir == f"{key}/run" and not stage.steps[0].snapshot


def test_two_stages_of_one_label_in_one_folder_are_refused(tmp_path):
    """The guard refuses a stage folder used twice even within one label (the second stage would be skipped as
    done with the first's result); one label's stages may share a run folder (budget tracks do)."""
    from esft.experiments.plan import _check_folders

    spec = load_spec_text(tmp_path, SPEC)
    comp = spec.method("es").components[0]
    run = "seed-42/single-task/countdown/es/run"

    def stage(key, budget):
        return Stage(key=key, kind="train", seed=42, label="es", steps=[Step(comp, run, budget)])

    _check_folders(spec, [stage("seed-42/a", 2), stage("seed-42/b", 4)])  # shared run, own folders: accepted
    with pytest.raises(SpecError, match=r"algorithms\.es would train in the folder seed-42/a, which is "
                                        r"algorithms\.es's"):
        _check_folders(spec, [stage("seed-42/a", 2), stage("seed-42/a", 4)])


SEQ = """\
name: t
kind: sequential
tasks: [countdown, boolq]
seeds: [52, 42]
algorithms:
  es:
    preset: cpu
    iterations: [2, 4]
  grpo->es:
    grpo: {max_steps: 1}
    es: {iterations: 1}
evaluation:
  limit: 3
"""


def test_stages_come_seed_by_seed_in_the_spec_s_order_after_their_prerequisites(tmp_path):
    stages = build_plan(load_spec_text(tmp_path, SEQ))
    assert stages[0].key == "base"
    seeds = [s.seed for s in stages[1:]]
    assert seeds == sorted(seeds, key=[52, 42].index) and set(seeds) == {52, 42}
    done: set[str] = {"base"}
    for s in stages[1:]:
        assert set(s.after) <= done and (s.parent is None or s.parent in done), s.key
        done.add(s.key)
    single = build_plan(load_spec_text(tmp_path, SPEC.replace("[countdown]", "[countdown, boolq]")))
    assert [s.key for s in single] == ["base"] + [f"seed-42/single-task/{t}/es@{b}" for t in ("countdown", "boolq")
                                                  for b in (2, 4, 6)]


def test_plan_entries_and_dry_run_lines_carry_the_step_facts(tmp_path):
    """plan.json (as_dict) and `--dry-run` (describe) say where each stage starts, its snapshot and its ES noise
    stream: a stage 2 of a chain that printed stream 0 would hide that it reuses stage 1's noise."""
    from esft.experiments.plan import as_dict, describe

    stages = build_plan(load_spec_text(tmp_path, SEQ))
    smap = {s.key: s for s in stages}
    chain2 = smap["seed-52/sequential/grpo-to-es/2-boolq"]
    entry = as_dict(chain2)
    assert [(st["algorithm"], st["noise_stream"]) for st in entry["steps"]] == [("grpo", 0), ("es", 1)]
    assert entry["parent"] == "seed-52/sequential/grpo-to-es/1-countdown" and entry["index"] == 2
    assert as_dict(smap["seed-52/sequential/es@2/1-countdown"])["display"] == "ES (iter=2)"
    lines = {line.split()[0]: line for line in describe(stages).splitlines()}
    assert "from seed-52/sequential/grpo-to-es/1-countdown:" in lines[chain2.key]
    assert lines[chain2.key].endswith(f"es to 1 in {chain2.key}/run-2-es (noise stream 1); "
                                      "evaluate countdown, boolq, mmlu, ifeval")
    first = lines["seed-52/sequential/es@2/1-countdown"]
    assert "from base model:" in first and "(snapshot)" in first and "noise stream" not in first
    assert lines["base"].endswith("evaluate the base model on countdown, boolq, mmlu, ifeval")


SHARED = """\
name: t
kind: single-task
tasks: [boolq]
seeds: [42]
algorithms:
  grpo: {preset: cpu, max_steps: 1}
  grpo->es:
    grpo: {}
    es: {preset: cpu, iterations: 1}
evaluation:
  limit: 3
"""


def test_a_chain_whose_own_first_run_exists_keeps_it(tmp_path):
    """An experiment folder of an esft that did not share runs holds the chain's own `run-1-grpo`, and its ES step
    started from that run's weights (status.json records that start): the plan keeps that run, so the re-run and
    its dry run accept the finished stage instead of calling it trained with other options."""
    from esft.experiments.runner import STATUS, _fingerprint, _step_configs, plan_text
    from esft.experiments.stage_eval import write_json

    spec = load_spec_text(tmp_path, SHARED)
    key = "seed-42/single-task/boolq/grpo-to-es"
    fresh = {s.key: s for s in build_plan(spec, tmp_path / "out")}[key]  # nothing trained yet: the run is shared
    assert (fresh.steps[0].run_dir, fresh.steps[0].owner) == ("seed-42/single-task/boolq/grpo/run", "grpo")
    root = tmp_path / "out"
    (root / key / "run-1-grpo").mkdir(parents=True)
    smap = {s.key: s for s in build_plan(spec, root)}
    chain = smap[key]
    assert (chain.steps[0].run_dir, chain.steps[0].owner) == (f"{key}/run-1-grpo", None)
    write_json(root / key / STATUS, {"status": "done", "trained": True,
                                     "fingerprint": _fingerprint(spec, chain, _step_configs(spec, chain, root, smap),
                                                                 smap)})
    line = next(line for line in plan_text(spec, root).splitlines() if line.startswith(key))
    assert f"grpo to 1 in {key}/run-1-grpo then es to 1 in {key}/run-2-es;" in line


#: SHARED without its `grpo` label, the chain's GRPO options written out
CHAIN_ONLY = SHARED.replace("  grpo: {preset: cpu, max_steps: 1}\n", "").replace(
    "    grpo: {}", "    grpo: {preset: cpu, max_steps: 1}")


def _interrupted_shared_chain(tmp_path):
    """An experiment folder where `grpo` trained the run its chain `grpo->es` shares, and the chain's ES step was
    stopped (status.json with its fingerprint, no result.json); returns (root, chain key, owner's run folder)."""
    from esft.experiments.runner import STATUS, _fingerprint, _step_configs
    from esft.experiments.stage_eval import write_json

    spec = load_spec_text(tmp_path, SHARED)
    root = tmp_path / "out"
    smap = {s.key: s for s in build_plan(spec, root)}
    key = "seed-42/single-task/boolq/grpo-to-es"
    owner_run = root / smap[key].steps[0].run_dir
    (owner_run / "checkpoints" / "final").mkdir(parents=True)
    (owner_run / "checkpoints" / "final" / "config.json").write_text("{}")
    (owner_run / "checkpoints" / "final" / "trainer_state.json").write_text('{"global_step": 1}')
    write_json(owner_run.parent / "result.json", {"label": "grpo", "steps": []})
    (root / key / "run-2-es").mkdir(parents=True)
    chain = smap[key]
    write_json(root / key / STATUS, {"status": "stopped", "attempts": 1, "trained": False,
                                     "fingerprint": _fingerprint(spec, chain, _step_configs(spec, chain, root, smap),
                                                                 smap)})
    return root, key, owner_run


def test_an_unfinished_chain_keeps_the_shared_run_after_its_owner_label_leaves_the_spec(tmp_path):
    """A chain stopped in its ES step, which started from the `grpo` label's run: a spec without `grpo` resumes it
    from that run (the dry run used to refuse the stage as trained with other options, its ES step's start model)."""
    from esft.experiments.runner import plan_text

    root, key, owner_run = _interrupted_shared_chain(tmp_path)
    spec = load_spec_text(tmp_path, CHAIN_ONLY)
    chain = {s.key: s for s in build_plan(spec, root)}[key]
    run_dir = owner_run.relative_to(root).as_posix()
    assert [(st.run_dir, st.owner, st.snapshot) for st in chain.steps] == [(run_dir, "grpo", False),
                                                                          (f"{key}/run-2-es", None, False)]
    line = next(line for line in plan_text(spec, root).splitlines() if line.startswith(key))
    assert f"grpo to 1 in {run_dir} (trained by grpo's stage) then es to 1 in {key}/run-2-es;" in line


def test_an_unfinished_chain_whose_shared_start_is_gone_says_what_to_do(tmp_path):
    import shutil

    from esft.experiments.runner import plan_text

    root, key, owner_run = _interrupted_shared_chain(tmp_path)
    shutil.rmtree(owner_run / "checkpoints" / "final")
    with pytest.raises(SpecError) as err:
        plan_text(load_spec_text(tmp_path, CHAIN_ONLY), root)
    assert str(err.value) == (f"{root / key} is unfinished, and its es step started from {owner_run}/checkpoints/"
                              f"final, which is gone: add label 'grpo' back to the spec to train that run again, or "
                              f"delete {root / key} to train the whole chain anew")


def test_a_per_task_budget_is_named_in_the_methods_display(tmp_path):
    """`iterations: 3` with `per_task: {boolq: {iterations: 1}}` trained BoolQ 1 iteration while every table named
    the method "ES (iter=3)"; the task whose budget differs is named with it."""
    from esft.experiments.plan import tracks

    spec = load_spec_text(tmp_path, SPEC.replace("tasks: [countdown]", "tasks: [countdown, boolq]").replace(
        "    iterations: [2, 4, 6]\n", "    iterations: 3\n    per_task: {boolq: {iterations: 1}}\n"
                                       "  grpo: {max_steps: 2}\n"))
    assert [t.display for m in spec.methods for t in tracks(m, spec)] == ["ES (iter=3; boolq 1)", "GRPO (T=2)"]
    assert [s.steps[0].budget for s in build_plan(spec) if s.steps and s.steps[0].algorithm == "es"] == [3, 1]
