"""The constant-answer baseline in the landscape and functional-sparsity analyses (esft.analysis.constant): each
result records it once per task from the examples it evaluated (5 "yes" and 3 "no" BoolQ answers: "yes" scores
62.5%, Wilson 95% interval [30.6, 86.3]); the tables print it (a column of the interpolation table, caption lines
under a sweep's, a row of the sparsity table), the figures draw it as a dotted line with a legend entry, the
`esft analyze` commands print it. A mean reward shows none; a cached result from before shows n/a and still
renders. The sparsity table shows the target sparsity asked for beside the one reached. Stub evaluations on a
tiny model (a few seconds).

Run: PYTHONPATH=src pytest -q tests/test_analysis_constant_baseline.py
"""

from __future__ import annotations

import pytest

from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from esft.analysis import landscape as L
from esft.analysis import landscape_report as LR
from esft.analysis import sparsity as SP
from esft.analysis.command_text import format_landscape, format_sparsity
from esft.analysis.constant import KEY, NOT_RECORDED, task_baselines
from esft.analysis.landscape_tables import interpolation_header, interpolation_notes, interpolation_rows, sweep_notes
from esft.analysis.report_builder import Report, ReportConfig
from esft.tasks import get_task
from test_analysis_landscape import tiny
from test_reward_scale_analysis import POINTS, scripted

#: 5 "yes" and 3 "no": always "yes" is right on 5 of 8
BOOLQ = [{"question": f"q{i}", "passage": "p", "answer": i < 5} for i in range(8)]
YES = "'yes' 62.5% [30.6, 86.3]"


def test_task_baselines_of_hand_made_examples():
    got = task_baselines({"boolq": (get_task("boolq"), BOOLQ), "stub": (None, [0] * 3),
                          "empty": (get_task("boolq"), [])})
    b = got["boolq"]
    assert b["constant_baseline"] == 0.625 and b["constant_answer"] == "yes"
    assert b["constant_baseline_ci95"] == pytest.approx([0.305738, 0.863158], abs=1e-6)
    assert got["stub"] is None and got["empty"] is None


@pytest.fixture
def path(monkeypatch):
    """An interpolation path over BoolQ's 8 examples ("a"'s scores) and a reward task "r"."""
    monkeypatch.setattr(L, "accuracy", scripted({"boolq": POINTS["a"], "r": POINTS["r"]}))
    tasks = {"boolq": (get_task("boolq"), BOOLQ), "r": (None, [0] * 4)}
    return L.interpolation_path(tiny(2), None, tiny(0), tiny(1), [0.5], tasks, None)


def test_the_interpolation_path_records_each_tasks_baseline_and_its_table_shows_it(path):
    assert path[KEY]["boolq"]["constant_baseline"] == 0.625 and path[KEY]["r"] is None
    header = interpolation_header(path, ["boolq", "r"], ("ES", "GRPO"))
    rows = interpolation_rows(path, ["boolq", "r"])
    assert header[-1] == "best constant answer (95% CI)" and len(header) == len(rows[0])
    assert rows[0][-1] == YES and rows[1][-1] == "n/a"  # a mean reward has none
    assert interpolation_notes(path, ["boolq"]) == []


def test_a_reward_only_interpolation_table_has_no_baseline_column(path):
    assert interpolation_header(path, ["r"], ("ES", "GRPO"))[-1] == "barrier (> 1.96 SE)"
    assert len(interpolation_rows(path, ["r"])[0]) == 7


def test_an_older_interpolation_result_without_baselines_still_renders_with_n_a(path):
    old = {k: v for k, v in path.items() if k != KEY}
    assert interpolation_rows(old, ["boolq"])[0][-1] == "n/a"
    assert interpolation_notes(old, ["boolq"]) == [NOT_RECORDED]
    notes = interpolation_notes(old, ["r"])  # no n/a line for a reward alone
    assert [n[:11] for n in notes] == ["Paired SE: ", "Mean reward"]


