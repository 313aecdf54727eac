"""Uncertainty of the post-training analyses' numbers: KL's standard error over sequences (`esft analyze kl`, the
report's KL tables), Wilson intervals of the landscape and functional-sparsity accuracies.

Run: `pytest -q tests/test_analysis_uncertainty.py` (about 5 s, no model).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from esft.analysis import kl as K
from esft.analysis import kl_report as KR
from esft.analysis.command_text import format_kl


def _seqs(rows):
    return [K.SequenceKL(t, x, x, x) for t, x in rows]


def test_kl_summary_records_the_standard_error_over_sequences():
    """Hand-computed: sums 0 and 2 over 1 token each: token mean 1, residuals -1 and 1, SE sqrt(2 * 2) / 2 = 1;
    the per-sequence mean's SE is the sample std sqrt(2) / sqrt(2) = 1."""
    s = K.summarize(_seqs([(1, 0.0), (1, 2.0)]))
    assert s["k3_token_mean"] == 1.0
    assert s["k3_token_mean_se"] == pytest.approx(1.0) and s["k3_seq_mean_se"] == pytest.approx(1.0)
    # unequal lengths: R = 2 / 4, residuals 1 - 0.5 and 1 - 1.5: SE sqrt(2 * 0.5) / 4; equal sums: seq SE 0
    s = K.summarize(_seqs([(1, 1.0), (3, 1.0)]))
    assert s["exact_token_mean_se"] == pytest.approx(0.25) and s["exact_seq_mean_se"] == 0.0
    # equal lengths L: the token mean is the sequence mean / L, and so is its SE
    rng = np.random.default_rng(0)
    x = rng.random(7)
    s = K.summarize(_seqs([(4, float(v)) for v in x]))
    assert s["k1_token_mean_se"] == pytest.approx(np.std(x, ddof=1) / math.sqrt(7) / 4, rel=1e-12)
    # one sequence has no spread to measure
    one = K.summarize(_seqs([(3, 1.0)]))
    assert one["k3_token_mean_se"] is None and one["k3_seq_mean_se"] is None


def test_kl_standard_error_leaves_the_estimate_bit_identical():
    rng = np.random.default_rng(1)
    seqs = [K.SequenceKL(int(t), *map(float, rng.normal(size=3))) for t in rng.integers(1, 30, size=11)]
    s = K.summarize(seqs)
    tokens = sum(q.tokens for q in seqs)
    for e in K.ESTIMATORS:
        total = sum(getattr(q, e) for q in seqs)
        assert s[f"{e}_token_mean"] == total / tokens and s[f"{e}_seq_mean"] == total / len(seqs)


def test_kl_printed_lines_and_report_tables_show_the_standard_error():
    s = K.summarize(_seqs([(1, 0.0), (1, 2.0)]))
    res = {"incremental": {"a": {"1:a": s}}, "cumulative": {"a": {"1:a": s}}}
    line = format_kl(res).splitlines()[0]
    assert "k3/token 1 ± 1  " in line and "k3/seq 1 ± 1  " in line and "exact/token 1 ± 1" in line
    one = {"stages": ["1:a"], "tasks": ["a"], "incremental": {"a": {"1:a": s}}, "cumulative": {"a": {"1:a": s}}}
    group = KR.KLGroup("es", "es", ("a",), [one], K.aggregate_seeds([one]))
    assert KR.kl_rows(group, "incremental")[1] == [["a", "1 ± 1"]]
    # several seeds: median [min, max] over seeds ± the median of their SEs
    tables = [{"stages": ["1:a"], "tasks": ["a"],
               **{k: {"a": {"1:a": {"k3_token_mean": v, "k3_token_mean_se": se}}} for k in ("incremental",
                                                                                           "cumulative")}}
              for v, se in ((0.1, 0.01), (0.3, 0.03), (0.2, 0.05))]
    agg = K.aggregate_seeds(tables)
    assert agg["incremental"]["a"]["1:a"]["se"] == pytest.approx(0.03)
    group = KR.KLGroup("es", "es", ("a",), tables, agg)
    assert KR.kl_rows(group, "cumulative")[1] == [["a", "0.2 [0.1, 0.3] ± 0.03"]]
    assert "median SE over sequences 0.03" in format_kl(agg)
    # a result computed before results recorded the SE prints its value alone
    old = tables
    for t in old:
        for kind in ("incremental", "cumulative"):
            t[kind]["a"]["1:a"].pop("k3_token_mean_se")
    assert KR.kl_rows(KR.KLGroup("es", "es", ("a",), old, K.aggregate_seeds(old)), "incremental")[1] == \
        [["a", "0.2 [0.1, 0.3]"]]


