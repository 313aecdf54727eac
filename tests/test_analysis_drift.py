"""Drift analysis: the random-walk prediction, through-origin fits, drift-log parsing, ES replay.

Run: `pytest -q tests/test_analysis_drift.py` (a few seconds).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from esft.analysis import drift as D


def test_predicted_sq_drift_formula():
    assert D.predicted_sq_drift(0.00075, 100, 4.02e9, 30) == pytest.approx(0.00075 ** 2 * 100 * 4.02e9 / 30)
    steps = np.arange(1, 4)
    assert np.allclose(D.predicted_sq_drift(0.1, steps, 10, 5), 0.01 * steps * 10 / 5)


def test_fit_through_origin_against_lstsq_and_r2_against_definition():
    rng = np.random.default_rng(0)
    x = np.arange(1, 40, dtype=float)
    y = 3.0 * x + rng.normal(0, 2, x.size)
    f = D.fit_through_origin(x, y)
    k_ref = np.linalg.lstsq(x[:, None], y, rcond=None)[0][0]
    assert f["slope"] == pytest.approx(k_ref, rel=1e-12)
    resid = y - k_ref * x
    assert f["r2"] == pytest.approx(1 - resid @ resid / ((y - y.mean()) ** 2).sum(), rel=1e-12)
    # with an intercept-free line the centred R^2 is below the ordinary regression's (scipy), and can be < 0
    assert f["r2"] <= scipy.stats.linregress(x, y).rvalue ** 2 + 1e-12
    saturating = 5 - 5 * np.exp(-x)  # rises then flattens, like an RMSNorm gain
    assert D.fit_through_origin(x, saturating)["r2"] < 0
    assert np.isnan(D.r2_score([1.0, 1.0], [1.0, 1.0]))
    # a constant whose mean rounds off it (an ES run whose updates after the first were all zero) has no R^2 either:
    # its SS_tot of ~1e-35 once gave R^2 = -1e31
    flat = [0.015554449777767616] * 3
    assert np.mean(flat) != flat[0] and np.isnan(D.r2_score(flat, [0.01, 0.02, 0.03]))


def random_walk(alpha, population, steps, shapes, seed=0):
    """The ES update with z-scored fitness: theta += (alpha / N) sum_n z_n eps_n, per tensor."""
    rng = np.random.default_rng(seed)
    theta = {k: np.zeros(s) for k, s in shapes.items()}
    records = []
    for t in range(1, steps + 1):
        f = rng.random(population)
        z = (f - f.mean()) / f.std()
        for k, s in shapes.items():
            eps = rng.standard_normal((population, int(np.prod(s))))
            theta[k] += (alpha / population) * (z @ eps).reshape(s)
        per = {k: float((v ** 2).sum()) for k, v in theta.items()}
        records.append({"step": t, "total": sum(per.values()), "per_tensor": per,
                        "numel": {k: int(np.prod(s)) for k, s in shapes.items()}})
    return records


def test_fit_recovers_rho_one_on_random_walk():
    shapes = {"model.layers.0.self_attn.q_proj.weight": (96, 96), "model.layers.0.mlp.up_proj.weight": (96, 192),
              "model.layers.1.self_attn.q_proj.weight": (96, 96)}
    alpha, n = 0.01, 10
    s = D.series_from_records(random_walk(alpha, n, 80, shapes))
    res = D.analyze_series(s, alpha, n)
    assert res["num_params"] == 96 * 96 * 2 + 96 * 192
    assert res["total"]["rho"] == pytest.approx(1.0, abs=0.02)
    assert res["total"]["r2_fit"] > 0.99
    assert res["total"]["r2_theory"] > 0.99
    for row in res["tensors"]:
        assert row["rho"] == pytest.approx(1.0, abs=0.05), row
        assert row["r2_fit"] > 0.98, row
    fam = res["families"]["q_proj"]
    assert fam["n"] == 2 and fam["rho"]["q1"] <= fam["rho"]["median"] <= fam["rho"]["q3"]
    assert set(res["kinds"]) == {"attention", "mlp"}


def test_series_parsing_accepts_grpo_spellings_and_torn_lines(tmp_path):
    p = tmp_path / "drift.jsonl"
    with open(p, "w") as fh:
        fh.write(json.dumps({"global_step": 0, "sq_total": 0.0, "tensors": {"model.norm.weight": 0.0}}) + "\n")
        for t in (1, 2, 3):
            fh.write(json.dumps({"global_step": t, "sq_total": 0.5 * t,
                                 "tensors": {"model.norm.weight": 0.1 * t, "lm_head.weight": 0.4 * t}}) + "\n")
        fh.write('{"global_step": 4, "sq_to')
    s = D.read_series(p, numel={"model.norm.weight": 8, "lm_head.weight": 64})
    assert s.steps == [1, 2, 3] and s.total == [0.5, 1.0, 1.5]
    assert set(s.per_tensor) == {"norm", "lm_head"} and s.numel == {"norm": 8, "lm_head": 64}
    assert s.num_params == 72
    out = s.write(tmp_path / "copy.jsonl")
    again = D.read_series(out)
    assert again.steps == s.steps and again.per_tensor == s.per_tensor and again.numel == s.numel


def test_displacement_ratio_at_matched_step():
    es = D.DriftSeries([1, 2, 3, 4], [4.0, 8.0, 12.0, 16.0])
    grpo = D.DriftSeries([1, 2, 3], [0.01, 0.02, 0.04])
    r = D.displacement_ratio(es, grpo)
    assert r["step"] == 3 and r["ratio"] == pytest.approx(np.sqrt(12.0 / 0.04))


def test_es_replay_drift_matches_the_law(tmp_path, tokenizer):
    """Synthetic seeds.jsonl, replayed through esft.es.replay: the law holds to sampling noise."""
    from analysis_runs import make_base, make_es_run

    base = make_base(tmp_path, tokenizer, hidden=16)
    run = make_es_run(tmp_path, base, steps=6, population=6, alpha=0.01)
    s = D.es_series(run)
    assert s.steps == [1, 2, 3, 4, 5, 6]
    assert s.expected is not None
    res = D.analyze_series(s, 0.01, 6)
    assert res["total"]["final_ratio"] == pytest.approx(1.0, abs=0.01)  # ~800k parameters: tiny noise
    assert res["r2_logged_expectation"] > 0.999
    assert {"embed_tokens", "q_proj", "input_layernorm", "norm"} <= set(res["families"])
    # theta_T from replay equals the saved final checkpoint: the drift is that of the checkpoint
    from esft.analysis.weights import update_norm

    assert update_norm(base, run / "checkpoints" / "final")["total"] ** 2 == pytest.approx(s.total[-1], rel=1e-6)


def test_the_replay_bar_counts_the_steps_it_will_replay(tmp_path, tokenizer, monkeypatch):
    """The report's `replay` bar had no total: it counted steps without saying how many were coming."""
    import tqdm.auto

    from analysis_runs import make_base, make_es_run

    totals = []

    class Bar(tqdm.auto.tqdm):
        def __init__(self, *args, **kwargs):
            if kwargs.get("desc") == "replay":
                totals.append(kwargs.get("total"))
            super().__init__(*args, **{**kwargs, "disable": True})

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    base = make_base(tmp_path, tokenizer, hidden=16)
    run = make_es_run(tmp_path, base, steps=3, population=4, alpha=0.01)
    assert D.es_series(run, progress=True).steps == [1, 2, 3] and totals == [3]
    assert D.es_series(run, upto=2, progress=True).steps == [1, 2] and totals == [3, 2]


