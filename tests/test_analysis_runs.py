"""Reading ES and GRPO run directories (esft.analysis.runs) and checkpoint tensor sources
(esft.analysis.sources), on synthetic folders with tiny random safetensors files: no model is trained or loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from esft.analysis import run_tables as T
from esft.analysis import runs as R


def ckpt(run: Path, name: str, state: dict | None = None, state_file: str = "es_state.json") -> Path:
    """A checkpoint folder with a (tiny, random) safetensors file and optionally a step file."""
    from safetensors.torch import save_file

    folder = run / "checkpoints" / name
    folder.mkdir(parents=True)
    save_file({"w": torch.randn(2, 2)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text("{}")
    if state is not None:
        (folder / state_file).write_text(json.dumps(state))
    return folder


def run_dir(path: Path, config: dict, metrics: list[dict] | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    if metrics is not None:
        (path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return path


def test_checkpoints_are_ordered_by_recorded_step_not_by_name(tmp_path):
    es = run_dir(tmp_path / "es", {"algorithm": "es"})
    ckpt(es, "iter_9", {"step": 9})
    ckpt(es, "iter_10", {"step": 10})
    ckpt(es, "zzz", {"step": 2})  # the step file wins over the name's digits
    ckpt(es, "final")  # no step recorded: last
    (es / "checkpoints" / "empty_5").mkdir()  # no weights: not a checkpoint
    (es / "checkpoints" / ".tmp_7").mkdir()
    got = [(s, f.name) for s, f in R.list_checkpoints(es)]
    assert got == [(2.0, "zzz"), (9.0, "iter_9"), (10.0, "iter_10"), (float("inf"), "final")]
    assert R.load_run(es).final.name == "final"


def test_grpo_checkpoints_read_the_trainer_state_step_as_es_ones_read_theirs(tmp_path):
    grpo = run_dir(tmp_path / "grpo", {"algorithm": "grpo"})
    ckpt(grpo, "checkpoint-a", {"global_step": 30}, "trainer_state.json")
    ckpt(grpo, "checkpoint-b", {"global_step": 4}, "trainer_state.json")
    ckpt(grpo, "checkpoint-c", {"step": 7}, "state.json")
    ckpt(grpo, "checkpoint-100")  # digits of the name
    ckpt(grpo, "checkpoint-12", {"other": 1})  # unreadable step file: the name's digits
    got = [(s, f.name) for s, f in R.list_checkpoints(grpo)]
    assert got == [(4.0, "checkpoint-b"), (7.0, "checkpoint-c"), (12.0, "checkpoint-12"), (30.0, "checkpoint-a"),
                   (100.0, "checkpoint-100")]
    run = R.load_run(grpo)
    assert run.final.name == "checkpoint-100"  # no `final`: the highest step
    assert R.logged_steps(run) == 100


def test_a_final_with_a_step_sorts_by_it_and_stays_the_final(tmp_path):
    es = run_dir(tmp_path / "es", {"algorithm": "es"})
    ckpt(es, "final", {"step": 5})
    ckpt(es, "iter_5", {"step": 5})
    ckpt(es, "iter_8", {"step": 8})
    assert [f.name for _, f in R.list_checkpoints(es)] == ["iter_5", "final", "iter_8"]
    assert R.load_run(es).final.name == "final"


def test_find_runs_reads_es_and_grpo_folders_alike_and_names_a_missing_root(tmp_path):
    run_dir(tmp_path / "a" / "es", {"population_size": 4, "sigma": 0.1, "model": "m", "seed": "3"}, [])
    (tmp_path / "a" / "es" / "seeds.jsonl").write_text("")
    run_dir(tmp_path / "a" / "grpo", {"learning_rate": 1e-6, "model_name_or_path": "m", "task_name": ["x", "y"]})
    ckpt(tmp_path / "a" / "grpo", "final")
    run_dir(tmp_path / "a" / "notarun", {"model": "m"})  # config but no log or checkpoints
    run_dir(tmp_path / "a" / "es" / "samples" / "inner", {"algorithm": "es"}, [])  # skipped folder
    runs = {r.name: r for r in R.find_runs(tmp_path)}
    assert sorted(runs) == ["es", "grpo"]
    assert (runs["es"].algorithm, runs["grpo"].algorithm) == ("es", "grpo")
    assert runs["es"].seed == 3 and runs["grpo"].seed is None
    assert runs["grpo"].model == "m" and runs["grpo"].task == "x,y"
    assert runs["grpo"].final.name == "final" and runs["es"].final is None
    assert R.find_runs(tmp_path, max_depth=1) == []  # the runs sit two levels down
    with pytest.raises(FileNotFoundError, match="nowhere does not exist"):
        R.find_runs(tmp_path / "nowhere")


@pytest.mark.parametrize("config,files,expected", [
    ({"algorithm": "GRPO", "population_size": 4, "sigma": 1}, (), "grpo"),
    ({"_run": {"algorithm": "es"}, "learning_rate": 1e-6}, (), "es"),
    ({"population_size": 4, "sigma": 0.1}, (), "es"),
    ({"population_size": 4}, (), "unknown"),
    ({}, ("seeds.jsonl",), "es"),
    ({}, ("drift.jsonl",), "grpo"),
    ({"num_generations": 4}, (), "grpo"),
    ({"learning_rate": 1e-6}, (), "grpo"),
])
def test_classify(tmp_path, config, files, expected):
    for f in files:
        (tmp_path / f).write_text("")
    assert R.classify(tmp_path, config) == expected


def test_a_partly_written_metrics_log_keeps_its_complete_records(tmp_path):
    run = run_dir(tmp_path / "r", {"algorithm": "grpo"})
    (run / "metrics.jsonl").write_text('{"step": 1, "kind": "eval", "accuracy": 0.25}\n'
                                       '{"step": 2, "test_accuracy": 0.5, "test_n": 8, "test_ci95": [0.1, 0.9]}\n'
                                       '{"step": 3, "accuracy": 0.9}\n'  # training accuracy: not held out
                                       '{"step": 4, "test_acc')
    r = R.load_run(run)
    assert [m["step"] for m in r.metrics] == [1, 2, 3]
    assert r.accuracy_at("first") == {"step": 1, "accuracy": 0.25, "n": None, "ci95": None, "format_rate": None}
    assert r.accuracy_at("last") == {"step": 2, "accuracy": 0.5, "n": 8, "ci95": [0.1, 0.9], "format_rate": None}
    assert R.logged_steps(r) == 3
    assert R.read_metrics(tmp_path / "missing") == []


def test_a_damaged_middle_line_of_metrics_is_an_error_naming_it_not_a_silent_cut(tmp_path):
    """Everything after a damaged record would otherwise vanish from the report without a word."""
    from esft.rundir import CorruptLogError

    run = run_dir(tmp_path / "r", {"algorithm": "grpo"})
    (run / "metrics.jsonl").write_text('{"step": 1, "test_accuracy": 0.25}\n{"step": 2, "te\n'
                                       '{"step": 3, "test_accuracy": 0.5}\n')
    with pytest.raises(CorruptLogError, match="metrics.jsonl:2"):
        R.load_run(run)


def test_logged_steps_counts_seed_and_drift_lines_without_headers(tmp_path):
    es = run_dir(tmp_path / "es", {"algorithm": "es"}, [{"step": 50}])
    (es / "seeds.jsonl").write_text('{"header": true}\n{"iteration": 0}\n\n{"iteration": 1}\n')
    assert R.logged_steps(R.load_run(es)) == 2
    grpo = run_dir(tmp_path / "grpo", {"algorithm": "grpo"}, [{"step": 50}])
    (grpo / "drift.jsonl").write_text('{"header": {"n": 1}}\n{"step": 1}\n{"step": 2}\n{"step": 3}\n')
    assert R.logged_steps(R.load_run(grpo)) == 3
    (grpo / "drift.jsonl").write_text("")  # empty log: the metrics' largest step
    assert R.logged_steps(R.load_run(grpo)) == 50
    bare = run_dir(tmp_path / "bare", {"algorithm": "grpo"})
    ckpt(bare, "checkpoint-7")
    ckpt(bare, "final")
    assert R.logged_steps(R.load_run(bare)) == 7
    assert R.logged_steps(R.load_run(run_dir(tmp_path / "none", {}))) is None


def test_run_rows_and_accuracy_rows(tmp_path):
    run = run_dir(tmp_path / "r", {"algorithm": "es", "task": "boolq", "seed": 1, "model": "m",
                                   "_run": {"precision": "bf16", "param_dtypes": ["bfloat16"],
                                            "master_dtype": "float32"}},
                  [{"kind": "eval", "step": 0, "test_accuracy": 0.5},
                   {"kind": "eval", "step": 9, "test_accuracy": 0.75, "test_n": 4, "test_ci95": [0.25, 1.0],
                    "test_format_rate": 1.0}])
    ckpt(run, "final", {"step": 9})
    r = R.load_run(run)
    assert T.run_rows([r], lambda x: x.name, shown=str.upper) == [
        ["r", "es", "boolq", 1, "M", 9, "final", "bf16; weights bfloat16; masters float32"]]
    rows = T.accuracy_rows([r], lambda x: x.name)
    assert rows[0][3].endswith("(step 0)") and rows[0][4].endswith("(step 9)") and rows[0][6] == 4
    assert T.accuracy_rows([R.Run(tmp_path, "es", {})], str) == []
    assert T.precision(R.Run(tmp_path, "es", {})) == "not recorded"


def test_run_rows_say_a_run_is_still_running(tmp_path):
    """A run a trainer is still writing (its lock held) read like a finished one, its steps so far as its steps;
    once the lock is released (the trainer stopped or ended) the count stands alone."""
    from esft.rundir import RunLock

    run = run_dir(tmp_path / "r", {"algorithm": "es", "task": "boolq", "seed": 1, "model": "m"},
                  [{"kind": "train", "step": 1}, {"kind": "train", "step": 2}])
    lock = RunLock(run).acquire()
    try:
        assert T.run_rows([R.load_run(run)], lambda x: x.name)[0][5] == "2 so far, still running"
    finally:
        lock.release()
    assert T.run_rows([R.load_run(run)], lambda x: x.name)[0][5] == 2


def chain(algorithm: str, seed: int | None, base: Path | None, tasks=("boolq",)) -> R.Chain:
    runs = [R.Run(Path(f"/{algorithm}{seed}{t}"), algorithm, {"seed": seed, "task": t}) for t in tasks]
    return R.Chain(algorithm, [R.StageRef([r], None, r.task) for r in runs], base, str(base))


def test_pairs_match_seed_first_then_order_and_need_the_same_base_and_tasks(tmp_path):
    es1, es2, es3 = chain("es", 1, tmp_path), chain("es", 2, tmp_path), chain("es", 5, tmp_path)
    g2, g7 = chain("grpo", 2, tmp_path), chain("grpo", 7, tmp_path)
    other = [chain("grpo", 1, tmp_path / "other"), chain("grpo", 1, tmp_path, ("math",)), chain("grpo", 1, None)]
    pairs = R.build_pairs([es1, es2, es3, g2, g7] + other)
    # seed 2's GRPO chain is ES seed 2's pair: seed 1 falls back to the one left, and seed 5 finds none
    assert [(p.es.seed, p.grpo.seed) for p in pairs] == [(1, 7), (2, 2)]
    assert pairs[0].label == "ES vs GRPO, boolq, seed 1/7" and pairs[1].label == "ES vs GRPO, boolq, seed 2"


def test_pairs_do_not_depend_on_the_order_of_the_runs(tmp_path):
    # ES seeds 1 and 2, GRPO seeds 2 and 3: ES seed 1 takes GRPO seed 3 whichever run comes first, and GRPO seed 2
    # is not compared with ES seed 1 while GRPO seed 3 is left out
    es1, es2, g2, g3 = (chain(a, s, tmp_path) for a, s in (("es", 1), ("es", 2), ("grpo", 2), ("grpo", 3)))
    for order in ([es1, es2, g2, g3], [es2, es1, g2, g3], [es1, es2, g3, g2]):
        assert sorted((p.es.seed, p.grpo.seed) for p in R.build_pairs(order)) == [(1, 3), (2, 2)]


def test_chains_link_a_run_started_from_another_runs_checkpoint(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    s1 = run_dir(tmp_path / "grpo1", {"algorithm": "grpo", "model": str(base), "task": "a", "seed": 3}, [])
    ckpt(s1, "checkpoint-2", {"global_step": 2}, "trainer_state.json")
    ckpt(s1, "checkpoint-10", {"global_step": 10}, "trainer_state.json")
    s2 = run_dir(tmp_path / "es2", {"algorithm": "es", "model": "grpo1/checkpoints/checkpoint-10", "task": "b"}, [])
    ckpt(s2, "final")
    chains = R.build_chains(R.find_runs(tmp_path), tmp_path)
    assert len(chains) == 1
    c = chains[0]
    assert c.algorithm == "grpo->es" and c.tasks == ["a", "b"] and c.seed == 3 and c.base == base.resolve()
    assert [(lab, ck.name) for lab, ck in c.checkpoints()] == [("1:a", "checkpoint-10"), ("2:b", "final")]
    assert c.label == "GRPO->ES a->b seed 3 (es2)"


def test_resolve_model_looks_beside_the_run_and_under_the_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    run = R.Run(tmp_path / "models" / "x" / "run", "es", {})
    assert R.resolve_model("m", run) == model.resolve()  # the run's grandparent holds it
    assert R.resolve_model("m", None, tmp_path / "models") == model.resolve()
    assert R.resolve_model("models/m") == model.resolve()
    assert R.resolve_model(None) is None
    assert R.resolve_model("no/such/model-xyz") is None


def test_experiment_plan(tmp_path):
    assert R.experiment_plan(tmp_path) is None
    (tmp_path / "plan.json").write_text(json.dumps({"stages": [
        {"key": "a", "steps": [{"run_dir": "a/run"}]}, {"key": "b", "steps": []}, "junk"]}))
    plan = R.experiment_plan(tmp_path)
    assert plan.keys == {"a"} and plan.run_dirs == {(tmp_path / "a" / "run").resolve()}


def test_an_empty_seed_log_falls_back_and_step_files_are_read_in_order(tmp_path):
    es = run_dir(tmp_path / "es", {"algorithm": "es"}, [{"step": 6}])
    (es / "seeds.jsonl").write_text("")  # created, nothing logged yet
    r = R.load_run(es)
    assert r.seed_log is None and R.logged_steps(r) == 6
    both = ckpt(es, "iter_1", {"step": 3})
    (both / "trainer_state.json").write_text(json.dumps({"global_step": 99}))  # es_state.json comes first
    assert [s for s, _ in R.list_checkpoints(es)] == [3.0]


def test_a_relative_run_path_is_resolved(tmp_path, monkeypatch):
    run_dir(tmp_path / "r", {"algorithm": "es"}, [])
    monkeypatch.chdir(tmp_path)
    assert R.load_run(Path("r")).path == (tmp_path / "r").resolve()


def test_a_run_resumed_from_its_own_checkpoint_is_still_a_chain(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    run = run_dir(tmp_path / "run", {"algorithm": "es", "model": "run/checkpoints/iter_5", "task": "a"}, [])
    ckpt(run, "iter_5", {"step": 5})
    ckpt(run, "final", {"step": 9})
    chains = R.build_chains(R.find_runs(tmp_path), tmp_path)
    assert [(c.tasks, c.stages[0].checkpoint.name) for c in chains] == [(["a"], "final")]


def test_mixed_chains_name_every_switch_of_algorithm(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    prev = base
    for i, algo in enumerate(("es", "grpo", "es")):
        r = run_dir(tmp_path / f"{i}-{algo}", {"algorithm": algo, "model": str(prev), "task": f"t{i}"}, [])
        prev = ckpt(r, "final")
    (c,) = R.build_chains(R.find_runs(tmp_path), tmp_path)
    assert c.algorithm == "es->grpo->es" and c.tasks == ["t0", "t1", "t2"]


def stage_record(root: Path, key: str, run: str, parent: str | None, task: str, track: str = "es") -> None:
    (root / key).mkdir(parents=True, exist_ok=True)
    model = f"{run}/checkpoints/final"
    (root / key / "result.json").write_text(json.dumps({
        "key": key, "kind": "train", "seed": 1, "track": track, "task": task, "parent": parent, "model": model,
        "steps": [{"algorithm": "es", "run_dir": run, "model_dir": model}]}))


def test_a_chain_with_a_middle_stage_left_out_ends_before_it(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    prev, parent = base, None
    for i, task in enumerate(("a", "b", "c"), 1):
        run = f"x/{i}-{task}/run"
        ckpt(run_dir(tmp_path / run, {"algorithm": "es", "model": str(prev), "task": task, "seed": 1}, []), "final")
        stage_record(tmp_path, f"x/{i}-{task}", run, parent, task)
        prev, parent = tmp_path / run / "checkpoints" / "final", f"x/{i}-{task}"
    (whole,) = R.build_chains(R.find_runs(tmp_path), tmp_path)
    assert whole.tasks == ["a", "b", "c"] and whole.name == "es" and whole.label == "es a->b->c seed 1 (3-c)"
    kept = [r for r in R.find_runs(tmp_path) if "/2-" not in str(r.path)]
    (chain,) = R.build_chains(kept, tmp_path)
    assert chain.tasks == ["a"]  # stage 3 does not follow from stage 1


def test_chains_without_a_local_base_are_never_paired(tmp_path):
    assert R.build_pairs([chain("es", 1, None), chain("grpo", 1, None)]) == []


def test_a_training_accuracy_beside_an_empty_test_accuracy_is_not_held_out(tmp_path):
    r = R.Run(tmp_path, "grpo", {}, metrics=[{"kind": "train", "step": 1, "test_accuracy": None, "accuracy": 0.9}])
    assert r.accuracy_at() is None


def test_a_hidden_checkpoint_folder_is_not_listed_even_with_weights(tmp_path):
    es = run_dir(tmp_path / "es", {"algorithm": "es"})
    ckpt(es, ".iter_11.tmp", {"step": 11})  # being written
    ckpt(es, "iter_4", {"step": 4})
    assert [f.name for _, f in R.list_checkpoints(es)] == ["iter_4"]


def test_stage_records_skip_an_orphan_stage_and_a_missing_checkpoint_is_none(tmp_path):
    for run in ("a/run", "b/run"):
        ckpt(run_dir(tmp_path / run, {"algorithm": "es", "model": "m", "task": "t", "seed": 1}, []), "final")
    stage_record(tmp_path, "a", "a/run", None, "t")
    stage_record(tmp_path, "b", "b/run", "gone", "t", track="other")  # its parent stage never finished
    (chain,) = R.chains_from_stage_records(R.find_runs(tmp_path), tmp_path)
    assert chain.name == "es" and chain.stages[0].checkpoint == tmp_path / "a/run/checkpoints/final"
    (tmp_path / "a/run/checkpoints/final/config.json").unlink()  # pruned / not a model folder
    (chain,) = R.chains_from_stage_records(R.find_runs(tmp_path), tmp_path)
    assert chain.stages[0].checkpoint is None


def test_sources_read_row_ranges_and_list_tied_tensors_once(tmp_path):
    from safetensors.torch import save_file

    from esft.analysis.sources import CheckpointSource, StateDictSource

    w = torch.arange(8.0).reshape(4, 2)
    (tmp_path / "m").mkdir()
    save_file({"w": w, "s": torch.tensor(3.0)}, str(tmp_path / "m" / "model.safetensors"))
    src = CheckpointSource(tmp_path / "m")
    assert src.shapes() == {"w": (4, 2), "s": ()}
    assert torch.equal(src.read("w", 1, 3), w[1:3]) and torch.equal(src.read("w"), w)
    assert float(src.read("s", 0, 1)) == 3.0  # a 0-d tensor has no rows: all of it
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        CheckpointSource(tmp_path / "nothing-here")
    tied = StateDictSource({"embed": w, "head": w, "other": w.clone(), "empty": torch.zeros(0)})
    assert list(tied.shapes()) == ["embed", "other", "empty"]
    assert torch.equal(tied.read("embed", 2, 4), w[2:4])


def test_aligned_refs_refuse_a_tensor_whose_shape_differs_between_sources():
    from esft.analysis.sources import StateDictSource, aligned_refs

    key = "model.layers.0.mlp.up_proj.weight"
    a, b = StateDictSource({key: torch.zeros(4, 2)}), StateDictSource({key: torch.zeros(2, 4)})
    with pytest.raises(ValueError, match="different shapes across sources"):
        aligned_refs([a, b])


def test_the_reports_accuracy_table_shows_the_constant_answer_baseline_of_the_last_eval(tmp_path):
    """The report's Table 1 showed a run's held-out accuracy (25% on BoolQ, say) with its interval but without
    what always answering "no" scored on the same examples, which metrics.jsonl records beside it: every other
    accuracy esft shows (eval, the model card, the landscape tables) stands beside that baseline."""
    run = run_dir(tmp_path / "r", {"algorithm": "es", "task": "boolq"},
                  [{"kind": "eval", "step": 0, "test_accuracy": 0.25, "test_n": 4, "test_ci95": [0.05, 0.7]},
                   {"kind": "eval", "step": 3, "test_accuracy": 0.5, "test_n": 4, "test_ci95": [0.15, 0.85],
                    "test_constant_baseline": 0.75, "test_constant_baseline_ci95": [0.3, 0.95],
                    "test_constant_answer": "no"}])
    older = run_dir(tmp_path / "old", {"algorithm": "grpo", "task": "boolq"},
                    [{"kind": "eval", "step": 1, "test_accuracy": 0.5, "test_n": 4, "test_ci95": [0.15, 0.85]}])
    rows = T.accuracy_rows([R.load_run(run), R.load_run(older)], lambda x: x.name)
    assert rows[0][3:8] == ["25.0% [5.0%, 70.0%] (step 0)", "50.0% (step 3)", "[15.0%, 85.0%]", 4, "n/a"]
    assert rows[0][8] == "'no' 75.0% [30.0, 95.0]"
    assert rows[1][8] == "n/a"  # an evaluation that recorded none
    assert rows[0][9] == rows[1][9]  # the study's Table 1 row, last


def test_a_first_evaluation_on_other_examples_says_so_in_the_accuracy_table(tmp_path):
    """A run resumed with another eval_limit logged its first accuracy on 4 examples and its last on 8: the table
    set the two side by side as a before and after, on different examples."""
    base = {"test_constant_baseline": 0.75, "test_constant_baseline_ci95": [0.3, 0.95], "test_constant_answer": "no"}
    resumed = run_dir(tmp_path / "r", {"algorithm": "es", "task": "boolq"},
                      [{"kind": "eval", "step": 0, "test_accuracy": 0.25, "test_n": 4, "test_ci95": [0.05, 0.7],
                        **base},
                       {"kind": "eval", "step": 5, "test_accuracy": 0.5, "test_n": 8, "test_ci95": [0.2, 0.8], **base}])
    same = run_dir(tmp_path / "s", {"algorithm": "es", "task": "boolq"},
                   [{"kind": "eval", "step": 0, "test_accuracy": 0.25, "test_n": 4, "test_ci95": [0.05, 0.7], **base},
                    {"kind": "eval", "step": 5, "test_accuracy": 0.5, "test_n": 4, "test_ci95": [0.15, 0.85], **base}])
    rows = T.accuracy_rows([R.load_run(resumed), R.load_run(same)], lambda x: x.name)
    assert rows[0][3] == "25.0% [5.0%, 70.0%] (step 0; other examples, n=4)"
    assert rows[1][3] == "25.0% [5.0%, 70.0%] (step 0)"


def test_experiment_budget_tracks_of_a_seed_all_pair_with_its_first_grpo_chain(tmp_path):
    """Named tracks keep the study's rule, whatever the text order of their budgets (es@100 and es@300 both against
    grpo@200, not es@300 against grpo@50 because "grpo@200" sorts first); unnamed runs of a seed each take their own
    GRPO run."""
    def named(algorithm, name):
        c = chain(algorithm, 1, tmp_path)
        c.name = name
        return c

    es = [named("es", "es@100"), named("es", "es@300")]
    grpo = [named("grpo", "grpo@200"), named("grpo", "grpo@50")]
    assert [(p.es.name, p.grpo.name) for p in R.build_pairs(es + grpo)] == [("es@100", "grpo@200"),
                                                                            ("es@300", "grpo@200")]
    runs = [chain("es", 1, tmp_path), chain("es", 1, tmp_path), chain("grpo", 1, tmp_path), chain("grpo", 1, tmp_path)]
    assert [(id(p.es), id(p.grpo)) for p in R.build_pairs(runs)] == [(id(runs[0]), id(runs[2])),
                                                                     (id(runs[1]), id(runs[3]))]