def test_a_kl_cell_beside_the_studys_mean_and_std_shows_ours_too():
    """Tables 13-14 print mean +- std over seeds: ours of several seeds stands beside them; Table 12's median
    [min, max] cells and one seed's cells get none."""
    tables = [{"stages": ["1:countdown"], "tasks": ["countdown"],
               **{k: {"countdown": {"1:countdown": {"k3_token_mean": v}}} for k in ("incremental", "cumulative")}}
              for v in (0.1, 0.3, 0.2)]
    es = KR.KLGroup("es", "es", ("countdown",), tables, K.aggregate_seeds(tables))
    assert KR.kl_rows(es, "cumulative")[1] == [["countdown", "0.2 [0.1, 0.3]; mean 0.2 +- 0.1 (paper 0.206 +- 0.023)"]]
    grpo = KR.KLGroup("grpo", "grpo", ("countdown",), tables, K.aggregate_seeds(tables))
    assert KR.kl_rows(grpo, "incremental")[1] == [["countdown", "0.2 [0.1, 0.3] (paper 0.381 [0.293, 0.454])"]]
    one = KR.KLGroup("es", "es", ("countdown",), tables[:1], K.aggregate_seeds(tables[:1]))
    assert KR.kl_rows(one, "cumulative")[1] == [["countdown", "0.1 (paper 0.206 +- 0.023)"]]


def _wilson_pct(acc, n):
    from esft.tasks.labels import wilson_interval

    lo, hi = wilson_interval(acc * n, n)
    return f"{100 * acc:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def test_landscape_and_sparsity_accuracies_carry_their_wilson_interval_over_n():
    """Figure 4's table, the functional-sparsity table and `esft analyze landscape`'s lines: each accuracy with
    the 95% Wilson interval over the n examples the result recorded (esft.tasks.labels.wilson_interval)."""
    from esft.analysis import sparsity as SP
    from esft.analysis.command_text import format_landscape
    from esft.analysis.landscape_tables import sweep_notes, sweep_rows

    sweep = {"magnitudes": [0.0, 1.0], "n": {"boolq": 20}, "score": {"boolq": "accuracy"},
             "directions": {"ES": {"norm": 2.0, "accuracy": {"boolq": [0.55, 0.9]}}}}
    _, rows = sweep_rows(sweep)
    assert rows == [["ES", "2", "boolq", _wilson_pct(0.55, 20), _wilson_pct(0.9, 20)]]
    assert rows[0][3] == "55.0% [34.2, 74.2]"
    assert "over the evaluated examples (boolq n = 20)" in sweep_notes(sweep)[-1]
    line = format_landscape({"directions": sweep}).splitlines()[0]
    assert line == "ES (norm 2) boolq: 0.550 [0.342, 0.742]; 0.900 [0.699, 0.972]"
    res = {"rows": [{"tau": 0.1, "sparsity": 0.5, "targets": [0.5], "accuracy": {"boolq": 0.55}}],
           "base_accuracy": {"boolq": 0.9}, "n": {"boolq": 20}, "score": {"boolq": "accuracy"}}
    sw = SP.SparsitySweep("es", ["boolq"], res)
    rows = SP.sweep_table_rows(sw)
    assert rows[0][3] == "55.0% [34.2, 74.2]" and rows[1][3] == _wilson_pct(0.9, 20)
    assert SP.sweep_table_notes(sw) == ["[a, b]: the 95% Wilson interval of the accuracy over the evaluated "
                                        "examples (boolq n = 20)."]


def test_report_of_a_checkpoint_folder_names_the_run_it_is_inside(tmp_path):
    """`esft report RUN/checkpoints/final`: the refusal says which folder is the run, not only that none is
    under the checkpoint."""
    from esft.analysis.report_builder import ReportConfig, build_report

    run = tmp_path / "es"
    final = run / "checkpoints" / "final"
    final.mkdir(parents=True)
    (final / "config.json").write_text("{}")
    (run / "config.yaml").write_text("algorithm: es\n")
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError) as err:
        build_report(ReportConfig(dir=str(final), analyses=[]), progress=False)
    assert f"is inside the run folder {run.resolve()}: give that (esft report {run.resolve()})" in str(err.value)
    # a folder inside no run says only that it holds none
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError) as err:
        build_report(ReportConfig(dir=str(empty), analyses=[]), progress=False)
    assert "no run directory under" in str(err.value) and "inside the run" not in str(err.value)


def test_drift_figures_of_a_single_step_tick_that_whole_step(tmp_path, monkeypatch):
    """An ES run of one iteration (or GRPO of one step): one point per axis, whose autoscaled axis ticked
    0.94, 0.96, ..., 1.06 (MaxNLocator(integer=True) gives up with fewer than two integers in view)."""
    import esft.analysis.plots as plots
    from esft.analysis import drift as D

    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, path: figures.append(fig) or path)
    per = {"model.layers.0.self_attn.q_proj.weight": 0.02, "model.norm.weight": 0.01}
    numel = {"model.layers.0.self_attn.q_proj.weight": 64, "model.norm.weight": 8}
    s = D.series_from_records([{"step": 1, "total": 0.03, "per_tensor": per, "numel": numel}])
    D.plot_total(s, 0.01, 4, tmp_path / "a.png", grpo=s)
    D.plot_tensor_curves(s, D.analyze_series(s, 0.01, 4), 0.01, 4, tmp_path / "c.png")
    axes = [ax for fig in figures for ax in fig.axes if ax.get_xlabel() == "step T" or ax.get_title() == "GRPO"]
    assert len(axes) >= 4  # both panels of Figure 9, its GRPO inset and a tensor panel
    for ax in axes:
        lo, hi = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert ticks == [1.0], (ax.get_title(), ticks)
    for fig in figures:
        plots.pyplot().close(fig)