def test_a_direction_sweep_records_the_baseline_and_its_notes_caption_it(monkeypatch):
    monkeypatch.setattr(L, "accuracy", scripted({"boolq": POINTS["a"], "r": POINTS["r"]}))
    tasks = {"boolq": (get_task("boolq"), BOOLQ), "r": (None, [0] * 4)}
    a, b = tiny(0), tiny(1)
    res = L.direction_sweep(tiny(2), None, a, [L.DeltaDirection(a, b, "ES")], [0.0, 1.0], tasks, None)
    assert res[KEY]["boolq"]["constant_baseline"] == 0.625
    notes = sweep_notes(res)
    assert notes[0] == f"Best constant answer of the same examples, boolq: {YES} (95% Wilson interval)."
    assert notes[1] == "[a, b]: the 95% Wilson interval of the accuracy over the evaluated examples (boolq n = 8)."
    assert len(notes) == 3 and notes[2].startswith("Mean reward") and "r:" not in notes[0]
    assert sweep_notes({k: v for k, v in res.items() if k != KEY})[0] == NOT_RECORDED


def test_the_landscape_command_prints_the_baseline(path):
    lines = format_landscape({"interpolation": path, "directions": {"directions": {}}}).splitlines()
    assert lines[-1] == f"best constant answer boolq: {YES}"
    assert not any("constant" in line and " r:" in line for line in lines)


def line_of(ax, y):
    return [ln for ln in ax.get_lines() if ln.get_linestyle() == ":" and list(ln.get_ydata()) == [y, y]]


def test_the_figures_draw_the_baseline_dotted_with_a_legend_entry(path, tmp_path, monkeypatch):
    from esft.analysis import plots

    figs = []
    real_save = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, p: figs.append(fig.get_axes()) or real_save(fig, p))
    L.plot_interpolation(path, tmp_path / "i.png")
    L.plot_direction_sweep({"magnitudes": [0.0, 1.0], "score": path["score"], KEY: path[KEY],
                            "directions": {"ES": {"norm": 1.0, "accuracy": {"boolq": [0.5, 0.5], "r": [2.0, 3.0]}}}},
                           tmp_path / "d.png")
    sweep = {"rows": [{"sparsity": 0.5, "accuracy": {"boolq": 0.5, "r": 2.0}}],
             "base_accuracy": {"boolq": 0.25, "r": 1.0}, "score": path["score"], KEY: path[KEY]}
    SP.plot_sparsity_sweep({"es": sweep, "grpo": dict(sweep)}, tmp_path / "s.png")
    (i_bool, i_r), (d_bool, d_r), (s_bool, s_r) = figs  # sparsity panels are sorted: boolq, r
    for ax in (i_bool, d_bool, s_bool):
        assert len(line_of(ax, 0.625)) == 1  # once, though two sweeps hold it
        assert f"best constant answer {YES}" in [t.get_text() for t in ax.get_legend().get_texts()]
    for ax in (i_r, d_r, s_r):
        assert not any("constant" in ln.get_label() for ln in ax.get_lines())
    old = {k: v for k, v in path.items() if k != KEY}
    L.plot_interpolation(old, tmp_path / "old.png")  # a cached result from before: drawn without it
    assert not line_of(figs[-1][0], 0.625)


@pytest.fixture
def sweep(monkeypatch):
    """A sparsity sweep of BoolQ at targets 0, 0.5, 0.9 and 0.97, the last two choosing thresholds that keep the
    same entries (a stand-in histogram: 0.9 and 0.97 both land on every entry)."""
    monkeypatch.setattr(SP, "accuracy", lambda model, tok, tasks, gc, scores_out=None, progress=False:
                        scores_out.update({"boolq": [1.0, 0.0]}) or {"boolq": 0.5})
    monkeypatch.setattr(SP, "taus_for_sparsity", lambda base, tuned, targets: [0.0, 1e-3, 1e3, 1e4][:len(targets)])
    tasks = {"boolq": (get_task("boolq"), BOOLQ)}
    return SP.sparsity_sweep(tiny(2), None, tiny(0), tiny(1), tasks, None, targets=[0.0, 0.5, 0.9, 0.97])


def test_the_sparsity_sweep_records_the_targets_of_each_threshold_and_the_baseline(sweep):
    assert [r["targets"] for r in sweep["rows"]] == [[0.0], [0.5], [0.9, 0.97]]
    assert sweep["rows"][-1]["sparsity"] == 1.0
    assert sweep[KEY]["boolq"]["constant_baseline"] == 0.625


