"""evaluation.checkpoints: a stage's intermediate checkpoints evaluated on the chosen tasks (esft.experiments.
checkpoint_eval), read back per stage (records.checkpoint_evaluations) and drawn as within-stage forgetting curves
(esft.experiments.forgetting_figures), on the tiny model of the other experiment tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from esft.experiments import SpecError, load_spec, run_experiment
from experiments_tiny import ES_BLOCK, EVAL_BLOCK, GRPO_BLOCK, TinyHooks, write_spec

TASKS = ["countdown", "boolq"]


def _spec(tmp_path: Path, checkpoints, name: str = "seq.yaml") -> Path:
    return write_spec(tmp_path / name, "sequential", TASKS,
                      {"es": {**ES_BLOCK, "iterations": 3, "checkpoint_every": 1},
                       "grpo": {**GRPO_BLOCK, "max_steps": 2, "save_steps": 1}},
                      evaluation={**EVAL_BLOCK, "checkpoints": checkpoints})


class CountingHooks(TinyHooks):
    """TinyHooks that also record every model the runner loads for an evaluation."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.evaluated: list[str] = []
        self.hooks.load_model = self.load_for_eval

    def load_for_eval(self, ref: str, dtype: str = "float32", device: str | None = None):
        self.evaluated.append(ref)
        return self.load_model(ref, dtype, device)


def test_checkpoints_option_is_validated_before_any_model_loads(tmp_path):
    for bad, words in (("yes", r"evaluation.checkpoints.*is not evaluated by this spec"),
                       (3, r"evaluation.checkpoints must be true, false or a list of evaluated tasks, got 3"),
                       (["math"], r"task 'math' in evaluation.checkpoints is not evaluated by this spec; "
                                  r"evaluated: countdown, boolq, mmlu")):
        with pytest.raises(SpecError, match=words) as info:
            load_spec(_spec(tmp_path, bad, "bad.yaml"))
        assert "bad.yaml:" in str(info.value)  # the line is named
    assert load_spec(_spec(tmp_path, True)).evaluation.checkpoints == TASKS  # true: the trained tasks
    assert load_spec(_spec(tmp_path, ["mmlu"])).evaluation.checkpoints == ["mmlu"]
    off = load_spec(_spec(tmp_path, False))
    assert off.evaluation.checkpoints == []
    # off, plan.json's spec and evaluation settings are those written before the option existed
    from esft.experiments.stage_eval import plan_settings

    assert "checkpoints" not in off.to_dict()["evaluation"]
    assert plan_settings(off) == plan_settings(load_spec(_spec(tmp_path, True)))
    assert "checkpoints" in load_spec(_spec(tmp_path, True)).to_dict()["evaluation"]


def _step_files(out: Path) -> dict[str, dict[str, list[str]]]:
    """stage folder -> step folder -> task files (JSON summaries) under eval/steps."""
    found: dict[str, dict[str, list[str]]] = {}
    for path in sorted(out.glob("seed-42/sequential/*/*/eval/steps/*/*.json")):
        stage = path.parents[3].relative_to(out).as_posix()
        found.setdefault(stage, {}).setdefault(path.parent.name, []).append(path.name)
    return found