def test_plots_write_files(tmp_path):
    shapes = {"model.layers.0.self_attn.q_proj.weight": (8, 8), "model.layers.0.input_layernorm.weight": (8,),
              "model.norm.weight": (8,)}
    s = D.series_from_records(random_walk(0.01, 4, 10, shapes))
    res = D.analyze_series(s, 0.01, 4)
    paths = [D.plot_total(s, 0.01, 4, tmp_path / "a.png", grpo=s), D.plot_families(res, tmp_path / "b.png"),
             D.plot_tensor_curves(s, res, 0.01, 4, tmp_path / "c.png"), D.plot_rho_r2(res, tmp_path / "d.png")]
    assert all(p.stat().st_size > 5000 for p in paths)


def test_fit_through_origin_refuses_an_all_zero_x():
    with pytest.raises(ValueError, match="nonzero x"):
        D.fit_through_origin([0.0, 0.0], [1.0, 2.0])
    assert D.fit_through_origin([1.0], [3.0])["slope"] == 3.0  # sum x^2 = 1 is an ordinary x


def test_quartiles_are_the_25_50_75_percentiles_of_the_values_given():
    q = D.quartiles([1.0, None, 2.0, float("nan"), 3.0, 4.0, 100.0])  # None and NaN: no value
    assert q == {"n": 5, "median": 3.0, "q1": 2.0, "q3": 4.0, "min": 1.0, "max": 100.0}


