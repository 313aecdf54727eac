"""Experiments end to end on a tiny random Llama (real trainers, generation loop and scorers; ~30-45 s).

    pytest -q tests/test_experiments.py tests/test_experiments_run.py      # all experiment tests (< 60 s)

Both kinds run through ES and GRPO; a re-run skips finished stages; a run killed mid-stage resumes that stage
from the trainer's own log; a failing stage leaves every other result in place and blocks only its dependants;
a changed option on a finished stage is refused before any compute.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest
import yaml

from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from esft.experiments import SpecError, load_spec, run_experiment
from experiments_tiny import ES_BLOCK, EVAL_BLOCK, GRPO_BLOCK, TinyHooks, write_spec


def _json(path: Path):
    return json.loads(path.read_text())


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _rerun_stopped_after_base(spec: Path, data: dict, out: Path, tiny: TinyHooks, again: TinyHooks):
    """Write `data` as the spec and run it again, stopped (Ctrl-C) at the second model load, once the base model is
    evaluated; the experiment as the tables then read it."""
    from esft.experiments.records import load_experiment
    from esft.rundir import RunInterrupted

    spec.write_text(yaml.safe_dump(data))
    loads = []

    def stop_after_base(*args):
        if loads:
            raise KeyboardInterrupt
        return loads.append(args) or tiny.load_model(*args)

    again.hooks.load_model = stop_after_base
    with pytest.raises(RunInterrupted):
        run_experiment(load_spec(spec), out, again.hooks)
    return load_experiment(out)


def test_single_task_end_to_end_and_rerun_skips_everything(tmp_path, tokenizer):
    spec = write_spec(tmp_path / "single.yaml", "single-task", ["boolq"],
                      {"es": {**ES_BLOCK, "iterations": [1, 2]}, "grpo": GRPO_BLOCK},
                      evaluation={"limit": 1, "max_new_tokens": 2, "batch_size": 8, "holdout": ["mmlu"],
                                  "after_single_task": "trained+holdout"})
    out = tmp_path / "out"
    tiny = TinyHooks(tokenizer)
    t0 = time.perf_counter()
    result = run_experiment(load_spec(spec), out, tiny.hooks)
    wall = time.perf_counter() - t0
    assert result.ok, result.statuses
    assert (out / "spec.yaml").read_text() == spec.read_text()  # the folder keeps the spec it ran
    stage = out / "seed-42/single-task/boolq"
    # one ES run served both budgets: trained to 1, snapshotted, continued to 2
    assert tiny.trained == [("es", "seed-42/single-task/boolq/es/run")] * 2 + \
        [("grpo", "seed-42/single-task/boolq/grpo/run")]
    snap = stage / "es/run/checkpoints/iter_000001"
    assert _json(snap / "es_state.json")["step"] == 1 and _json(stage / "es/run/checkpoints/final/es_state.json")[
        "step"] == 2
    r1, r2, rg = (_json(stage / name / "result.json") for name in ("es@1", "es@2", "grpo"))
    for rec in (r1, r2, rg):  # each stage's measured training and evaluation time lies within the run's
        assert 0 < rec["seconds"]["train"] <= wall and 0 < rec["seconds"]["eval"] <= wall
    assert r1["model"].endswith("es/run/checkpoints/iter_000001") and r2["model"].endswith("es/run/checkpoints/final")
    # accounting measured from the run logs up to each budget: N 2 x B 2 generations per iteration
    assert [r["steps"][0]["accounting"]["generations"] for r in (r1, r2)] == [4, 8]
    # every run draws its learning curve, as a run started with `esft train` does (README, "Run directories")
    assert all((stage / algo / "run/curve.png").stat().st_size > 1000 for algo in ("es", "grpo"))
    assert rg["steps"][0]["accounting"]["generations"] == 4  # 2 prompts x 2 samples
    assert set(r1["eval"]) == {"boolq", "mmlu"} and r1["eval"]["boolq"]["n"] == 1
    assert set(_json(out / "base/result.json")["eval"]) == {"boolq", "mmlu"}
    table1 = (out / "tables/table1_single_task.md").read_text()
    assert "| Task | Constant answer | Base | ES (iter=1) | ES (iter=2) | GRPO (T=1) |" in table1  # the prior beside every accuracy
    assert (out / "tables/table18_compute.csv").exists()

    again = TinyHooks(tokenizer)
    loads = []
    again.hooks.load_model = lambda *a: loads.append(a) or tiny.load_model(*a)
    result = run_experiment(load_spec(spec), out, again.hooks)
    assert result.ok and again.trained == [] and loads == []  # nothing trained, nothing evaluated
    assert len(_lines(out / "invocations.jsonl")) == 2
    # a spec built in memory (no file behind its path) runs in the folder too, which keeps the spec it has
    from esft.experiments.spec import parse_spec
    from esft.experiments.yamlines import load_file

    result = run_experiment(parse_spec(load_file(spec)), out, again.hooks)
    assert result.ok and again.trained == [] and loads == []
    assert (out / "spec.yaml").read_text() == spec.read_text()

    # a changed evaluation setting re-evaluates only what it affects, from the kept weights
    data = yaml.safe_load(spec.read_text())
    data["evaluation"]["per_task"] = {"mmlu": {"limit": 2}}
    spec.write_text(yaml.safe_dump(data))
    loads.clear()
    result = run_experiment(load_spec(spec), out, again.hooks)
    assert result.ok and again.trained == [] and len(loads) == 4  # base + 3 stages, no training
    r1 = _json(stage / "es@1/result.json")
    assert r1["eval"]["mmlu"]["n"] == 2 and r1["eval"]["boolq"] == _json(stage / "es@1/eval/boolq.json")["summary"]

    # settings changed again, and the run stopped once the base model was re-evaluated: the stages it did not reach
    # still hold their mmlu evaluation of 2 examples. The tables leave those out and say so, rather than set them
    # beside the base model's of 3 (a false forgetting)
    data["evaluation"]["per_task"] = {"mmlu": {"limit": 3}}
    exp = _rerun_stopped_after_base(spec, data, out, tiny, again)
    assert exp.base["eval"]["mmlu"]["n"] == 3
    later = ["seed-42/single-task/boolq/es@2", "seed-42/single-task/boolq/grpo"]
    assert exp.stale == {key: ["mmlu"] for key in later}
    assert all("mmlu" not in exp.results[key]["eval"] and "boolq" in exp.results[key]["eval"] for key in later)
    summary = (out / "tables/tables.md").read_text()
    assert f"- {later[0]}: its evaluation of MMLU was made with other settings than the spec's" in summary


def test_sequential_end_to_end(tmp_path, tokenizer):
    spec = write_spec(tmp_path / "seq.yaml", "sequential", ["countdown", "boolq"],
                      {"es": {**ES_BLOCK, "iterations": 1}, "grpo": GRPO_BLOCK},
                      sequential={"carry_optimizer_state": True})
    out = tmp_path / "out"
    tiny = TinyHooks(tokenizer)
    result = run_experiment(load_spec(spec), out, tiny.hooks)
    assert result.ok, result.statuses
    seq = out / "seed-42/sequential"
    for algo in ("es", "grpo"):
        first = yaml.safe_load((seq / algo / "1-countdown/run/config.yaml").read_text())
        second = yaml.safe_load((seq / algo / "2-boolq/run/config.yaml").read_text())
        assert first["model"] == "tiny" and first["task"] == "countdown"
        # the trackers' names: every stage's folder is `run`
        assert (first["run_name"], second["run_name"]) == (f"out/seed-42/sequential/{algo}/1-countdown",
                                                           f"out/seed-42/sequential/{algo}/2-boolq")
        # stage 2 starts from stage 1's final weights (which is how `esft report` links the chain)
        assert second["model"] == str((seq / algo / "1-countdown/run/checkpoints/final").resolve())
        for k, task in ((1, "countdown"), (2, "boolq")):
            rec = _json(seq / algo / f"{k}-{task}/result.json")
            assert set(rec["eval"]) == {"countdown", "boolq", "mmlu"} and rec["index"] == k
    # GRPO stage 2 is a new run: its own step count and schedule (AdamW moments carried, as the spec asks,
    # from stage 1's checkpoint)
    assert (seq / "grpo/1-countdown/run/checkpoints/final/optimizer.pt").exists()
    steps = [r["step"] for r in map(json.loads, _lines(seq / "grpo/2-boolq/run/metrics.jsonl"))
             if r["kind"] == "train"]
    assert steps == [1]
    tables = out / "tables"
    table2 = (tables / "table2_holdout.md").read_text()
    assert "| Stage | ES (iter=1) (MMLU) | GRPO (T=1) (MMLU) |" in table2 and "| After Task 2 (BoolQ) |" in table2
    assert "| After Countdown | **" in (tables / "table5-8_sequential_es.md").read_text()
    assert (tables / "table5-8_sequential_grpo.csv").exists() and (tables / "results.csv").exists()


def test_resume_after_kill_mid_stage(tmp_path, tokenizer, monkeypatch):
    from esft.es import trainer as es_trainer
    from esft.rundir import RunInterrupted

    spec = write_spec(tmp_path / "seq.yaml", "sequential", ["countdown", "boolq"],
                      {"es": {**ES_BLOCK, "iterations": 3}},
                      evaluation={"limit": 1, "max_new_tokens": 2, "holdout": []})
    out = tmp_path / "out"
    original = es_trainer.ESTrainer.iteration
    done: list[tuple[str, int]] = []

    def killed_in_stage_2(self):
        if self.config.task == "boolq" and self.step == 1:
            raise KeyboardInterrupt  # what Ctrl-C (or a kill) does mid-stage
        done.append((self.config.task, self.step))
        return original(self)

    monkeypatch.setattr(es_trainer.ESTrainer, "iteration", killed_in_stage_2)
    # the line `esft experiment run` prints in place of the trainer's `esft train es --resume` (which would bypass
    # the experiment)
    with pytest.raises(RunInterrupted, match="^interrupted in seed-42/sequential/es/2-boolq; run the same command "
                       "again to resume$"):
        run_experiment(load_spec(spec), out, TinyHooks(tokenizer).hooks)
    stage1, stage2 = out / "seed-42/sequential/es/1-countdown", out / "seed-42/sequential/es/2-boolq"
    assert _json(stage1 / "status.json")["status"] == "done"
    # the stop is recorded (Ctrl-C or SIGTERM: esft.sigterm), not left as a "running" stage
    # with the pid of a process that is gone
    stopped = _json(stage2 / "status.json")
    assert stopped["status"] == "stopped" and "pid" not in stopped and stopped["stopped"]
    logged = _lines(stage2 / "run/seeds.jsonl")
    assert len(logged) == 1 and done == [("countdown", 0), ("countdown", 1), ("countdown", 2), ("boolq", 0)]
    assert _json(out / "invocations.jsonl")["interrupted"] is True
    # the interrupted run's tables: the stage done, the one stopped (before, tables/ waited for an uninterrupted run)
    summary = (out / "tables/tables.md").read_text()
    assert "2 of 3 stages done.\n- seed-42/sequential/es/2-boolq: stopped\n" in summary, summary

    done.clear()
    monkeypatch.setattr(es_trainer.ESTrainer, "iteration", lambda self: done.append(
        (self.config.task, self.step)) or original(self))
    tiny = TinyHooks(tokenizer)
    result = run_experiment(load_spec(spec), out, tiny.hooks)
    assert result.ok
    # stage 1 was not redone; stage 2 resumed after its logged iteration
    assert tiny.trained == [("es", "seed-42/sequential/es/2-boolq/run")]
    assert done == [("boolq", 1), ("boolq", 2)]
    resumed = _lines(stage2 / "run/seeds.jsonl")
    assert len(resumed) == 3 and resumed[0] == logged[0]
    assert all(json.loads(line)["noise_stream"] == 1 for line in resumed)  # the resumed stage kept its stream
    finished = _json(stage2 / "status.json")
    assert finished["attempts"] == 2 and finished["status"] == "done" and "stopped" not in finished


def test_sigterm_during_a_stages_evaluation_stops_a_script_run_as_ctrl_c_does(tmp_path, tokenizer):
    """`run_experiment` called from a script: a SIGTERM (a scheduler's preemption) while the base model is evaluated,
    outside any trainer, stops the experiment as Ctrl-C does (the stage reads stopped, the invocation is logged),
    and SIGTERM's default is back once it returns. Sent only where esft handles it: the default would end pytest."""
    import os
    import signal

    from esft.rundir import RunInterrupted

    spec = write_spec(tmp_path / "seq.yaml", "sequential", ["boolq"], {"es": {**ES_BLOCK, "iterations": 1}},
                      evaluation={"limit": 1, "max_new_tokens": 2, "holdout": []})
    out = tmp_path / "out"
    tiny = TinyHooks(tokenizer)
    handlers = []

    def preempted(*args):
        handlers.append(signal.getsignal(signal.SIGTERM))
        if handlers[-1] is not signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGTERM)
        return tiny.load_model(*args)

    tiny.hooks.load_model = preempted
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a script's process, which has no handler of its own
    try:
        with pytest.raises(RunInterrupted, match="^interrupted in base;"):
            run_experiment(load_spec(spec), out, tiny.hooks)
        assert handlers and handlers[0] is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert _json(out / "base/status.json")["status"] == "stopped"
    assert _json(out / "invocations.jsonl")["interrupted"] is True


