"""esft.evaluation pinned where a mutation audit found it untested: the generation time its summaries report.

Run: pytest -q tests/test_evaluation_mutrun.py   (< 2 s; the generator is stubbed, no model)
"""

from __future__ import annotations

import time

from esft import evaluation
from esft.generation import Generation, GenerationConfig
from test_evaluation_audit import LabelTask


def _slow_generate(model, tokenizer, prompts, cfg, progress=False):
    time.sleep(0.05)
    return [Generation(text="yes", completion_ids=[1], prompt_tokens=2, finished=True) for _ in prompts]


def test_generation_seconds_is_the_time_generation_took(monkeypatch):
    monkeypatch.setattr(evaluation, "generate", _slow_generate)
    task = LabelTask()
    t0 = time.perf_counter()
    summary = evaluation.evaluate_task(None, None, task, task.rows[:2], GenerationConfig(), progress=False)
    took = time.perf_counter() - t0
    assert 0.04 <= summary["generation_s"] <= took + 0.01


def test_sampled_generation_seconds_is_the_time_all_samples_took(monkeypatch):
    monkeypatch.setattr(evaluation, "generate", _slow_generate)
    task = LabelTask()
    t0 = time.perf_counter()
    summary = evaluation.evaluate_task_sampled(None, None, task, task.rows[:2], GenerationConfig(temperature=1.0),
                                               samples=2, ks=[1, 2], progress=False)
    took = time.perf_counter() - t0
    assert 0.09 <= summary["generation_s"] <= took + 0.01


def _sampled(pass_at_k):
    return {"n": 4, "samples": 8, "accuracy": 0.5, "ci95": [0.25, 0.75], "pass@k": pass_at_k,
            "maj@k": {"1": {"value": 0.5, "ci95": [0.2, 0.8]}}}


def test_sampled_row_says_pass_at_k_is_na_only_when_it_is():
    line = evaluation.format_row("coin", _sampled({"4": {"value": 0.75, "ci95": [0.5, 1.0]}}))
    assert line == ("coin       n=4     x8 mean@8 0.500  95% CI [0.250, 0.750]  pass@4 0.750 [0.500, 1.000]"
                    "  maj@1 0.500 [0.200, 0.800]")
    na = evaluation.format_row("coin", _sampled(None))
    assert "  pass@k n/a (scores not 0/1)  maj@1 0.500 [0.200, 0.800]" in na


def test_a_task_without_test_examples_is_refused_under_the_name_the_user_typed():
    import pytest

    from esft.config import ConfigError
    from esft.eval_config import EvalConfig
    from test_validation_rules import FakeTask

    empty = FakeTask(rows={"train": [{"q": 1}], "test": []})
    empty.name = "named"
    with pytest.raises(ConfigError, match=r"^tasks = 'named:opt=1' is not accepted"):
        EvalConfig(tasks=["boolq", "named:opt=1"]).check_task_fit(empty)
    with pytest.raises(ConfigError, match=r"^tasks = 'named' is not accepted"):  # not typed: its own name
        EvalConfig(tasks=["boolq"]).check_task_fit(empty)
    with pytest.raises(ConfigError, match=r"^split = 'test2' is not accepted"):
        EvalConfig(tasks=["named:opt=1"], split="test2").check_task_fit(empty)


def test_without_output_dir_there_are_no_previous_results_to_check():
    from esft.evaluation import check_previous_results
    from esft.eval_config import EvalConfig

    assert check_previous_results(EvalConfig(output_dir=None)) is None


def test_the_samples_bar_counts_every_pass_and_closes(monkeypatch):
    class Bar:
        def __init__(self, total):
            self.total, self.n, self.closed = total, 0, False

        def update(self, k):
            self.n += k

        def close(self):
            self.closed = True

    bars = []
    monkeypatch.setattr(evaluation, "_samples_bar", lambda samples: bars.append(Bar(samples)) or bars[-1])
    monkeypatch.setattr(evaluation, "generate", _slow_generate)
    task = LabelTask()
    evaluation.evaluate_task_sampled(None, None, task, task.rows[:2], GenerationConfig(temperature=1.0), samples=3,
                                     ks=[1], progress=True)
    assert [(b.total, b.n, b.closed) for b in bars] == [(3, 3, True)]


def test_run_eval_prints_each_task_row_only_with_progress(monkeypatch, capsys):
    from esft.evaluation import run_eval
    from esft.eval_config import EvalConfig
    from test_evaluation_audit import _patch

    _patch(monkeypatch, LabelTask(), [])
    cfg = EvalConfig(tasks=["lab"], limit=2)
    run_eval(cfg, model=object(), tokenizer=object(), progress=False)
    assert capsys.readouterr().out == ""
    res = run_eval(cfg, model=object(), tokenizer=object(), progress=True)["lab"]
    assert capsys.readouterr().out == evaluation.format_row("lab", res) + "\n"


