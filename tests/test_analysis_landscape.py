"""Landscape and functional sparsity: weights set along lines and directions, barrier test, thresholds.

Run: `pytest -q tests/test_analysis_landscape.py` (a few seconds; evaluation uses a stub accuracy).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from conftest import make_tiny_model
from esft.analysis import barrier as B
from esft.analysis import landscape as L
from esft.analysis import sparsity as SP


def tiny(seed):
    return make_tiny_model(vocab_size=128, hidden=16, seed=seed)


def params(model):
    return {n: p.detach().double().clone() for n, p in model.named_parameters()}


def test_set_weights_interpolates_and_moves_along_unit_directions(tmp_path):
    a, b, work = tiny(0), tiny(1), tiny(2)
    b.save_pretrained(tmp_path / "b")  # one endpoint on disk, one in memory
    pa, pb = params(a), params(b)
    d = L.DeltaDirection(a, tmp_path / "b", "a->b").bind(work)
    L.set_weights(work, a, [(0.25, d)])
    for n, v in params(work).items():
        assert torch.allclose(v, 0.75 * pa[n] + 0.25 * pb[n], atol=1e-6)
    full = np.sqrt(sum(float(((pb[n] - pa[n]) ** 2).sum()) for n in pa))
    assert d.norm == pytest.approx(full, rel=1e-9)
    # random direction: same per-tensor norms as the reference, nearly orthogonal to it, deterministic
    r = L.RandomDirection(d, seed=3).bind(work)
    for n, v in d.tensor_norms().items():
        assert float(r.tensor(n).norm()) == pytest.approx(v, rel=1e-9)
    dot = sum(float((r.tensor(n) * d.tensor(n)).sum()) for n in pa)
    assert abs(dot) / (d.norm * r.norm) < 0.05
    assert torch.equal(r.tensor("model.norm.weight"), L.RandomDirection(d, seed=3).bind(work).tensor("model.norm.weight"))
    assert not torch.equal(r.tensor("model.layers.0.self_attn.q_proj.weight"),
                           r.tensor("model.layers.1.self_attn.q_proj.weight")[: 16])


def test_barrier_against_hand_computation():
    b = B.barrier([0, 0.5, 1], [0.6, 0.2, 0.8], n=100)
    assert b["linear"] == pytest.approx([0.6, 0.7, 0.8])
    assert b["max_drop"] == pytest.approx(0.5) and b["at"] == 0.5 and b["barrier"]
    flat = B.barrier([0, 0.5, 1], [0.6, 0.69, 0.8], n=100)
    assert not flat["barrier"] and flat["max_drop"] == pytest.approx(0.01)


def test_paired_barrier_against_hand_computation():
    """Three examples at t = 0, 0.5, 1: scores (1, 1, 0), (0, 1, 0), (1, 0, 1). Their own lines at 0.5 are (1, 0.5,
    0.5), their drops (1, -0.5, 0.5): mean 1/3, sample sd sqrt(7/12), SE sqrt(7/36); z = 0.76 < 1.96."""
    b = B.paired_barrier([0, 0.5, 1], [[1, 1, 0], [0, 1, 0], [1, 0, 1]])
    assert b["max_drop"] == pytest.approx(1 / 3) and b["at"] == 0.5 and b["line_at"] == pytest.approx(2 / 3)
    assert b["se"] == pytest.approx(math.sqrt(7 / 36)) and b["se_of"] == "paired" and not b["barrier"]
    assert b["linear"] == pytest.approx([2 / 3, 2 / 3, 2 / 3]) and b["min_accuracy"] == pytest.approx(1 / 3)
    # the same drop shared by every example has no spread: a barrier however small; no drop at all is none
    assert B.paired_barrier([0, 0.5, 1], [[1, 1], [0.9, 0.9], [1, 1]])["barrier"]
    assert not B.paired_barrier([0, 0.5, 1], [[1, 0], [1, 0], [1, 0]])["barrier"]
    assert B.paired_barrier([0, 0.5, 1], [[1], [0], [1]])["se"] is None  # one example: no verdict
    # partial credit on an exact straight line: the rounding noise of its drops (~1e-17) is no barrier
    line = B.paired_barrier([0, 0.25, 0.5, 0.75, 1], [[0.1] * 4, [0.2] * 4, [0.3] * 4, [0.4] * 4, [0.5] * 4])
    assert abs(line["max_drop"]) < 1e-12 and not line["barrier"]
    with pytest.raises(ValueError, match="one row of per-example scores per point"):
        B.paired_barrier([0, 0.5, 1], [[1, 0], [1, 0]])


def test_the_paired_threshold_is_bonferroni_corrected_over_the_interior_points():
    assert B.critical_z(1) == pytest.approx(1.959964, abs=1e-6)
    assert B.critical_z(3) == pytest.approx(2.393980, abs=1e-6)
    assert B.critical_z(9) == pytest.approx(2.772921, abs=1e-6)
    # the threshold decides: z = 2.18 is a barrier with one interior point and none with three
    mid = [0] * 4 + [1] * 16  # 20 examples scoring 1 at both ends, 4 of them losing it midway
    one = B.paired_barrier([0, 0.5, 1], [[1] * 20, mid, [1] * 20])
    three = B.paired_barrier([0, 0.25, 0.5, 0.75, 1], [[1] * 20, [1] * 20, mid, [1] * 20, [1] * 20])
    assert one["max_drop"] / one["se"] == pytest.approx(three["max_drop"] / three["se"]) == pytest.approx(2.179, 1e-3)
    assert one["barrier"] and not three["barrier"]


def test_the_paired_test_keeps_its_level_where_two_standard_errors_of_the_line_did_not():
    """A flat path (every point an independent draw of the same 60% accuracy, n = 100, 5 points): the paired test
    declares a barrier in about its nominal 2.5% of paths; 2 binomial SEs at the largest of three drops, which
    ignores the endpoints' noise, in several times that."""
    rng = np.random.default_rng(0)
    ts, paired, binomial = [0, 0.25, 0.5, 0.75, 1], 0, 0
    for _ in range(1000):
        s = (rng.random((5, 100)) < 0.6).astype(float)
        paired += B.paired_barrier(ts, s)["barrier"]
        binomial += B.barrier(ts, s.mean(axis=1), 100)["barrier"]
    assert paired / 1000 < 0.04 and binomial / 1000 > 0.10