def test_tables_that_fail_after_an_interrupt_leave_the_interrupts_message(tmp_path, tokenizer, monkeypatch, capsys):
    """The tables of an interrupted run are written in its `finally`: a failure there must not replace the
    interrupt's message (how to resume) with its own traceback."""
    from esft.es import trainer as es_trainer
    from esft.experiments import study_tables
    from esft.rundir import RunInterrupted

    spec = write_spec(tmp_path / "seq.yaml", "sequential", ["countdown", "boolq"], {"es": {**ES_BLOCK, "iterations": 1}},
                      evaluation={"limit": 1, "max_new_tokens": 2, "holdout": []})

    def stop(self):
        raise KeyboardInterrupt

    def broken(root):
        raise OSError("disk full")

    monkeypatch.setattr(es_trainer.ESTrainer, "iteration", stop)
    monkeypatch.setattr(study_tables, "write_all_tables", broken)
    with pytest.raises(RunInterrupted, match="run the same command again to resume"):
        run_experiment(load_spec(spec), tmp_path / "out", TinyHooks(tokenizer).hooks)
    err = capsys.readouterr().err
    assert "esft: warning: the tables of" in err and "(OSError: disk full); `esft experiment tables" in err


def test_a_stage_whose_parent_was_retrained_is_refused_not_kept(tmp_path, tokenizer):
    """Stage 1 deleted (to retrain it, as the refusal of a changed option advises): stage 2, trained from the old
    stage 1 weights, is refused before anything runs. Before, it was skipped as done and its numbers chained to
    the new stage 1's."""
    from esft.experiments.yamlines import SpecError

    spec = write_spec(tmp_path / "seq.yaml", "sequential", ["countdown", "boolq"], {"es": {**ES_BLOCK, "iterations": 1}},
                      evaluation={"limit": 1, "max_new_tokens": 2, "holdout": []})
    out = tmp_path / "out"
    tiny = TinyHooks(tokenizer)
    assert run_experiment(load_spec(spec), out, tiny.hooks, write_tables=False).ok
    stage1, stage2 = out / "seed-42/sequential/es/1-countdown", out / "seed-42/sequential/es/2-boolq"
    assert _json(stage2 / "status.json")["parent_trained_at"] == _json(stage1 / "status.json")["trained_at"]
    shutil.rmtree(stage1)
    tiny.trained.clear()
    with pytest.raises(SpecError, match=f"^{re.escape(str(stage2))} was trained from the weights of "
                                        f"{re.escape(str(stage1))}, which was deleted or trained again since"):
        run_experiment(load_spec(spec), out, tiny.hooks, write_tables=False)
    assert tiny.trained == [] and not stage1.exists()
    shutil.rmtree(stage2)  # as the refusal says: then both are trained again
    assert run_experiment(load_spec(spec), out, tiny.hooks, write_tables=False).ok and len(tiny.trained) == 2