def test_heatmap_text_colour_follows_the_cell_luminance(monkeypatch, tmp_path):
    """Two identical models (all KL 0) fill the heatmap with viridis' darkest colour: its values are written in
    white, as on any dark cell; the light (yellow) end gets black."""
    import esft.analysis.plots as plots

    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, path: figures.append(fig) or path)
    assert (K.text_colour((0.0, 0.0, 0.0, 1.0)), K.text_colour((1.0, 1.0, 1.0, 1.0))) == ("w", "k")
    K.plot_heatmap({"ES": (np.zeros((1, 2)), ["a"], ["1:a", "2:a"])}, tmp_path / "h.png")
    K.plot_heatmap({"GRPO": (np.array([[0.0, 0.4]]), ["a"], ["1:a", "2:a"])}, tmp_path / "h.png")
    for fig in figures:
        (ax,) = [ax for ax in fig.axes if ax.get_title()]
        (im,) = ax.get_images()
        cells = [im.cmap(im.norm(im.get_array()[0, j])) for j in range(2)]
        assert all(c[1] < 0.1 for c in cells[:1])  # viridis' darkest end (68, 1, 84)
        written = [t.get_color() for t in ax.texts]
        assert written == (["w", "w"] if ax.get_title() == "ES" else ["w", "k"]), (ax.get_title(), written)
        plots.pyplot().close(fig)


@pytest.mark.parametrize("accs, line, wilson", [([0.0, 0.0, 0.0], "0.0%", "[0.0, 49.0]"),
                                               ([1.0, 0.75, 1.0], "100.0%", "[51.0, 100.0]")])
def test_figure3_binomial_se_at_0_and_100_percent_is_0_with_the_wilson_interval(accs, line, wilson):
    """Figure 3's table read `5.000e-07` for the binomial SE of a line at 0% or 100% (a floor inside the square
    root): the SE there is 0, printed with the line's value and its 95% Wilson interval over n, and a note says
    why; a result cached with the old floor prints the same."""
    from esft.analysis.barrier import barrier
    from esft.analysis.landscape_tables import interpolation_notes, interpolation_rows

    b = barrier([0.0, 0.5, 1.0], accs, 4)
    assert b["se"] == 0.0 and b["barrier"] == (accs[1] < accs[0])
    res = {"t": [0.0, 0.5, 1.0], "accuracy": {"countdown": accs}, "n": {"countdown": 4},
           "score": {"countdown": "accuracy"}, "barrier": {"countdown": b}}
    want = f"0 (line at {line} {wilson})"
    assert interpolation_rows(res, ["countdown"])[0][5] == want
    assert any(n.startswith("Binomial SE 0 (countdown)") for n in interpolation_notes(res, ["countdown"]))
    old = {**res, "barrier": {"countdown": {**b, "se": 5e-07}}}
    assert interpolation_rows(old, ["countdown"])[0][5] == want
    inside = barrier([0.0, 0.5, 1.0], [0.5, 0.25, 0.5], 4)
    assert interpolation_rows({**res, "barrier": {"countdown": inside}}, ["countdown"])[0][5] == "0.25"
    assert not any(n.startswith("Binomial SE 0") for n in interpolation_notes(
        {**res, "barrier": {"countdown": inside}}, ["countdown"]))


def test_kl_standard_error_over_sequences_counts_a_lone_token():
    """Two sequences, one empty (the completion stopped at once) and one of a single token: the per-token mean
    is that token's value, and its delta-method SE exists (residuals 2 - 2 * 1 and 0 - 2 * 0: SE 0); only no
    token at all leaves it undefined."""
    assert K.sequence_se([1, 0], [2.0, 0.0]) == (0.0, pytest.approx(1.0))
    assert K.sequence_se([0, 0], [0.0, 0.0]) == (None, 0.0)


def test_sample_standard_deviation_of_a_point_needs_two_scores():
    """The mean reward's barrier SE uses each point's sample std (ddof 1): none for no scores or one score."""
    from esft.analysis.barrier import sample_sd

    assert sample_sd([1.0, 3.0]) == pytest.approx(math.sqrt(2.0))
    assert sample_sd([2.5]) is None and sample_sd(None) is None and sample_sd([]) is None
