"""The assembly of `esft report` (report_builder, report_context, report_cache, drift_runs) on synthetic run
folders, the heavy measurements replaced by stand-ins: which sections run and what the report says of those that
cannot, when a cached result is reused and when it is computed again, the evaluation parameters of the cache key,
and the drift section over ES and GRPO runs (the ES replay replaced, the figures written empty).

Run: `pytest -q tests/test_analysis_report_assembly.py` (a few seconds: no model is loaded).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from esft.analysis import drift as D
from esft.analysis.drift_runs import drift_notes, law_rows, report_drift
from esft.analysis.report_builder import Report, ReportConfig
from esft.analysis.report_cache import Cache, fingerprint, slug
from esft.analysis.report_context import ReportContext
from esft.analysis.runs import Run


def run_dir(path: Path, algorithm: str, base: Path, seed: int = 42, seeds: bool = True,
            drift: list[float] | None = None, every: int = 1, **config) -> Path:
    """A run folder: config.yaml, an empty metrics.jsonl, a seed log (ES) and a drift log of `drift` logged every
    `every` steps (GRPO)."""
    path.mkdir(parents=True)
    cfg = {"algorithm": algorithm, "model": str(base), "task": "boolq", "seed": seed}
    cfg.update({"population_size": 4, "alpha": 0.5} if algorithm == "es" else {})
    cfg.update(config)
    (path / "config.yaml").write_text(yaml.safe_dump({k: v for k, v in cfg.items() if v is not None}))
    (path / "metrics.jsonl").write_text("")
    if algorithm == "es" and seeds:
        (path / "seeds.jsonl").write_text('{"step": 1}\n')
    if drift is not None:
        (path / "drift.jsonl").write_text("".join(json.dumps({"step": every * (i + 1), "total": v}) + "\n"
                                                  for i, v in enumerate(drift)))
    return path


@pytest.fixture()
def base(tmp_path):
    import torch
    from safetensors.torch import save_file

    folder = tmp_path / "base"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    save_file({"model.layers.0.mlp.up_proj.weight": torch.zeros(3, 2)}, str(folder / "model.safetensors"))
    return folder


@pytest.fixture()
def replays(monkeypatch):
    """The ES replay replaced: squared drift 2, 4, 6 at steps 1-3 (its run's folder recorded per call); the
    drift figures written empty, each drawing recorded."""
    calls: list[Path] = []
    drawn: list[str] = []

    def fake_series(run_path, model=None, progress=False):
        calls.append(Path(run_path))
        return D.DriftSeries([1, 2, 3], [2.0, 4.0, 6.0], {}, {}, 4, None, f"replay of {run_path}")

    def fake_plot(*args, **kw):
        path = Path(next(a for a in args if isinstance(a, Path)))
        drawn.append(path.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        return path

    monkeypatch.setattr(D, "es_series", fake_series)
    for name in ("plot_total", "plot_families", "plot_tensor_curves", "plot_rho_r2"):
        monkeypatch.setattr(D, name, fake_plot)
    return calls, drawn


def context(root: Path, **config) -> ReportContext:
    ctx = ReportContext(ReportConfig(dir=str(root), output_dir=str(root / "report"), **config), progress=False)
    ctx.discover()
    return ctx


# ---- the cache -------------------------------------------------------------------------------------------------------

def test_a_cached_result_is_reused_only_while_its_params_are_unchanged(tmp_path):
    cache = Cache(tmp_path, recompute=False)
    assert cache.get("a", {"x": 1, "p": Path("/m")}, lambda: (1, 2)) == ([1, 2], False)  # as the JSON reads back
    assert cache.get("a", {"x": 1, "p": Path("/m")}, lambda: [9]) == ([1, 2], True)
    assert cache.get("a", {"x": 2, "p": Path("/m")}, lambda: [3]) == ([3], False)
    assert cache.get("a", {"x": 1, "p": Path("/m")}, lambda: [4]) == ([4], False)  # the entry holds x=2 now
    assert cache.get("b", {"x": 1, "p": Path("/m")}, lambda: [5]) == ([5], False)  # another name, its own entry
    assert Cache(tmp_path, recompute=True).get("b", {"x": 1, "p": Path("/m")}, lambda: [6]) == ([6], False)
    assert cache.get("b", {"x": 1, "p": Path("/m")}, lambda: [7]) == ([6], True)


def test_a_cached_result_without_a_field_of_this_esft_is_computed_again(tmp_path):
    cache = Cache(tmp_path, recompute=False)
    old = {"t": [0, 1], "tasks": [{"acc": 0.5}]}  # as an older esft wrote it: no baseline
    assert cache.get("a", {"x": 1}, lambda: old) == (old, False)
    assert cache.get("a", {"x": 1}, lambda: [9]) == (old, True)  # no field asked for: reused
    new = {"t": [0, 1], "tasks": [{"acc": 0.5, "baseline": 0.25}]}
    assert cache.get("a", {"x": 1}, lambda: new, holds=["baseline"]) == (new, False)
    assert cache.get("a", {"x": 1}, lambda: [9], holds=["baseline"]) == (new, True)  # found nested in a list
    assert cache.get("a", {"x": 1}, lambda: [7], holds=["baseline", "se"]) == ([7], False)


def test_report_file_names_keep_plain_labels_and_never_share_one_between_two_labels():
    assert slug("es") == "es" and slug("grpo_2") == "grpo_2"  # the names tests and users see stay as they are
    labels = ["countdown:ops=+", "countdown:ops=*", "countdown_ops__", "es@100", "es_100", "a" * 90, "a" * 91,
              "/runs/es", "_runs_es"]
    names = [slug(t) for t in labels]
    assert len(set(names)) == len(labels), names
    assert slug("countdown:ops=+*").startswith("countdown_ops_plustimes-")  # spelt as experiment folders spell it
    assert all(len(n) <= 80 and all(c.isalnum() or c in "-_" for c in n) for n in names)


def test_a_long_run_paths_file_name_keeps_its_seed_at_the_head_and_its_run_folder_at_the_tail():
    """The drift figures are named after the ES run's path: cut to its last 72 characters, the names of the
    seed-42 and seed-52 runs of a study started mid-word in the method folder (`5_2-countdown...`) and told the
    seeds apart only by their hashes."""
    runs = [f"seed-{s}/sequential/es@15/2-countdown.numbers=2.max_number=50.ops=plus-.ask_format=1.shots=2/run"
            for s in (42, 52)]
    names = [slug(r) for r in runs]
    assert [n.split("__")[0] for n in names] == ["seed-42_sequential_es_15_2-countdown",
                                                 "seed-52_sequential_es_15_2-countdown"]
    for name in names:
        head, tail = name.split("__")
        assert tail.rsplit("-", 1)[0].endswith("_ask_format_1_shots_2_run") and tail.startswith("ops_")
        assert len(name) <= 80


def test_the_fingerprint_follows_each_weight_file_time(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    for name in ("b.safetensors", "a.safetensors", "config.json"):
        (ck / name).write_text("x")
    os.utime(ck / "a.safetensors", (100.0, 100.0))
    os.utime(ck / "b.safetensors", (200.0, 200.0))
    log = tmp_path / "seeds.jsonl"
    log.write_text("{}")
    os.utime(log, (300.0, 300.0))
    first = fingerprint([ck, None, log, tmp_path / "gone.jsonl"])
    assert first == [[str(ck), [100.0, 200.0]], None, [str(log), [300.0]], [str(tmp_path / "gone.jsonl"), []]]
    os.utime(ck / "b.safetensors", (200.5, 200.5))
    assert fingerprint([ck])[0] != first[0]


# ---- the context's evaluation parameters -----------------------------------------------------------------------------

def test_eval_params_key_balance_and_engine_options_and_the_budget_comes_from_the_runs(tmp_path):
    ctx = ReportContext(ReportConfig(dir=str(tmp_path), device="cpu"), progress=False)
    assert ctx.eval_params() == {} and ctx.out == tmp_path / "report" and ctx.out.is_dir()  # the default folder
    ctx = ReportContext(ReportConfig(dir=str(tmp_path), device="cpu", balanced=True,
                                     generation_options={"share_prefix": True}), progress=False)
    assert ctx.eval_params() == {"balanced": True, "generation_options": {"share_prefix": True}}
    # the generation budget: the largest of the runs' own (max_completion_length for GRPO), else 256
    from esft.analysis.runs import Chain, StageRef

    es = Run(tmp_path / "es", "es", {"task": "boolq", "max_new_tokens": 64})
    grpo = Run(tmp_path / "grpo", "grpo", {"task": "boolq", "max_completion_length": 128})
    bare = Run(tmp_path / "bare", "es", {"task": "boolq"})
    chains = [Chain(r.algorithm, [StageRef([r], None, "boolq")], None, "m", r.path.name) for r in (es, grpo, bare)]
    ctx.chains = chains
    assert ctx.gen_config().max_new_tokens == 128
    assert ctx.gen_config(chains[0]).max_new_tokens == 64
    assert ctx.gen_config(chains[2]).max_new_tokens == 256
    assert ctx.gen_config().batch_size == 16 and ctx.gen_config().temperature == 0.0
    fixed = ReportContext(ReportConfig(dir=str(tmp_path), max_new_tokens=8, batch_size=3), progress=False)
    fixed.chains = chains
    assert fixed.gen_config().max_new_tokens == 8 and fixed.gen_config().batch_size == 3


# ---- which sections run ----------------------------------------------------------------------------------------------

def test_the_report_runs_the_requested_sections_and_says_why_the_others_did_not(tmp_path, base, monkeypatch):
    run_dir(tmp_path / "es", "es", base)
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "tables.md").write_text("")
    ran = []

    def section(name, fail=False):
        def run(self):
            ran.append(name)
            self.cache.get(f"{name}_a", {}, lambda: 1)
            self.cache.get(f"{name}_b", {"n": self.config.limit}, lambda: 2)
            if fail:
                raise RuntimeError("boom")
            self.sections.append(f"## section {name}\n")
        return run

    monkeypatch.setattr(Report, "section_weights", section("weights"))
    monkeypatch.setattr(Report, "section_kl", section("kl", fail=True))
    cfg = ReportConfig(dir=str(tmp_path), output_dir=str(tmp_path / "r"), analyses=["kl", "weights"])
    report = Report(cfg, progress=False)
    text = report.build().read_text()
    assert ran == ["weights", "kl"]  # in the report's order, whatever the order asked
    unsupported = text.split("## What these runs could not support")[1]
    for a in ("drift", "landscape", "sparsity"):
        assert f"- **{a}**: not requested (--analyses)" in unsupported
    assert "- **kl**: failed with RuntimeError: boom" in unsupported and report.failed == ["kl"]
    assert "## section weights" in text and "## kl\n\nFailed: `RuntimeError: boom`" in text
    cost = text.split("## Cost")[1]
    assert "| weights | " in cost and " 0 of 2 |" in cost and " 0 of 4 |" in cost.split("| total |")[1]
    assert [n for n, _, _ in report.cost["kl"]] == ["kl_a", "kl_b"]
    assert "Evaluations use the first 50 test examples per task" in text
    assert "Written by the experiment runner from its stage evaluations: [../tables/tables.md]" in text
    # the runner's tables hold Table 1: only the runs' own evaluations during training are missing
    assert "accuracy (Table 1)**" not in unsupported
    assert ("- **held-out accuracy during training**: no evaluation records (kind=eval with test_accuracy) in the "
            "runs' metrics.jsonl; the stages' accuracy (Table 1) is in ../tables/tables.md") in unsupported
    # the second report takes one of weights' results from the cache and computes the other again
    again = Report(ReportConfig(dir=str(tmp_path), output_dir=str(tmp_path / "r"), analyses=["weights"], limit=7),
                   progress=False)
    text = again.build().read_text()
    cost = text.split("## Cost")[1]
    assert [(n, reused) for n, reused, _ in again.cost["weights"]] == [("weights_a", True), ("weights_b", False)]
    # nothing evaluated: the header gave "the first 7 test examples" and a generation path as if something had
    assert "No evaluations (--analyses has none of kl, landscape, sparsity)." in text
    assert "Evaluations use" not in text and "Generation:" not in text
    assert "| weights | " in cost and " 1 of 2 |" in cost
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    assert results["config"]["limit"] == 7 and ["kl", "not requested (--analyses)"] in results["unsupported"]
    # requested, but with nothing to evaluate in these runs (no result asked of the cache): no evaluations either
    monkeypatch.setattr(Report, "section_sparsity", lambda self: ran.append("sparsity"))
    idle = Report(ReportConfig(dir=str(tmp_path), output_dir=str(tmp_path / "r2"), analyses=["sparsity"]),
                  progress=False)
    text = idle.build().read_text()
    assert ran[-1] == "sparsity" and "No evaluations (sparsity: nothing to evaluate in these runs)." in text
    assert "Evaluations use" not in text

    def boom(self):
        raise RuntimeError("before any result")

    monkeypatch.setattr(Report, "section_sparsity", boom)
    broken = Report(ReportConfig(dir=str(tmp_path), output_dir=str(tmp_path / "r3"), analyses=["sparsity"]),
                    progress=False)
    text = broken.build().read_text()  # not "nothing to evaluate": its section says it failed
    assert "No evaluations (sparsity: sparsity failed before evaluating)." in text and broken.failed == ["sparsity"]

    with pytest.raises(ValueError, match="interpolation_points = 1 is not accepted; expected an integer >= 2"):
        ReportConfig(interpolation_points=1)
    assert ReportConfig(interpolation_points=2).interpolation_points == 2
    with pytest.raises(ValueError, match=r"analyses = \['drfit'\] is not accepted"):
        Report(ReportConfig(dir=str(tmp_path), output_dir=str(tmp_path / "r"), analyses=["drfit"]),
               progress=False).build()
    with pytest.raises(ValueError, match="no run directory"):
        Report(ReportConfig(dir=str(base)), progress=False).build()


def test_a_report_whose_every_run_is_left_out_says_so(tmp_path, base):
    """`--exclude '.*'` (or patterns that match every run) said "no run directory under DIR", which sends the
    user looking for runs that are there: the error names the runs left out and why."""
    run_dir(tmp_path / "es", "es", base)
    run_dir(tmp_path / "grpo", "grpo", base)
    with pytest.raises(ValueError, match=r"every run under .* was left out \(2\): es: matches --exclude 'e'; "
                                         r"grpo: matches --exclude 'g'$"):
        Report(ReportConfig(dir=str(tmp_path), output_dir=str(tmp_path / "r"), exclude=["e", "g"]),
               progress=False).build()
    assert not (tmp_path / "r").exists()


def test_a_report_of_runs_that_logged_nothing_yet_says_so(tmp_path):
    """A run in its first iteration (config.yaml, samples/ and a held lock) got only "no run directory under
    DIR", as if the folder were mistyped: the error names the run and whether a process is still writing it."""
    from esft.rundir import RunLock

    for name in ("live", "stopped"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "config.yaml").write_text("algorithm: es\n")
    RunLock(tmp_path / "runs" / "stopped").acquire().release()  # a stopped run's trainer left its .lock
    # a training config the user keeps beside the runs (no .lock: no trainer ran there) is not a run that stopped
    (tmp_path / "runs" / "my-configs").mkdir()
    (tmp_path / "runs" / "my-configs" / "config.yaml").write_text("algorithm: es\npopulation_size: 4\n")
    lock = RunLock(tmp_path / "runs" / "live").acquire()
    try:
        with pytest.raises(ValueError) as err:
            Report(ReportConfig(dir=str(tmp_path / "runs"), output_dir=str(tmp_path / "r")), progress=False).build()
    finally:
        lock.release()
    assert "my-configs" not in str(err.value) and str(err.value).endswith(
        f"; {tmp_path / 'runs' / 'live'} has logged nothing yet (a run in its first iteration: an esft process holds "
        f"its lock); {tmp_path / 'runs' / 'stopped'} has logged nothing yet (a run stopped before its first "
        "iteration ended)")


def test_an_interrupted_report_says_what_it_kept_and_how_to_go_on(tmp_path, base, monkeypatch, capsys):
    """Ctrl-C or SIGTERM during an analysis printed only "interrupted": the report's results finished so far are
    kept and the same command continues from them, which the user is told."""
    from esft.cli import main

    run_dir(tmp_path / "es", "es", base)

    def weights(self):
        self.cache.get("weights_a", {}, lambda: 1)
        raise KeyboardInterrupt

    monkeypatch.setattr(Report, "section_weights", weights)
    assert main(["report", str(tmp_path), "--output-dir", str(tmp_path / "r"), "--analyses", "weights"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"esft report: interrupted in weights; the finished analysis results (1) are kept in "
        f"{tmp_path / 'r' / 'data'}, and the same command continues from them (report.md is written when it finishes)")
    # interrupted before any result: no data folder to name (it was named, though it did not exist)
    monkeypatch.setattr(Report, "section_weights", lambda self: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(["report", str(tmp_path), "--output-dir", str(tmp_path / "r2"), "--analyses", "weights"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "esft report: interrupted in weights; no analysis result had finished, and the same command starts again "
        "(report.md is written when it finishes)")
    assert not (tmp_path / "r2" / "data").exists()


# ---- the drift section -----------------------------------------------------------------------------------------------

def test_drift_replays_each_es_run_once_and_again_when_its_seed_log_or_model_changes(tmp_path, base, replays):
    calls, drawn = replays
    es = run_dir(tmp_path / "es", "es", base)
    runs, grpo_only = report_drift(context(tmp_path))
    assert calls == [es] and grpo_only == [] and [d.name for d in runs] == ["es"]
    assert runs[0].result["total"]["final_sq"] == 6.0 and runs[0].grpo is None
    assert [c for c, _ in runs[0].figures] == ["total drift (Figure 9 / 6A)"] and drawn == ["drift_total_es.png"]
    report_drift(context(tmp_path))
    assert calls == [es] and drawn == ["drift_total_es.png"]  # the series and its figure reused
    (tmp_path / "report" / "figures" / "drift_total_es.png").unlink()
    report_drift(context(tmp_path))
    assert calls == [es] and drawn == ["drift_total_es.png"] * 2  # a figure deleted is drawn again
    report_drift(context(tmp_path, recompute=True))
    assert calls == [es, es] and len(drawn) == 3
    stamp = (es / "seeds.jsonl").stat().st_mtime + 5
    os.utime(es / "seeds.jsonl", (stamp, stamp))  # the run went on
    report_drift(context(tmp_path))
    assert calls == [es, es, es]
    report_drift(context(tmp_path))
    assert len(calls) == 3
    cfg = yaml.safe_load((es / "config.yaml").read_text())
    (es / "config.yaml").write_text(yaml.safe_dump({**cfg, "model": str(tmp_path / "other")}))
    report_drift(context(tmp_path))
    assert len(calls) == 4


def test_drift_compares_es_with_its_grpo_partner_and_says_what_it_cannot_read(tmp_path, base, replays):
    run_dir(tmp_path / "es1", "es", base, seed=1)
    run_dir(tmp_path / "es2", "es", base, seed=2)
    run_dir(tmp_path / "grpo2", "grpo", base, seed=2, drift=[0.5, 1.0])
    run_dir(tmp_path / "grpo1", "grpo", base, seed=1, drift=[0.25, 0.5, 1.5], every=2)
    run_dir(tmp_path / "grpo3", "grpo", base, seed=3)  # no drift.jsonl
    run_dir(tmp_path / "noseeds", "es", base, seed=4, seeds=False)
    run_dir(tmp_path / "noalpha", "es", base, seed=5, alpha=None)
    ctx = context(tmp_path)
    runs, grpo_only = report_drift(ctx)
    assert grpo_only == [] and sorted(d.name for d in runs) == ["es1", "es2"]
    by = {d.name: d for d in runs}
    assert by["es1"].grpo.total == [0.25, 0.5, 1.5] and by["es2"].grpo.total == [0.5, 1.0]
    assert by["es1"].result["grpo"]["final_sq"] == 1.5 and by["es1"].result["grpo"]["steps"] == 6
    assert by["es1"].result["grpo"]["ratio_at_matched_step"]["ratio"] == pytest.approx(4.0)  # step 2: sqrt(4 / .25)
    assert by["es1"].result["alpha"] == 0.5 and by["es1"].result["population"] == 4
    ratio = by["es2"].result["grpo"]["ratio_at_matched_step"]
    assert ratio["step"] == 2 and ratio["ratio"] == pytest.approx(2.0)  # sqrt(4 / 1)
    assert by["es1"].grpo.numel == {"layers.0.up_proj": 6}  # tensor sizes read from the base model
    reasons = dict(ctx.unsupported)
    assert reasons["GRPO drift (grpo3)"] == "the run has no drift.jsonl"
    assert reasons["ES drift (noseeds)"] == "no seeds.jsonl to replay"
    assert reasons["ES drift (noalpha)"] == "config.yaml lacks alpha or population_size"
    assert "ES drift (Figures 6, 9-11)" not in reasons
    assert sorted(ctx.results["drift"]) == ["es1", "es2"] and "tensors" in ctx.results["drift"]["es1"]
    rows = dict((q, v) for q, v in law_rows(by["es2"].result, True))
    assert rows["GRPO final ||dtheta||^2"] == 1.0 and rows["ES/GRPO displacement at matched step 2"] == 2.0
    assert rows["GRPO run compared"] == "grpo2 (its pair)" and by["es1"].result["grpo"]["run"] == "grpo1"
    assert "GRPO final ||dtheta||^2" not in dict(law_rows(by["es2"].result, False))
    calls, _ = replays
    assert len(calls) == 2
    report_drift(context(tmp_path))  # each run's replay has its own cache entry
    assert len(calls) == 2


def test_an_es_run_is_not_compared_with_the_grpo_stage_that_went_on_from_its_weights(tmp_path, base, replays):
    """An es->grpo chain (GRPO started from the ES run's final checkpoint) has no pair: its GRPO stage, the only
    GRPO run of the folder, was shown as the ES run's comparison, though its drift is measured from the ES
    weights."""
    es = run_dir(tmp_path / "es", "es", base, seed=1)
    shutil.copytree(base, es / "checkpoints" / "final")
    run_dir(tmp_path / "grpo", "grpo", es / "checkpoints" / "final", seed=1, drift=[1.0, 2.0])
    ctx = context(tmp_path)
    assert ctx.pairs == [] and [[r.path.name for r in c.runs] for c in ctx.chains] == [["es", "grpo"]]
    runs, _ = report_drift(ctx)
    assert runs[0].grpo is None and "grpo" not in runs[0].result


def test_the_unpaired_grpo_run_compared_is_said_to_be_of_another_task_sequence_when_its_base_is_the_same(
        tmp_path, base, replays):
    """Both bases on disk and the same: the note named "another base model or task sequence" whatever kept the
    runs apart (also a base not on disk, for which it now says so)."""
    run_dir(tmp_path / "es", "es", base, seed=1)
    run_dir(tmp_path / "grpo", "grpo", base, seed=1, drift=[1.0, 2.0], task="math")
    runs, _ = report_drift(context(tmp_path))
    assert runs[0].result["grpo"]["unpaired"] == "another task sequence"


def test_an_unpaired_es_run_is_compared_with_the_only_grpo_run(tmp_path, base, replays):
    run_dir(tmp_path / "es", "es", base, seed=1)
    run_dir(tmp_path / "grpo", "grpo", tmp_path / "elsewhere", seed=1, drift=[1.0, 2.0])  # another base: no pair
    ctx = context(tmp_path)
    assert ctx.pairs == []
    runs, _ = report_drift(ctx)
    assert runs[0].grpo is not None and runs[0].grpo.total == [1.0, 2.0]
    assert runs[0].grpo.numel == {}  # its base is not on disk
    text = Report(ReportConfig(dir=str(tmp_path), output_dir=str(tmp_path / "r"), analyses=["drift"]),
                  progress=False).build().read_text()
    assert "### ES es\n" in text and "| GRPO final \\|\\|dtheta\\|\\|^2 | 2 |" in text
    # the ratio is not a like-for-like one: the report names the GRPO run and says it is not the ES run's pair
    assert runs[0].result["grpo"]["run"] == "grpo" and runs[0].result["grpo"]["paired"] is False
    # why: its base is not on disk (runs pair by their base model's folder), not "another base or task sequence"
    assert "| GRPO run compared | grpo (not a pair: the only GRPO run here, of a base model not found on disk here) |" in text
    # with two GRPO runs, which one an unpaired ES run compares with is unknown: none
    run_dir(tmp_path / "grpo-b", "grpo", tmp_path / "elsewhere", seed=2, drift=[1.0])
    runs, _ = report_drift(context(tmp_path))
    assert runs[0].grpo is None and "grpo" not in runs[0].result
    # an ES run paired with a GRPO run that logged no drift is not compared with another pair's GRPO run
    for name in ("grpo", "grpo-b"):
        (tmp_path / name / "drift.jsonl").unlink()
    run_dir(tmp_path / "grpo-c", "grpo", base, seed=1)
    run_dir(tmp_path / "other", "grpo", tmp_path / "elsewhere", seed=3, drift=[1.0])
    ctx = context(tmp_path)
    assert len(ctx.pairs) == 1
    runs, _ = report_drift(ctx)
    assert runs[0].grpo is None


def test_grpo_runs_alone_are_shown_and_es_drift_says_why_not(tmp_path, base, replays):
    run_dir(tmp_path / "g1", "grpo", base, seed=1, drift=[1.0, 3.0])
    run_dir(tmp_path / "g2", "grpo", base, seed=2)
    ctx = context(tmp_path)
    runs, grpo_only = report_drift(ctx)
    assert runs == [] and [(n, s.total) for n, s in grpo_only] == [("g1", [1.0, 3.0])]
    reasons = dict(ctx.unsupported)
    assert reasons["ES drift (Figures 6, 9-11)"] == "no ES run" and "GRPO drift (g2)" in reasons
    report = Report(ReportConfig(dir=str(tmp_path), output_dir=str(tmp_path / "r"), analyses=["drift"]),
                    progress=False)
    text = report.build().read_text()
    assert "### GRPO g1\n\n2 steps, final ||dtheta||^2 = 3" in text


def test_drift_notes_name_the_settings_the_law_does_not_cover(tmp_path):
    plain = Run(tmp_path, "es", {"optimizer": "sgd", "fitness_shaping": "zscore"},
                metrics=[{"kind": "train", "zero_update": False}])
    assert drift_notes(plain) == [] and drift_notes(Run(tmp_path, "es", {})) == []
    odd = Run(tmp_path, "es", {"optimizer": "adam", "antithetic": True, "fitness_shaping": "rank"},
              metrics=[{"kind": "train", "zero_update": True}, {"kind": "eval", "zero_update": True},
                       {"kind": "train", "zero_update": True}])
    notes = drift_notes(odd)
    assert len(notes) == 4 and notes[0].startswith("the run used Adam") and notes[1].startswith("antithetic")
    assert notes[2].startswith("fitness shaping rank") and notes[3] == "2 steps had zero fitness spread and made " \
                                                                        "no update"
    one = Run(tmp_path, "es", {}, metrics=[{"kind": "train", "zero_update": True}])
    assert drift_notes(one) == ["1 step had zero fitness spread and made no update"]


def test_a_task_option_the_run_recorded_wins_over_its_passage_cut_as_in_training(tmp_path):
    """Training builds a task from {**passage_cut, **task_options} (esft.config.RunConfig): the report's
    evaluation must build the same task."""
    ctx = ReportContext(ReportConfig(dir=str(tmp_path)), progress=False)
    ctx.runs = [Run(tmp_path / "a", "es", {"task": "boolq", "max_passage_chars": 400,
                                           "task_options": {"max_passage_chars": 100}})]
    assert ctx.task_options() == {"boolq": {"max_passage_chars": 100}}


def test_a_task_trained_with_different_options_is_not_evaluated_for_any_run(tmp_path):
    """Runs of one task name with different options (a BoolQ passage cut of 400 and none) would all be evaluated
    with the options of whichever run came first: the analyses that evaluate skip their chains and say which runs
    disagree, while a task the runs agree on is still evaluated."""
    from esft.analysis.runs import Chain, StageRef

    ctx = ReportContext(ReportConfig(dir=str(tmp_path)), progress=False)
    es = Run(tmp_path / "es", "es", {"task": "boolq", "max_passage_chars": 400})
    grpo = Run(tmp_path / "grpo", "grpo", {"task": "boolq"})
    other = Run(tmp_path / "cd", "es", {"task": "countdown", "max_passage_chars": 400})
    ctx.runs = [es, grpo, other]
    chains = [Chain(r.algorithm, [StageRef([r], None, r.task)], None, "m", r.path.name) for r in ctx.runs]
    assert ctx.option_conflicts().keys() == {"boolq"}
    assert [c.name for c in ctx.evaluable(chains, "KL")] == ["cd"]
    assert [a.split()[:2] for a, _ in ctx.unsupported] == [["KL", "(es"], ["KL", "(grpo"]]
    reason = ctx.unsupported[0][1]
    assert "es: {'max_passage_chars': 400}" in reason and "grpo: none" in reason and "--exclude" in reason
    ctx.runs, ctx.unsupported = [es, other], []  # the same options in every run: evaluated with them
    assert not ctx.option_conflicts()
    assert [c.name for c in ctx.evaluable(chains[::2], "KL")] == ["es", "cd"] and not ctx.unsupported


def test_a_folder_without_runs_is_refused_without_leaving_an_empty_report_folder(tmp_path):
    """`esft report DIR` on a mistyped folder (one holding no run) said so, and left DIR/report behind, empty; an
    output folder the user made beforehand stays."""
    (tmp_path / "notes").mkdir()
    with pytest.raises(ValueError, match="no run directory"):
        Report(ReportConfig(dir=str(tmp_path / "notes")), progress=False).build()
    assert not (tmp_path / "notes" / "report").exists()
    (tmp_path / "mine").mkdir()
    with pytest.raises(ValueError, match="no run directory"):
        Report(ReportConfig(dir=str(tmp_path / "notes"), output_dir=str(tmp_path / "mine")), progress=False).build()
    assert (tmp_path / "mine").is_dir()
