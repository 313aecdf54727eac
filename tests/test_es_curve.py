"""A run's summary and learning-curve figure (esft.es.curve) against their documented content: means over logged
iterations, the time split as fractions of the total, the first and last evaluation, the held-out accuracy's 95%
interval and the constant-answer band as drawn.

Run: pytest -q tests/test_es_curve.py   (seconds)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esft.es import curve

TRAIN = [
    {"kind": "train", "step": 1, "time": {"total": 2.0, "generate": 1.0, "update": 0.5, "evaluate": 1.5},
     "fitness": {"mean": 0.1, "min": 0.0, "max": 0.3}, "format_rate": 0.4, "generated_tokens_per_s": 10.0,
     "peak_rss_mb": 100.0, "zero_update": True},
    {"kind": "train", "step": 2, "time": {"total": 4.0, "generate": 3.0, "update": 1.0, "evaluate": 3.5},
     "fitness": {"mean": 0.5, "min": 0.2, "max": 0.9}, "format_rate": 0.8, "generated_tokens_per_s": 30.0,
     "peak_rss_mb": 120.0, "zero_update": False},
]
EVALS = [
    {"kind": "eval", "step": 0, "test_n": 10, "test_accuracy": 0.3, "test_ci95": [0.1, 0.6], "test_format_rate": 0.5,
     "peak_rss_mb": 150.0},
    {"kind": "eval", "step": 2, "test_n": 10, "test_accuracy": 0.6, "test_ci95": [0.3, 0.8], "test_format_rate": 0.9,
     "train_reward": 0.55, "test_constant_baseline": 0.5, "test_constant_baseline_ci95": [0.25, 0.75],
     "test_constant_answer": "yes"},
]


def _run(root: Path, lines: list[dict]) -> Path:
    root.mkdir(parents=True)
    (root / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    return root


def test_summary_is_means_over_iterations_and_the_first_and_last_evaluation(tmp_path):
    s = curve.summarize(_run(tmp_path / "run", TRAIN + EVALS))
    assert s["iterations"] == 2 and s["evaluations"] == 2
    assert s["seconds_per_iteration"] == 3.0
    assert s["time_split_s"] == {"total": 3.0, "generate": 2.0, "update": 0.75, "evaluate": 2.5}
    # "evaluate" spans the other parts, so it is no fraction of the split; "total" is the denominator
    assert s["time_split_fraction"] == pytest.approx({"generate": 2.0 / 3.0, "update": 0.25})
    assert s["generated_tokens_per_s"] == 20.0 and s["zero_updates"] == 1
    assert (s["fitness_mean_first"], s["fitness_mean_last"]) == (0.1, 0.5)
    assert (s["format_rate_first"], s["format_rate_last"]) == (0.4, 0.8)
    assert s["peak_rss_mb"] == 150.0  # the largest over training and evaluation records
    assert s["eval_first"]["step"] == 0 and s["eval_first"]["test_accuracy"] == 0.3
    assert s["eval_first"]["train_reward"] is None
    assert s["eval_last"] == {"step": 2, "test_n": 10, "test_accuracy": 0.6, "test_ci95": [0.3, 0.8],
                              "test_format_rate": 0.9, "test_accuracy_among_well_formed": None, "train_reward": 0.55,
                              "test_constant_baseline": 0.5, "test_constant_baseline_ci95": [0.25, 0.75],
                              "test_constant_answer": "yes"}
    assert s["heldout_constant_baseline"] == {"constant_baseline": 0.5, "constant_baseline_ci95": [0.25, 0.75],
                                              "constant_answer": "yes"}


def test_a_phase_missing_from_an_iteration_took_no_time_there(tmp_path):
    lines = [dict(TRAIN[0], time={"total": 2.0, "generate": 1.0}), dict(TRAIN[1], time={"total": 4.0, "replay": 1.0})]
    s = curve.summarize(_run(tmp_path / "run", lines))
    assert s["time_split_s"] == {"total": 3.0, "generate": 0.5, "replay": 0.5}


def test_summary_of_an_empty_run_and_of_a_run_without_evaluations(tmp_path):
    assert curve.summarize(_run(tmp_path / "empty", [])) == {"iterations": 0, "evaluations": 0}
    s = curve.summarize(_run(tmp_path / "train", TRAIN[:1]))
    assert s["iterations"] == 1 and "eval_first" not in s and "heldout_constant_baseline" not in s
    assert s["peak_rss_mb"] == 100.0 and s["seconds_per_iteration"] == 2.0


def test_no_constant_baseline_without_a_recorded_one_or_a_config(tmp_path):
    assert curve.heldout_constant_baseline(_run(tmp_path / "a", TRAIN + EVALS[:1])) is None  # no config.yaml
    assert curve.heldout_constant_baseline(_run(tmp_path / "b", TRAIN)) is None
    run = _run(tmp_path / "c", EVALS[:1])
    (run / "config.yaml").write_text("task: boolq\n")  # no eval_limit: the held-out examples are unknown
    assert curve.heldout_constant_baseline(run) is None
    (run / "config.yaml").write_text("eval_limit: 5\n")  # no task
    assert curve.heldout_constant_baseline(run) is None


def test_figure_draws_the_interval_and_the_constant_band_of_the_records(tmp_path):
    run = _run(tmp_path / "run", TRAIN + EVALS)
    fig = curve.run_figure(run)
    train_ax, heldout_ax = fig.axes
    assert train_ax.get_xlabel() == "iteration (updates applied)"
    labels = [line.get_label() for line in train_ax.get_lines()]
    assert labels == ["fitness mean", "format rate"]
    assert list(train_ax.get_lines()[0].get_ydata()) == [0.1, 0.5]
    band = train_ax.collections[0].get_paths()[0].vertices[:, 1]  # the min-max band spans the extremes
    assert min(band) == 0.0 and max(band) == 0.9
    (bars,) = [c for c in heldout_ax.collections if len(c.get_segments()) == 2]
    assert [tuple(seg[:, 1]) for seg in bars.get_segments()] == [(0.1, 0.6), (0.3, 0.8)]
    (span,) = heldout_ax.patches
    # a Rectangle (matplotlib >= 3.9) or a Polygon (before)
    ys = [span.get_y(), span.get_y() + span.get_height()] if hasattr(span, "get_height") else span.get_xy()[:, 1]
    assert min(ys) == 0.25 and max(ys) == 0.75
    assert heldout_ax.get_ylim() == (0.0, 1.0)


def test_accuracy_lines_are_unclipped_and_empty_panels_say_why(tmp_path):
    fig = curve.run_figure(_run(tmp_path / "run", TRAIN + EVALS))
    train_ax, heldout_ax = fig.axes
    assert heldout_ax.get_lines() and all(not line.get_clip_on() for line in heldout_ax.get_lines())
    assert train_ax.get_legend() is not None and heldout_ax.get_legend() is not None and not train_ax.texts
    empty_train, empty_heldout = curve.run_figure(_run(tmp_path / "empty", [])).axes
    assert [t.get_text() for t in empty_train.texts] == ["no training iteration logged"]
    assert [t.get_text() for t in empty_heldout.texts] == ["no held-out evaluation (eval_every or eval_limit 0)"]
    assert empty_train.get_legend() is None and empty_heldout.get_ylim() == (0.0, 1.0)


def test_figure_of_a_grpo_run_shows_its_reward_per_step(tmp_path):
    lines = [{"kind": "train", "step": s, "reward": {"mean": 0.2 * s, "min": 0.0, "max": 1.0}} for s in (1, 2)]
    train_ax, _ = curve.run_figure(_run(tmp_path / "grpo", lines)).axes
    assert train_ax.get_xlabel() == "step (updates applied)"
    assert [line.get_label() for line in train_ax.get_lines()] == ["reward mean"]  # no format rate logged
    # step s's completions came from the weights of s - 1 updates, as an ES batch at iteration s - 1 (which was
    # plotted one step to its left); with num_iterations 2, a round's two steps share the round's first weights
    assert list(train_ax.get_lines()[0].get_xdata()) == [0, 1]
    run = _run(tmp_path / "mu", [dict(line, step=s) for s, line in zip((1, 2, 3, 4), lines * 2)])
    (run / "config.yaml").write_text("algorithm: grpo\nnum_iterations: 2\n")
    train_ax, _ = curve.run_figure(run).axes
    assert list(train_ax.get_lines()[0].get_xdata()) == [0, 0, 2, 2]


def test_main_prints_the_summary_and_writes_the_figure(tmp_path, capsys):
    assert curve.main([]) == 2
    run = _run(tmp_path / "run", TRAIN + EVALS)
    assert curve.main([str(run), str(tmp_path / "c.png")]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{"):out.rindex("}") + 1])["iterations"] == 2
    assert (tmp_path / "c.png").stat().st_size > 1000
    assert curve.plot_run(run) == run / "curve.png" and (run / "curve.png").exists()


def test_plot_run_keeps_the_earlier_curve_when_drawing_is_interrupted(tmp_path, monkeypatch):
    """curve.png is redrawn at the end of every run and resume: a Ctrl-C while it is written must leave the earlier
    figure, not a cut PNG (and no temporary file beside it)."""
    from matplotlib.figure import Figure

    run = _run(tmp_path / "run", TRAIN + EVALS)
    before = curve.plot_run(run).read_bytes()
    assert before[:8] == b"\x89PNG\r\n\x1a\n"

    def cut(self, fname, **kwargs):
        Path(fname).write_bytes(b"\x89PNG cut")
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", cut)
    with pytest.raises(KeyboardInterrupt):
        curve.plot_run(run)
    assert (run / "curve.png").read_bytes() == before and sorted(p.name for p in run.iterdir()
                                                                   if p.name.startswith(".")) == []


def test_main_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    """`python -m esft.es.curve` on a folder without metrics.jsonl wrote an empty curve.png into it and exited 0;
    on a missing folder it ended in PIL's FileNotFoundError traceback. Both are one line and exit 2 now."""
    (tmp_path / "empty").mkdir()
    for folder in (tmp_path / "empty", tmp_path / "missing"):
        assert curve.main([str(folder)]) == 2
        assert capsys.readouterr().err.strip() == f"esft.es.curve: error: {folder} is not a run directory (no " \
                                                   "metrics.jsonl)"
    assert not list((tmp_path / "empty").iterdir())


