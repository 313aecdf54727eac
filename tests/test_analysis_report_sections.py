"""The KL and functional-sparsity sections of `esft report` (report_kl, report_sparsity) on hand-built chains,
the measurement itself replaced by a stand-in: which chains are measured, with which inputs, how seeds and tracks
are grouped, what the cache keys and when the figure is drawn again.

Run: `pytest -q tests/test_analysis_report_sections.py` (a few seconds: no model is loaded).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from esft.analysis import kl_report as K
from esft.analysis import sparsity as SP
from esft.analysis.report_builder import ReportConfig
from esft.analysis.report_context import ReportContext
from esft.analysis.runs import Chain, Run, StageRef


def folder(path: Path, weights: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    if weights:
        (path / "model.safetensors").write_text("x")
    return path


def chain(root: Path, track: str, seed: int, tasks: tuple[str, ...], base: Path | None, missing: tuple[int, ...] = (),
          algorithm: str = "es") -> Chain:
    """A chain of `tasks` (stage i's run under ROOT/TRACK/sSEED/i), stage numbers in `missing` without a checkpoint."""
    stages = []
    for i, task in enumerate(tasks, 1):
        run = Run(root / track / f"s{seed}" / str(i) / "run", algorithm, {"task": task, "seed": seed})
        ck = None if i in missing else folder(run.path / "checkpoints" / "final")
        stages.append(StageRef([run], ck, task))
    return Chain(algorithm, stages, base, str(base), track)


def context(root: Path, chains: list[Chain], **config) -> ReportContext:
    ctx = ReportContext(ReportConfig(dir=str(root), output_dir=str(root / "report"), **config), progress=False)
    ctx.chains = chains
    return ctx


# ---- KL --------------------------------------------------------------------------------------------------------------

#: incremental k3 of a chain's stage: by seed; cumulative: ten times it
KL_OF_SEED = {1: 0.1, 2: 0.2, 3: 0.6}


@pytest.fixture()
def kl_calls(monkeypatch):
    """kl_stages replaced: one table of KL_OF_SEED[seed] * stage per call; each call's arguments recorded."""
    calls = []

    def fake(base, stages, tasks, limit, gen_config, batch_size, options, loader, progress, balanced, build):
        seed = int(Path(stages[0][1]).parent.parent.parent.parent.name[1:])
        calls.append({"base": base, "stages": stages, "tasks": tasks, "limit": limit, "balanced": balanced,
                      "max_new_tokens": gen_config.max_new_tokens})
        labels = [label for label, _ in stages]

        def table(scale):
            return {t: {lab: {"k3_token_mean": scale * KL_OF_SEED[seed] * (j + 1), "k3_token_mean_se": 0.0}
                        for j, lab in enumerate(labels)} for t in tasks}

        return {"stages": labels, "tasks": tasks, "incremental": table(1.0), "cumulative": table(10.0)}

    monkeypatch.setattr(K, "kl_stages", fake)
    return calls


@pytest.fixture()
def heatmaps(monkeypatch):
    """plot_heatmap replaced: the panels of each drawing, the PNG written empty."""
    drawn = []

    def fake(panels, path, title=""):
        drawn.append(panels)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(b"")
        return Path(path)

    monkeypatch.setattr(K, "plot_heatmap", fake)
    return drawn


def test_kl_groups_seeds_by_track_and_sequence_and_draws_their_median(tmp_path, kl_calls, heatmaps):
    base = folder(tmp_path / "base")
    seq = ("countdown", "boolq")
    chains = [chain(tmp_path, "es@100", s, seq, base) for s in (1, 2, 3)]
    chains += [chain(tmp_path, "es@300", 1, seq, base), chain(tmp_path, "grpo", 2, ("boolq", "boolq"), base,
                                                              algorithm="grpo"),
               chain(tmp_path, "es@100", 4, seq, base, missing=(2,))]
    ctx = context(tmp_path, chains, limit=3, max_new_tokens=4, balanced=True)
    groups, figure = K.report_kl(ctx)
    assert figure == ctx.fig("kl_heatmap")
    # the chain whose second stage left no weights is named, not measured
    assert dict(ctx.unsupported) == {f"KL ({chains[-1].label})": f"no checkpoint with weights for stage 2 (boolq, run "
                                     f"`{ctx.rel_run(chains[-1].stages[1].run)}`)"}
    assert len(kl_calls) == 5
    assert all(c["limit"] == 3 and c["max_new_tokens"] == 4 and c["balanced"] is True and c["base"] == base
               for c in kl_calls)
    assert kl_calls[-1]["tasks"] == ["boolq"]  # boolq->boolq: each task evaluated once
    assert [(g.track, g.tasks, len(g.seeds)) for g in groups] == [("es@100", seq, 3), ("es@300", seq, 1),
                                                                  ("grpo", ("boolq", "boolq"), 1)]
    assert [g.over for g in groups] == ["3 seeds", "1 seed", "1 seed"]
    cell = groups[0].aggregate["incremental"]["countdown"]["2:boolq"]
    assert (cell["median"], cell["min"], cell["max"]) == pytest.approx((0.4, 0.2, 1.2))
    assert sorted(ctx.results["kl"]) == ["es@100 countdown->boolq", "es@300 countdown->boolq", "grpo boolq->boolq"]
    # more than two groups: each panel titled by its track and sequence; its cells the incremental median
    (panels,) = heatmaps
    assert list(panels) == ["ES@100 countdown->boolq", "ES@300 countdown->boolq", "GRPO boolq->boolq"]
    m, rows, cols = panels["ES@100 countdown->boolq"]
    assert rows == ["countdown", "boolq"] and cols == ["1:countdown", "2:boolq"]
    np.testing.assert_allclose(m, [[0.2, 0.4], [0.2, 0.4]])


def test_kl_of_runs_of_one_seed_in_two_folders_is_headed_as_chains_not_seeds(tmp_path, kl_calls, heatmaps):
    base = folder(tmp_path / "base")
    chains = [chain(tmp_path / d, "es", 1, ("boolq",), base) for d in ("a", "b")]
    groups, _ = K.report_kl(context(tmp_path, chains, limit=1))
    assert [(len(g.seeds), g.over) for g in groups] == [(2, "2 chains (seeds 1, 1)")]


def test_kl_of_two_tracks_names_panels_by_track_and_says_when_stages_coincide(tmp_path, kl_calls, heatmaps):
    base = folder(tmp_path / "base")
    chains = [chain(tmp_path, "es", 1, ("boolq",), base),
              chain(tmp_path, "grpo", 1, ("boolq",), base, algorithm="grpo")]
    K.report_kl(ctx := context(tmp_path, chains, limit=1))
    assert list(heatmaps[0]) == ["ES", "GRPO"]
    reasons = dict(ctx.unsupported)
    assert "single-stage runs only" in reasons["KL across stages (Figure 2's columns, Tables 13-16's rows)"]
    two = [chain(tmp_path / "b", "es", 1, ("boolq", "countdown"), base)]
    K.report_kl(ctx := context(tmp_path / "b", two, limit=1))
    assert ctx.unsupported == []


def test_two_groups_of_one_track_each_keep_their_heatmap_panel(tmp_path, kl_calls, heatmaps):
    """ES chains of two task sequences are two groups of one track: named by the track alone, both panels were
    keyed "ES" and the second replaced the first, so the heatmap showed one group under a name that fits both."""
    base = folder(tmp_path / "base")
    chains = [chain(tmp_path / "a", "es", 1, ("boolq",), base), chain(tmp_path / "b", "es", 1, ("countdown",), base)]
    groups, _ = K.report_kl(context(tmp_path, chains, limit=1))
    assert [g.tasks for g in groups] == [("boolq",), ("countdown",)]
    assert list(heatmaps[0]) == ["ES boolq", "ES countdown"]
    assert [rows for _, rows, _ in heatmaps[0].values()] == [["boolq"], ["countdown"]]


def test_kl_with_no_measurable_chain_says_so(tmp_path, kl_calls):
    ctx = context(tmp_path, [chain(tmp_path, "es", 1, ("boolq",), folder(tmp_path / "base"), missing=(1,))])
    assert K.report_kl(ctx) is None and kl_calls == []
    assert dict(ctx.unsupported)["KL"] == "no chain with a base model folder and checkpoints"


def test_kl_is_measured_again_when_what_decides_it_changes_and_redrawn_with_any_new_result(tmp_path, kl_calls,
                                                                                           heatmaps):
    base = folder(tmp_path / "base")
    chains = [chain(tmp_path, "es", s, ("boolq", "countdown"), base) for s in (1, 2)]

    def measured(**config) -> int:
        before = len(kl_calls)
        K.report_kl(context(tmp_path, chains, **{"limit": 2, "max_new_tokens": 3, "device": "cpu", **config}))
        return len(kl_calls) - before

    assert measured() == 2 and measured() == 0 and len(heatmaps) == 1  # all from the cache: figure kept
    assert measured(limit=5) == 2 and measured(max_new_tokens=7) == 2 and measured(dtype="bf16") == 2
    assert measured() == 2
    drawn = len(heatmaps)
    ck = chains[1].stages[1].checkpoint / "model.safetensors"  # seed 2's stage 2 weights written again
    os.utime(ck, (ck.stat().st_atime, ck.stat().st_mtime + 10))
    assert measured() == 1 and len(heatmaps) == drawn + 1  # the last chain's result is new: the figure too
    chains.reverse()
    os.utime(ck, (ck.stat().st_atime, ck.stat().st_mtime + 10))
    assert measured() == 1 and len(heatmaps) == drawn + 2  # ... whichever chain it is


# ---- functional sparsity ---------------------------------------------------------------------------------------------

@pytest.fixture()
def sweeps(monkeypatch):
    """sparsity_sweep, prepare_tasks and the figure replaced: each sweep's arguments recorded."""
    calls = []

    def sweep(model, tokenizer, base, tuned, tasks, gen_config, targets, progress):
        calls.append({"model": model, "tokenizer": tokenizer, "base": base, "tuned": tuned, "tasks": tasks,
                      "targets": targets, "max_new_tokens": gen_config.max_new_tokens})
        return {"rows": [{"tau": 0.0, "sparsity": 0.0, "accuracy": {t: 0.5 for t in tasks}}],
                "base_accuracy": {t: 0.25 for t in tasks}, "constant_baseline": {}}

    def prepare(names, limit, task_options=None, balanced=False, build=None):
        return {"names": list(names), "limit": limit, "balanced": balanced}

    def plot(results, path):
        calls.append({"figure": list(results), "algorithms": [r.get("algorithm") for r in results.values()]})
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(b"")
        return Path(path)

    monkeypatch.setattr(SP, "sparsity_sweep", sweep)
    monkeypatch.setattr(SP, "prepare_tasks", prepare)
    monkeypatch.setattr(SP, "plot_sparsity_sweep", plot)
    return calls


def sparsity_context(root: Path, chains: list[Chain], **config) -> ReportContext:
    ctx = context(root, chains, **config)
    ctx.load = lambda base, weights=None: (f"model of {base.name}", f"tokenizer of {base.name}")
    return ctx


def test_sparsity_sweeps_the_first_seed_of_each_track_and_sequence_at_its_last_checkpoint(tmp_path, sweeps):
    base = folder(tmp_path / "base")
    seq = ("countdown", "boolq")
    chains = [chain(tmp_path, "es", 1, seq, base, missing=(1,)),  # stage 1 pruned: the last stage is what counts
              chain(tmp_path, "es", 2, seq, base),  # a second seed of the same: not swept
              chain(tmp_path, "es", 3, ("boolq", "boolq"), base),  # another sequence of the same track
              chain(tmp_path, "grpo", 1, seq, base, missing=(2,), algorithm="grpo")]
    ctx = sparsity_context(tmp_path, chains, limit=3, max_new_tokens=4, balanced=True, sparsity_targets=[0.0, 0.9])
    found, figure = SP.report_sparsity(ctx)
    assert dict(ctx.unsupported) == {f"functional sparsity ({chains[-1].label})":
                                     "its last stage has no checkpoint with weights"}
    runs = [c for c in sweeps if "figure" not in c]
    assert [c["tuned"] for c in runs] == [chains[0].stages[1].checkpoint, chains[2].stages[1].checkpoint]
    assert all(c["base"] == base and c["targets"] == [0.0, 0.9] and c["max_new_tokens"] == 4 for c in runs)
    assert runs[0]["tasks"] == {"names": ["countdown", "boolq"], "limit": 3, "balanced": True}
    assert runs[1]["tasks"]["names"] == ["boolq"]  # boolq->boolq: evaluated once
    assert [(s.label, s.tasks) for s in found] == [(chains[0].label, ["countdown", "boolq"]),
                                                   (chains[2].label, ["boolq"])]
    # the second result of a track is keyed by its chain's label, not written over the first
    assert list(ctx.results["sparsity"]) == ["es", chains[2].label] == sweeps[-1]["figure"]
    assert sweeps[-1]["algorithms"] == ["es", "es"]  # the figure colours a line by it, not by its label
    assert figure == ctx.fig("functional_sparsity")


def test_each_sweep_runs_on_the_model_of_its_own_base(tmp_path, sweeps):
    """Two chains from different base models: the second was swept on the model and tokenizer loaded for the
    first one's base (loaded once for the whole section)."""
    small, large = folder(tmp_path / "small"), folder(tmp_path / "large")
    chains = [chain(tmp_path, "es", 1, ("boolq",), small), chain(tmp_path, "grpo", 1, ("boolq",), large,
                                                                 algorithm="grpo")]
    SP.report_sparsity(sparsity_context(tmp_path, chains, limit=1))
    runs = [c for c in sweeps if "figure" not in c]
    assert [(c["base"].name, c["model"], c["tokenizer"]) for c in runs] == [
        ("small", "model of small", "tokenizer of small"), ("large", "model of large", "tokenizer of large")]


def test_sparsity_with_no_sweepable_chain_says_so(tmp_path, sweeps):
    ctx = sparsity_context(tmp_path, [chain(tmp_path, "es", 1, ("boolq",), folder(tmp_path / "b"), missing=(1,))])
    assert SP.report_sparsity(ctx) is None and sweeps == []
    assert dict(ctx.unsupported)["functional sparsity"] == "no run with a base model folder and a final checkpoint"


def test_sparsity_is_swept_again_when_what_decides_it_changes_and_redrawn_with_any_new_result(tmp_path, sweeps):
    base = folder(tmp_path / "base")
    chains = [chain(tmp_path, "es", 1, ("boolq",), base), chain(tmp_path, "grpo", 1, ("boolq",), base,
                                                                algorithm="grpo")]

    def swept(**config) -> tuple[int, int]:
        before = [("figure" in c) for c in sweeps]
        SP.report_sparsity(sparsity_context(tmp_path, chains, **{"limit": 2, "max_new_tokens": 3, **config}))
        new = [("figure" in c) for c in sweeps][len(before):]
        return new.count(False), new.count(True)

    assert swept() == (2, 1) and swept() == (0, 0)  # all from the cache: the figure kept
    assert swept(limit=5) == (2, 1) and swept(max_new_tokens=7) == (2, 1)
    assert swept(sparsity_targets=[0.0, 0.5]) == (2, 1) and swept() == (2, 1)
    for c in (chains[1], chains[0]):  # the last chain's, then the first chain's, weights written again
        ck = c.stages[-1].checkpoint / "model.safetensors"
        os.utime(ck, (ck.stat().st_atime, ck.stat().st_mtime + 10))
        assert swept() == (1, 1)


def test_kl_progress_names_the_chain_each_measurement_belongs_to(tmp_path, kl_calls, heatmaps, capsys):
    """The per-stage KL lines read alike for an ES and a GRPO chain ("KL incremental 1:countdown countdown ..."):
    the report says which chain it measures before its lines."""
    base = folder(tmp_path / "base")
    chains = [chain(tmp_path, "es", 1, ("countdown", "boolq"), base),
              chain(tmp_path, "grpo", 1, ("countdown", "boolq"), base, algorithm="grpo")]
    ctx = context(tmp_path, chains, limit=1)
    ctx.progress = True
    K.report_kl(ctx)
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("esft report: KL of ")] == [
        f"esft report: KL of {c.label}" for c in chains]