def test_every_intermediate_checkpoint_is_evaluated_once_and_a_rerun_skips_done_ones(tmp_path, tokenizer):
    out = tmp_path / "out"
    spec = load_spec(_spec(tmp_path, True))
    tiny = CountingHooks(tokenizer)
    assert run_experiment(spec, out, tiny.hooks).ok
    seq = "seed-42/sequential"
    # ES saves iterations 1 and 2 before its final 3, GRPO step 1 before its final 2; the holdout is not asked
    expected = {f"{seq}/es/1-countdown": ["000001", "000002"], f"{seq}/es/2-boolq": ["000001", "000002"],
                f"{seq}/grpo/1-countdown": ["000001"], f"{seq}/grpo/2-boolq": ["000001"]}
    files = _step_files(out)
    assert {stage: sorted(steps) for stage, steps in files.items()} == expected
    assert all(sorted(names) == ["boolq.json", "countdown.json"] for steps in files.values()
               for names in steps.values())
    # each checkpoint's model was loaded once, the same settings as the stage's final evaluation but the model
    stage = out / seq / "es/2-boolq"
    saved = json.loads((stage / "eval/steps/000002/boolq.json").read_text())["settings"]
    final = json.loads((stage / "eval/boolq.json").read_text())["settings"]
    assert saved["model"] == str((stage / "run/checkpoints/iter_000002").resolve())
    assert {**saved, "model": None} == {**final, "model": None}
    checkpoint_loads = [ref for ref in tiny.evaluated if "/checkpoints/iter_" in ref or "/checkpoint-" in ref]
    assert len(checkpoint_loads) == len(set(checkpoint_loads)) == 6

    again = CountingHooks(tokenizer)  # nothing left: no model loads, no file written again
    before = {p: p.stat().st_mtime_ns for p in out.glob("**/eval/steps/*/*.json")}
    assert run_experiment(spec, out, again.hooks).ok
    assert again.evaluated == [] and again.trained == []
    assert {p: p.stat().st_mtime_ns for p in out.glob("**/eval/steps/*/*.json")} == before

    # an evaluation interrupted after one task of one checkpoint: only the missing task is evaluated
    (stage / "eval/steps/000001/countdown.json").unlink()
    resumed = CountingHooks(tokenizer)
    assert run_experiment(spec, out, resumed.hooks).ok
    assert resumed.evaluated == [str((stage / "run/checkpoints/iter_000001").resolve())]
    assert resumed.trained == []
    assert (stage / "eval/steps/000001/countdown.json").exists()
    assert (stage / "eval/steps/000001/boolq.json").stat().st_mtime_ns == \
        before[stage / "eval/steps/000001/boolq.json"]


def test_off_nothing_is_written_and_turned_on_later_a_done_stage_is_evaluated_without_retraining(tmp_path,
                                                                                                   tokenizer):
    algorithms = {"es": {**ES_BLOCK, "iterations": 2, "checkpoint_every": 1}}
    off = write_spec(tmp_path / "off.yaml", "sequential", TASKS, algorithms, evaluation=EVAL_BLOCK)
    out = tmp_path / "out"
    assert run_experiment(load_spec(off), out, TinyHooks(tokenizer).hooks).ok
    assert not list(out.glob("**/eval/steps")) and not list(out.glob("tables/forgetting_*"))
    assert "checkpoints" not in json.loads((out / "plan.json").read_text())["spec"]["evaluation"]
    stage = out / "seed-42/sequential/es/1-countdown"
    assert set(json.loads((stage / "result.json").read_text())["seconds"]) == {"train", "eval"}

    on = write_spec(tmp_path / "on.yaml", "sequential", TASKS, algorithms,
                    evaluation={**EVAL_BLOCK, "checkpoints": ["boolq"]})
    tiny = CountingHooks(tokenizer)
    assert run_experiment(load_spec(on), out, tiny.hooks).ok
    assert tiny.trained == []
    assert tiny.evaluated == [str((out / f"seed-42/sequential/es/{k}/run/checkpoints/iter_000001").resolve())
                              for k in ("1-countdown", "2-boolq")]
    assert sorted(p.relative_to(stage).as_posix() for p in stage.glob("eval/steps/*/*.json")) == \
        ["eval/steps/000001/boolq.json"]
    assert "checkpoint_eval" in json.loads((stage / "result.json").read_text())["seconds"]
    assert (out / "tables/forgetting_es_seed-42.png").exists()


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tokenizer):
    """A sequential experiment with ES checkpoints evaluated on both tasks (GRPO keeps none: save_steps 0)."""
    tmp = tmp_path_factory.mktemp("forgetting")
    spec = write_spec(tmp / "seq.yaml", "sequential", TASKS,
                      {"es": {**ES_BLOCK, "iterations": 3, "checkpoint_every": 1}, "grpo": GRPO_BLOCK},
                      evaluation={**EVAL_BLOCK, "checkpoints": True})
    out = tmp / "out"
    assert run_experiment(load_spec(spec), out, TinyHooks(tokenizer).hooks).ok
    return out