# ---- records that are not one more ES iteration or held-out evaluation --------------------------------------------
EXECUTOR = {"kind": "executor", "event": "started", "time": 1733300000.0}  # a Ray run's event line, in the same file


def test_executor_events_are_neither_iterations_nor_evaluations(tmp_path):
    run = _run(tmp_path / "run", [EXECUTOR] + TRAIN + [dict(EXECUTOR, step=2)] + EVALS)
    s = curve.summarize(run)
    assert (s["iterations"], s["evaluations"], s["seconds_per_iteration"]) == (2, 2, 3.0)
    assert s["eval_first"]["step"] == 0
    train_ax, _ = curve.run_figure(run).axes
    assert train_ax.get_xlabel() == "iteration (updates applied)"


def test_first_and_last_are_the_ends_of_a_longer_run(tmp_path):
    middle_train = dict(TRAIN[0], step=3, fitness={"mean": 0.7, "min": 0.6, "max": 0.8}, format_rate=0.6)
    middle_eval = dict(EVALS[0], step=1, test_accuracy=0.9, test_ci95=[0.7, 1.0])
    s = curve.summarize(_run(tmp_path / "run", [TRAIN[0], middle_train, TRAIN[1], EVALS[0], middle_eval, EVALS[1]]))
    assert (s["fitness_mean_first"], s["fitness_mean_last"]) == (0.1, 0.5)
    assert (s["format_rate_first"], s["format_rate_last"]) == (0.4, 0.8)
    assert (s["eval_first"]["step"], s["eval_last"]["step"]) == (0, 2)