def fake_accuracy(reference):
    """accuracy = 1 - distance to `reference` (a stand-in for evaluate_task that reads the weights)."""
    ref = params(reference)

    def acc(model, tokenizer, tasks, gen_config, scores_out=None, progress=False):
        dist = np.sqrt(sum(float(((p.detach().double() - ref[n]) ** 2).sum()) for n, p in model.named_parameters()))
        return {t: max(0.0, 1.0 - dist) for t in tasks}

    return acc


def test_interpolation_path_and_direction_sweep(monkeypatch):
    a, b, work = tiny(0), tiny(1), tiny(2)
    monkeypatch.setattr(L, "accuracy", fake_accuracy(a))
    tasks = {"t": (None, [0] * 10)}
    res = L.interpolation_path(work, None, a, b, [0.5], tasks, None)
    assert res["t"] == [0.0, 0.5, 1.0]
    dist = res["distance"]
    assert res["accuracy"]["t"] == pytest.approx([1.0, max(0, 1 - dist / 2), max(0, 1 - dist)], abs=1e-5)
    d = L.DeltaDirection(a, b, "ES")
    mags = [0.0, 0.1, 0.2]
    sw = L.direction_sweep(work, None, a, [d], mags, tasks, None)
    assert sw["directions"]["ES"]["accuracy"]["t"] == pytest.approx([1.0, 0.9, 0.8], abs=1e-5)
    assert L.default_magnitudes([1.0, 90.0], 4)[:2] == [0.0, 0.25]
    assert 1.0 in L.default_magnitudes([1.0, 90.0], 4) and 90.0 in L.default_magnitudes([1.0, 90.0], 4)


def test_threshold_and_sparsity_against_numpy():
    d = torch.tensor([-3e-5, 1e-6, 0.0, 2e-5, -5e-6])
    assert SP.threshold_update(d, 1e-5).tolist() == pytest.approx([-3e-5, 0, 0, 2e-5, 0])
    # |d| <= tau reverts, boundary included (what sparsity_at counts as sparse)
    assert SP.threshold_update(torch.tensor([0.25, -0.25, 0.5, -0.75]), 0.25).tolist() == [0.0, 0.0, 0.5, -0.75]
    base, tuned = tiny(0), tiny(0)
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in tuned.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 1e-4)
    pb = params(base)
    delta = np.concatenate([(v - pb[n]).numpy().ravel() for n, v in params(tuned).items()])
    taus = [0.0, 1e-5, 5e-5, 1e-4]
    got = SP.sparsity_at(base, tuned, taus, chunk_elems=300)
    assert got == pytest.approx([float(np.mean(np.abs(delta) <= t)) for t in taus], abs=1e-12)
    targets = [0.25, 0.5, 0.9]
    chosen = SP.taus_for_sparsity(base, tuned, targets)
    assert SP.sparsity_at(base, tuned, chosen) == pytest.approx(targets, abs=0.01)
    assert np.quantile(np.abs(delta), 0.5) == pytest.approx(chosen[1], rel=0.02)