def test_a_stage_whose_parents_status_is_unreadable_is_refused_with_that_file_named(tmp_path, tokenizer):
    """A damaged status.json of stage 1 read as "stage 1 was deleted or trained again since", and the refusal
    advised deleting stage 2, trained from stage 1's present weights: the unreadable file is named instead."""
    from esft.experiments.yamlines import SpecError

    spec = write_spec(tmp_path / "seq.yaml", "sequential", ["countdown", "boolq"], {"es": {**ES_BLOCK, "iterations": 1}},
                      evaluation={"limit": 1, "max_new_tokens": 2, "holdout": []})
    out = tmp_path / "out"
    tiny = TinyHooks(tokenizer)
    assert run_experiment(load_spec(spec), out, tiny.hooks, write_tables=False).ok
    status1 = out / "seed-42/sequential/es/1-countdown/status.json"
    kept = status1.read_text()
    status1.write_text(kept[:20])
    tiny.trained.clear()
    with pytest.raises(SpecError, match=f"^{re.escape(str(status1))} is unreadable, so whether "
                                        f"{re.escape(str(out / 'seed-42/sequential/es/2-boolq'))} was trained from "
                                        "that stage's present weights cannot be told; restore the file"):
        run_experiment(load_spec(spec), out, tiny.hooks, write_tables=False)
    status1.write_text(kept)  # restored: nothing to do
    assert run_experiment(load_spec(spec), out, tiny.hooks, write_tables=False).ok and tiny.trained == []


