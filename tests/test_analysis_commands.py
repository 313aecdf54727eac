"""`esft analyze` commands (esft.analysis.commands): each argument reaches the library function it names. The
analyses themselves are replaced by recorders; paths are folders under tmp_path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml


def run_dir(path: Path, config: dict) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    return path


def test_weights_command_passes_labels_eps_and_paths(tmp_path, monkeypatch):
    from esft.analysis import commands as C
    from esft.analysis import weights as W

    seen = {}

    def compare(base, tuned, **kw):
        seen.update(base=base, tuned=tuned, **kw)
        return {"labels": list(tuned), "total": {}, "pairs": []}

    monkeypatch.setattr(W, "compare_updates", compare)
    monkeypatch.setattr(W, "plot_weights", lambda rep, path: seen.setdefault("plot", path))
    monkeypatch.setattr(C, "model_folder", lambda spec: f"resolved:{spec}")
    monkeypatch.setattr("esft.analysis.checks.check_device", lambda key, value: None)  # "cuda" on any machine
    x, y, z = (str(tmp_path / n) for n in "xyz")
    for p in (x, y, z):
        Path(p).mkdir()
    cfg = C.WeightsConfig(base="b", tuned=[x, y, z], labels=["one"], eps=1e-3, stable_ranks=False,
                          stable_rank_device="cuda", output_dir=str(tmp_path / "o"))
    C.run_weights(cfg)
    assert seen["base"] == "resolved:b" and seen["tuned"] == {"one": x, "tuned1": y, "tuned2": z}
    assert (seen["eps"], seen["stable_ranks"], seen["stable_rank_device"]) == (1e-3, False, "cuda")
    assert seen["plot"] == tmp_path / "o" / "weights.png"
    assert json.loads((tmp_path / "o" / "weights.json").read_text())["config"]["eps"] == 1e-3
    with pytest.raises(ValueError, match="distinct"):
        C.run_weights(C.WeightsConfig(base="b", tuned=[x, y], labels=["a", "a"], output_dir=str(tmp_path)))


def test_weights_command_names_each_checkpoint_by_its_runs_algorithm(tmp_path, monkeypatch):
    """Without --labels, the checkpoints of two ES seeds and a GRPO run were named es, grpo and tuned2: the second
    ES run was reported, and drawn, as GRPO. A checkpoint outside a run folder keeps the es, grpo, tuned2 names."""
    from esft.analysis import commands as C
    from esft.analysis import weights as W

    seen = {}
    monkeypatch.setattr(W, "compare_updates", lambda base, tuned, **kw: seen.update(tuned) or
                        {"labels": list(tuned), "total": {}, "pairs": []})
    monkeypatch.setattr(W, "plot_weights", lambda rep, path: path)
    monkeypatch.setattr(C, "model_folder", lambda spec: spec)
    runs = [run_dir(tmp_path / n, {"algorithm": a}) for n, a in (("g", "grpo"), ("e1", "es"), ("e2", "es"))]
    cks = [str(r / "checkpoints" / "final") for r in runs]
    for ck in cks:
        Path(ck).mkdir(parents=True)
    C.run_weights(C.WeightsConfig(base="b", tuned=cks, output_dir=str(tmp_path / "o")))
    assert seen == {"grpo": cks[0], "es": cks[1], "es_2": cks[2]}
    seen.clear()
    loose = tmp_path / "loose"
    loose.mkdir()
    C.run_weights(C.WeightsConfig(base="b", tuned=[cks[0], str(loose), cks[1]], output_dir=str(tmp_path / "o2")))
    assert seen == {"es": cks[0], "grpo": str(loose), "tuned2": cks[1]}


def test_drift_command_takes_alpha_and_population_from_the_run_unless_given(tmp_path, monkeypatch):
    from esft.analysis import commands as C
    from esft.analysis import drift as D

    grpo = run_dir(tmp_path / "grpo", {"algorithm": "grpo"})
    (grpo / "drift.jsonl").write_text("{}\n")
    es = run_dir(tmp_path / "es", {"alpha": 0.5, "population_size": 8})
    (es / "drift.jsonl").write_text("{}\n")
    calls = []
    monkeypatch.setattr(D, "read_series", lambda p: f"series:{Path(p).parent.name}")
    monkeypatch.setattr(D, "analyze_series", lambda s, a, n: calls.append((s, a, n)) or {"tensors": {}})
    monkeypatch.setattr(D, "displacement_ratio", lambda s, g: (s, g))
    monkeypatch.setattr(D, "plot_total", lambda *a, **k: None)
    res = C.run_drift(C.DriftConfig(run=str(es), grpo_run=str(grpo), output_dir=str(tmp_path / "o")))
    assert calls == [("series:es", 0.5, 8)] and res["grpo_ratio_at_matched_step"] == ("series:es", "series:grpo")
    C.run_drift(C.DriftConfig(run=str(es), alpha=0.25, population=2, output_dir=str(tmp_path / "o2")))
    assert calls[-1] == ("series:es", 0.25, 2)
    bare = run_dir(tmp_path / "bare", {"alpha": 0.5, "population_size": 8})
    with pytest.raises(FileNotFoundError, match="bare"):
        C.run_drift(C.DriftConfig(run=str(bare), output_dir=str(tmp_path / "o3")))
    (bare / "drift.jsonl").write_text("{}\n")
    (bare / "config.yaml").write_text("{}")
    with pytest.raises(ValueError, match="alpha and population"):
        C.run_drift(C.DriftConfig(run=str(bare), output_dir=str(tmp_path / "o3")))


def test_drift_command_draws_a_grpo_run_measured_against_the_es_law_as_grpo(tmp_path, monkeypatch):
    """`esft analyze drift --run RUNS/grpo --alpha A --population N` (what its refusal without them advises) drew
    the GRPO run's drift as "ES", in ES's colour."""
    from esft.analysis import commands as C
    from esft.analysis import drift as D

    grpo = run_dir(tmp_path / "grpo", {"algorithm": "grpo", "num_generations": 4})
    (grpo / "drift.jsonl").write_text("{}\n")
    es = run_dir(tmp_path / "es", {"alpha": 0.5, "population_size": 8})
    (es / "drift.jsonl").write_text("{}\n")
    drawn = []
    monkeypatch.setattr(D, "read_series", lambda p: D.DriftSeries([1], [0.0], source=f"series:{Path(p).parent.name}"))
    monkeypatch.setattr(D, "analyze_series", lambda s, a, n: {"tensors": {}})
    monkeypatch.setattr(D, "plot_total", lambda series, *a, **k: drawn.append((series.source, k["method"])))
    C.run_drift(C.DriftConfig(run=str(grpo), alpha=0.5, population=4, output_dir=str(tmp_path / "o")))
    C.run_drift(C.DriftConfig(run=str(es), output_dir=str(tmp_path / "o2")))
    # the run's drift.jsonl given as the file --run takes is the same GRPO run's
    C.run_drift(C.DriftConfig(run=str(grpo / "drift.jsonl"), alpha=0.5, population=4, output_dir=str(tmp_path / "o3")))
    C.run_drift(C.DriftConfig(run=str(es / "drift.jsonl"), alpha=0.5, population=8, output_dir=str(tmp_path / "o4")))
    assert drawn == [("series:grpo", "grpo"), ("series:es", "es"), ("series:grpo", "grpo"), ("series:es", "es")]


def test_drift_command_refuses_a_grpo_run_folder_without_drift_jsonl(tmp_path, monkeypatch):
    """`--grpo-run` naming a folder without drift.jsonl (an ES run, a misspelt run) was read as an empty series:
    the command printed its ES results, with no GRPO comparison and no word about it."""
    from esft.analysis import commands as C
    from esft.analysis import drift as D

    es = run_dir(tmp_path / "es", {"alpha": 0.5, "population_size": 8})
    (es / "drift.jsonl").write_text("{}\n")
    other_es = run_dir(tmp_path / "other-es", {"alpha": 0.5, "population_size": 8})
    (other_es / "seeds.jsonl").write_text("{}\n")
    monkeypatch.setattr(D, "read_series", lambda p: f"series:{Path(p).parent.name}")
    monkeypatch.setattr(D, "analyze_series", lambda s, a, n: {"tensors": {}})
    monkeypatch.setattr(D, "displacement_ratio", lambda s, g: None)
    monkeypatch.setattr(D, "plot_total", lambda *a, **k: None)
    with pytest.raises(FileNotFoundError, match="other-es has no drift.jsonl"):
        C.run_drift(C.DriftConfig(run=str(es), grpo_run=str(other_es), output_dir=str(tmp_path / "o")))
    assert not (tmp_path / "o").exists()


def test_kl_command_names_stages_by_run_and_passes_its_options(tmp_path, monkeypatch):
    from esft.analysis import commands as C
    from esft.analysis import kl as K

    seen = {}

    def kl_stages(base, stages, tasks, limit, gen, kl_batch, opts, loader, progress):
        seen.update(base=base, stages=stages, tasks=tasks, limit=limit, gen=gen, kl_batch=kl_batch, opts=opts)
        return {"tasks": tasks, "stages": [s for s, _ in stages]}

    monkeypatch.setattr(K, "kl_stages", kl_stages)
    monkeypatch.setattr(K, "matrix", lambda *a, **k: None)
    monkeypatch.setattr(K, "plot_heatmap", lambda *a, **k: None)
    monkeypatch.setattr(C, "model_folder", lambda spec: spec)
    es, grpo = tmp_path / "runs" / "es" / "checkpoints" / "final", tmp_path / "runs" / "grpo"
    es.mkdir(parents=True)
    grpo.mkdir()
    cfg = C.KLConfig(base="b", stages=[str(es), str(grpo)], tasks=["boolq"], limit=3,
                     max_new_tokens=7, temperature=1.0, batch_size=5, kl_batch_size=2, max_passage_chars=80,
                     output_dir=str(tmp_path / "o"))
    C.run_kl(cfg)
    assert seen["stages"] == [("es", str(es)), ("grpo", str(grpo))]
    assert (seen["base"], seen["tasks"], seen["limit"], seen["kl_batch"]) == ("b", ["boolq"], 3, 2)
    assert (seen["gen"].max_new_tokens, seen["gen"].temperature, seen["gen"].batch_size) == (7, 1.0, 5)
    assert seen["opts"] == {"boolq": {"max_passage_chars": 80}}
    cfg.stage_labels, cfg.output_dir = ["s1", "s2"], str(tmp_path / "o2")
    C.run_kl(cfg)
    assert [s for s, _ in seen["stages"]] == ["s1", "s2"]


def test_landscape_command_sweeps_each_update_and_its_holdout_fractions(tmp_path, monkeypatch):
    from esft.analysis import commands as C
    from esft.analysis import landscape as L

    es, grpo = tmp_path / "es", tmp_path / "grpo"
    es.mkdir()
    grpo.mkdir()
    seen: dict = {"sweeps": []}

    class Dir:
        def __init__(self, *args):
            self.args, self.norm = args, 2.0 if args[-1] == "ES" else 8.0

        def bind(self, model):
            return self

    monkeypatch.setattr(C, "model_folder", lambda spec: f"resolved:{spec}")
    monkeypatch.setattr(C, "load_with_weights", lambda base, w, dtype, device: (("model", base, w, dtype, device), "tok"))
    monkeypatch.setattr(L, "prepare_tasks",
                        lambda names, limit, task_options: {n: (limit, task_options) for n in names})
    monkeypatch.setattr(L, "DeltaDirection", Dir)
    monkeypatch.setattr(L, "RandomDirection", Dir)
    monkeypatch.setattr(L, "interpolation_path",
                        lambda model, tok, a, b, ts, tasks, gc, progress: seen.update(path=(a, b, ts)) or {})
    monkeypatch.setattr(L, "default_magnitudes", lambda norms, points: seen.update(mags=(norms, points)) or [0.0])
    monkeypatch.setattr(L, "direction_sweep", lambda model, tok, origin, dirs, mags, tasks, gc, progress:
                        seen["sweeps"].append((origin, [d.args for d in dirs], mags, sorted(tasks), gc)) or {})
    monkeypatch.setattr(L, "plot_interpolation", lambda *a: None)
    monkeypatch.setattr(L, "plot_direction_sweep", lambda *a, **k: None)
    cfg = C.LandscapeConfig(base="b", es=str(es), grpo=str(grpo), tasks=["boolq"], holdout_tasks=["mmlu"], limit=3,
                            max_new_tokens=5, batch_size=2, interpolation_points=5, magnitude_points=3,
                            random_seed=7, dtype="float32", device="cpu", output_dir=str(tmp_path / "o"))
    C.run_landscape(cfg)
    assert seen["path"] == (str(es), str(grpo), [0.0, 0.25, 0.5, 0.75, 1.0])
    assert seen["mags"] == ([2.0, 8.0], 3)
    origin, dirs, _, tasks, gc = seen["sweeps"][0]
    assert origin == "resolved:b" and tasks == ["boolq"] and (gc.max_new_tokens, gc.batch_size) == (5, 2)
    assert dirs[:2] == [("resolved:b", str(es), "ES"), ("resolved:b", str(grpo), "GRPO")]
    assert dirs[2][1:] == (7, "random (per-tensor norms of ES)")
    assert seen["sweeps"][1][:4] == (str(es), [dirs[0]], [0.0, 0.5, 1.0, 2.0], ["mmlu"])
    assert seen["sweeps"][2][:4] == (str(grpo), [dirs[1]], [0.0, 2.0, 4.0, 8.0], ["mmlu"])
    assert json.loads((tmp_path / "o" / "landscape.json").read_text())["config"]["random_seed"] == 7


def test_sparsity_command_passes_base_tuned_and_thresholds_in_order(tmp_path, monkeypatch):
    from esft.analysis import commands as C
    from esft.analysis import landscape as L
    from esft.analysis import sparsity as SP

    tuned = tmp_path / "t"
    tuned.mkdir()
    seen = {}
    monkeypatch.setattr(C, "model_folder", lambda spec: f"resolved:{spec}")
    monkeypatch.setattr(C, "load_with_weights", lambda base, w, dtype, device: ("model", "tok"))
    monkeypatch.setattr(L, "prepare_tasks", lambda names, limit, task_options: {})
    monkeypatch.setattr(SP, "sparsity_sweep", lambda model, tok, base, t, tasks, gc, taus, targets, progress:
                        seen.update(base=base, tuned=t, taus=taus, targets=targets, gen=gc) or {})
    monkeypatch.setattr(SP, "plot_sparsity_sweep", lambda *a: None)
    C.run_sparsity(C.SparsityConfig(base="b", tuned=str(tuned), taus=[0.5], targets=[0.9], max_new_tokens=6,
                                    batch_size=3, output_dir=str(tmp_path / "o")))
    gen = seen.pop("gen")  # the sweep evaluates greedily
    assert (gen.max_new_tokens, gen.batch_size, gen.temperature, gen.top_p, gen.seed) == (6, 3, 0.0, 1.0, 0)
    assert seen == {"base": "resolved:b", "tuned": str(tuned), "taus": [0.5], "targets": [0.9]}
    C.run_sparsity(C.SparsityConfig(base="b", tuned=str(tuned), targets=[0.9], output_dir=str(tmp_path / "o2")))
    assert seen["taus"] is None


def test_sparsity_figure_names_the_update_by_its_runs_algorithm(tmp_path, monkeypatch):
    """A GRPO checkpoint's sweep was drawn as "es", in ES's colour, unless --label said otherwise: the default
    label is the checkpoint's run's algorithm, es outside a run folder, and --label still wins."""
    from esft.analysis import commands as C
    from esft.analysis import landscape as L
    from esft.analysis import sparsity as SP

    grpo = tmp_path / "grpo" / "checkpoints" / "final"
    grpo.mkdir(parents=True)
    (tmp_path / "grpo" / "config.yaml").write_text("algorithm: grpo\n")
    loose = tmp_path / "loose"
    loose.mkdir()
    drawn = []
    monkeypatch.setattr(C, "model_folder", lambda spec: f"resolved:{spec}")
    monkeypatch.setattr(C, "load_with_weights", lambda base, w, dtype, device: ("model", "tok"))
    monkeypatch.setattr(C, "check_base", lambda *a: None)
    monkeypatch.setattr(L, "prepare_tasks", lambda names, limit, task_options: {})
    monkeypatch.setattr(SP, "sparsity_sweep", lambda *a, **k: {})
    monkeypatch.setattr(SP, "plot_sparsity_sweep", lambda results, path: drawn.append(list(results)))
    for i, (tuned, label) in enumerate([(grpo, None), (loose, None), (grpo, "mine")]):
        C.run_sparsity(C.SparsityConfig(base="b", tuned=str(tuned), label=label, output_dir=str(tmp_path / f"o{i}")))
    assert drawn == [["grpo"], ["es"], ["mine"]]
    # the name only labels the figure: the same sweep under another name (a sparsity.json of an older esft,
    # which recorded label "es" for every checkpoint) is the same analysis, redrawn, not refused
    (tmp_path / "o0" / "sparsity.json").write_text(json.dumps({"config": {**json.loads(
        (tmp_path / "o0" / "sparsity.json").read_text())["config"], "label": "es"}}))
    C.run_sparsity(C.SparsityConfig(base="b", tuned=str(grpo), output_dir=str(tmp_path / "o0")))
    assert drawn[-1] == ["grpo"]


def kl_table(seed: int) -> dict:
    """One seed's kl.json as `esft analyze kl --stages` writes it (no cells: the aggregation is replaced)."""
    return {"seed": seed, "stages": ["es"], "tasks": ["boolq"], "incremental": {}, "cumulative": {}}