def test_records_without_a_step_or_a_total_are_skipped():
    recs = [{"step": 1, "total": 1.0}, {"step": 2, "loss": 0.3}, {"note": "eval"}, {"step": 2, "total": 2.5}]
    s = D.series_from_records(recs)
    assert s.steps == [1, 2] and s.total == [1.0, 2.5]


def test_final_drift_is_compared_at_the_last_step():
    """final_sq, its ratio to alpha^2 T d / N and to the logged expectation are those of the last step."""
    # the first step had no fitness spread: no update, expectation 0
    s = D.DriftSeries([1, 2, 3], [0.0, 2.0, 6.0], num_params=100, expected=[0.0, 3.0, 4.0])
    res = D.analyze_series(s, alpha=0.1, population=5)
    pred = 0.01 * 3 * 100 / 5
    assert res["total"]["final_sq"] == 6.0 and res["total"]["predicted_final_sq"] == pytest.approx(pred)
    assert res["total"]["final_ratio"] == pytest.approx(6.0 / pred)
    assert res["final_over_logged_expectation"] == pytest.approx(6.0 / 4.0)
    assert res["r2_logged_expectation"] == pytest.approx(D.r2_score([0.0, 2.0, 6.0], [0.0, 3.0, 4.0]))
    s.expected = [1.0, 3.0, 0.0]
    assert D.analyze_series(s, alpha=0.1, population=5)["final_over_logged_expectation"] is None


def test_displacement_ratio_falls_back_to_the_last_common_step():
    es = D.DriftSeries([1, 2, 3], [4.0, 8.0, 12.0])
    grpo = D.DriftSeries([1, 2, 3, 4, 5], [0.01, 0.02, 0.04, 0.05, 0.06])  # ES stopped before GRPO's last step
    r = D.displacement_ratio(es, grpo)
    assert r["step"] == 3 and r["ratio"] == pytest.approx(np.sqrt(12.0 / 0.04))
    assert D.displacement_ratio(es, grpo, step=2) == {"step": 2, "es_sq": 8.0, "grpo_sq": 0.02,
                                                      "ratio": pytest.approx(20.0)}
    assert D.displacement_ratio(es, D.DriftSeries([], [])) is None
    assert D.displacement_ratio(D.DriftSeries([], []), grpo) is None


def test_fit_drift_against_hand_computed_random_walk_values():
    """sq = 2T with alpha = 0.1, N = 5: slope 2, d_eff = 2 * 5 / 0.01 = 1000; against a tensor of 1000 entries
    the law alpha^2 T d / N = 2T is the data itself (rho 1, both R^2 = 1); against 500 entries it predicts T:
    rho 2 and R^2 of the theory 1 - sum(T^2) / sum((2T - 4)^2) = 1 - 14 / 8."""
    steps, sq = [1, 2, 3], [2.0, 4.0, 6.0]
    f = D.fit_drift(steps, sq, alpha=0.1, population=5, numel=1000)
    assert f["slope"] == pytest.approx(2.0) and f["d_eff"] == pytest.approx(1000.0)
    assert f["rho"] == pytest.approx(1.0) and f["r2_fit"] == pytest.approx(1.0) and f["r2_theory"] == pytest.approx(1.0)
    half = D.fit_drift(steps, sq, alpha=0.1, population=5, numel=500)
    assert half["rho"] == pytest.approx(2.0) and half["r2_theory"] == pytest.approx(1 - 14 / 8)
    assert D.fit_drift(steps, sq, alpha=0.1, population=5, numel=0)["rho"] is None  # no entries: no ratio