def test_the_sparsity_table_shows_the_target_beside_the_sparsity_reached_and_the_baseline(sweep):
    sw = SP.SparsitySweep("es", ["boolq"], sweep)
    assert SP.sweep_table_header(sw) == ["tau", "target sparsity", "sparsity reached", "boolq acc"]
    rows = SP.sweep_table_rows(sw)
    assert rows[2][1:] == ["90.0%, 97.0%", "100.0%", "50.0% [21.5, 78.5]"]
    assert rows[1][1] == "50.0%" and rows[-2][0] == "base (all reverted)"
    assert rows[-1] == ["best constant answer", "", "", YES]
    assert SP.target_text({"targets": []}) == "(tau given)"
    text = format_sparsity(sweep).splitlines()
    assert "target 90.0%, 97.0% sparsity 100.00%" in text[2] and text[-1] == f"best constant answer boolq: {YES}"


def test_a_reward_sparsity_table_has_no_baseline_row():
    res = {"rows": [{"tau": 0.0, "sparsity": 0.0, "targets": [0.0], "accuracy": {"m": 2.5}}],
           "base_accuracy": {"m": 0.25}, "score": {"m": "mean reward"}, KEY: {"m": {"constant_baseline": 0.5}}}
    rows = SP.sweep_table_rows(SP.SparsitySweep("es", ["m"], res))
    assert rows[-1][0] == "base (all reverted)" and len(rows) == 2


def test_the_reports_sections_render_a_cached_result_from_before_with_n_a(path, tmp_path, monkeypatch):
    """docs/results' report caches predate the baseline: their sections render, saying n/a."""
    from esft.analysis import report_builder

    old = {k: v for k, v in path.items() if k != KEY}
    found = LR.LandscapeReport(("es", "grpo"), ["boolq"], interpolation=old, interpolation_figure=tmp_path / "i.png",
                              directions={"magnitudes": [0.0], "directions": {"ES": {"norm": 1.0,
                                                                                     "accuracy": {"boolq": [0.5]}}}},
                              directions_figure=tmp_path / "d.png")
    monkeypatch.setattr(report_builder, "report_landscape", lambda ctx: found)
    res = {"rows": [{"tau": 0.0, "sparsity": 0.0, "accuracy": {"boolq": 0.5}}], "base_accuracy": {"boolq": 0.25}}
    monkeypatch.setattr(report_builder, "report_sparsity",
                        lambda ctx: ([SP.SparsitySweep("es", ["boolq"], res)], tmp_path / "s.png"))
    report = Report(ReportConfig(dir=str(tmp_path), analyses=[], holdout_tasks=[]), progress=False)
    report.section_landscape()
    report.section_sparsity()
    landscape, sparsity = report.sections[-2:]
    assert landscape.count(NOT_RECORDED) == 2  # Figure 3's table and Figure 4's
    assert "| boolq | 50.0% | 75.0% |" in landscape and landscape.count(" n/a |") == 1
    assert "| 0 | n/a | 0.0% | 50.0% |" in sparsity and "| best constant answer |  |  | n/a |" in sparsity


def test_the_printed_sparsity_accuracies_carry_their_95_percent_interval():
    """`esft analyze sparsity` printed `boolq 0.000` from 2 examples, no interval beside the baseline's
    `'no' 50.0% [9.5, 90.5]`: 0 of 2 is compatible with anything up to 66%. A mean reward gets none (its spread is
    not kept)."""
    res = {"rows": [{"tau": 0.0, "sparsity": 0.0, "targets": [0.0], "accuracy": {"boolq": 0.0}}],
           "base_accuracy": {"boolq": 0.5}, "n": {"boolq": 2}, "score": {"boolq": "accuracy"}}
    row, base = format_sparsity(res).splitlines()
    assert row.endswith("boolq 0.000 [0.000, 0.658]")
    assert base.endswith("boolq 0.500 [0.095, 0.905]")
    reward = {**res, "score": {"boolq": "mean reward"}}
    assert format_sparsity(reward).splitlines()[0].endswith("boolq 0.000")


def test_baseline_text_without_an_interval_and_with_a_long_answer():
    """A baseline recorded without its interval reads as the point itself ([x, x]); an answer longer than 16
    characters is cut to its first 16 and '...', one of 16 is shown whole."""
    from esft.analysis.constant import baseline_text

    assert baseline_text({"constant_baseline": 0.625, "constant_answer": "yes"}) == "'yes' 62.5% [62.5, 62.5]"
    b = {"constant_baseline": 0.5, "constant_baseline_ci95": [0.25, 0.75]}
    assert baseline_text({**b, "constant_answer": "a" * 16}) == f"'{'a' * 16}' 50.0% [25.0, 75.0]"
    assert baseline_text({**b, "constant_answer": "b" * 16 + "c"}) == f"'{'b' * 16}...' 50.0% [25.0, 75.0]"