def test_sequential_es_stages_draw_independent_noise(tmp_path, tokenizer):
    from esft.es.replay import matches_checkpoint, rebuild

    spec = write_spec(tmp_path / "seq.yaml", "sequential", ["countdown", "boolq"],
                      {"es": {**ES_BLOCK, "iterations": 2}},
                      evaluation={"limit": 1, "max_new_tokens": 2, "holdout": []})
    out = tmp_path / "out"
    tiny = TinyHooks(tokenizer)
    assert run_experiment(load_spec(spec), out, tiny.hooks, write_tables=False).ok
    seq = out / "seed-42/sequential/es"
    first, second = (seq / "1-countdown/run", seq / "2-boolq/run")
    logs = [[json.loads(line) for line in _lines(run / "seeds.jsonl")] for run in (first, second)]
    assert [len(log) for log in logs] == [2, 2]
    # both stages run seed 42 from iteration 0, yet no iteration of stage 2 re-draws a perturbation of stage 1
    for a, b in zip(*logs):
        assert not {s for s, _ in a["members"]} & {s for s, _ in b["members"]}
    assert not {s for r in logs[0] for s in r["seeds"]} & {s for r in logs[1] for s in r["seeds"]}
    streams = [yaml.safe_load((run / "config.yaml").read_text())["noise_stream"] for run in (first, second)]
    assert streams == [0, 1] and all(r["noise_stream"] == 1 for r in logs[1])
    assert _json(seq / "2-boolq/result.json")["steps"][0]["config"]["noise_stream"] == 1
    # stage 2 replays from its start model (stage 1's final weights) and its seed log alone, bit for bit
    model, _ = tiny.load_model(yaml.safe_load((second / "config.yaml").read_text())["model"])
    assert matches_checkpoint(model, rebuild(model, second), second / "checkpoints/final")


def test_failed_stage_keeps_other_results_then_reruns(tmp_path, tokenizer):
    algorithms = {"es": {**ES_BLOCK, "iterations": 1},
                  "es-b": {"algorithm": "es", **ES_BLOCK, "iterations": 1, "sigma": 0.02}}
    spec_path = write_spec(tmp_path / "seq.yaml", "sequential", ["countdown", "boolq"], algorithms,
                           evaluation={"limit": 1, "max_new_tokens": 2, "holdout": []})
    out = tmp_path / "out"
    tiny = TinyHooks(tokenizer)
    good = tiny.hooks.train_kwargs

    def failing(step, config):
        if "/es-b/1-" in step.run_dir:
            raise RuntimeError("boom")
        return good(step, config)

    tiny.hooks.train_kwargs = failing
    result = run_experiment(load_spec(spec_path), out, tiny.hooks)
    seq = "seed-42/sequential"
    assert result.statuses == {"base": "done", f"{seq}/es/1-countdown": "done", f"{seq}/es/2-boolq": "done",
                               f"{seq}/es-b/1-countdown": "failed", f"{seq}/es-b/2-boolq": "blocked"}
    failed = out / seq / "es-b/1-countdown"
    assert "RuntimeError: boom" in (failed / "error.txt").read_text()
    assert "Traceback" in (failed / "error.txt").read_text()
    assert _json(failed / "status.json")["error"] == "RuntimeError: boom"
    summary = (out / "tables/tables.md").read_text()
    assert f"- {seq}/es-b/1-countdown: failed (RuntimeError: boom)" in summary
    assert f"- {seq}/es-b/2-boolq: blocked" in summary
    kept = (out / seq / "es/2-boolq/result.json").read_text()

    tiny.hooks.train_kwargs = good
    tiny.trained.clear()
    result = run_experiment(load_spec(spec_path), out, tiny.hooks)
    assert result.ok
    assert [run for _, run in tiny.trained] == [f"{seq}/es-b/1-countdown/run", f"{seq}/es-b/2-boolq/run"]
    assert (out / seq / "es/2-boolq/result.json").read_text() == kept
    assert not (failed / "error.txt").exists()

    # a finished stage trained with other options is refused before any compute, naming stage and field
    data = yaml.safe_load(spec_path.read_text())
    data["algorithms"]["es"]["sigma"] = 0.5
    spec_path.write_text(yaml.safe_dump(data))
    tiny.trained.clear()
    with pytest.raises(SpecError, match=r"es/1-countdown was trained with other options \(sigma: 0\.01 -> 0\.5"):
        run_experiment(load_spec(spec_path), out, tiny.hooks)
    assert tiny.trained == []