def test_summary_leaves_out_an_unknown_constant_baseline(tmp_path):
    s = curve.summarize(_run(tmp_path / "run", TRAIN + EVALS[:1]))  # no recorded baseline, no config.yaml
    assert s["evaluations"] == 1 and "heldout_constant_baseline" not in s


def test_summary_of_a_grpo_run_names_its_reward(tmp_path):
    """A GRPO train record has `reward`, not `fitness`; a step that sampled no completion logs no reward."""
    steps = [{"kind": "train", "step": s, "time": {"total": 1.0}, "generated_tokens_per_s": 5.0,
              **({"reward": {"mean": 0.2 * s, "min": 0.0, "max": 1.0}, "format_rate": 0.1 * s} if s != 1 else {})}
             for s in (1, 2, 3)]
    s = curve.summarize(_run(tmp_path / "grpo", steps))
    assert s["iterations"] == 3 and "fitness_mean_first" not in s
    assert s["reward_mean_first"] == pytest.approx(0.4) and s["reward_mean_last"] == pytest.approx(0.6)
    assert s["format_rate_first"] == pytest.approx(0.2) and s["format_rate_last"] == pytest.approx(0.3)
    train_ax, _ = curve.run_figure(tmp_path / "grpo").axes
    assert list(train_ax.get_lines()[0].get_xdata()) == [1, 2]  # the step without a reward is left out
    assert train_ax.get_title() == "train batch (sampled completions)"