def test_a_zero_update_and_a_single_step_have_no_r2():
    """R^2 is undefined (None, not NaN) when the squared drift is constant: no update at all, or one step."""
    zero = D.fit_drift([1, 2, 3], [0.0, 0.0, 0.0], alpha=0.1, population=5, numel=10)
    assert zero["slope"] == 0.0 and zero["rho"] == 0.0 and zero["r2_fit"] is None and zero["r2_theory"] is None
    one = D.fit_drift([4], [0.8], alpha=0.1, population=5, numel=10)
    assert one["slope"] == pytest.approx(0.2) and one["r2_fit"] is None and one["r2_theory"] is None
    res = D.analyze_series(D.DriftSeries([1, 2], [0.0, 0.0], num_params=10), alpha=0.1, population=5)
    assert res["total"]["r2_fit"] is None and res["total"]["final_ratio"] == 0.0


def test_quartiles_interpolate_between_values():
    assert D.quartiles([1.0, 2.0, 3.0, 4.0]) == {"n": 4, "median": 2.5, "q1": 1.75, "q3": 3.25, "min": 1.0,
                                                 "max": 4.0}
    assert D.quartiles([None, float("nan")])["median"] is None


def test_series_keeps_complete_tensor_series_and_counts_the_logged_tensors_once():
    """A tensor missing from a step is dropped (its series would not line up with the steps); d counts the
    entries of the logged tensors only, so a tied lm_head listed in `numel` but not logged is not counted twice."""
    recs = [{"step": 1, "total": 1.0, "per_tensor": {"model.norm.weight": 0.1, "model.embed_tokens.weight": 0.9}},
            {"step": 2, "total": 2.0, "per_tensor": {"model.norm.weight": 0.2}},
            {"step": 3, "total": 3.0, "per_tensor": {"model.norm.weight": 0.3}}]
    numel = {"model.norm.weight": 8, "model.embed_tokens.weight": 64, "lm_head.weight": 64}
    s = D.series_from_records(recs, numel=numel)
    assert s.per_tensor == {"norm": [0.1, 0.2, 0.3]}
    assert s.num_params == 8
    header = [{"header": True, "num_params": 1000, "numel": numel}] + recs
    assert D.series_from_records(header).num_params == 1000  # a logged count is kept


def test_the_logged_expectation_needs_every_step():
    recs = [{"step": 1, "total": 1.0, "expected": 1.0}, {"step": 2, "total": 2.0}]
    assert D.series_from_records(recs).expected is None
    recs[1]["expected"] = 2.0
    assert D.series_from_records(recs).expected == [1.0, 2.0]


def test_tensors_with_one_canonical_name_keep_both_series():
    """Two towers' layer 0 (a vision and a language model) map onto one canonical name: the second keeps its
    stored name, as in the weight analysis (esft.analysis.canonical.canonical_refs), instead of replacing the
    first one's series and count."""
    a, b = "model.vision_tower.layers.0.mlp.fc1.weight", "model.language_model.layers.0.mlp.up_proj.weight"
    recs = [{"step": s, "total": 3.0 * s, "per_tensor": {a: 1.0 * s, b: 2.0 * s}, "numel": {a: 10, b: 20}}
            for s in (1, 2)]
    s = D.series_from_records(recs)
    assert s.per_tensor == {"layers.0.up_proj": [1.0, 2.0], b: [2.0, 4.0]}
    assert s.numel == {"layers.0.up_proj": 10, b: 20}
    assert s.num_params == 30
    again = D.series_from_records([{"header": True, "numel": s.numel}] + s.to_records())  # the report's cache
    assert again.per_tensor == s.per_tensor and again.numel == s.numel


def test_bias_drift_keeps_its_own_name():
    assert D.canonical_drift_name("model.layers.2.self_attn.q_proj.bias") == "layers.2.q_proj.bias"
    assert D.canonical_drift_name("model.layers.2.self_attn.q_proj.weight") == "layers.2.q_proj"