def test_sparsity_sweep_reverts_small_entries(monkeypatch):
    base, tuned, work = tiny(0), tiny(1), tiny(2)
    monkeypatch.setattr(SP, "accuracy", fake_accuracy(tuned))
    res = SP.sparsity_sweep(work, None, base, tuned, {"t": (None, [0])}, None, targets=[0.0, 0.5])
    pb, pt = params(base), params(tuned)
    zeros = np.mean(np.concatenate([(pt[n] - pb[n]).numpy().ravel() for n in pb]) == 0)  # RMSNorm gains: both 1
    assert res["rows"][0]["tau"] == 0.0 and res["rows"][0]["sparsity"] == pytest.approx(zeros, abs=1e-12)
    assert res["rows"][0]["accuracy"]["t"] == pytest.approx(1.0, abs=1e-6)  # full update = tuned weights
    assert res["rows"][1]["sparsity"] == pytest.approx(0.5, abs=0.01)
    assert res["rows"][1]["accuracy"]["t"] < 1.0
    # the last call restored the base weights for the base accuracy
    assert all(torch.allclose(v, pb[n], atol=1e-7) for n, v in params(work).items())


def test_threshold_update_compares_low_precision_deltas_at_the_exact_tau():
    d = torch.tensor([1.0e-5, -1.0e-5, 2e-6, 3e-5], dtype=torch.bfloat16)  # |1e-5| rounds to 1.0014e-5 > tau
    kept = SP.threshold_update(d, 1e-5)
    assert kept.dtype == torch.bfloat16
    assert kept.tolist() == [d[0].item(), d[1].item(), 0.0, d[3].item()]


def test_an_interpolation_path_needs_its_two_endpoints():
    """`--interpolation-points 1` divided by zero inside the analysis; both configs refuse it up front."""
    from esft.analysis.commands import LandscapeConfig
    from esft.analysis.report_builder import ReportConfig

    with pytest.raises(ValueError, match="interpolation_points = 1 is not accepted; expected an integer >= 2"):
        LandscapeConfig(interpolation_points=1)
    with pytest.raises(ValueError, match="interpolation_points = 1 is not accepted; expected an integer >= 2"):
        ReportConfig(dir=".", interpolation_points=1)
    assert LandscapeConfig(interpolation_points=2).interpolation_points == 2
    assert ReportConfig(dir=".", interpolation_points=2).interpolation_points == 2


def test_accuracy_axes_of_the_report_figures_are_held_to_zero_one(tmp_path, monkeypatch):
    """A flat accuracy curve (0.50 -> 0.51) must look flat: every accuracy panel spans [0, 1], not autoscaled
    to the curve's own range."""
    from esft.analysis import plots

    drawn, lefts = [], []
    real_save = plots.save

    def keep(fig, path):
        drawn.append([(ax.get_ylabel(), ax.get_ylim()) for ax in fig.get_axes()])
        lefts.extend(ax.get_xlim()[0] for ax in fig.get_axes() if "distance" in ax.get_xlabel())
        return real_save(fig, path)

    monkeypatch.setattr(plots, "save", keep)
    flat = [0.50, 0.505, 0.51]
    L.plot_interpolation({"t": [0.0, 0.5, 1.0], "accuracy": {"boolq": flat},
                          "barrier": {"boolq": B.barrier([0.0, 0.5, 1.0], flat, 200)}}, tmp_path / "i.png")
    L.plot_direction_sweep({"magnitudes": [0.0, 1.0, 90.0],
                            "directions": {"ES": {"norm": 90.0, "accuracy": {"boolq": flat}},
                                           "GRPO": {"norm": 1.0, "accuracy": {"boolq": [0.5, 0.5, 0.5]}}}},
                           tmp_path / "d.png", reference={"base": {"boolq": 0.5}})
    SP.plot_sparsity_sweep({"es": {"rows": [{"sparsity": s, "accuracy": {"boolq": a}} for s, a in
                                            zip([0.0, 0.5, 0.9], flat)], "base_accuracy": {"boolq": 0.5}}},
                           tmp_path / "s.png")
    assert len(drawn) == 3
    assert lefts == [0.0]  # the sweep's distance axis starts at 0, not at a margin of negative distances
    for axes in drawn:
        assert axes and all(label == "accuracy" and limits == (0.0, 1.0) for label, limits in axes), axes