# ---- the held-out constant baseline, recomputed from config.yaml -----------------------------------------------
def _boolq_run(root: Path, evals: list[dict], **config) -> Path:
    run = _run(root, evals)
    (run / "config.yaml").write_text(json.dumps({"task": "boolq", "eval_limit": 20, **config}))  # JSON is YAML
    return run


def _expected(balanced: bool) -> dict:
    from esft.evaluation import load_examples
    from esft.tasks import get_task
    from esft.tasks.labels import constant_baseline

    task = get_task("boolq")
    return constant_baseline([task.gold_key(x) for x in load_examples(task, "test", 20, balanced)])


def test_recomputed_baseline_needs_a_held_out_evaluation_and_follows_eval_balanced(tmp_path):
    assert curve.heldout_constant_baseline(_boolq_run(tmp_path / "none", TRAIN)) is None
    held_out = {"kind": "eval", "step": 2, "test_n": 20, "test_accuracy": 0.5, "test_ci95": [0.3, 0.7]}
    # an evaluation without a held-out set (eval_limit was 0 before a resume) is not the one counted
    run = _boolq_run(tmp_path / "resumed", [{"kind": "eval", "step": 0, "train_reward": 0.5}, held_out])
    assert curve.heldout_constant_baseline(run)["constant_baseline"] == _expected(False)["constant_baseline"]
    balanced = curve.heldout_constant_baseline(_boolq_run(tmp_path / "balanced", [held_out], eval_balanced=True))
    assert balanced["constant_baseline_ci95"] == _expected(True)["constant_baseline_ci95"] != \
        _expected(False)["constant_baseline_ci95"]


def test_no_recomputed_baseline_when_a_gold_answer_is_unknown(tmp_path, monkeypatch):
    import esft.tasks
    from esft.tasks.base import Task

    class NoGold(Task):  # as IFEval: nothing to compare a constant answer with
        def gold_key(self, example):
            return None

    monkeypatch.setattr(esft.tasks, "get_task", lambda name, **options: NoGold())
    monkeypatch.setattr(curve, "load_examples", lambda task, split, n, balanced: [{}] * n)
    run = _run(tmp_path / "run", [dict(EVALS[0], test_n=5)])
    (run / "config.yaml").write_text("task: ifeval\neval_limit: 5\n")
    assert curve.heldout_constant_baseline(run) is None