def test_kl_aggregate_reads_cached_results_and_plain_tables(tmp_path, monkeypatch):
    from esft.analysis import commands as C
    from esft.analysis import kl as K

    (tmp_path / "a.json").write_text(json.dumps({"result": kl_table(1)}))
    (tmp_path / "b.json").write_text(json.dumps(kl_table(2)))
    seen = {}
    monkeypatch.setattr(K, "aggregate_seeds", lambda tables: seen.setdefault("tables", tables) and
                        {"tasks": [], "stages": []})
    monkeypatch.setattr(K, "matrix", lambda *a, **k: None)
    monkeypatch.setattr(K, "plot_heatmap", lambda *a, **k: None)
    C.run_kl(C.KLConfig(aggregate=[str(tmp_path / "a.json"), str(tmp_path / "b.json")],
                        output_dir=str(tmp_path / "o")))
    assert seen["tables"] == [kl_table(1), kl_table(2)]


def test_a_model_spec_that_is_not_on_disk_is_named(monkeypatch, tmp_path):
    from esft import models
    from esft.analysis import commands as C

    monkeypatch.setattr(models, "resolve_model_path", lambda spec: str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="'org/model'"):
        C.model_folder("org/model")


def test_load_puts_a_checkpoint_s_weights_on_the_base_unless_it_is_the_base(monkeypatch, tmp_path):
    from esft import models
    from esft.analysis import commands as C
    from esft.analysis import landscape as L

    loaded, set_to = [], []
    monkeypatch.setattr(models, "load_model", lambda base, dtype, device: loaded.append((base, dtype, device)) or
                        ("model", "tok"))
    monkeypatch.setattr(L, "set_weights", lambda model, weights: set_to.append(weights))
    assert C.load_with_weights(str(tmp_path), str(tmp_path / "ck"), "bfloat16", "cpu") == ("model", "tok")
    C.load_with_weights(str(tmp_path), str(tmp_path), "bfloat16", "cpu")
    C.load_with_weights(str(tmp_path), None, "bfloat16", "cpu")
    assert loaded == [(str(tmp_path), "bfloat16", "cpu")] * 3 and set_to == [str(tmp_path / "ck")]


