"""esft.analysis.runs: which checkpoints form a sequential chain, where the mutation audit of 2026-12-05 (mutcanon)
found no test: the checkpoint a stage record names, the order of an experiment's chains, a chain named by its
label, and every stage's checkpoint of a chain of three linked runs.

Run: PYTHONPATH=src pytest -q tests/test_analysis_runs_mutmutcanon.py   (seconds)
"""

from __future__ import annotations

import json
from pathlib import Path

from esft.analysis import runs as R

from test_analysis_runs import ckpt, run_dir


def record(root: Path, key: str, steps: list[tuple[str, str, str]], **fields) -> None:
    """A training stage's result.json: `steps` = (algorithm, run_dir, model_dir) of each step, in order."""
    (root / key).mkdir(parents=True, exist_ok=True)
    (root / key / "result.json").write_text(json.dumps({
        "key": key, "kind": "train", "parent": None, "task": "t", **fields,
        "steps": [{"algorithm": a, "run_dir": r, "model_dir": m} for a, r, m in steps]}))


def test_a_stage_checkpoint_is_the_records_model_else_its_last_steps_model_dir(tmp_path):
    """A stage record's `model` (the snapshot the next stage starts from) is its checkpoint, not the last step's
    model_dir; without `model` it is the model_dir of the stage's last step (grpo then es: the es run's)."""
    for run, algo in (("a/grpo", "grpo"), ("a/es", "es"), ("b/es", "es")):
        folder = run_dir(tmp_path / run, {"algorithm": algo, "model": "m", "task": "t", "seed": 1}, [])
        ckpt(folder, "final")
    ckpt(tmp_path / "b/es", "iter_2", {"step": 2})
    record(tmp_path, "a", [("grpo", "a/grpo", "a/grpo/checkpoints/final"), ("es", "a/es", "a/es/checkpoints/final")],
           track="mixed")
    record(tmp_path, "b", [("es", "b/es", "b/es/checkpoints/final")], model="b/es/checkpoints/iter_2", track="snap")
    mixed, snap = R.chains_from_stage_records(R.find_runs(tmp_path), tmp_path)
    assert mixed.name == "mixed" and mixed.algorithm == "grpo->es"
    assert mixed.stages[0].checkpoint == tmp_path / "a/es/checkpoints/final"
    assert snap.name == "snap" and snap.stages[0].checkpoint == tmp_path / "b/es/checkpoints/iter_2"


def test_an_experiments_chains_are_ordered_by_seed_then_track(tmp_path):
    """Chains sort by seed (a run without a seed as seed 0), then by track name, whatever order their stage
    folders are found in."""
    for key, seed, track in (("a", 2, "t"), ("b", None, "t"), ("c", 1, "z"), ("d", 1, "m")):
        config = {"algorithm": "es", "model": "m", "task": "t", **({"seed": seed} if seed is not None else {})}
        ckpt(run_dir(tmp_path / key / "run", config, []), "final")
        record(tmp_path, key, [("es", f"{key}/run", f"{key}/run/checkpoints/final")], track=track)
    chains = R.chains_from_stage_records(R.find_runs(tmp_path), tmp_path)
    assert [(c.seed, c.name) for c in chains] == [(None, "t"), (1, "m"), (1, "z"), (2, "t")]


def test_a_stage_record_without_a_track_names_its_chain_by_its_label(tmp_path):
    ckpt(run_dir(tmp_path / "a/run", {"algorithm": "es", "model": "m", "task": "t", "seed": 1}, []), "final")
    record(tmp_path, "a", [("es", "a/run", "a/run/checkpoints/final")], label="es@100")
    (chain,) = R.chains_from_stage_records(R.find_runs(tmp_path), tmp_path)
    assert chain.name == "es@100" and chain.label == "es@100 t seed 1 (a)"


def test_each_stage_of_a_three_run_chain_keeps_the_checkpoint_the_next_stage_started_from(tmp_path):
    """Without stage records: run 2 starts from run 1's iter_4 snapshot, run 3 from run 2's final; stage 1's
    checkpoint is iter_4 (not run 1's final), stage 2's run 2's final, stage 3's its own final."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    one = run_dir(tmp_path / "one", {"algorithm": "es", "model": str(base), "task": "a", "seed": 1}, [])
    snap = ckpt(one, "iter_4", {"step": 4})
    ckpt(one, "final", {"step": 8})
    two = run_dir(tmp_path / "two", {"algorithm": "es", "model": str(snap), "task": "b"}, [])
    two_final = ckpt(two, "final")
    three = run_dir(tmp_path / "three", {"algorithm": "es", "model": str(two_final), "task": "c"}, [])
    three_final = ckpt(three, "final")
    chains = R.build_chains(R.find_runs(tmp_path), tmp_path)
    (chain,) = [c for c in chains if len(c.stages) == 3]
    assert chain.tasks == ["a", "b", "c"] and chain.base == base.resolve()
    assert [ck for _, ck in chain.checkpoints()] == [snap.resolve(), two_final.resolve(), three_final]


def test_a_sequence_of_grpo_to_es_stages_is_a_grpo_to_es_chain(tmp_path):
    """Two stages, each GRPO then ES: the chain's algorithm is "grpo->es" (its tables' headings), not the runs
    joined across stages, "grpo->es->grpo->es"; a sequence of an ES stage then a GRPO stage stays "es->grpo"."""
    for run, algo in (("1/grpo", "grpo"), ("1/es", "es"), ("2/grpo", "grpo"), ("2/es", "es"), ("x/es", "es"),
                      ("y/grpo", "grpo")):
        ckpt(run_dir(tmp_path / run, {"algorithm": algo, "model": "m", "task": "t", "seed": 1}, []), "final")
    record(tmp_path, "1", [("grpo", "1/grpo", "1/grpo/checkpoints/final"), ("es", "1/es", "1/es/checkpoints/final")],
           track="hybrid", index=1, seed=1)
    record(tmp_path, "2", [("grpo", "2/grpo", "2/grpo/checkpoints/final"), ("es", "2/es", "2/es/checkpoints/final")],
           track="hybrid", index=2, seed=1, parent="1")
    record(tmp_path, "x", [("es", "x/es", "x/es/checkpoints/final")], track="mixed", index=1, seed=1)
    record(tmp_path, "y", [("grpo", "y/grpo", "y/grpo/checkpoints/final")], track="mixed", index=2, seed=1,
           parent="x")
    chains = {c.name: c for c in R.chains_from_stage_records(R.find_runs(tmp_path), tmp_path)}
    assert len(chains["hybrid"].stages) == 2 and chains["hybrid"].algorithm == "grpo->es"
    assert len(chains["mixed"].stages) == 2 and chains["mixed"].algorithm == "es->grpo"