def test_sequential_grpo_to_es_chain_has_a_passk_table_of_its_stages(tmp_path, tokenizer):
    """A GRPO->ES chain as a sequential track with `evaluation.passk`: tables/passk_sequential_grpo-es.md has a row
    per stage, each cell the pass@k its stage's `<task>.passk.json` recorded, with that file's interval."""
    spec = write_spec(tmp_path / "seq.yaml", "sequential", ["countdown", "boolq"],
                      {"grpo->es": {"grpo": GRPO_BLOCK, "es": {**ES_BLOCK, "iterations": 1}}},
                      evaluation={**EVAL_BLOCK, "limit": 2, "holdout": [],
                                  "passk": {"samples": 3, "k": [1, 3], "temperature": 1.0}})
    out = tmp_path / "out"
    assert run_experiment(load_spec(spec), out, TinyHooks(tokenizer).hooks).ok
    table = (out / "tables/passk_sequential_grpo-es.md").read_text()
    assert table in (out / "tables/tables.md").read_text()
    stages = {"Base": "base", "After Countdown": "seed-42/sequential/grpo-to-es/1-countdown",
              "After BoolQ": "seed-42/sequential/grpo-to-es/2-boolq"}
    for label, key in stages.items():
        cells = []
        for task in ("countdown", "boolq"):
            for k in ("1", "3"):
                entry = _json(out / key / f"eval/{task}.passk.json")["summary"]["pass@k"][k]
                value = f"{100 * entry['value']:.1f}"
                bold = label == f"After {'Countdown' if task == 'countdown' else 'BoolQ'}"
                lo, hi = entry["ci95"]
                cells += [f"**{value}**" if bold else value, f"[{100 * lo:.1f}, {100 * hi:.1f}]"]
        assert f"| {label} | {' | '.join(cells)} |" in table


def test_method_comparison_with_passk_sampling(tmp_path, tokenizer):
    """Issue 8's comparison: ES variants as labelled blocks, a sampled pass@k evaluation beside the greedy one, and
    the per-task methods table with CIs and training time; a re-run samples nothing again."""
    spec = write_spec(tmp_path / "compare.yaml", "single-task", ["boolq"],
                      {"es": {**ES_BLOCK, "iterations": 1},
                       "dart-es": {**ES_BLOCK, "algorithm": "es", "display": "DART-ES", "fitness_rule": "dart",
                                   "iterations": 1}},
                      evaluation={"limit": 2, "max_new_tokens": 2, "batch_size": 8, "holdout": [],
                                  "after_single_task": "trained",
                                  "passk": {"samples": 3, "k": [1, 3], "temperature": 1.0}})
    out = tmp_path / "out"
    tiny = TinyHooks(tokenizer)
    assert run_experiment(load_spec(spec), out, tiny.hooks).ok
    stage = out / "seed-42/single-task/boolq"
    sampled = _json(stage / "dart-es/eval/boolq.passk.json")
    assert sampled["settings"]["samples"] == 3 and sampled["summary"]["completions"] == 6
    assert set(sampled["summary"]["pass@k"]) == {"1", "3"}
    assert len(_lines(stage / "dart-es/eval/boolq.passk.jsonl")) == 6  # 2 questions x 3 samples
    result = _json(stage / "dart-es/result.json")
    assert result["eval"]["boolq"]["sampled"]["pass@k"] == sampled["summary"]["pass@k"]
    assert "sampled" in _json(out / "base/result.json")["eval"]["boolq"]
    table = (out / "tables/methods_boolq.md").read_text()
    assert "| Method | Accuracy % | 95% CI | Format % | pass@1 % | pass@1 CI | pass@3 % | pass@3 CI | Train wall s |" \
        in table
    assert "| DART-ES" in table and "| Base |" in table and "3 completions per question" in table

    again = TinyHooks(tokenizer)
    loads = []
    again.hooks.load_model = lambda *a: loads.append(a) or tiny.load_model(*a)
    assert run_experiment(load_spec(spec), out, again.hooks).ok and loads == [] and again.trained == []
    # done stages were skipped, not visited again to rebuild the same record
    assert _json(stage / "dart-es/status.json")["attempts"] == 1 and _json(stage / "dart-es/result.json") == result

    # a lost sampled evaluation is sampled again, from the kept weights, beside the kept greedy one
    greedy = (stage / "dart-es/eval/boolq.json").read_text()
    (stage / "dart-es/eval/boolq.passk.json").unlink()
    assert run_experiment(load_spec(spec), out, again.hooks).ok and len(loads) == 1 and again.trained == []
    assert (stage / "dart-es/eval/boolq.json").read_text() == greedy  # not evaluated again
    assert _json(stage / "dart-es/result.json")["eval"]["boolq"]["sampled"]["completions"] == 6

    # pass@k asked with another n, and the run stopped once the base was sampled again: the stages it did not reach
    # still hold a pass@k of 3 completions per question. The tables leave those out and say so, rather than set
    # them beside the base's pass@k of 4 (their greedy evaluations, made with unchanged settings, stay)
    data = yaml.safe_load(spec.read_text())
    data["evaluation"]["passk"]["samples"] = 4
    exp = _rerun_stopped_after_base(spec, data, out, tiny, again)
    assert exp.base["eval"]["boolq"]["sampled"]["completions"] == 8 and exp.stale == {}
    # (the stage the stop interrupted is not done, so its result is out anyway)
    assert "seed-42/single-task/boolq/dart-es" not in exp.results
    later = "seed-42/single-task/boolq/es"
    assert exp.stale_sampled == {later: ["boolq"]}
    assert "sampled" not in exp.results[later]["eval"]["boolq"] and "accuracy" in exp.results[later]["eval"]["boolq"]
    assert f"- {later}: its pass@k of BoolQ was sampled with other settings" in (out / "tables/tables.md").read_text()
    # a spec that samples no more: nothing is stale (a run again samples nothing that could clear it)
    from esft.experiments.records import load_experiment

    del data["evaluation"]["passk"]
    spec.write_text(yaml.safe_dump(data))
    again.hooks.load_model = tiny.load_model
    assert run_experiment(load_spec(spec), out, again.hooks).ok
    assert load_experiment(out).stale_sampled == {}