def test_the_same_evaluation_into_the_same_folder_spelled_otherwise_is_not_another_one(tmp_path, monkeypatch):
    """`--output-dir res/` then `--output-dir res` (or its absolute path, or from another folder) was refused as
    "another evaluation (output_dir: 'res/' there, 'res' now)": the folder's own name counted as a difference."""
    import json
    from dataclasses import asdict

    import pytest

    from esft.evaluation import check_previous_results

    from esft.eval_config import EvalConfig

    monkeypatch.chdir(tmp_path)
    (tmp_path / "res").mkdir()
    first = EvalConfig(tasks=["boolq"], limit=4, output_dir="res/")
    (tmp_path / "res" / "summary.json").write_text(json.dumps({"config": asdict(first), "results": {}}))
    for spelled in ("res/", "res", str(tmp_path / "res")):
        check_previous_results(EvalConfig(tasks=["boolq"], limit=4, output_dir=spelled))
    with pytest.raises(FileExistsError, match=r"another evaluation \(limit: 4 there, 5 now\)"):
        check_previous_results(EvalConfig(tasks=["boolq"], limit=5, output_dir="res"))


def test_an_interrupted_evaluation_keeps_the_summaries_of_the_tasks_that_finished(tmp_path, monkeypatch):
    """Ctrl-C in the second task of `esft eval --tasks a,b --output-dir DIR` printed a bare "interrupted" and wrote
    no summary.json: the first task's summary was only on the screen. Now summary.json holds the finished tasks,
    `unfinished` names the others, and the message says so; an earlier run of this same evaluation in the folder
    keeps its results for the tasks this one did not reach (another evaluation's do not count)."""
    import json

    import pytest

    from esft.evaluation import run_eval

    from esft.eval_config import EvalConfig
    from esft.rundir import RunInterrupted
    from test_evaluation_audit import _patch

    _patch(monkeypatch, LabelTask(), [])
    calls = []

    def stop_at_second_task(model, tokenizer, prompts, cfg, progress=False):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return [Generation(text="yes", completion_ids=[1], prompt_tokens=2, finished=True) for _ in prompts]

    def interrupted(cfg):
        calls.clear()
        monkeypatch.setattr(evaluation, "generate", stop_at_second_task)
        with pytest.raises(KeyboardInterrupt) as info:  # a bare one fails below, not as pytest's own Ctrl-C
            run_eval(cfg, model=object(), tokenizer=object(), progress=False)
        assert isinstance(info.value, RunInterrupted)
        return str(info.value), json.loads((tmp_path / "summary.json").read_text())

    cfg = EvalConfig(tasks=["one", "two"], limit=2, output_dir=str(tmp_path))
    message, summary = interrupted(cfg)
    assert message == (f"interrupted: {tmp_path / 'summary.json'} holds one; not evaluated: two (listed under "
                       "`unfinished` there)")
    assert list(summary["results"]) == ["one"] and summary["unfinished"] == ["two"]
    assert summary["results"]["one"]["n"] == 2 and (tmp_path / "one.jsonl").is_file()

    _patch(monkeypatch, LabelTask(), [])
    whole = run_eval(cfg, model=object(), tokenizer=object(), progress=False)
    message, summary = interrupted(cfg)
    assert message.endswith("holds one (and, from an earlier run of this evaluation, two)")
    assert list(summary["results"]) == ["one", "two"] and summary["unfinished"] == []
    assert summary["results"]["two"] == json.loads(json.dumps(whole["two"]))

    message, summary = interrupted(EvalConfig(tasks=["one", "two"], limit=1, output_dir=str(tmp_path)))
    assert list(summary["results"]) == ["one"] and summary["unfinished"] == ["two"]
    assert summary["results"]["one"]["n"] == 1

    # the same evaluation spelled otherwise (res/, an absolute path), which check_previous_results lets run again,
    # keeps the earlier results too: an interrupt never replaces a complete summary with a partial one
    _patch(monkeypatch, LabelTask(), [])
    whole = run_eval(cfg, model=object(), tokenizer=object(), progress=False)
    message, summary = interrupted(EvalConfig(tasks=["one", "two"], limit=2, output_dir=str(tmp_path) + "/"))
    assert list(summary["results"]) == ["one", "two"] and summary["unfinished"] == []
    assert summary["results"]["two"] == json.loads(json.dumps(whole["two"]))

    # a summary from an esft that did not record an option: its results are kept where this run leaves that option
    # at its default, not where it sets it (they were not measured that way)
    for top_p, kept in ((1.0, ["one", "two"]), (0.5, ["one"])):
        _patch(monkeypatch, LabelTask(), [])
        run_eval(cfg, model=object(), tokenizer=object(), progress=False)
        old = json.loads((tmp_path / "summary.json").read_text())
        del old["config"]["top_p"]
        (tmp_path / "summary.json").write_text(json.dumps(old))
        message, summary = interrupted(EvalConfig(tasks=["one", "two"], limit=2, top_p=top_p,
                                                  output_dir=str(tmp_path)))
        assert list(summary["results"]) == kept
