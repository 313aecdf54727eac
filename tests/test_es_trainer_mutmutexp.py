"""What the ES loop logs per iteration and per evaluation, checked against the run's own wall time and the
definitions of its rates (the mutation audit of 2026-12-05, mutexp, found these values untested). Tiny run with
the stub generate of tests/es_tiny.py (seconds).

Run: pytest tests/test_es_trainer_mutmutexp.py -q
"""

from __future__ import annotations

import time

import pytest

from es_tiny import one_thread  # noqa: F401  (autouse fixture)
from esft.es import es_rundir
from test_es_trainer import cfg, run


def test_logged_times_lie_within_the_run_and_rates_follow_their_definitions(tmp_path):
    t0 = time.perf_counter()
    res = run(cfg(tmp_path, iterations=3, eval_every=2, checkpoint_every=0))
    wall = time.perf_counter() - t0
    metrics = es_rundir.read_jsonl(res.output_dir / "metrics.jsonl")
    train = [m for m in metrics if m["kind"] == "train"]
    evals = [m for m in metrics if m["kind"] == "eval"]
    assert [m["step"] for m in train] == [1, 2, 3] and [m["step"] for m in evals] == [0, 2, 3]
    for m in evals:
        assert 0 < m["seconds"] <= wall
    for m in train:
        times = m["time"]
        assert 0 < times["evaluate"] <= times["total"] <= wall
        assert 0 <= times["update"] <= times["total"]
        assert m["generated_tokens_per_s"] == pytest.approx(m["tokens_generated"] / times["evaluate"])
        assert m["finished_rate"] == 1.0  # the stub finishes every completion: finished / completions


@pytest.mark.parametrize("per_iteration,rows", [(0, None), (3, 3), (20, 8)])
def test_each_iteration_keeps_the_first_samples_of_its_batch_up_to_samples_per_iteration(tmp_path, per_iteration,
                                                                                          rows):
    """samples/iter_XXXXXX.jsonl holds min(samples_per_iteration, batch_size) completions of member 0, in batch
    order; samples_per_iteration 0 writes no sample file."""
    res = run(cfg(tmp_path, iterations=2, eval_every=0, checkpoint_every=0, batch_size=8,
                  samples_per_iteration=per_iteration))
    seeds = es_rundir.read_jsonl(res.output_dir / "seeds.jsonl")
    for it, line in enumerate(seeds):
        path = res.output_dir / "samples" / f"iter_{it:06d}.jsonl"
        if rows is None:
            assert not path.exists()
            continue
        samples = es_rundir.read_jsonl(path)
        assert [s["index"] for s in samples] == line["batch"][:rows]
        assert all(s["member"] == 0 and [s["seed"], s["sign"]] == list(line["members"][0]) for s in samples)


def test_a_run_stopped_before_its_first_checkpoint_resumes_from_the_base_model_and_its_whole_log(tmp_path):
    """No checkpoint to start from (checkpoint_every 0, stopped in iteration 3): resume replays every logged
    iteration from iteration 0 on the base model, and ends where an uninterrupted run ends."""
    from es_tiny import bit_equal
    from test_es_trainer import interrupted_run, seeds_log

    full = run(cfg(tmp_path, "full", iterations=4, checkpoint_every=0, eval_every=0))
    config = cfg(tmp_path, "cut", iterations=4, checkpoint_every=0, eval_every=0)
    trainer, _ = interrupted_run(config, at=2)
    assert es_rundir.list_checkpoints(trainer.out) == []
    res = run(config.replace(resume=True))
    assert seeds_log(res.output_dir) == seeds_log(full.output_dir)
    assert bit_equal(es_rundir.read_checkpoint_tensors(res.final_checkpoint),
                     es_rundir.read_checkpoint_tensors(full.final_checkpoint))


@pytest.mark.parametrize("asked, recorded", [("auto", "float32"), ("float32", "float32"), ("bfloat16", "bfloat16")])
def test_an_injected_executor_runs_with_the_rollout_dtype_asked_auto_meaning_fp32(tmp_path, asked, recorded):
    """An executor given to the trainer decides how members roll out: "auto" is recorded as fp32 (what a resume
    then compares), an explicit dtype as itself."""
    from es_tiny import ToyTask, tiny_llama
    from esft.es.executor import Executor
    from esft.es.trainer import ESTrainer

    trainer = ESTrainer(cfg(tmp_path, rollout_dtype=asked), model=tiny_llama(), tokenizer=None, task=ToyTask(),
                        executor=Executor(), progress=False)
    assert trainer.precision.dtype == recorded and trainer.config.rollout_dtype == recorded