def test_each_sampled_line_names_its_task_with_options(tmp_path, tokenizer, capsys):
    """Two Countdown variants sampled in one stage both printed `countdown  sampled x2: ...` (the task class's
    name), so which pass@k was which could not be told; each line names the spec's task, as the greedy line does."""
    from esft.experiments.stage_eval import evaluate_stage

    tasks = ["countdown:numbers=2,ops=+*", "countdown:numbers=2,ops=+-"]
    spec = write_spec(tmp_path / "variants.yaml", "single-task", tasks, {"es": {**ES_BLOCK, "iterations": 1}},
                      evaluation={"limit": 1, "max_new_tokens": 2, "batch_size": 8, "holdout": [],
                                  "passk": {"samples": 2, "temperature": 1.0}})
    evaluate_stage(load_spec(spec), "tiny", tasks, tmp_path / "base", TinyHooks(tokenizer).load_model, root=tmp_path)
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if "sampled x2:" in line]
    assert [words[0] for words in lines] == tasks


def test_passk_block_is_validated_before_compute(tmp_path):
    for bad, words in (({"samples": 1}, "samples must be >= 2"), ({"samples": 4, "k": [8]}, "between 1 and"),
                       ({"samples": 4, "temperature": 0}, "temperature"), ({"k": [1]}, "needs samples"),
                       ({"samples": 4, "tasks": ["mmlu"]}, "mmlu.* is not evaluated by this spec; evaluated: boolq")):
        spec = write_spec(tmp_path / "bad.yaml", "single-task", ["boolq"], {"es": {**ES_BLOCK, "iterations": 1}},
                          evaluation={**EVAL_BLOCK_NO_HOLDOUT, "passk": bad})
        with pytest.raises(SpecError, match=words):
            load_spec(spec)


EVAL_BLOCK_NO_HOLDOUT = {"limit": 1, "max_new_tokens": 2, "holdout": []}


def test_wall_time_of_a_sigkilled_invocation_is_recovered(tmp_path, tokenizer):
    """SIGKILL skips the runner's `finally`: the heartbeat it left behind still puts its wall time in the log."""
    from esft.experiments.invocation import HEARTBEAT

    spec = write_spec(tmp_path / "seq.yaml", "sequential", ["boolq"], {"es": {**ES_BLOCK, "iterations": 1}},
                      evaluation={"limit": 1, "max_new_tokens": 2, "holdout": []})
    out = tmp_path / "out"
    out.mkdir()
    (out / HEARTBEAT).write_text(json.dumps({"started": "2026-01-01T00:00:00", "last": "2026-01-01T00:12:30",
                                             "pid": 1, "wall_s": 750.0}))  # what a killed runner leaves
    assert run_experiment(load_spec(spec), out, TinyHooks(tokenizer).hooks).ok
    killed, this = (json.loads(line) for line in _lines(out / "invocations.jsonl"))
    assert killed["wall_s"] == 750.0 and killed["killed"] and killed["interrupted"]
    assert this["interrupted"] is False and not (out / HEARTBEAT).exists()
    assert "Wall time of all" in (out / "tables/tables.md").read_text()


