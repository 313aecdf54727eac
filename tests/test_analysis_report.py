"""`esft report` and `esft analyze` on tiny synthetic ES and GRPO run directories (tests/analysis_runs.py).

Run: `pytest -q tests/test_analysis_report.py` (about 20 s: every analysis runs on a tiny random Llama with one or
two test examples and 2-3 generated tokens, so the numbers are meaningless; the structure is what is tested).
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from analysis_runs import make_base, make_es_run, make_grpo_run
from esft.analysis.report_builder import ReportConfig, build_report
from esft.analysis.runs import build_chains, build_pairs, find_runs
from esft.cli import main


@pytest.fixture(scope="module")
def experiment(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("exp")
    base = make_base(root, tokenizer, hidden=16)
    make_es_run(root, base, steps=3)
    make_grpo_run(root, base, steps=3)
    return root


def test_discovery_pairs_es_with_grpo(experiment):
    runs = find_runs(experiment)
    assert sorted(r.algorithm for r in runs) == ["es", "grpo"]
    chains = build_chains(runs, experiment)
    pairs = build_pairs(chains)
    assert len(chains) == 2 and len(pairs) == 1
    assert pairs[0].es.base == (experiment / "base").resolve()


def test_report_has_every_table_and_says_what_is_unsupported(experiment, tmp_path):
    cfg = ReportConfig(dir=str(experiment), output_dir=str(tmp_path / "r"), limit=1, max_new_tokens=2,
                       holdout_tasks=["mmlu"], interpolation_points=3, magnitude_points=2,
                       sparsity_targets=[0.0, 0.5], batch_size=2, kl_batch_size=2)
    path = build_report(cfg, progress=False)
    text = path.read_text()
    for heading in ("Table 3", "Table 4", "Table 20", "Figure 2", "Figure 3", "Figure 4", "Figure 5",
                    "Figure 9", "Figure 10", "Figure 11", "Functional sparsity", "paper Table 1"):
        assert heading in text, heading
    # paper values sit next to ours
    # (the study's norms and ranks are cumulative over its sequence: not beside a single-task BoolQ run)
    assert "173.0 / 1.84 / 94x" not in text and "where the chain trained that sequence up to it" in text
    assert "2.7e-04 (Qwen)" not in text and "paper 0.239 [0.094, 0.322]" in text  # KL: one step's, per task
    # the drift law holds on the synthetic ES run and the table says so
    assert re.search(r"R\^2 of the theory line \(no fitted parameter\) \| (0\.99\d+|1\.0+) \|", text)
    # what the runs could not support is said plainly
    section = text.split("## What these runs could not support")[1]
    assert "single-stage runs only" in section
    assert "Failed" not in text
    for img in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (path.parent / img).stat().st_size > 3000, img
    results = json.loads((path.parent / "results.json").read_text())
    w = next(iter(results["results"]["weights"].values()))
    assert w["es"]["norm"] > 10 * w["grpo"]["norm"] and w["grpo"]["sparsity"] > 0.8
    # Figure 3: interpolation_points=3 is t = 0, 1/2, 1; Figure 5: 0 and 1/4, 1/2, 1 of each update's own norm
    data = path.parent / "data"
    interpolation = json.loads((data / "landscape_interpolation.json").read_text())["result"]
    assert interpolation["t"] == [0.0, 0.5, 1.0]
    # the one BoolQ example evaluated: its gold answer, given always, is right on 1 of 1
    assert interpolation["constant_baseline"]["boolq"]["constant_baseline"] == 1.0
    assert "Best constant answer of the same examples, boolq: '" in text and "| best constant answer |" in text
    holdout = json.loads((data / "landscape_holdout.json").read_text())["result"]
    assert sorted(holdout) == ["es", "grpo"]
    for lab, sweep in holdout.items():
        norm = sweep["directions"][lab.upper()]["norm"]
        assert norm > 0 and sweep["magnitudes"] == pytest.approx([0.0, norm / 4, norm / 2, norm], rel=1e-12)
    # a second report reuses every cached analysis
    before = {p.name: p.read_text() for p in (path.parent / "data").glob("*.json")}
    build_report(cfg, progress=False)
    after = {p.name: p.read_text() for p in (path.parent / "data").glob("*.json")}
    assert before == after
    assert all(b["se_of"] == "paired" for b in interpolation["barrier"].values())
    # caches written by an older esft, without the constant baseline, the paired barrier test or the KL standard
    # errors: computed again, not shown as n/a or with an older test
    kl = next(data.glob("kl_ES_*.json"))
    old = [(data / "landscape_holdout.json", "constant_baseline"), (data / "landscape_interpolation.json", "z_crit"),
           (kl, "k3_token_mean_se"), (next(data.glob("weights_*_stage1.json")), "sparsity_bf16")]
    for file, key in old:
        entry = json.loads(file.read_text())
        entry["result"] = without(entry["result"], key)
        assert key not in json.dumps(entry["result"])
        file.write_text(json.dumps(entry))
    again = build_report(cfg, progress=False).read_text()
    assert all(f'"{key}"' in file.read_text() for file, key in old)
    assert "| landscape | " in again and re.search(r"\| landscape \| [\d.]+ \| 1 of 3 \|", again), again
    assert re.search(r"\| kl \| [\d.]+ \| 1 of 2 \|", again), again


def without(value, key):
    """`value` with every `key` removed from the dicts in it (a result as an older esft cached it)."""
    if isinstance(value, dict):
        return {k: without(v, key) for k, v in value.items() if k != key}
    return [without(v, key) for v in value] if isinstance(value, list) else value


def test_a_zero_update_has_no_direction_to_sweep(tmp_path, tokenizer):
    """A GRPO run that changed no weight (every group's rewards equal): Figures 4 and 5 do not show the base model
    repeated as results "along" it; the report says why. The ES direction and its random twin are still swept."""
    from esft.analysis.landscape_report import ZERO_UPDATE

    base = make_base(tmp_path, tokenizer, hidden=16)
    make_es_run(tmp_path / "exp", base, steps=2)
    make_grpo_run(tmp_path / "exp", base, scale=0.0)
    cfg = ReportConfig(dir=str(tmp_path / "exp"), output_dir=str(tmp_path / "rep"), analyses=["landscape"], limit=1,
                       max_new_tokens=2, holdout_tasks=["mmlu"], interpolation_points=3, magnitude_points=2)
    text = build_report(cfg, progress=False).read_text()
    data = json.loads((tmp_path / "rep/data/landscape_directions.json").read_text())["result"]
    assert data["zero"] == ["GRPO"] and sorted(data["directions"]) == ["ES", "random (per-tensor norms of ES)"]
    assert f"**Figure 4 along GRPO**: {ZERO_UPDATE}" in text and f"**Figure 5 along GRPO**: {ZERO_UPDATE}" in text
    assert "holdout tasks, from the final ES checkpoint" in text
    assert "holdout tasks, from the final GRPO checkpoint" not in text
    # the ES update zero and GRPO's not: the random direction is norm-matched to GRPO's, not dropped with ES's
    es = make_es_run(tmp_path / "exp2", base, steps=2)
    final = es / "checkpoints" / "final"
    (final / "masters.safetensors").unlink(missing_ok=True)
    shutil.copyfile(base / "model.safetensors", final / "model.safetensors")  # an ES run that moved nothing
    make_grpo_run(tmp_path / "exp2", base)
    build_report(ReportConfig(**{**cfg.__dict__, "dir": str(tmp_path / "exp2"), "output_dir": str(tmp_path / "rep2"),
                                 "holdout_tasks": []}), progress=False)
    data = json.loads((tmp_path / "rep2/data/landscape_directions.json").read_text())["result"]
    assert data["zero"] == ["ES"] and sorted(data["directions"]) == ["GRPO", "random (per-tensor norms of GRPO)"]
    # results an older esft cached, with the zero update swept as a direction: computed again, not shown
    cached = tmp_path / "rep/data"

    def zero_swept(sweep):
        return {**sweep, "directions": {**sweep["directions"], "GRPO": {**sweep["directions"]["ES"], "norm": 0.0}}}

    for name, edit in (("landscape_directions", lambda r: zero_swept({k: v for k, v in r.items() if k != "zero"})),
                       ("landscape_holdout", lambda r: {**r, "grpo": zero_swept(r["es"])})):
        entry = json.loads((cached / f"{name}.json").read_text())
        entry["result"] = edit(entry["result"])
        (cached / f"{name}.json").write_text(json.dumps(entry))
    assert build_report(cfg, progress=False).read_text().count(ZERO_UPDATE) == 2
    assert json.loads((cached / "landscape_directions.json").read_text())["result"]["zero"] == ["GRPO"]
    assert sorted(json.loads((cached / "landscape_holdout.json").read_text())["result"]) == ["es"]


def test_an_older_sweep_is_kept_where_every_direction_moved():
    """An older esft's Figure 4-5 results differ from this one's only where an update was zero: the rest are kept
    (a sweep takes minutes of generation), not computed again."""
    from esft.analysis.landscape_report import no_zero_direction

    moved = {"directions": {"ES": {"norm": 2.0}, "random (per-tensor norms of ES)": {"norm": 2.0}}}
    assert no_zero_direction(moved)
    assert not no_zero_direction({"directions": {**moved["directions"], "GRPO": {"norm": 0.0}}})


def test_es_only_report_via_cli(tmp_path, tokenizer, capsys):
    base = make_base(tmp_path, tokenizer, hidden=16)
    make_es_run(tmp_path / "exp", base, steps=2)
    out = tmp_path / "rep"
    rc = main(["report", str(tmp_path / "exp"), "--output-dir", str(out), "--analyses", "weights,drift,landscape",
               "--limit", "1", "--max-new-tokens", "2", "--holdout-tasks", "", "--magnitude-points", "2"])
    assert rc == 0
    text = (out / "report.md").read_text()
    section = text.split("## What these runs could not support")[1]
    assert "ES/GRPO norm ratio and cosine" in section and "interpolation ES <-> GRPO (Figure 3)" in section
    assert "kl**: not requested" in section and "Figure 5**: no holdout tasks" in section
    assert "Table 3" in text and "Figure 4" in text


def test_a_failing_analysis_is_reported_and_the_command_exits_1(tmp_path, tokenizer, capsys, monkeypatch):
    from esft.analysis.report_builder import Report

    base = make_base(tmp_path, tokenizer, hidden=16)
    make_es_run(tmp_path / "exp", base, steps=2)

    def broken(self):
        raise TypeError("an option this task does not take")

    monkeypatch.setattr(Report, "section_weights", broken)
    out = tmp_path / "rep"
    assert main(["report", str(tmp_path / "exp"), "--output-dir", str(out), "--analyses", "weights,drift"]) == 1
    err = capsys.readouterr().err
    assert "1 analyses failed (weights)" in err
    text = (out / "report.md").read_text()
    assert "Failed: `TypeError: an option this task does not take`" in text and "## Drift" in text


def test_analyze_commands(experiment, tmp_path, capsys):
    es, grpo = experiment / "es" / "checkpoints" / "final", experiment / "grpo" / "checkpoints" / "final"
    base = experiment / "base"
    assert main(["analyze", "weights", "--base", str(base), "--tuned", f"{es},{grpo}",
                 "--output-dir", str(tmp_path / "w")]) == 0
    rep = json.loads((tmp_path / "w" / "weights.json").read_text())
    assert rep["labels"] == ["es", "grpo"] and (tmp_path / "w" / "weights.png").exists()
    assert main(["analyze", "drift", "--run", str(experiment / "es"), "--grpo-run", str(experiment / "grpo"),
                 "--output-dir", str(tmp_path / "d")]) == 0
    assert json.loads((tmp_path / "d" / "drift.json").read_text())["total"]["r2_theory"] > 0.99
    assert main(["analyze", "kl", "--base", str(base), "--stages", str(es), "--limit", "1", "--max-new-tokens", "2",
                 "--max-passage-chars", "80", "--output-dir", str(tmp_path / "k")]) == 0
    assert (tmp_path / "k" / "kl_heatmap.png").exists()
    assert main(["analyze", "sparsity", "--base", str(base), "--tuned", str(grpo), "--targets", "0,0.95",
                 "--limit", "1", "--max-new-tokens", "2", "--output-dir", str(tmp_path / "s")]) == 0
    assert len(json.loads((tmp_path / "s" / "sparsity.json").read_text())["rows"]) == 2
    printed = capsys.readouterr().out
    assert "cosine" in printed and "R^2" in printed and "k3/token" in printed
    assert main(["analyze", "weights", "--base", str(base)]) == 2  # no --tuned: a clean error, not a traceback


def test_analyze_landscape_prints_figure_5s_lines(experiment, tmp_path, capsys):
    """`esft analyze landscape --holdout-tasks ...` printed lines for Figures 3 and 4 only: Figure 5's scores
    (holdout tasks from each checkpoint along its own update) were in landscape.json and the figures alone."""
    es, grpo = experiment / "es" / "checkpoints" / "final", experiment / "grpo" / "checkpoints" / "final"
    assert main(["analyze", "landscape", "--base", str(experiment / "base"), "--es", str(es), "--grpo", str(grpo),
                 "--tasks", "boolq", "--holdout-tasks", "countdown", "--limit", "1", "--max-new-tokens", "2",
                 "--interpolation-points", "2", "--magnitude-points", "0", "--max-passage-chars", "80",
                 "--output-dir", str(tmp_path / "l")]) == 0
    res = json.loads((tmp_path / "l" / "landscape.json").read_text())
    printed = capsys.readouterr().out.splitlines()
    for lab in ("ES", "GRPO"):
        d = res["holdout"][lab]["directions"][lab]
        want = (f"holdout from the {lab} checkpoint along {lab} (norm {d['norm']:.4g}, at 0, 0.25, 0.5, 1 of it) "
                f"countdown: ")
        assert [line for line in printed if line.startswith(want)] != [], printed
    assert any(line.startswith("best constant answer countdown: ") for line in printed), printed


def fake_run(path, algorithm, model, task, checkpoints=("final",), seed=42):
    """A run directory with empty checkpoint folders (discovery reads names, configs and step files only)."""
    import yaml

    path.mkdir(parents=True)
    cfg = {"model": str(model), "task": task, "seed": seed}
    cfg.update({"population_size": 4, "sigma": 0.1, "alpha": 0.05} if algorithm == "es" else
               {"algorithm": "grpo", "learning_rate": 1e-6})
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    (path / "metrics.jsonl").write_text("")
    for name in checkpoints:
        ck = path / "checkpoints" / name
        ck.mkdir(parents=True)
        (ck / "config.json").write_text("{}")
        (ck / "model.safetensors").write_text("")
    return path


def test_chains_follow_budget_snapshots(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    a = fake_run(tmp_path / "seq/es/1-countdown/run", "es", base, "countdown", ("iter_000100", "final"))
    fake_run(tmp_path / "seq/es@100/2-math/run", "es", a / "checkpoints/iter_000100", "math")
    fake_run(tmp_path / "seq/es@300/2-math/run", "es", a / "checkpoints/final", "math")
    single = fake_run(tmp_path / "single/boolq/es/run", "es", base, "boolq", ("iter_000100", "final"))
    fake_run(tmp_path / "single/boolq/grpo/run", "grpo", base, "boolq")
    chains = build_chains(find_runs(tmp_path), tmp_path)
    seqs = sorted([(c.tasks, [s.checkpoint.name for s in c.stages]) for c in chains])
    assert seqs == [(["boolq"], ["final"]), (["boolq"], ["final"]),
                    (["countdown", "math"], ["final", "final"]), (["countdown", "math"], ["iter_000100", "final"])]
    pairs = build_pairs(chains)
    assert len(pairs) == 1 and pairs[0].es.stages[0].run.path == single.resolve()

    # an experiment's stage records name the budget snapshot of the single-task run, too
    for key, track, model in (("single/boolq/es@100", "es@100", "single/boolq/es/run/checkpoints/iter_000100"),
                              ("single/boolq/es@300", "es@300", "single/boolq/es/run/checkpoints/final"),
                              ("single/boolq/grpo", "grpo", "single/boolq/grpo/run/checkpoints/final")):
        (tmp_path / key).mkdir(parents=True, exist_ok=True)
        run_dir = model.split("/checkpoints")[0]
        (tmp_path / key / "result.json").write_text(json.dumps({
            "key": key, "kind": "train", "seed": 42, "track": track, "task": "boolq", "index": 1, "parent": None,
            "model": model, "steps": [{"algorithm": track[:4].strip("@"), "run_dir": run_dir, "model_dir": model}]}))
    chains = build_chains(find_runs(tmp_path), tmp_path)
    got = sorted((c.name, c.algorithm, c.stages[0].checkpoint.name) for c in chains)
    assert got == [("es@100", "es", "iter_000100"), ("es@300", "es", "final"), ("grpo", "grpo", "final")]
    assert len(build_pairs(chains)) == 2  # both ES budgets pair with the seed's GRPO run


def test_chains_end_at_the_last_stage_present(tmp_path):
    """Stage 2 left out (`esft report --exclude '/2-'`): each track's chain is its stage 1, and ES still pairs
    with GRPO."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    a = fake_run(tmp_path / "s/es/1-countdown/run", "es", base, "countdown", ("iter_000100", "final"))
    fake_run(tmp_path / "s/es@300/2-math/run", "es", a / "checkpoints/final", "math")
    g = fake_run(tmp_path / "s/grpo/1-countdown/run", "grpo", base, "countdown")
    fake_run(tmp_path / "s/grpo/2-math/run", "grpo", g / "checkpoints/final", "math")
    stages = [("s/es@300/1-countdown", "es@300", None, "s/es/1-countdown/run", "final", "countdown", 1),
              ("s/es@300/2-math", "es@300", "s/es@300/1-countdown", "s/es@300/2-math/run", "final", "math", 2),
              ("s/grpo/1-countdown", "grpo", None, "s/grpo/1-countdown/run", "final", "countdown", 1),
              ("s/grpo/2-math", "grpo", "s/grpo/1-countdown", "s/grpo/2-math/run", "final", "math", 2)]
    for key, track, parent, run_dir, ckpt, task, index in stages:
        (tmp_path / key).mkdir(parents=True, exist_ok=True)
        model = f"{run_dir}/checkpoints/{ckpt}"
        (tmp_path / key / "result.json").write_text(json.dumps({
            "key": key, "kind": "train", "seed": 42, "track": track, "task": task, "index": index, "parent": parent,
            "model": model, "steps": [{"algorithm": track[:4].strip("@"), "run_dir": run_dir, "model_dir": model}]}))
    whole = build_chains(find_runs(tmp_path), tmp_path)
    assert sorted((c.name, c.tasks) for c in whole) == [("es@300", ["countdown", "math"]),
                                                        ("grpo", ["countdown", "math"])]
    kept = [r for r in find_runs(tmp_path) if "/2-" not in str(r.path)]
    chains = build_chains(kept, tmp_path)
    assert sorted((c.name, c.tasks) for c in chains) == [("es@300", ["countdown"]), ("grpo", ["countdown"])]
    assert len(build_pairs(chains)) == 1


def test_prepare_tasks_takes_the_balanced_subset():
    from esft.analysis.landscape import prepare_tasks

    name = "countdown:numbers=2,max_number=50,ops=+*"
    task, first = prepare_tasks([name], 40)[name]
    _, balanced = prepare_tasks([name], 40, balanced=True)[name]
    assert first == task.load("test", 40)
    keys = [task.balance_key(ex) for ex in balanced]
    assert len(balanced) == 40 and keys.count("+") == keys.count("*") == 20


def test_report_evaluates_balanced_examples_on_the_fast_path_when_asked(experiment, tmp_path):
    cfg = ReportConfig(dir=str(experiment), output_dir=str(tmp_path / "r"), limit=2, max_new_tokens=2,
                       analyses=["landscape"], holdout_tasks=[], interpolation_points=3, magnitude_points=2,
                       batch_size=2, balanced=True, generation_options="fast")
    assert cfg.generation_options["packed_linear"] is True
    path = build_report(cfg, progress=False)
    assert "Failed" not in path.read_text()
    assert "Evaluations use a label-balanced subset of 2 test examples" in path.read_text()
    assert "Generation: engine options share_prefix=True, prefill_buckets=4, packed_linear=True" in path.read_text()
    again = build_report(cfg, progress=False).read_text()  # nothing changed: every result from the cache
    assert re.search(r"\| landscape \| 0\.\d \| (\d) of \1 \| \d+\.\d \|", again), again.split("## Cost")[1]
    cached = [json.loads(p.read_text())["params"] for p in (path.parent / "data").glob("*.json")]
    evaluating = [p for p in cached if "limit" in p]
    assert evaluating and all(p["balanced"] is True and p["generation_options"]["packed_linear"] is True
                              for p in evaluating)


def test_report_shows_paths_relative_to_its_root_or_home(tmp_path, monkeypatch):
    from esft.analysis.report_context import shown_path

    root = tmp_path / "runs"
    (root / "a" / "run").mkdir(parents=True)
    assert shown_path(root / "a" / "run" / "checkpoints" / "final", root) == "a/run/checkpoints/final"
    assert shown_path(root, root) == "."
    assert shown_path("smollm2-135m", root) == "smollm2-135m"  # a model name, not a path
    assert shown_path("runs/es-demo", root) == "runs/es-demo"  # relative as given
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert shown_path(tmp_path / "home" / ".cache" / "m", root) == "~/.cache/m"
    assert shown_path("/opt/models/x", root) == "/opt/models/x"  # elsewhere: as given


def test_task_options_give_the_passage_cut_to_boolq_only(tmp_path):
    """A cpu-preset run records max_passage_chars whatever its task; the report's evaluations pass it to BoolQ
    only, as training does (a Countdown or data task would reject the option)."""
    from esft.analysis.report_builder import ReportConfig
    from esft.analysis.report_context import ReportContext
    from esft.analysis.runs import Run

    ctx = ReportContext(ReportConfig(dir=str(tmp_path)), progress=False)
    ctx.runs = [Run(tmp_path / "a", "es", {"task": "countdown", "max_passage_chars": 400}),
                Run(tmp_path / "b", "es", {"task": "boolq", "max_passage_chars": 400}),
                Run(tmp_path / "c", "grpo", {"task": "sums.jsonl", "max_passage_chars": 400,
                                             "task_options": {"prompt_field": "q"}})]
    assert ctx.task_options() == {"boolq": {"max_passage_chars": 400}, "sums.jsonl": {"prompt_field": "q"}}


def test_an_experiment_folder_reports_the_runs_of_its_plan(tmp_path):
    """Stage folders of a label removed from the spec stay on disk; the report follows plan.json, names the runs
    it left out and why, and `all_runs` brings them back."""
    from esft.analysis.report_builder import Report

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    plan = []
    for track, algo in (("es", "es"), ("grpo", "grpo"), ("old-es", "es")):
        key, run_dir = f"single/boolq/{track}", f"single/boolq/{track}/run"
        fake_run(tmp_path / run_dir, algo, base, "boolq")
        stage = {"key": key, "kind": "train", "seed": 42, "track": track, "task": "boolq", "index": 1,
                 "parent": None, "model": f"{run_dir}/checkpoints/final",
                 "steps": [{"algorithm": algo, "run_dir": run_dir, "model_dir": f"{run_dir}/checkpoints/final"}]}
        (tmp_path / key / "result.json").write_text(json.dumps(stage))
        # es done; grpo stopped by Ctrl-C (its run reported as far as it went)
        (tmp_path / key / "status.json").write_text(json.dumps({"status": "stopped" if algo == "grpo" else "done"}))
        if track != "old-es":  # the label `old-es` was removed from the spec before the last `experiment run`
            plan.append(stage)
    # a stage the plan lists that has not started: no run, no status
    plan.append({**plan[0], "key": "single/boolq/new", "track": "new",
                 "steps": [{"algorithm": "es", "run_dir": "single/boolq/new/run", "model_dir": "x"}]})
    (tmp_path / "plan.json").write_text(json.dumps({"spec": {}, "stages": plan}))

    report = Report(ReportConfig(dir=str(tmp_path)), progress=False)
    report.discover()
    assert sorted(r.path.parent.name for r in report.runs) == ["es", "grpo"]
    assert sorted(c.name for c in report.chains) == ["es", "grpo"] and len(report.pairs) == 1
    report.section_runs()
    text = report.sections[0]
    assert "experiment folder: the runs of the 3 training stages its plan.json lists" in text
    assert "`single/boolq/old-es/run`: no stage of the experiment's plan" in text
    # a stage not done is named, not reported as if it had finished
    assert dict(report.unsupported) == {
        "stage single/boolq/grpo": "stopped, not done: its run is reported as far as it went (`esft experiment "
                                   "status DIR`; run the experiment again to finish it)",
        "stage single/boolq/new": "not started, not done: it has no run yet (`esft experiment status DIR`; run the "
                                  "experiment again to finish it)"}

    everything = Report(ReportConfig(dir=str(tmp_path), all_runs=True, exclude=["grpo"]), progress=False)
    everything.discover()
    assert sorted(c.name for c in everything.chains) == ["es", "old-es"]
    assert everything.left_out == [("single/boolq/grpo/run", "matches --exclude 'grpo'")]


def test_the_cache_survives_an_interrupted_computation_and_keys_the_dtype(tmp_path):
    from esft.analysis.report_cache import Cache
    from esft.analysis.report_context import ReportContext

    cache = Cache(tmp_path, recompute=False)
    assert cache.get("a", {"x": 1}, lambda: [1.0]) == ([1.0], False)
    assert cache.get("a", {"x": 1}, lambda: [2.0]) == ([1.0], True)

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Cache(tmp_path, recompute=True).get("a", {"x": 1}, interrupted)
    with pytest.raises(KeyboardInterrupt):
        cache.get("b", {"x": 1}, interrupted)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["a.json"]  # the old entry intact, no other
    assert cache.get("a", {"x": 1}, lambda: [3.0]) == ([1.0], True)
    (tmp_path / "data" / "a.json").write_text('{"params": {"x": 1}, "res')  # truncated by an older esft
    assert cache.get("a", {"x": 1}, lambda: [4.0]) == ([4.0], False)
    assert [(name, reused) for name, reused, _ in cache.entries] == [("a", False), ("a", True), ("a", True),
                                                                      ("a", False)]

    def params(dtype):
        return ReportContext(ReportConfig(dir=str(tmp_path), dtype=dtype, device="cpu"), progress=False).eval_params()

    assert params("auto") == params("fp32") == {}  # results cached before the key existed were float32
    assert params("bf16") == {"dtype": "bfloat16"}


def runs_missing_a_base_and_a_checkpoint(tmp_path):
    """A report context over an ES run whose base model is not on disk and a GRPO run without checkpoints."""
    from esft.analysis.report_context import ReportContext

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    fake_run(tmp_path / "es", "es", "/nowhere/model", "boolq")
    fake_run(tmp_path / "grpo", "grpo", base, "boolq", checkpoints=())
    ctx = ReportContext(ReportConfig(dir=str(tmp_path)), progress=False)
    ctx.discover()
    return ctx


def test_functional_sparsity_names_each_chain_it_cannot_sweep(tmp_path):
    """A GRPO run whose final checkpoint lost its weights: the sweep of the others goes on, and the report says
    which chain was left out and why (it was dropped silently)."""
    from esft.analysis.sparsity import report_sparsity

    ctx = runs_missing_a_base_and_a_checkpoint(tmp_path)
    assert report_sparsity(ctx) is None
    reasons = dict(ctx.unsupported)
    assert reasons["functional sparsity (ES boolq seed 42 (es))"] == "no base model folder on disk"
    assert reasons["functional sparsity (GRPO boolq seed 42 (grpo))"] == "its last stage has no checkpoint with weights"


def test_a_pair_with_one_side_missing_names_it_and_measures_the_other(tmp_path, tokenizer):
    """ES and GRPO paired, one side's checkpoint gone: the report says which side is missing and still shows
    the other side's update (norm, sparsity, stable rank against the base) and its Figure 4 sweep, instead of
    dropping the pair's stage silently (weights) or failing (landscape)."""
    import shutil

    root = tmp_path / "exp"
    base = make_base(root, tokenizer, hidden=16)
    make_es_run(root, base, steps=2)
    make_grpo_run(root, base, steps=2)
    shutil.move(root / "grpo" / "checkpoints", tmp_path / "grpo_checkpoints")
    cfg = ReportConfig(dir=str(root), output_dir=str(tmp_path / "r"), analyses=["weights", "landscape"], limit=1,
                       max_new_tokens=2, holdout_tasks=[], magnitude_points=2, batch_size=2)
    text = build_report(cfg, progress=False).read_text()
    assert "Failed" not in text
    table3 = text.split("**Table 3: update norm ||dtheta||_2**")[1].split("**Table 4")[0]
    row = next(line for line in table3.splitlines() if line.startswith("| 1: boolq"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[1]) > 0 and cells[2] == "missing" and cells[3] == "n/a"
    table4 = text.split("**Table 4: sparsity and stable rank**")[1].split("**Table 20")[0]
    cells = [c.strip() for c in next(line for line in table4.splitlines() if line.startswith("| 1: boolq"))
             .strip("|").split("|")]
    assert re.fullmatch(r"[\d.]+% \(bf16 [\d.]+%\)", cells[1]) and cells[2] == "missing" and float(cells[3]) > 1
    assert cells[4] == "missing"
    assert "Missing checkpoints: Stage 1 (boolq): the GRPO run `grpo` left no checkpoint with weights" in text
    unsupported = text.split("## What these runs could not support")[1]
    assert "weights (ES vs GRPO, boolq, seed 42, stage 1, GRPO side)**: the GRPO run `grpo`" in unsupported
    assert "the GRPO side (GRPO boolq seed 42 (grpo)) has no final checkpoint with weights; Figures 4-5 use " \
           "the ES update alone" in unsupported
    figure4 = text.split("### Figure 4")[1]
    assert "| ES |" in figure4 and "| GRPO |" not in figure4

    # the other way round: GRPO measured alone
    shutil.move(tmp_path / "grpo_checkpoints", root / "grpo" / "checkpoints")
    shutil.move(root / "es" / "checkpoints", tmp_path / "es_checkpoints")
    text = build_report(ReportConfig(dir=str(root), output_dir=str(tmp_path / "r2"), analyses=["weights"]),
                        progress=False).read_text()
    table3 = text.split("**Table 3: update norm ||dtheta||_2**")[1].split("**Table 4")[0]
    cells = [c.strip() for c in next(line for line in table3.splitlines() if line.startswith("| 1: boolq"))
             .strip("|").split("|")]
    assert cells[1] == "missing" and float(cells[2]) > 0
    assert "the ES run `es` left no checkpoint with weights for this stage; GRPO measured alone" in text


def test_kl_names_the_missing_side_of_each_chain_it_cannot_measure(tmp_path):
    from esft.analysis.kl_report import report_kl

    ctx = runs_missing_a_base_and_a_checkpoint(tmp_path)
    assert report_kl(ctx) is None
    reasons = dict(ctx.unsupported)
    assert reasons["KL (ES boolq seed 42 (es))"] == "base model '/nowhere/model' is not a folder on disk"
    assert reasons["KL (GRPO boolq seed 42 (grpo))"] == "no checkpoint with weights for stage 1 (boolq, run `grpo`)"


def test_a_replay_on_another_device_type_is_refused_and_one_of_its_type_matches(experiment, tmp_path, capsys,
                                                                                 monkeypatch):
    """`--device` loaded the base with `load_model(..., device)` directly: a CPU run replayed on CUDA would draw
    CUDA noise and rebuild other weights, silently (esft.es.noise: the generator's device sets the numbers)."""
    run = experiment / "es"
    monkeypatch.setattr("esft.analysis.checks.check_device", lambda key, value: None)  # as on a machine with CUDA
    assert main(["analyze", "drift", "--run", str(run), "--device", "cuda", "--output-dir", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err
    assert "drew its noise on cpu; a replay on cuda would draw other numbers" in err
    assert main(["analyze", "drift", "--run", str(run), "--device", "cpu", "--output-dir", str(tmp_path / "c")]) == 0
    assert main(["analyze", "drift", "--run", str(run), "--output-dir", str(tmp_path / "n")]) == 0
    assert (tmp_path / "c" / "series.jsonl").read_text() == (tmp_path / "n" / "series.jsonl").read_text()


def test_the_report_replays_an_es_run_on_its_own_device_type(experiment, tmp_path):
    """`esft report --device cuda` (for its evaluations) replayed a CPU run's seed log on CUDA."""
    cfg = ReportConfig(dir=str(experiment), output_dir=str(tmp_path / "r"), analyses=["drift"], device="cuda")
    text = build_report(cfg, progress=False).read_text()
    assert "Failed" not in text and "## Drift" in text