def test_set_threads(monkeypatch):
    from esft.analysis import command_io as C

    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    C.set_threads(None)
    C.set_threads(3)
    assert calls == [3]


def test_kl_command_loads_each_stage_with_its_dtype_and_device(tmp_path, monkeypatch):
    from esft.analysis import commands as C
    from esft.analysis import kl as K

    stage = tmp_path / "s"
    stage.mkdir()
    loads = []
    monkeypatch.setattr(C, "model_folder", lambda spec: "B")
    monkeypatch.setattr("esft.analysis.checks.check_device", lambda key, value: None)  # "cuda" on any machine
    monkeypatch.setattr(C, "load_with_weights", lambda *a: loads.append(a))
    monkeypatch.setattr(K, "kl_stages", lambda base, stages, *a, loader, progress: loader(stages[0][1]) or
                        {"tasks": [], "stages": []})
    monkeypatch.setattr(K, "matrix", lambda *a, **k: None)
    monkeypatch.setattr(K, "plot_heatmap", lambda *a, **k: None)
    C.run_kl(C.KLConfig(base="b", stages=[str(stage)], dtype="bfloat16", device="cuda", output_dir=str(tmp_path)))
    assert loads == [("B", str(stage), "bfloat16", "cuda")]


def test_an_analysis_of_other_inputs_does_not_silently_replace_the_one_in_its_output_dir(tmp_path, monkeypatch):
    """`esft analyze weights` (default output analysis/weights) on other checkpoints replaced the weights.json and
    figure of the earlier analysis there without a word; `esft eval` refuses the same for its summary.json. The
    same analysis again, or one that differs only in where or how fast it runs, may overwrite its own."""
    from esft.analysis import commands as C
    from esft.analysis import weights as W

    calls = []
    monkeypatch.setattr(W, "compare_updates", lambda base, tuned, **kw: calls.append(dict(tuned)) or
                        {"labels": list(tuned), "total": {}, "pairs": []})
    monkeypatch.setattr(W, "plot_weights", lambda rep, path: path)
    monkeypatch.setattr(C, "model_folder", lambda spec: spec)
    x, y = tmp_path / "x", tmp_path / "y"
    x.mkdir()
    y.mkdir()
    out = str(tmp_path / "o")
    C.run_weights(C.WeightsConfig(base="b", tuned=[str(x)], labels=["es"], output_dir=out))
    C.run_weights(C.WeightsConfig(base="b", tuned=[str(x)], labels=["es"], threads=1, output_dir=out))  # its own
    assert len(calls) == 2
    with pytest.raises(FileExistsError, match="another analysis.*tuned"):
        C.run_weights(C.WeightsConfig(base="b", tuned=[str(y)], labels=["es"], output_dir=out))
    assert len(calls) == 2  # refused before any work
    assert json.loads((tmp_path / "o" / "weights.json").read_text())["config"]["tuned"] == [str(x)]
    monkeypatch.setattr(C, "load_with_weights", lambda *a: (_ for _ in ()).throw(AssertionError("loaded a model")))
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "sparsity.json").write_text(json.dumps({"config": {"tuned": str(x)}}))
    with pytest.raises(FileExistsError, match="sparsity.json"):
        C.run_sparsity(C.SparsityConfig(base="b", tuned=str(y), output_dir=str(tmp_path / "s")))