def test_a_moved_folder_and_an_added_budget_resume_without_retraining(tmp_path, tokenizer):
    """Stage records keep absolute paths of the weights a stage started from and was evaluated on: an experiment
    folder moved (or copied) elsewhere was refused as "trained with other options (model: ...)", and adding a
    larger budget to a sequential ES list was refused the same way (stage 1 of the old largest budget now starts
    from its snapshot, the same weights as the run's final then)."""
    import shutil

    spec_path = write_spec(tmp_path / "seq.yaml", "sequential", ["countdown", "boolq"],
                           {"es": {**ES_BLOCK, "iterations": [1, 2]}},
                           evaluation={"limit": 1, "max_new_tokens": 2, "batch_size": 8, "holdout": []})
    tiny = TinyHooks(tokenizer)
    assert run_experiment(load_spec(spec_path), tmp_path / "out", tiny.hooks).ok
    moved = tmp_path / "elsewhere" / "out"
    shutil.move(str(tmp_path / "out"), str(moved))
    again, loads = TinyHooks(tokenizer), []
    again.hooks.load_model = lambda *a: loads.append(a) or tiny.load_model(*a)
    result = run_experiment(load_spec(spec_path), moved, again.hooks)
    assert result.ok and again.trained == [] and loads == []  # nothing trained, nothing evaluated again

    data = yaml.safe_load(spec_path.read_text())
    data["algorithms"]["es"]["iterations"] = [1, 2, 3]
    spec_path.write_text(yaml.safe_dump(data))
    result = run_experiment(load_spec(spec_path), moved, again.hooks)
    seq = "seed-42/sequential"
    assert result.ok, result.statuses
    # only the new budget trains: the shared stage-1 run continues from 2 to 3, then its stage 2
    assert again.trained == [("es", f"{seq}/es/1-countdown/run"), ("es", f"{seq}/es@3/2-boolq/run")]
    run = moved / seq / "es/1-countdown/run/checkpoints"
    assert _json(run / "iter_000002/es_state.json")["step"] == 2 and _json(run / "final/es_state.json")["step"] == 3
    assert _json(moved / seq / "es@2/1-countdown/result.json")["model"].endswith("checkpoints/iter_000002")


def test_dropping_the_largest_budget_is_refused_not_evaluated_on_later_weights(tmp_path, tokenizer):
    """ES budgets [1, 2, 3] share one run; listing [1, 2] afterwards made budget 2 the run's last, read from its
    final checkpoint, which holds step 3: ES (iter=2) was evaluated and reported on step 3's weights."""
    spec_path = write_spec(tmp_path / "single.yaml", "single-task", ["boolq"],
                           {"es": {**ES_BLOCK, "iterations": [1, 2, 3]}},
                           evaluation={"limit": 1, "max_new_tokens": 2, "batch_size": 8, "holdout": []})
    out = tmp_path / "out"
    tiny = TinyHooks(tokenizer)
    assert run_experiment(load_spec(spec_path), out, tiny.hooks).ok
    before = _json(out / "seed-42/single-task/boolq/es@2/result.json")
    data = yaml.safe_load(spec_path.read_text())
    data["algorithms"]["es"]["iterations"] = [1, 2]
    spec_path.write_text(yaml.safe_dump(data))
    tiny.trained.clear()
    result = run_experiment(load_spec(spec_path), out, tiny.hooks)
    stage = out / "seed-42/single-task/boolq/es@2"
    assert result.statuses["seed-42/single-task/boolq/es@2"] == "failed" and tiny.trained == []
    assert "has trained to 3 steps, past this stage's budget of 2" in _json(stage / "status.json")["error"]
    assert _json(stage / "result.json") == before  # the record of step 2's weights is kept


def test_a_failed_evaluation_keeps_the_weights_for_the_next_stage_and_a_lost_result_is_rebuilt(tmp_path, tokenizer):
    """A stage whose training finished but whose evaluation failed has its weights: the next stage trains from
    them instead of being blocked, and the re-run evaluates it again without training. A done stage whose
    result.json is gone is visited again (from its kept weights and evaluations), not skipped with no record."""
    spec = write_spec(tmp_path / "seq.yaml", "sequential", ["countdown", "boolq"],
                      {"es": {**ES_BLOCK, "iterations": 1}}, evaluation={"limit": 1, "max_new_tokens": 2, "holdout": []})
    out, seq = tmp_path / "out", "seed-42/sequential/es"
    tiny = TinyHooks(tokenizer)
    good = tiny.hooks.load_model

    def failing(ref, *args):
        if ref.endswith("1-countdown/run/checkpoints/final"):
            raise RuntimeError("evaluation boom")
        return good(ref, *args)

    tiny.hooks.load_model = failing
    result = run_experiment(load_spec(spec), out, tiny.hooks, write_tables=False)
    assert result.statuses == {"base": "done", f"{seq}/1-countdown": "failed", f"{seq}/2-boolq": "done"}
    assert _json(out / seq / "1-countdown/status.json")["trained"] is True
    tiny.hooks.load_model = good
    tiny.trained.clear()
    assert run_experiment(load_spec(spec), out, tiny.hooks, write_tables=False).ok and tiny.trained == []
    assert set(_json(out / seq / "1-countdown/result.json")["eval"]) == {"countdown", "boolq"}

    (out / seq / "2-boolq/result.json").unlink()
    loads = []
    tiny.hooks.load_model = lambda *a: loads.append(a) or good(*a)
    assert run_experiment(load_spec(spec), out, tiny.hooks, write_tables=False).ok
    assert tiny.trained == [] and loads == []  # neither trained nor evaluated again: only the record is rebuilt
    assert set(_json(out / seq / "2-boolq/result.json")["eval"]) == {"countdown", "boolq"}