def test_an_accuracy_axis_widens_to_a_reward_outside_zero_one(tmp_path):
    """A custom reward may score -1 or 2: its points stay inside the panel (they are drawn unclipped, so an axis
    held to [0, 1] drew them across the neighbouring panel), and the axis still starts at 0 and reaches 1."""
    from esft.analysis.plots import accuracy_axis, pyplot
    from esft.es.curve import run_figure

    fig, ax = pyplot().subplots()
    ax.plot([0, 1, 2], [-1.0, 0.5, 2.0])
    accuracy_axis(ax)
    # with a margin on each widened side: a cap on the frame hid in its line
    assert ax.get_ylim() == pytest.approx((-1.12, 2.12)) and ax.get_ylabel() == "accuracy"
    pyplot().close(fig)
    fig, ax = pyplot().subplots()
    accuracy_axis(ax)  # nothing drawn: the plain [0, 1]
    assert ax.get_ylim() == (0.0, 1.0)
    pyplot().close(fig)

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("task: boolq\neval_limit: 2\n")
    (run / "metrics.jsonl").write_text(
        '{"kind": "eval", "step": 1, "test_n": 2, "test_accuracy": 1.5, "test_ci95": [1.2, 1.8]}\n')
    right = run_figure(run).axes[1]
    low, high = right.get_ylim()
    assert low == 0.0 and high > 1.8 and right.get_ylabel() == "held-out mean reward"  # it had no label


def test_abs_histogram_bins_each_entry_by_its_magnitude():
    """Bins [e_i, e_(i+1)); below the first edge (zeros too) counted apart; at or above the last edge: last bin."""
    base = {"w": torch.zeros(7, dtype=torch.float64)}
    tuned = {"w": torch.tensor([0.0, -0.5, 1.0, 1.5, -3.0, 8.0, 100.0], dtype=torch.float64)}
    counts, below, total = SP.abs_histogram(base, tuned, np.array([1.0, 2.0, 4.0, 8.0]))
    assert counts.tolist() == [2.0, 1.0, 2.0] and below == 2 and total == 7


def test_a_thresholded_update_has_the_norms_of_its_kept_entries():
    base, tuned = tiny(0), tiny(1)
    tau = 0.05
    thr = SP.ThresholdedDelta(L.DeltaDirection(base, tuned, "update"), tau).bind(tiny(2))
    pb, pt = params(base), params(tuned)
    want = {n: float(np.linalg.norm(np.where(np.abs(d) > tau, d, 0.0)))
            for n, d in ((n, (pt[n] - pb[n]).numpy()) for n in pb)}
    norms = thr.tensor_norms()
    assert set(norms) == set(want) and all(norms[n] == pytest.approx(want[n], rel=1e-12) for n in want)
    assert thr.norm == pytest.approx(np.sqrt(sum(v * v for v in want.values())), rel=1e-12)
    assert thr.norm < L.DeltaDirection(base, tuned).bind(tiny(2)).norm


def test_a_tied_head_stored_under_its_own_name_is_read_for_the_embedding():
    """A tied model lists the shared tensor once (the embedding); a checkpoint that stores it only as lm_head
    still sets it, and a direction between two such checkpoints moves it."""
    model = tiny(0)
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    emb = state.pop("model.embed_tokens.weight")
    origin = {**state, "lm_head.weight": emb + 1.0}
    end = {**state, "lm_head.weight": emb + 3.0}
    d = L.DeltaDirection(origin, end).bind(model)
    assert d.tensor("model.embed_tokens.weight") == pytest.approx(torch.full_like(emb, 2.0, dtype=torch.float64))
    L.set_weights(model, origin, [(0.5, d)])
    assert torch.allclose(model.lm_head.weight, emb + 2.0)


def test_a_direction_without_a_tensor_contributes_zero_and_unrelated_sources_are_refused():
    model = tiny(0)
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    only_norm = {"model.norm.weight": state["model.norm.weight"] + 1.0}
    d = L.DeltaDirection({"model.norm.weight": state["model.norm.weight"]}, only_norm).bind(model)
    assert d.tensor("model.layers.0.self_attn.q_proj.weight") is None
    L.set_weights(model, state, [(1.0, d)])
    assert torch.allclose(model.model.norm.weight, state["model.norm.weight"] + 1.0)
    assert torch.equal(model.model.layers[0].self_attn.q_proj.weight, state["model.layers.0.self_attn.q_proj.weight"])
    with pytest.raises(ValueError, match="no parameter of the model"):
        L.DeltaDirection({"other.weight": torch.zeros(2)}, {"other.weight": torch.ones(2)}).bind(model)