# ---- what the figure draws ---------------------------------------------------------------------------------------
def test_figure_plots_against_the_logged_steps_and_names_what_it_draws(tmp_path):
    lines = [dict(TRAIN[0], step=5), dict(TRAIN[1], step=9), dict(EVALS[0], step=4), dict(EVALS[1], step=9)]
    train_ax, heldout_ax = curve.run_figure(_run(tmp_path / "run", lines)).axes
    assert list(train_ax.get_lines()[0].get_xdata()) == [4, 8]  # each batch at the updates applied before it
    labels = heldout_ax.get_legend_handles_labels()[1]
    assert labels == ["held-out format rate", "constant answer \"yes\" (95% CI)", "held-out accuracy (n=10)"]
    accuracy = heldout_ax.containers[0].lines[0]  # the errorbar's data line
    assert list(accuracy.get_xdata()) == [4, 9] and list(accuracy.get_ydata()) == [0.3, 0.6]
    (constant,) = [line for line in heldout_ax.get_lines() if line.get_linestyle() == ":"]
    assert set(constant.get_ydata()) == {0.5}  # the baseline itself, inside its band [0.25, 0.75]


def test_a_baseline_without_its_interval_is_drawn_as_a_line(tmp_path):
    run = _run(tmp_path / "run", [dict(EVALS[1], test_constant_baseline_ci95=None)])
    (span,) = curve.run_figure(run).axes[1].patches
    ys = [span.get_y(), span.get_y() + span.get_height()] if hasattr(span, "get_height") else span.get_xy()[:, 1]
    assert min(ys) == max(ys) == 0.5


def test_an_es_run_that_only_evaluated_and_a_run_without_a_held_out_set(tmp_path):
    train_ax, heldout_ax = curve.run_figure(_run(tmp_path / "base", EVALS[:1])).axes  # iterations: 0
    assert train_ax.get_xlabel() == "iteration (updates applied)" and heldout_ax.get_title() == "unperturbed model"
    no_held_out = [{"kind": "eval", "step": s, "train_reward": 0.5} for s in (0, 2)]  # eval_limit: 0
    _, heldout_ax = curve.run_figure(_run(tmp_path / "no-held-out", TRAIN + no_held_out)).axes
    assert [t.get_text() for t in heldout_ax.texts] == ["no held-out evaluation (eval_every or eval_limit 0)"]


# a resumed run whose eval_limit changed: 10 held-out examples (baseline 0.5), then 20 others (baseline 0.7)
RESUMED = [EVALS[1], dict(EVALS[1], step=4, test_n=20, test_accuracy=0.8, test_ci95=[0.6, 0.9],
                          test_constant_baseline=0.7, test_constant_baseline_ci95=[0.5, 0.85], test_constant_answer="no")]


def test_a_held_out_set_changed_on_resume_has_no_single_baseline(tmp_path):
    """Resuming may change eval_limit / eval_balanced: the evaluations then ran on different examples, so no one
    baseline (nor the first evaluation's n) describes them; each evaluation keeps its own in the summary."""
    assert not curve.heldout_set_changed(EVALS)  # one set: the first evaluation recorded no baseline, same n
    assert curve.heldout_set_changed(RESUMED)
    assert curve.heldout_set_changed([dict(EVALS[0]), dict(EVALS[0], test_n=11)])  # counts alone differ
    run = _run(tmp_path / "run", TRAIN + RESUMED)
    (run / "config.yaml").write_text("task: boolq\neval_limit: 20\n")  # the last set only: no recompute either
    assert curve.heldout_constant_baseline(run) is None
    s = curve.summarize(run)
    assert "heldout_constant_baseline" not in s
    assert (s["eval_first"]["test_n"], s["eval_first"]["test_constant_baseline"]) == (10, 0.5)
    assert (s["eval_last"]["test_n"], s["eval_last"]["test_constant_baseline"]) == (20, 0.7)


