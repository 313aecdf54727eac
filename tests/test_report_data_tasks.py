"""`esft report` over runs that trained on a user's data file: config.yaml records the file by its absolute path
(so a resume finds it from any folder), and the report shows it by its file name; two ES-GRPO pairs of the same
task, seed and run-folder names keep apart (their headings, cached results and figures).

Run: `pytest -q tests/test_report_data_tasks.py` (about 40 s: tiny random Llama, synthetic runs, one example).
"""

from __future__ import annotations

import json
import re

import matplotlib.figure
import pytest

from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from analysis_runs import make_base, make_es_run, make_grpo_run
from esft.analysis.report_builder import ReportConfig, build_report
from esft.analysis.report_context import ReportContext, task_names
from esft.tasks.display import shown_task


@pytest.mark.parametrize("spec,shown", [
    ("/home/me/data/sums.jsonl", "sums.jsonl"),
    ("/home/me/data/sums.csv.gz:prompt_field=q,test_file=/home/me/data/test.jsonl", "sums.csv.gz:prompt_field=q,"
                                                                                     "test_file=test.jsonl"),
    ("data/sums.TSV:reward=my_rewards:correct_sum", "sums.TSV:reward=my_rewards:correct_sum"),
    ("/runs/lr=0.1/sums.jsonl", "sums.jsonl"), ("/data/a,b/s.csv", "s.csv"),
    ("/x/s.jsonl:system_prompt=see a/b.csv", "s.jsonl:system_prompt=see a/b.csv"),
    ("boolq", "boolq"), ("countdown:ops=+", "countdown:ops=+"), ("pkg.mod:MyTask", "pkg.mod:MyTask"),
    ("owner/dataset:main", "owner/dataset:main"), ("/a/b.jsonl.bak", "/a/b.jsonl.bak"),
])
def test_a_task_string_shows_each_data_file_by_its_name(spec, shown):
    assert shown_task(spec) == shown


def record_prompt_field(config_yaml) -> None:
    """The option the rows need, as the CLI's --prompt-field records it in the run's config.yaml."""
    import yaml

    data = yaml.safe_load(config_yaml.read_text())
    data["task_options"] = {"prompt_field": "q"}
    config_yaml.write_text(yaml.safe_dump(data))