def test_set_weights_keeps_parameters_the_origin_lacks():
    model = tiny(0)
    before = params(model)
    L.set_weights(model, {"model.norm.weight": torch.full_like(model.model.norm.weight, 3.0)})
    after = params(model)
    assert torch.equal(after["model.norm.weight"], torch.full_like(before["model.norm.weight"], 3.0))
    assert all(torch.equal(after[n], before[n]) for n in before if n != "model.norm.weight")


def test_barrier_standard_error_and_its_strict_threshold():
    b = B.barrier([0, 0.5, 1], [0.6, 0.2, 0.8], n=100)
    assert b["se"] == pytest.approx(np.sqrt(0.7 * 0.3 / 100), rel=1e-12)
    # a drop of exactly twice the standard error is not "more than" it: line 0.5, n = 4, se = 0.25
    edge = B.barrier([0, 0.5, 1], [0.5, 0.0, 0.5], n=4)
    assert edge["max_drop"] == 0.5 and edge["se"] == 0.25 and not edge["barrier"]
    # the straight line runs between the endpoints wherever the path's parameter starts
    shifted = B.barrier([1, 2, 3], [0.6, 0.2, 0.8], n=100)
    assert shifted["linear"] == pytest.approx([0.6, 0.7, 0.8]) and shifted["at"] == 2.0
    # between two and three standard errors: a barrier (line 0.7, n = 100: 2 se = 0.092, drop 0.12)
    assert B.barrier([0, 0.5, 1], [0.6, 0.58, 0.8], n=100)["barrier"]


def test_magnitudes_without_a_positive_norm_are_the_origin_alone():
    assert L.default_magnitudes([0.0, None]) == [0.0] and L.default_magnitudes([]) == [0.0]


def test_every_direction_starts_at_the_origins_accuracy(monkeypatch):
    a, b, work = tiny(0), tiny(1), tiny(2)
    monkeypatch.setattr(L, "accuracy", fake_accuracy(a))
    tasks = {"t": (None, [0] * 10)}
    dirs = [L.DeltaDirection(a, b, "ES"), L.RandomDirection(L.DeltaDirection(a, b), seed=1, label="random")]
    sw = L.direction_sweep(work, None, a, dirs, [0.0, 0.1], tasks, None)
    for label in ("ES", "random"):
        assert sw["directions"][label]["accuracy"]["t"] == pytest.approx([1.0, 0.9], abs=1e-5)


def test_sparsity_of_weights_with_no_tensor_in_common_is_refused():
    """sparsity_at read 0.0 and taus_for_sparsity put every threshold at the histogram's top (1000) for a base and
    a tuned model that share no weight, as if an update had been measured."""
    from esft.analysis.sparsity import sparsity_at, taus_for_sparsity

    base, tuned = {"a.weight": torch.zeros(3)}, {"b.weight": torch.ones(3)}
    for measure in (lambda: sparsity_at(base, tuned, [0.1]), lambda: taus_for_sparsity(base, tuned, [0.5])):
        with pytest.raises(ValueError, match="no tensor in common"):
            measure()
    assert sparsity_at({"a.weight": torch.zeros(4)}, {"a.weight": torch.tensor([0.0, 0.0, 1.0, 1.0])}, [0.5]) == [0.5]


def test_interpolation_endpoints_are_the_two_models_exactly():
    a, b, work = tiny(0), tiny(1), tiny(2)
    d = L.DeltaDirection(a, b).bind(work)
    for t, want in ((0.0, params(a)), (1.0, params(b))):
        L.set_weights(work, a, [(t, d)])
        assert all(torch.equal(v, want[n]) for n, v in params(work).items()), t


def test_weights_of_another_shape_are_refused_not_reshaped():
    """A stored tensor whose shape differs from the model's (here transposed: same entries, other layout) would
    be reshaped into scrambled weights; refused, naming the tensor."""
    model = tiny(0)
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    name = "model.layers.0.mlp.up_proj.weight"
    bad = {**state, name: state[name].T.contiguous()}
    with pytest.raises(ValueError, match=name):
        L.set_weights(model, bad)
    with pytest.raises(ValueError, match=name):
        L.DeltaDirection(state, bad).bind(model)