def test_the_reader_returns_step_task_accuracy_and_interval_per_stage(finished):
    from esft.experiments.records import checkpoint_evaluations, load_experiment

    steps = checkpoint_evaluations(load_experiment(finished))
    seq = "seed-42/sequential"
    assert set(steps) == {f"{seq}/es/1-countdown", f"{seq}/es/2-boolq"}  # GRPO saved no checkpoint
    for key, by_step in steps.items():
        assert sorted(by_step) == [1, 2]
        for n, by_task in by_step.items():
            assert sorted(by_task) == ["boolq", "countdown"]
            for task, point in by_task.items():
                summary = json.loads((finished / key / f"eval/steps/{n:06d}/{task}.json").read_text())["summary"]
                assert point["accuracy"] == summary["accuracy"] and point["n"] == summary["n"] == 1
                assert point["ci95"] == tuple(summary["ci95"])
                assert point["constant_baseline"] == summary["constant_baseline"]
                assert point["constant_baseline_ci95"] == summary["constant_baseline_ci95"]


def test_a_checkpoint_evaluated_with_other_settings_is_left_out(finished, tmp_path):
    import shutil

    from esft.experiments.records import checkpoint_evaluations, load_experiment

    copy = tmp_path / "copy"
    shutil.copytree(finished, copy)
    path = copy / "seed-42/sequential/es/1-countdown/eval/steps/000002/boolq.json"
    data = json.loads(path.read_text())
    data["settings"]["limit"] = 7
    path.write_text(json.dumps(data))
    steps = checkpoint_evaluations(load_experiment(copy))
    assert sorted(steps["seed-42/sequential/es/1-countdown"][2]) == ["countdown"]
    assert sorted(steps["seed-42/sequential/es/1-countdown"][1]) == ["boolq", "countdown"]


def test_the_forgetting_figure_draws_every_task_over_the_whole_chain(finished):
    from esft.experiments.forgetting_figures import forgetting_figure, track_curves
    from esft.experiments.records import checkpoint_evaluations, load_experiment

    assert (finished / "tables/forgetting_es_seed-42.png").stat().st_size > 0
    assert not (finished / "tables/forgetting_grpo_seed-42.png").exists()  # no checkpoint evaluated
    assert "forgetting_es_seed-42.png" in (finished / "tables/tables.md").read_text()
    exp = load_experiment(finished)
    data = track_curves(exp, "es", "ES", 42, checkpoint_evaluations(exp))
    ax = forgetting_figure(data, "t").axes[0]
    lines = {line.get_label(): line for line in ax.lines}
    for task, name in (("countdown", "Countdown"), ("boolq", "BoolQ")):
        # base model at 0, checkpoints 1 and 2, stage 1's end at 3, then stage 2's 4, 5 and its end at 6
        assert list(lines[name].get_xdata()) == [0, 1, 2, 3, 4, 5, 6]
        stage_1 = json.loads((finished / "seed-42/sequential/es/1-countdown/result.json").read_text())
        assert lines[name].get_ydata()[3] == pytest.approx(100 * stage_1["eval"][task]["accuracy"])
        baseline = lines[f"{name}: constant answer"]
        assert baseline.get_linestyle() == ":"
        assert baseline.get_ydata()[0] == pytest.approx(100 * stage_1["eval"][task]["constant_baseline"])
    boundaries = [line for line in ax.lines if line.get_linestyle() == "--"]
    assert [line.get_xdata()[0] for line in boundaries] == [3]
    assert len(ax.lines) == 2 + 2 + 1  # two tasks, their baselines, one stage boundary
    assert len(ax.collections) >= 2 + 2  # each task's interval band and its stage-end squares