def test_analyze_series_reports_the_last_step_and_skips_what_it_cannot_fit():
    """`steps` is the last step (not the record count); the final values are those of the last record; no total
    fit without a parameter count; tensors without an entry count are left out; a family whose tensors differ
    in size has no common numel; an empty series is refused."""
    s = D.DriftSeries([10, 30, 20], [1.0, 3.0, 2.0], num_params=100, expected=[1.0, 5.0, 2.0],
                      per_tensor={"layers.0.q_proj": [1, 3, 2], "layers.1.q_proj": [1, 3, 2], "norm": [0, 1, 1]},
                      numel={"layers.0.q_proj": 10, "layers.1.q_proj": 20})
    res = D.analyze_series(s, alpha=0.1, population=5)
    assert res["steps"] == 30
    assert res["total"]["predicted_final_sq"] == pytest.approx(0.01 * 20 * 100 / 5)  # the last record's step
    assert res["final_over_logged_expectation"] == pytest.approx(1.0)
    assert [r["name"] for r in res["tensors"]] == ["layers.0.q_proj", "layers.1.q_proj"]
    assert res["families"]["q_proj"]["n"] == 2 and res["families"]["q_proj"]["numel"] is None
    assert "total" not in D.analyze_series(D.DriftSeries([1], [1.0]), alpha=0.1, population=5)
    with pytest.raises(ValueError, match="no drift records"):
        D.analyze_series(D.DriftSeries([], []), alpha=0.1, population=5)


def test_rho_r2_figure_without_a_fitted_tensor_warns_nothing(tmp_path):
    """A run whose tensors have no fit (one step, or no movement) drew an empty legend: matplotlib's "No artists
    with labels found to put in legend" reached the user as `esft: warning: ...` from `esft analyze drift`."""
    import warnings

    from esft.analysis.drift import plot_rho_r2

    tensors = [{"kind": "attention", "rho": 0.0, "r2_fit": None}, {"kind": "norm", "rho": None, "r2_fit": None}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plot_rho_r2({"tensors": tensors}, tmp_path / "rho.png").exists()


def test_drift_figures_of_a_short_run_tick_whole_steps(tmp_path, monkeypatch):
    """A two-step run's step axes were autoscaled to 1.0, 1.2, ..., 2.0: steps are whole numbers."""
    import esft.analysis.plots as plots

    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, path: figures.append(fig) or Path(path))
    shapes = {"model.layers.0.self_attn.q_proj.weight": (8, 8), "model.norm.weight": (8,)}
    s = D.series_from_records(random_walk(0.01, 4, 2, shapes))
    D.plot_total(s, 0.01, 4, tmp_path / "a.png", grpo=s)
    D.plot_tensor_curves(s, D.analyze_series(s, 0.01, 4), 0.01, 4, tmp_path / "c.png")
    axes = [ax for fig in figures for ax in fig.axes if ax.get_xlabel() == "step T"]
    assert len(axes) >= 3
    for ax in axes:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_a_series_of_totals_alone_counts_every_tensor_the_numel_names():
    """No per-tensor series to pick the logged tensors from: d is the sum of every entry count given (8 + 64),
    the dimension the random-walk law's alpha^2 T d / N needs."""
    recs = [{"step": 1, "total": 1.0}, {"step": 2, "total": 2.0}]
    s = D.series_from_records(recs, numel={"model.norm.weight": 8, "model.embed_tokens.weight": 64})
    assert s.per_tensor == {} and s.num_params == 72


def test_a_family_of_equal_tensors_reports_their_common_size_and_each_tensor_its_last_step():
    s = D.DriftSeries([1, 2], [1.0, 2.0], per_tensor={"layers.0.q_proj": [1.0, 2.0], "layers.1.q_proj": [2.0, 4.0]},
                      numel={"layers.0.q_proj": 10, "layers.1.q_proj": 10})
    res = D.analyze_series(s, alpha=0.1, population=5)
    fam = res["families"]["q_proj"]
    assert fam["n"] == 2 and fam["numel"] == 10
    assert [r["final_sq"] for r in res["tensors"]] == [2.0, 4.0]  # each tensor's last step