def test_a_direction_needs_the_tensor_at_both_ends():
    model = tiny(0)
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    end = {"model.norm.weight": state["model.norm.weight"] + 2.0}
    d = L.DeltaDirection(state, end).bind(model)
    assert set(d.tensor_norms()) == {"model.norm.weight"} and d.norm == pytest.approx(2.0 * 4.0)  # sqrt(16 * 4)
    assert d.tensor("model.layers.0.self_attn.q_proj.weight") is None
    r = L.RandomDirection(d, seed=0).bind(model)
    assert r.tensor("model.layers.0.self_attn.q_proj.weight") is None  # no reference norm: not moved


def test_rebinding_to_another_model_recomputes_the_norms():
    state = {n: p.detach().clone() for n, p in tiny(0).named_parameters()}
    end = {n: v + 1.0 for n, v in state.items()}
    d = L.DeltaDirection(state, end).bind(tiny(0))
    assert len(d.tensor_norms()) == len(state)
    only_norm = torch.nn.Module()
    only_norm.model = torch.nn.Module()
    only_norm.model.norm = torch.nn.Module()
    only_norm.model.norm.weight = torch.nn.Parameter(state["model.norm.weight"].clone())
    assert d.bind(only_norm).tensor_norms() == {"model.norm.weight": pytest.approx(4.0)}


def test_random_directions_differ_by_seed_and_by_tensor():
    """Unit-normalised, two q_proj tensors of one shape get different noise, and so do two seeds."""
    base, tuned, work = tiny(0), tiny(1), tiny(2)
    d = L.DeltaDirection(base, tuned).bind(work)
    q0, q1 = "model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.q_proj.weight"

    def unit(r, n):
        t = r.tensor(n)
        return t / t.norm()

    r0, r1 = L.RandomDirection(d, seed=0).bind(work), L.RandomDirection(d, seed=1).bind(work)
    assert float((unit(r0, q0) * unit(r0, q1)).sum()) < 0.5
    assert float((unit(r0, q0) * unit(r1, q0)).sum()) < 0.5


def test_barrier_without_a_sample_size_and_with_the_minimum_at_an_end():
    b = B.barrier([0, 0.5, 1], [0.6, 0.2, 0.8])
    assert b["se"] is None and not b["barrier"] and b["max_drop"] == pytest.approx(0.5)
    rising = B.barrier([0, 0.5, 1], [0.2, 0.5, 0.8], n=10)
    assert rising["min_accuracy"] == 0.2 and rising["max_drop"] == pytest.approx(0.0, abs=1e-12)


def test_interpolation_barrier_uses_each_tasks_sample_size(monkeypatch):
    a, b, work = tiny(0), tiny(1), tiny(2)
    monkeypatch.setattr(L, "accuracy", lambda *args, **kw: {"t": 0.5})
    res = L.interpolation_path(work, None, a, b, [0.5], {"t": (None, [0] * 25)}, None)
    assert res["n"] == {"t": 25} and res["barrier"]["t"]["se"] == pytest.approx(np.sqrt(0.25 / 25))


def test_default_magnitudes_grid_against_hand_computation():
    """0, the norms, and geomspace(min / 4, 1.5 max): for norms 1 and 90, 0.25 ... 135; non-positive ignored."""
    want = sorted({0.0, 1.0, 90.0, *np.geomspace(0.25, 135.0, 4).tolist()})
    assert L.default_magnitudes([1.0, 90.0], 4) == pytest.approx(want)
    assert L.default_magnitudes([-1.0, 1.0, 90.0], 4) == pytest.approx(want)


def test_abs_histogram_bins_are_closed_on_the_left_and_the_top_bin_takes_the_overflow():
    base = {"a.weight": torch.zeros(6)}
    tuned = {"a.weight": torch.tensor([0.5, -1.0, 2.0, -3.0, 4.0, -5.0])}
    counts, below, total = SP.abs_histogram(base, tuned, np.array([1.0, 2.0, 4.0]))
    # [1, 2): |-1|; [2, 4): 2, |-3|, and 4, |-5| (>= the last edge); below 1: 0.5
    assert counts.tolist() == [1.0, 4.0] and (below, total) == (1, 6)