def _seed_curves(seed: int, boundaries: list, points: dict[str, list], ends: dict[str, list]):
    from esft.experiments.forgetting_figures import TaskCurve, TrackCurves

    curves = [TaskCurve(task, [(x, y, (y - 1, y + 1)) for x, y in pts], ends[task],
                        (50.0, (40.0, 60.0)) if task == "boolq" else None) for task, pts in points.items()]
    return TrackCurves("es", "ES", seed, curves, boundaries)


def test_the_mean_over_seeds_takes_the_shared_steps_of_the_seeds_that_ran_as_far():
    from esft.experiments.forgetting_figures import forgetting_figure, mean_over_seeds

    both = [(3, "countdown"), (6, "boolq")]
    a = _seed_curves(1, both, {"countdown": [(0, 10), (1, 20), (3, 30), (6, 0)], "boolq": [(0, 50), (3, 99)]},
                     {"countdown": [(3, 30), (6, 0)], "boolq": [(3, 99)]})
    b = _seed_curves(2, both, {"countdown": [(0, 10), (3, 50), (6, 4)], "boolq": [(0, 60), (3, 100)]},
                     {"countdown": [(3, 50), (6, 4)], "boolq": [(3, 100)]})
    c = _seed_curves(3, both, {"countdown": [(0, 10), (3, 40), (6, 2)], "boolq": [(0, 70), (3, 98)]},
                     {"countdown": [(3, 40), (6, 2)], "boolq": [(3, 98)]})
    short = _seed_curves(4, both[:1], {"countdown": [(0, 90), (3, 90)], "boolq": [(0, 90), (3, 90)]},
                         {"countdown": [(3, 90)], "boolq": [(3, 90)]})
    mean = mean_over_seeds([a, short, b, c])
    assert mean.seed is None and [d.seed for d in mean.seeds] == [1, 2, 3]  # seed 4 stopped after stage 1
    assert mean.boundaries == both
    countdown, boolq = mean.curves
    # step 1 is seed 1's alone: left out; sample std (ddof=1) of 30, 50, 40 is 10
    assert [p[0] for p in countdown.points] == [0, 3, 6]
    assert countdown.points[1] == (3, pytest.approx(40.0), (pytest.approx(30.0), pytest.approx(50.0)))
    assert countdown.points[0][2] == (10.0, 10.0)  # no spread
    assert countdown.points[2][2][0] == 0.0  # mean 2, sd 2: the band stops at 0
    assert boolq.points[1][2][1] == 100.0 and boolq.points[1][1] == pytest.approx(99.0)  # and at 100
    assert countdown.stage_ends == [(3, pytest.approx(40.0)), (6, pytest.approx(2.0))]
    assert boolq.constant == (50.0, (40.0, 60.0)) and countdown.constant is None
    assert mean_over_seeds([a]) is None and mean_over_seeds([a, short]) is None and mean_over_seeds([]) is None
    ax = forgetting_figure(mean, "t").axes[0]
    thin = [line for line in ax.lines if line.get_alpha() == 0.35]
    assert len(thin) == 2 * 3  # each task, each seed
    assert "over 3 seeds" in ax.get_legend().get_title().get_text()


def test_two_seeds_get_a_mean_forgetting_figure(tmp_path, tokenizer):
    spec = write_spec(tmp_path / "seq.yaml", "sequential", TASKS,
                      {"es": {**ES_BLOCK, "iterations": 2, "checkpoint_every": 1}}, seeds=[42, 43],
                      evaluation={**EVAL_BLOCK, "checkpoints": ["countdown"]})
    out = tmp_path / "out"
    assert run_experiment(load_spec(spec), out, TinyHooks(tokenizer).hooks).ok
    tables = out / "tables"
    for name in ("forgetting_es_seed-42.png", "forgetting_es_seed-43.png", "forgetting_es_mean.png"):
        assert (tables / name).stat().st_size > 0
        assert name in (tables / "tables.md").read_text()