def test_a_chain_takes_the_run_an_earlier_label_trains_with_the_same_options(tmp_path, tokenizer):
    """`grpo->es` beside `grpo` with the same GRPO options: GRPO trains once, the chain's ES step starts from that
    run's final checkpoint, and both stages record the same GRPO run; a chain whose GRPO options differ trains
    its own."""
    spec = write_spec(tmp_path / "chain.yaml", "single-task", ["boolq"],
                      {"grpo": GRPO_BLOCK, "grpo->es": {"grpo": {}, "es": {"iterations": 1}},
                       "long": {"algorithm": "grpo->es", "grpo": {"max_steps": 2}, "es": {"iterations": 1}},
                       "es": {**ES_BLOCK, "iterations": 1}})
    out = tmp_path / "out"
    tiny = TinyHooks(tokenizer)
    result = run_experiment(load_spec(spec), out, tiny.hooks)
    assert result.ok, result.statuses
    base = "seed-42/single-task/boolq"
    assert tiny.trained == [("grpo", f"{base}/grpo/run"), ("es", f"{base}/grpo-to-es/run-2-es"),
                            ("grpo", f"{base}/long/run-1-grpo"), ("es", f"{base}/long/run-2-es"),
                            ("es", f"{base}/es/run")]
    chain = _json(out / base / "grpo-to-es/result.json")
    assert [s["run_dir"] for s in chain["steps"]] == [f"{base}/grpo/run", f"{base}/grpo-to-es/run-2-es"]
    assert chain["steps"][0]["trained_by"] == "grpo" and "trained_by" not in chain["steps"][1]
    es_config = yaml.safe_load((out / base / "grpo-to-es/run-2-es/config.yaml").read_text())
    assert es_config["model"] == str((out / base / "grpo/run/checkpoints/final").resolve())
    assert es_config["run_name"] == f"out/{base}/grpo-to-es/run-2-es"
    assert not (out / base / "grpo-to-es/run-1-grpo").exists()


def test_a_chain_keeps_the_shared_run_after_its_owner_label_leaves_the_spec(tmp_path, tokenizer):
    """After `grpo` and `grpo->es` shared the GRPO run, a spec without the `grpo` label re-runs the folder: the
    finished chain stays done (its ES step started from that run, as recorded), nothing is trained again."""
    algorithms = {"grpo": GRPO_BLOCK, "grpo->es": {"grpo": {}, "es": {**ES_BLOCK, "iterations": 1}}}
    out = tmp_path / "out"
    first = TinyHooks(tokenizer)
    assert run_experiment(load_spec(write_spec(tmp_path / "a.yaml", "single-task", ["boolq"], algorithms)), out,
                          first.hooks).ok
    assert [algo for algo, _ in first.trained] == ["grpo", "es"]
    chain_only = {"grpo->es": {"grpo": GRPO_BLOCK, "es": {**ES_BLOCK, "iterations": 1}}}
    again = TinyHooks(tokenizer)
    result = run_experiment(load_spec(write_spec(tmp_path / "a.yaml", "single-task", ["boolq"], chain_only)), out,
                            again.hooks)
    assert result.ok, result.statuses
    assert again.trained == []
    assert not (out / "seed-42/single-task/boolq/grpo-to-es/run-1-grpo").exists()


def test_a_stopped_chain_resumes_from_the_shared_run_after_its_owner_label_leaves_the_spec(tmp_path, tokenizer,
                                                                                          monkeypatch):
    """The chain `grpo->es` stopped in its ES step, which started from the `grpo` label's run; a spec without
    `grpo` continues that ES run from the same weights (it used to refuse the stage as trained with other
    options: the ES step's start model)."""
    from esft.es import trainer as es_trainer
    from esft.rundir import RunInterrupted

    algorithms = {"grpo": GRPO_BLOCK, "grpo->es": {"grpo": {}, "es": {**ES_BLOCK, "iterations": 2}}}
    out, base = tmp_path / "out", "seed-42/single-task/boolq"
    original = es_trainer.ESTrainer.iteration

    def stopped_at_1(self):
        if self.step == 1:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(es_trainer.ESTrainer, "iteration", stopped_at_1)
    with pytest.raises(RunInterrupted):
        run_experiment(load_spec(write_spec(tmp_path / "a.yaml", "single-task", ["boolq"], algorithms)), out,
                       TinyHooks(tokenizer).hooks)
    assert not (out / base / "grpo-to-es/result.json").exists()
    monkeypatch.setattr(es_trainer.ESTrainer, "iteration", original)
    chain_only = {"grpo->es": {"grpo": GRPO_BLOCK, "es": {**ES_BLOCK, "iterations": 2}}}
    again = TinyHooks(tokenizer)
    result = run_experiment(load_spec(write_spec(tmp_path / "a.yaml", "single-task", ["boolq"], chain_only)), out,
                            again.hooks)
    assert result.ok, result.statuses
    assert again.trained == [("es", f"{base}/grpo-to-es/run-2-es")]
    chain = _json(out / base / "grpo-to-es/result.json")
    assert [(s["run_dir"], s.get("trained_by")) for s in chain["steps"]] == [(f"{base}/grpo/run", "grpo"),
                                                                           (f"{base}/grpo-to-es/run-2-es", None)]
    assert not (out / base / "grpo-to-es/run-1-grpo").exists()