def test_taus_for_sparsity_against_a_hand_computed_histogram():
    """Edges 1, 2, 4, 8, 16; |d| = 0.5, 1.5, 3, 5: the fraction below each upper edge is 1/2, 3/4, 1, 1. A target
    takes the first upper edge whose fraction reaches it; 0 keeps the whole update, 1 reverts all of it."""
    base, tuned = {"a.weight": torch.zeros(4)}, {"a.weight": torch.tensor([0.5, -1.5, 3.0, -5.0])}
    targets = [0.0, 0.5, 0.6, 0.75, 1.0]
    taus = SP.taus_for_sparsity(base, tuned, targets, bins=4, lo=1.0, hi=16.0)
    assert taus == pytest.approx([0.0, 2.0, 4.0, 4.0, 8.0], rel=1e-12)
    assert SP.sparsity_at(base, tuned, taus) == [0.0, 0.5, 0.75, 0.75, 1.0]
    # the kept entries are the largest |d|: at the 0.5 target, 3 and -5 survive
    assert SP.threshold_update(tuned["a.weight"], taus[1]).tolist() == [0.0, 0.0, 3.0, -5.0]


def test_threshold_update_leaves_its_input_alone():
    d = torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64)
    kept = SP.threshold_update(d, 0.15)
    assert kept.tolist() == [0.0, -0.2, 0.3] and d.tolist() == [0.1, -0.2, 0.3]
    assert SP.threshold_update(d, 0.0).tolist() == d.tolist()  # tau 0: the full update


def test_sparsity_sweep_sorts_thresholds_skips_repeats_and_keeps_base_and_tuned(monkeypatch):
    """Thresholds given out of order are swept in increasing order; one that reverts exactly the same entries
    as the previous one is not evaluated again; the base and tuned models are read, never written."""
    base, tuned, work = tiny(0), tiny(1), tiny(2)
    pb, pt = params(base), params(tuned)
    calls = []
    acc = fake_accuracy(tuned)
    monkeypatch.setattr(SP, "accuracy", lambda *a, **kw: calls.append(1) or acc(*a))
    res = SP.sparsity_sweep(work, None, base, tuned, {"t": (None, [0])}, None, taus=[1e3, 0.0, 1e-30])
    assert [r["tau"] for r in res["rows"]] == [0.0, 1e3]
    assert res["rows"][1]["sparsity"] == 1.0 and res["rows"][1]["accuracy"]["t"] < 1.0
    assert len(calls) == 3  # two rows and the base
    norm = np.sqrt(sum(float(((pt[n] - pb[n]) ** 2).sum()) for n in pb))
    assert res["update_norm"] == pytest.approx(norm, rel=1e-9)
    assert all(torch.equal(v, pb[n]) for n, v in params(base).items())
    assert all(torch.equal(v, pt[n]) for n, v in params(tuned).items())


def test_sweep_table_rows_print_tau_sparsity_and_accuracy_then_the_base():
    """A result that recorded neither the targets nor the constant answers (an older cache): n/a for both."""
    res = {"rows": [{"tau": 0.0, "sparsity": 0.125, "accuracy": {"a": 0.5, "b": 0.25}},
                    {"tau": 2e-5, "sparsity": 0.78, "accuracy": {"a": 0.375, "b": 0.0}}],
           "base_accuracy": {"a": 0.1, "b": 0.2}}
    rows = SP.sweep_table_rows(SP.SparsitySweep("es", ["b", "a"], res))
    assert rows == [["0", "n/a", "12.5%", "25.0%", "50.0%"], ["2.000e-05", "n/a", "78.0%", "0.0%", "37.5%"],
                    ["base (all reverted)", "", "100%", "20.0%", "10.0%"],
                    ["best constant answer", "", "", "n/a", "n/a"]]


def test_magnitude_points_counts_the_grid_points_besides_zero_and_the_norms():
    """`--magnitude-points N` adds N points of geomspace(min / 4, 1.5 max) (its help: "besides 0 and the update
    norms"); 0 and 1 once still added the grid's two ends. Norm 2: grid ends 0.5 and 3."""
    from esft.analysis.commands import LandscapeConfig
    from esft.analysis.report_builder import ReportConfig

    assert L.default_magnitudes([2.0], 0) == [0.0, 2.0]
    assert L.default_magnitudes([2.0], 1) == pytest.approx([0.0, 0.5, 2.0])
    assert L.default_magnitudes([2.0], 2) == pytest.approx([0.0, 0.5, 2.0, 3.0])
    with pytest.raises(ValueError, match="magnitude points must be >= 0, got -1"):
        L.default_magnitudes([2.0], -1)
    assert LandscapeConfig(magnitude_points=0).magnitude_points == 0
    assert ReportConfig(dir=".", magnitude_points=0).magnitude_points == 0
    with pytest.raises(ValueError, match="magnitude_points = -1 is not accepted; expected an integer >= 0"):
        ReportConfig(dir=".", magnitude_points=-1)