def test_figure_draws_each_evaluations_own_baseline_when_the_held_out_set_changed(tmp_path):
    heldout_ax = curve.run_figure(_run(tmp_path / "run", TRAIN + RESUMED)).axes[1]
    assert not heldout_ax.patches  # no single band across both sets
    labels = heldout_ax.get_legend_handles_labels()[1]
    assert "held-out accuracy (n=10-20; set changed on resume)" in labels
    assert "constant answer of each evaluation (95% CI)" in labels
    accuracy, own = heldout_ax.containers
    assert list(own.lines[0].get_xdata()) == [2, 4] and list(own.lines[0].get_ydata()) == [0.5, 0.7]
    # drawn 7 points right of each evaluation's point (on it, the grey bar hid the held-out one), at any x scale
    shift = own.lines[0].get_transform().transform((4, 0.7)) - heldout_ax.transData.transform((4, 0.7))
    assert shift == pytest.approx([7 * heldout_ax.figure.dpi / 72, 0.0])
    bar_shift = own.lines[2][0].get_transform().transform((4, 0.7)) - heldout_ax.transData.transform((4, 0.7))
    assert bar_shift == pytest.approx(shift)  # its interval with it
    assert list(accuracy.lines[0].get_xdata()) == [2, 4]
    (bars,) = own.lines[2]
    assert [tuple(seg[:, 1]) for seg in bars.get_segments()] == [(0.25, 0.75), (0.5, 0.85)]


def test_zero_updates_is_counted_for_es_only(tmp_path):
    """`zero_updates` counts ES's `zero_update` flags; a GRPO run logs none, so a count there read 0 for a run whose
    first step (no reward spread, gradient 0) left the weights where they were."""
    grpo = [{"kind": "train", "step": s, "time": {"total": 1.0}, "generated_tokens_per_s": 5.0, "grad_norm": g,
             "drift_total": d, "reward": {"mean": m, "min": 0.0, "max": 2 * m}} for s, g, d, m in
            ((1, 0.0, 0.0, 0.0), (2, 6.1, 0.04, 0.3))]
    assert "zero_updates" not in curve.summarize(_run(tmp_path / "grpo", grpo))
    es = [{**TRAIN[0], "zero_update": False}, {**TRAIN[1], "zero_update": False}]
    assert curve.summarize(_run(tmp_path / "es", es))["zero_updates"] == 0


def test_recomputed_baseline_is_the_tasks_own_as_the_trainer_records_it(tmp_path, monkeypatch):
    """The recomputed baseline was the most frequent gold answer's share, though under a reward that gives partial
    credit the baseline is what always giving the best of the frequent golds scores (esft.tasks.base.Task.
    constant_baseline, as the trainer records it): a run whose evaluations did not record it drew another."""
    from esft.evaluation import load_examples
    from esft.tasks import get_task
    from esft.tasks.labels import constant_baseline

    (tmp_path / "digit_credit.py").write_text(
        "def credit(completions, **kwargs):\n"
        "    return [min(1.0, sum(ch.isdigit() for ch in c) / 10) for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = tmp_path / "golds.jsonl"
    golds = ["1", "1", "1234567890", "1"] * 3
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": g}) + "\n" for i, g in enumerate(golds)))
    options = {"reward": "digit_credit:credit", "test_size": 0.5, "completion_format": "text"}
    task = get_task(str(data), **options)
    examples = load_examples(task, "test", 6)
    own = task.constant_baseline([{"index": i, "example": x} for i, x in enumerate(examples)])
    assert own["constant_baseline"] != constant_baseline([task.gold_key(x) for x in examples])["constant_baseline"]
    run = _run(tmp_path / "run", [{"kind": "eval", "step": 1, "test_n": 6, "test_accuracy": 0.5,
                                   "test_ci95": [0.2, 0.8]}])
    (run / "config.yaml").write_text(json.dumps({"task": str(data), "task_options": options, "eval_limit": 6}))
    assert curve.heldout_constant_baseline(run) == own