def test_drift_on_a_grpo_run_as_run_says_to_give_it_as_grpo_run(tmp_path, monkeypatch):
    """`esft analyze drift --run GRPO_RUN` said "alpha and population are needed": true, but it hid that --run
    takes the ES run and the GRPO run goes to --grpo-run."""
    from esft.analysis import commands as C
    from esft.analysis import drift as D

    grpo = run_dir(tmp_path / "grpo", {"num_generations": 2, "learning_rate": 1e-5})
    (grpo / "drift.jsonl").write_text("{}\n")
    monkeypatch.setattr(D, "read_series", lambda p: D.DriftSeries([1], [0.0]))
    with pytest.raises(ValueError, match="is a GRPO run: give it as --grpo-run"):
        C.run_drift(C.DriftConfig(run=str(grpo), output_dir=str(tmp_path / "o")))
    bare = run_dir(tmp_path / "bare", {})  # not known to be either: the plain reason
    (bare / "drift.jsonl").write_text("{}\n")
    (bare / "drift.jsonl").rename(tmp_path / "series.jsonl")
    with pytest.raises(ValueError, match="^alpha and population are needed"):
        C.run_drift(C.DriftConfig(run=str(tmp_path / "series.jsonl"), output_dir=str(tmp_path / "o2")))


def test_a_kl_aggregate_does_not_replace_the_heatmap_of_a_stages_kl_in_its_folder(tmp_path, monkeypatch):
    """`esft analyze kl --aggregate a/kl.json,b/kl.json` with the default --output-dir (analysis/kl, where seed
    a's own KL was written) replaced seed a's kl_heatmap.png with the aggregate's, beside seed a's kl.json."""
    from esft.analysis import commands as C
    from esft.analysis import kl as K

    (tmp_path / "a.json").write_text(json.dumps(kl_table(1)))
    (tmp_path / "b.json").write_text(json.dumps(kl_table(2)))
    drawn = []
    monkeypatch.setattr(K, "aggregate_seeds", lambda tables: {"tasks": [], "stages": []})
    monkeypatch.setattr(K, "matrix", lambda *a, **k: None)
    monkeypatch.setattr(K, "plot_heatmap", lambda panels, path, **k: drawn.append(path))
    out = tmp_path / "kl"
    out.mkdir()
    (out / "kl.json").write_text(json.dumps({"config": {"stages": ["runs/es/checkpoints/final"], "aggregate": []}}))
    agg = C.KLConfig(aggregate=[str(tmp_path / "a.json"), str(tmp_path / "b.json")], output_dir=str(out))
    with pytest.raises(FileExistsError, match="kl.json holds the results of another analysis"):
        C.run_kl(agg)
    assert drawn == []
    C.run_kl(C.KLConfig(aggregate=agg.aggregate, output_dir=str(tmp_path / "agg")))
    C.run_kl(C.KLConfig(aggregate=agg.aggregate, output_dir=str(tmp_path / "agg")))  # the same one again
    with pytest.raises(FileExistsError, match="kl_aggregate.json"):
        C.run_kl(C.KLConfig(aggregate=agg.aggregate[:1], output_dir=str(tmp_path / "agg")))