def test_a_random_direction_matches_the_norm_of_a_one_entry_tensor():
    """Norm-matched tensor by tensor, however small the tensor: a one-entry parameter whose reference norm is 3
    gets |r| = 3 for every seed (a single Gaussian draw is often below 1)."""
    class Fixed(L.Direction):
        def tensor_norms(self):
            return {"w": 3.0}

    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.zeros(1))
    for seed in range(10):
        r = L.RandomDirection(Fixed(), seed=seed).bind(model).tensor("w")
        assert float(r.abs()) == pytest.approx(3.0)


def test_a_short_direction_is_walked_to_each_distance_and_a_zero_one_stays_at_the_origin(monkeypatch):
    """A direction of norm below 1 (one norm gain moved by 1e-3) is still scaled to unit length, so distance 0.1
    lands 0.1 from the origin; an update that moved nothing has no direction and leaves the origin in place
    (no division by its zero norm)."""
    a, near, work = tiny(0), tiny(0), tiny(2)
    with torch.no_grad():
        near.model.norm.weight.add_(1e-3)
    monkeypatch.setattr(L, "accuracy", fake_accuracy(a))
    tasks = {"t": (None, [0] * 10)}
    short, zero = L.DeltaDirection(a, near, "short"), L.DeltaDirection(a, tiny(0), "zero")
    sw = L.direction_sweep(work, None, a, [short, zero], [0.0, 0.1], tasks, None)
    assert sw["directions"]["short"]["norm"] == pytest.approx(1e-3 * 4, rel=1e-3)  # 16 entries moved by 1e-3
    assert sw["directions"]["short"]["accuracy"]["t"] == pytest.approx([1.0, 0.9], abs=1e-5)
    assert sw["directions"]["zero"]["norm"] == 0.0
    assert sw["directions"]["zero"]["accuracy"]["t"] == pytest.approx([1.0, 1.0], abs=1e-12)


def test_paired_barrier_draws_each_line_between_the_paths_own_endpoints():
    """A path extended past the two models (ts -1, 0, 1, as `interpolation_path` makes of ts [-1]): each example's
    line runs from its score at t = -1 to its score at t = 1, so at t = 0 it stands halfway. Scores (0, 0), (0, 0.5),
    (1, 1): lines at t = 0 are (0.5, 0.5), drops (0.5, 0): mean 0.25, sample sd sqrt(1/8), SE 0.25; z = 1 < 1.96."""
    b = B.paired_barrier([-1, 0, 1], [[0, 0], [0, 0.5], [1, 1]])
    assert b["max_drop"] == pytest.approx(0.25) and b["at"] == 0.0 and b["line_at"] == pytest.approx(0.5)
    assert b["se"] == pytest.approx(0.25) and not b["barrier"]
    assert b["linear"] == pytest.approx([0.0, 0.5, 1.0])


def test_path_barrier_falls_back_to_the_test_of_means_on_the_scores_scale():
    """The paired test needs all n scores at every point. A point without them: an accuracy gets the binomial SE
    of the line's value (1 at t = 0.5: SE 0, so the drop of 0.5 is a barrier); a mean reward gets each point's
    sample sd over sqrt(n) (scores 1, 3 at t = 0.5: sd sqrt 2, SE sqrt(2) / 2 = 0.707 with n = 4; the drop of 1 is
    below 2 SE)."""
    from esft.tasks.labels import ACCURACY, MEAN_REWARD

    acc = B.path_barrier([0, 0.5, 1], [1.0, 0.5, 1.0], [[1, 1, 1, 1], None, [1, 1, 1, 1]], 4, ACCURACY)
    assert acc["se_of"] == B.BINOMIAL and acc["se"] == 0.0 and acc["max_drop"] == pytest.approx(0.5)
    assert acc["barrier"]
    reward = B.path_barrier([0, 0.5, 1], [3.0, 2.0, 3.0], [[2, 4, 2, 4], [1, 3], [2, 4, 2, 4]], 4, MEAN_REWARD)
    assert reward["se_of"] == B.SAMPLE and reward["se"] == pytest.approx(math.sqrt(2) / 2)
    assert reward["max_drop"] == pytest.approx(1.0) and not reward["barrier"]