@pytest.fixture(scope="module")
def two_pairs(tmp_path_factory, tokenizer):
    """Two ES-GRPO pairs (folders a/ and b/, each with runs `es` and `grpo`, seed 42) on a data file outside the
    runs' folder, recorded as its absolute path with the prompt field the rows need."""
    root = tmp_path_factory.mktemp("pairs")
    data = tmp_path_factory.mktemp("userdata") / "sums.jsonl"
    data.write_text("".join(json.dumps({"q": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(10)))
    base = make_base(root, tokenizer, hidden=16)
    for side, alpha, scale in (("a", 0.01, 1e-3), ("b", 0.04, 5e-3)):
        make_es_run(root / side, base, steps=2, alpha=alpha, task=str(data))
        make_grpo_run(root / side, base, steps=2, task=str(data), scale=scale)
    for cfg in root.glob("*/*/config.yaml"):
        record_prompt_field(cfg)
    return root, data


def test_pairs_of_alike_runs_in_other_folders_keep_apart(two_pairs):
    root, data = two_pairs
    ctx = ReportContext(ReportConfig(dir=str(root), output_dir=str(root / "report")), progress=False)
    ctx.discover()
    pairs = sorted((ctx.shown(p.es.runs[0].path), ctx.shown(p.grpo.runs[0].path)) for p in ctx.pairs)
    assert pairs == [("a/es", "a/grpo"), ("b/es", "b/grpo")]
    assert sorted(p.label for p in ctx.pairs) == ["ES vs GRPO, sums.jsonl, seed 42 (a/es vs a/grpo)",
                                                  "ES vs GRPO, sums.jsonl, seed 42 (b/es vs b/grpo)"]
    assert sorted(c.label for c in ctx.chains) == ["ES sums.jsonl seed 42 (a/es)", "ES sums.jsonl seed 42 (b/es)",
                                                   "GRPO sums.jsonl seed 42 (a/grpo)",
                                                   "GRPO sums.jsonl seed 42 (b/grpo)"]
    assert ctx.chains[0].tasks == [str(data)]  # the key of the runs' options stays the recorded path
    assert ctx.build_task(ctx.chains[0].tasks[0]).prompt_field == "q"


def test_the_report_names_a_data_task_by_its_file_and_gives_each_pair_its_own_figure(two_pairs, tmp_path,
                                                                                      monkeypatch):
    root, data = two_pairs
    texts: dict[str, list[str]] = {}
    save = matplotlib.figure.Figure.savefig

    def recording(fig, path, *args, **kwargs):
        texts[str(path)] = [t.get_text() for t in fig.findobj(matplotlib.text.Text) if t.get_text()]
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", recording)
    cfg = ReportConfig(dir=str(root), output_dir=str(tmp_path / "r"), limit=1, max_new_tokens=2, holdout_tasks=[],
                       interpolation_points=3, magnitude_points=1, sparsity_targets=[0.5], batch_size=2,
                       kl_batch_size=2)
    text = build_report(cfg, progress=False).read_text()
    folder = str(data.parent)
    assert folder not in text and "sums.jsonl" in text
    assert texts and not [(p, t) for p, ts in texts.items() for t in ts if folder in t]
    assert any("sums.jsonl" in t for ts in texts.values() for t in ts)
    assert "Failed" not in text
    # each pair's section shows its own weights figure, and the two figures differ as the updates do
    sections = re.findall(r"ES vs GRPO, sums\.jsonl, seed 42 \(([ab])/es vs \1/grpo\)", text)
    assert sorted(set(sections)) == ["a", "b"]
    figures = sorted(set(re.findall(r"figures/(weights_[^)]+\.png)", text)))
    assert len(figures) == 2 and all(f in str(list(texts)) for f in figures)
    weights = json.loads((tmp_path / "r" / "results.json").read_text())["results"]["weights"]
    norms = {k.split("(")[1][0]: v["es"]["norm"] for k, v in weights.items()}
    assert norms["b"] > 2 * norms["a"] > 0  # b's ES run took 4x the step


def test_an_experiment_stage_of_a_data_task_is_keyed_as_its_runs_recorded_it(tmp_path, tokenizer):
    """An experiment spec names the file as typed (`sums.jsonl`), its runs record the absolute path with the options
    the spec gave: the report builds the task with those options (before, every evaluating analysis failed with
    "row 1 has no field 'prompt'")."""
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"q": f"{i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(10)))
    exp = tmp_path / "exp"
    base = make_base(exp, tokenizer, hidden=16)
    run = make_es_run(exp / "s1", base, steps=1, task=str(data))
    record_prompt_field(run / "config.yaml")
    (exp / "s1" / "result.json").write_text(json.dumps({
        "key": "s1", "kind": "train", "seed": 42, "track": "es", "task": "sums.jsonl", "parent": None,
        "model": "s1/es/checkpoints/final",
        "steps": [{"algorithm": "es", "run_dir": "s1/es", "model_dir": "s1/es/checkpoints/final"}]}))
    ctx = ReportContext(ReportConfig(dir=str(exp), output_dir=str(tmp_path / "r")), progress=False)
    ctx.discover()
    (chain,) = ctx.chains
    assert chain.tasks == [str(data)] and chain.label == "es sums.jsonl seed 42 (s1)"
    assert ctx.task_name(str(data)) == "sums.jsonl"
    assert ctx.build_task("sums.jsonl").prompt_field == "q" and ctx.build_task(str(data)).prompt_field == "q"


def test_two_data_files_of_one_name_keep_their_paths_in_the_analyses():
    keys = ["/data/x/sums.jsonl", "/data/y/sums.jsonl", "/data/z/other.jsonl:prompt_field=q", "boolq"]
    assert task_names(keys) == {"/data/x/sums.jsonl": "/data/x/sums.jsonl", "/data/y/sums.jsonl": "/data/y/sums.jsonl",
                                "/data/z/other.jsonl:prompt_field=q": "other.jsonl:prompt_field=q", "boolq": "boolq"}


def test_a_run_left_unpaired_is_told_why(tmp_path):
    from esft.analysis.runs import Chain, Run, StageRef, build_pairs
    from esft.analysis.weights_report import _unpaired

    def chain(algo, folder, seed=42):
        r = Run(tmp_path / folder, algo, {"task": "boolq", "seed": seed})
        return Chain(algo, [StageRef([r], None, "boolq")], tmp_path / "base", "base")

    ctx = ReportContext(ReportConfig(dir=str(tmp_path), output_dir=str(tmp_path / "r")), progress=False)
    ctx.chains = [chain("es", "es_a"), chain("es", "es_b"), chain("grpo", "g_a"), chain("grpo", "g_b"),
                  chain("grpo", "g_c", seed=7)]
    pairs = build_pairs(ctx.chains)
    assert [(p.es.runs[0].name, p.grpo.runs[0].name) for p in pairs] == [("es_a", "g_a"), ("es_b", "g_b")]
    assert _unpaired(ctx, ctx.chains[4]) == ("the ES run(s) from the same base model on the same task sequence "
                                             "(`es_a`, `es_b`) are each paired with another GRPO run (pairs match "
                                             "seeds first, then run order)")
    lone = chain("grpo", "g_d")
    lone.stages[0].task = "math"
    ctx.chains.append(lone)
    assert _unpaired(ctx, lone) == "no run of the other algorithm from the same base model on the same task sequence"


def test_a_run_that_logged_nothing_yet_is_listed_under_runs(two_pairs, tmp_path):
    """A run stopped before its first step (config.yaml and its trainer's lock, no log) was left out of the report
    without a word; a config.yaml without a lock is the user's, not a run."""
    import shutil

    from esft.rundir import RunLock

    root = tmp_path / "runs"
    shutil.copytree(two_pairs[0] / "a", root / "a")
    shutil.copytree(two_pairs[0] / "base", root / "base")
    for folder in ("stopped", "my-configs"):
        (root / folder).mkdir()
        (root / folder / "config.yaml").write_text("algorithm: es\npopulation_size: 4\n")
    RunLock(root / "stopped").acquire().release()
    ctx = ReportContext(ReportConfig(dir=str(root), output_dir=str(tmp_path / "r")), progress=False)
    ctx.discover()
    assert sorted(ctx.shown(r.path) for r in ctx.runs) == ["a/es", "a/grpo"]
    assert ctx.unstarted == [(root / "stopped").resolve()]
    text = build_report(ReportConfig(dir=str(root), output_dir=str(tmp_path / "r"), analyses=["weights"]),
                        progress=False).read_text()
    assert "- `stopped`: nothing logged yet (a run stopped before its first iteration ended)" in text
    assert "my-configs" not in text
    ctx = ReportContext(ReportConfig(dir=str(root), output_dir=str(tmp_path / "r"), exclude=["stop"]),
                        progress=False)
    ctx.discover()
    assert ctx.unstarted == []  # --exclude leaves it out as it would a run that logged