def test_landscape_command_sweeps_no_zero_update_and_matches_the_random_direction_to_one_that_moved(tmp_path,
                                                                                                     monkeypatch):
    """An ES run that changed no weight: its "direction", and a random one matched to its zero norms, evaluated the
    base model at every distance under the name of a move (docs/analysis.md: a zero update is not swept)."""
    from esft.analysis import commands as C
    from esft.analysis import landscape as L
    from esft.analysis.command_text import format_landscape

    es, grpo = tmp_path / "es", tmp_path / "grpo"
    es.mkdir()
    grpo.mkdir()
    sweeps, randoms = [], []

    class Delta:
        def __init__(self, base, path, label):
            self.label, self.norm = label, 0.0 if label == "ES" else 8.0

        def bind(self, model):
            return self

    class Random(Delta):
        def __init__(self, like, seed, label):
            randoms.append(like.label)
            self.label, self.norm = label, like.norm

    def sweep(model, tok, origin, dirs, mags, tasks, gc, progress):
        sweeps.append((origin, [d.label for d in dirs]))
        return {"magnitudes": mags, "directions": {d.label: {"norm": d.norm, "accuracy": {}} for d in dirs}}

    monkeypatch.setattr(C, "model_folder", lambda spec: "base")
    monkeypatch.setattr(C, "load_with_weights", lambda base, w, dtype, device: ("model", "tok"))
    monkeypatch.setattr(L, "prepare_tasks", lambda names, limit, task_options: {})
    monkeypatch.setattr(L, "DeltaDirection", Delta)
    monkeypatch.setattr(L, "RandomDirection", Random)
    monkeypatch.setattr(L, "interpolation_path", lambda *a, **k: {})
    monkeypatch.setattr(L, "direction_sweep", sweep)
    monkeypatch.setattr(L, "plot_interpolation", lambda *a: None)
    monkeypatch.setattr(L, "plot_direction_sweep", lambda *a, **k: None)
    res = C.run_landscape(C.LandscapeConfig(base="b", es=str(es), grpo=str(grpo), tasks=["boolq"],
                                            holdout_tasks=["mmlu"], output_dir=str(tmp_path / "o")))
    assert randoms == ["GRPO"]
    assert sweeps == [("base", ["GRPO", "random (per-tensor norms of GRPO)"]), (str(grpo), ["GRPO"])]
    assert res["directions"]["zero"] == ["ES"] and list(res["holdout"]) == ["GRPO"]
    res.pop("interpolation")
    assert "ES: not swept, its update is zero" in format_landscape(res)
