"""The ES loop end to end on a tiny random Llama with a toy task and a stub generate (esft.es.trainer,
esft.es.replay, esft.es.runlog, esft.es.config): determinism, resume, replay, run-directory contents.

Run: . .venv/bin/activate && pytest -q tests/test_es_trainer.py   (~15 s, CPU, no tokenizer or download)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from es_tiny import one_thread  # noqa: F401  (autouse fixture)
from es_tiny import ToyTask, bit_equal, state, stub_generate, tiny_llama
from esft.es import es_rundir as runlog
from esft.es.es_config import ESConfig, preset
from esft.es.executor import LocalExecutor
from esft.es.replay import drift, matches_checkpoint, rebuild
from esft.api import train_es
from esft.es.build import sample_batch
from esft.es.trainer import ESTrainer


def cfg(tmp_path, name="run", **kw) -> ESConfig:
    base = dict(model="tiny", task="toy", population_size=6, sigma=0.05, alpha=0.02, batch_size=8,
                iterations=6, max_new_tokens=2, seed=5, output_dir=str(tmp_path / name), eval_every=3,
                eval_limit=6, checkpoint_every=2, format_bonus=0.1)
    base.update(kw)
    return ESConfig(**base)


def run(config, dtype=torch.float32, **kw):
    return train_es(config, model=tiny_llama(dtype=dtype), tokenizer=None, task=ToyTask(),
                    generate_fn=stub_generate, progress=False, **kw)


def final_masters(run_dir, dtype=torch.float32):
    model = tiny_llama(dtype=dtype)
    weights = rebuild(model, run_dir)
    return model, weights


def seeds_log(path):
    return runlog.read_jsonl(path / "seeds.jsonl")


def test_run_directory_contents(tmp_path):
    config = cfg(tmp_path)
    res = run(config)
    out = res.output_dir
    assert res.steps == 6 and res.final_checkpoint == out / "checkpoints" / "final"
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["population_size"] == 6 and saved["_run"]["master_dtype"] == "float32"
    assert saved["_run"]["param_dtypes"] == {"float32": len(list(tiny_llama().parameters()))}
    metrics = runlog.read_jsonl(out / "metrics.jsonl")
    train = [m for m in metrics if m["kind"] == "train"]
    evals = [m for m in metrics if m["kind"] == "eval"]
    assert [m["iteration"] for m in train] == list(range(6))
    assert [e["step"] for e in evals] == [0, 3, 6]
    m = train[0]
    for key in ("perturb", "generate", "score", "restore", "update", "total"):
        assert key in m["time"]
    assert set(m["fitness"]) == {"mean", "std", "min", "max"} and m["peak_rss_mb"] > 0
    assert m["tokens_generated"] == 6 * 8 * 2 and 0 <= m["format_rate"] <= 1
    assert all(t["finished_rate"] == 1.0 for t in train)  # the stub finishes every completion of every member
    assert evals[0]["test_n"] == 6 and len(evals[0]["test_ci95"]) == 2
    seeds = seeds_log(out)
    assert len(seeds) == 6 and len(seeds[0]["members"]) == 6 and len(seeds[0]["batch"]) == 8
    assert any(np.ptp(r["fitness"]) > 0 for r in seeds)  # the stub gives a real fitness signal
    assert [t["zero_update"] for t in train] == [r["update_norm"] == 0 for r in seeds]
    assert (out / "samples" / "iter_000000.jsonl").exists() and (out / "samples" / "eval_000006.jsonl").exists()
    ckpts = [s for s, _ in runlog.list_checkpoints(out)]
    assert ckpts == [2, 4, 6]
    for step, folder in runlog.list_checkpoints(out):  # each checkpoint names the seed-log lines it covers
        assert json.loads((folder / runlog.STATE_FILE).read_text())["seed_log_lines"] == step
    assert (out / "checkpoints" / "final" / "model.safetensors").exists()
    with pytest.raises(FileExistsError):  # never silently overwrite a run
        run(config)
    from esft.es.curve import plot_run, summarize

    summary = summarize(out)
    assert summary["iterations"] == 6 and summary["eval_last"]["step"] == 6 and summary["peak_rss_mb"] > 0
    assert {"perturb", "generate", "score", "restore", "update"} <= set(summary["time_split_fraction"])
    assert plot_run(out).stat().st_size > 1000


def test_same_seed_is_bit_identical_and_replay_reproduces_weights(tmp_path):
    a = run(cfg(tmp_path, "a"))
    b = run(cfg(tmp_path, "b"))
    assert seeds_log(a.output_dir) == seeds_log(b.output_dir)
    sa = runlog.read_checkpoint_tensors(a.final_checkpoint)
    sb = runlog.read_checkpoint_tensors(b.final_checkpoint)
    assert bit_equal(sa, sb)
    model, weights = final_masters(a.output_dir)  # base model + seeds.jsonl only
    assert matches_checkpoint(model, weights, a.final_checkpoint)
    from esft.es.replay import verify

    assert verify(a.output_dir, model=tiny_llama())["bit_identical"] is True
    assert not matches_checkpoint(tiny_llama(), weights, a.output_dir / "checkpoints" / "iter_000002")
    # any intermediate step, too
    model2 = tiny_llama()
    w2 = rebuild(model2, a.output_dir, step=4)
    assert matches_checkpoint(model2, w2, a.output_dir / "checkpoints" / "iter_000004")
    c = run(cfg(tmp_path, "c", seed=6))
    assert seeds_log(c.output_dir) != seeds_log(a.output_dir)


@pytest.mark.parametrize("opts", [dict(), dict(antithetic=True), dict(noise="lowrank", rank=2),
                                  dict(fitness_rule="dart", format_bonus=0.0), dict(optimizer="adam", alpha=0.01)],
                         ids=["sgd", "antithetic", "lowrank", "dart", "adam"])
def test_noise_stream_draws_other_members_and_replays_bit_for_bit(tmp_path, opts):
    from esft.es.replay import verify
    from esft.es.strategy import member_seeds

    kw = dict(iterations=3, eval_every=0, checkpoint_every=0, **opts)
    base = run(cfg(tmp_path, "stream0", **kw))
    res = run(cfg(tmp_path, "stream1", noise_stream=1, **kw))
    assert yaml.safe_load((res.output_dir / "config.yaml").read_text())["noise_stream"] == 1
    lines, lines0 = seeds_log(res.output_dir), seeds_log(base.output_dir)
    pairs = 2 if opts.get("antithetic") else 1
    for t, (rec, rec0) in enumerate(zip(lines, lines0)):
        assert rec["noise_stream"] == 1 and "noise_stream" not in rec0  # stream 0 lines keep the old format
        assert [s for s, _ in rec["members"][::pairs]] == member_seeds(5, t, 6 // pairs, stream=1)
        assert not {s for s, _ in rec["members"]} & {s for s, _ in rec0["members"]}
    assert any(r["update_norm"] > 0 for r in lines)
    # replay from the base model and seeds.jsonl lands on the final weights of the stream-1 run, bit for bit
    model, weights = final_masters(res.output_dir)
    assert matches_checkpoint(model, weights, res.final_checkpoint)
    assert verify(res.output_dir, model=tiny_llama()) == {
        "step": 3, "checkpoint": str(res.final_checkpoint), "bit_identical": True, "noise_stream": 1}


def test_replay_refuses_a_seed_log_of_another_stream(tmp_path):
    res = run(cfg(tmp_path, iterations=1, eval_every=0, checkpoint_every=0, noise_stream=2))
    path = res.output_dir / "config.yaml"
    path.write_text(path.read_text().replace("noise_stream: 2", "noise_stream: 0"))
    with pytest.raises(ValueError, match="noise_stream"):
        rebuild(tiny_llama(), res.output_dir)


class Interrupt(LocalExecutor):
    """Raises KeyboardInterrupt while evaluating member 3 of iteration `at` (weights perturbed at the time)."""

    def __init__(self, *args, at: int, **kw):
        super().__init__(*args, **kw)
        self.at, self.calls = at, 0

    def evaluate_members(self, members, batch):
        self.calls += 1
        if self.calls - 1 == self.at:
            original = self.generate_fn
            count = {"n": 0}

            def gen(*a):
                count["n"] += 1
                if count["n"] == 3:
                    raise KeyboardInterrupt
                return original(*a)

            self.generate_fn = gen
            try:
                return super().evaluate_members(members, batch)
            finally:
                self.generate_fn = original
        return super().evaluate_members(members, batch)


def test_ctrl_c_in_a_custom_executor_that_leaves_the_weights_perturbed_restores_them(tmp_path):
    """An executor of the user's (the `Executor` hooks only) that perturbs the driver's weights and is interrupted
    before it restores them: the trainer restores the unperturbed weights, so the model a script keeps using (and
    a checkpoint written from it) is the trained one, not a member."""
    from esft.es.executor import Executor
    from esft.rundir import RunInterrupted

    class Careless(Executor):
        def __init__(self, weights):
            self.weights = weights

        def evaluate_members(self, members, batch):
            self.weights.perturb(*members[0], 0.5)
            raise KeyboardInterrupt

        def evaluate_center(self, batch):
            raise AssertionError("not reached")

    config = cfg(tmp_path, iterations=2, eval_every=0)
    trainer = ESTrainer(config, model=tiny_llama(), tokenizer=None, task=ToyTask(), generate_fn=stub_generate,
                        progress=False)
    trainer.executor = Careless(trainer.weights)
    before = state(trainer.model)
    with pytest.raises(RunInterrupted):
        trainer.train()
    assert trainer.weights.perturbed is None
    assert bit_equal(state(trainer.model), before)


def test_ctrl_c_just_after_the_seed_log_line_counts_that_iteration(tmp_path, monkeypatch):
    """The seed-log line commits an iteration; an interrupt landing right after it (before the trainer's step
    counter moves) must report the iteration as logged, as the resume that follows will find it."""
    from esft.es import trainer as trainer_module
    from esft.rundir import RunInterrupted

    real = trainer_module.es_rundir.append_jsonl

    def append_then_interrupt(path, record, **kw):
        real(path, record, **kw)
        if path.name == "seeds.jsonl" and record["iteration"] == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(trainer_module.es_rundir, "append_jsonl", append_then_interrupt)
    config = cfg(tmp_path, iterations=3, eval_every=0, checkpoint_every=0)
    trainer = ESTrainer(config, model=tiny_llama(), tokenizer=None, task=ToyTask(), generate_fn=stub_generate,
                        progress=False)
    with pytest.raises(RunInterrupted, match="2 iterations are logged"):
        trainer.train()
    assert trainer.step == 2 == len(runlog.read_seed_log(Path(config.output_dir)))


def interrupted_run(config, at, dtype=torch.float32):
    trainer = ESTrainer(config, model=tiny_llama(dtype=dtype), tokenizer=None, task=ToyTask(),
                        generate_fn=stub_generate, progress=False)
    trainer.executor = Interrupt(trainer.model, None, trainer.weights, trainer.task, config.sigma,
                                 None, generate_fn=stub_generate, at=at)
    before = state(trainer.model)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert trainer.step == at
    return trainer, before


@pytest.mark.parametrize("opts", [dict(), dict(optimizer="adam", alpha=0.01), dict(dtype=torch.bfloat16),
                                  dict(antithetic=True, fitness_shaping="centered_rank", exclude=["norm"]),
                                  dict(noise_stream=3)],
                         ids=["sgd-fp32", "adam", "bf16", "antithetic-rank-nonorm", "stream-3"])
def test_resume_equals_uninterrupted(tmp_path, opts):
    dtype = opts.pop("dtype", torch.float32)
    full = run(cfg(tmp_path, "full", **opts), dtype=dtype)
    config = cfg(tmp_path, "cut", **opts)
    # Ctrl-C in iteration 3, member 3: resume = checkpoint iter_000002 + replay of seed-log line 2
    trainer, _ = interrupted_run(config, at=3, dtype=dtype)
    assert trainer.weights.perturbed is None
    assert len(seeds_log(trainer.out)) == 3
    # a torn line from a crash mid-write must be ignored
    with open(trainer.out / "seeds.jsonl", "a") as fh:
        fh.write('{"iteration": 3, "batch": [1, 2')
    res = run(config.replace(resume=True), dtype=dtype)
    assert res.steps == 6
    assert seeds_log(res.output_dir) == seeds_log(full.output_dir)
    assert bit_equal(runlog.read_checkpoint_tensors(res.final_checkpoint),
                     runlog.read_checkpoint_tensors(full.final_checkpoint))
    if dtype != torch.float32:
        from safetensors.torch import load_file

        ma = load_file(str(res.final_checkpoint / runlog.MASTERS_FILE))
        mb = load_file(str(full.final_checkpoint / runlog.MASTERS_FILE))
        assert bit_equal(ma, mb)
    metrics = runlog.read_jsonl(res.output_dir / "metrics.jsonl")
    assert [m["iteration"] for m in metrics if m["kind"] == "train"] == list(range(6))
    # replay from the base model alone also lands on the final weights (Adam replayed through its optimizer)
    model, weights = final_masters(res.output_dir, dtype=dtype)
    assert matches_checkpoint(model, weights, res.final_checkpoint)


@pytest.mark.parametrize("recorded, warns", [("DEFAULT", True), ("AVX2", False), ("AVX512", False)])
def test_a_resume_on_other_noise_kernels_warns(tmp_path, monkeypatch, recorded, warns):
    """torch's DEFAULT CPU kernels draw other noise bits than its AVX2 / AVX-512 ones (measured alike): resuming
    a run on another kind says its updates from there are not the run's own; alike kinds resume without a word."""
    import warnings

    import yaml

    run(cfg(tmp_path, iterations=1))
    path = tmp_path / "run" / "config.yaml"
    data = yaml.safe_load(path.read_text())
    data["_run"]["cpu_capability"] = recorded
    path.write_text(yaml.safe_dump(data))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(cfg(tmp_path, iterations=2, resume=True))
    said = [str(w.message) for w in caught if "other noise bits" in str(w.message)]
    assert len(said) == int(warns)
    if warns:
        assert "kernels 'AVX2' where it ran on 'DEFAULT'" in said[0]


def test_a_resume_keeps_each_earlier_segments_run_block(tmp_path):
    """config.yaml's `_run` (threads, versions, machine) is the last segment's; a resume keeps the segments before it
    under `earlier`, oldest first. Before, a resume on another thread count rewrote the whole run's record."""
    import yaml

    first = yaml.safe_load((run(cfg(tmp_path, iterations=2)).output_dir / "config.yaml").read_text())["_run"]
    assert "earlier" not in first
    # which of torch's CPU kernels drew the noise (its DEFAULT tier draws other bits than AVX2 / AVX-512)
    assert first["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    run(cfg(tmp_path, iterations=4, resume=True))
    run(cfg(tmp_path, iterations=6, resume=True))
    block = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["_run"]
    assert len(block["earlier"]) == 2 and block["earlier"][0] == first
    assert "earlier" not in block["earlier"][1] and block["earlier"][1]["torch_threads"] == block["torch_threads"]
    # each segment names its executor: a resume may move a run between layouts (docs/distributed.md)
    assert [b["executor"] for b in block["earlier"] + [block]] == ["local"] * 3 and "worker_threads" not in block
    # a fresh run where an attempt died before its first record left config.yaml: that attempt is no segment
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "config.yaml").write_text(yaml.safe_dump({**cfg(tmp_path).to_dict(), "_run": first}))
    run(cfg(tmp_path, "again", iterations=2))
    assert "earlier" not in yaml.safe_load((tmp_path / "again" / "config.yaml").read_text())["_run"]


def test_resume_rejects_changed_config(tmp_path):
    config = cfg(tmp_path, iterations=2, eval_every=0)
    run(config)
    with pytest.raises(ValueError, match="sigma"):
        run(config.replace(resume=True, sigma=0.1))
    with pytest.raises(ValueError, match="noise_stream"):  # a resumed stage keeps its noise stream
        run(config.replace(resume=True, noise_stream=1))
    # extending a finished run is allowed; resume_config recovers the saved settings from the run directory
    from esft.es.es_config import resume_config

    with pytest.raises(ValueError, match="sigma"):
        resume_config(config.output_dir, {"sigma": 0.1})
    again = resume_config(config.output_dir, {"iterations": 3, "population_size": 6})
    assert again.resume and again.iterations == 3 and again.sigma == config.sigma
    res = run(again)
    assert res.steps == 3 and len(seeds_log(res.output_dir)) == 3
    # the finished run's final checkpoint is kept under its step: the extension writes a new final
    assert [(s, f.name) for s, f in runlog.list_checkpoints(res.output_dir)] == [(2, "iter_000002"), (3, "final")]


@pytest.mark.parametrize("opts", [dict(noise="lowrank", rank=2), dict(fitness_rule="dart", format_bonus=0.0)],
                         ids=["lowrank", "dart"])
def test_variant_resume_equals_uninterrupted(tmp_path, opts):
    """Ctrl-C at iteration 3 of a low-rank (one batched population pass) or DART-ES (stateful batches) run, then
    --resume: same seed log and bit-identical final weights as the uninterrupted run."""
    kw = dict(eval_every=0, **opts)
    full = run(cfg(tmp_path, "full", **kw))
    config = cfg(tmp_path, "cut", **kw)
    holder = {}

    def gen(*args):
        if holder["trainer"].step == 3:
            raise KeyboardInterrupt
        return stub_generate(*args)

    holder["trainer"] = ESTrainer(config, model=tiny_llama(), tokenizer=None, task=ToyTask(), generate_fn=gen,
                                  progress=False)
    with pytest.raises(KeyboardInterrupt):
        holder["trainer"].train()
    assert len(seeds_log(holder["trainer"].out)) == 3
    res = run(config.replace(resume=True))
    assert res.steps == 6
    assert any(r["update_norm"] > 0 for r in seeds_log(full.output_dir))
    assert seeds_log(res.output_dir) == seeds_log(full.output_dir)
    assert bit_equal(runlog.read_checkpoint_tensors(res.final_checkpoint),
                     runlog.read_checkpoint_tensors(full.final_checkpoint))


def test_drift_follows_logged_random_walk(tmp_path):
    res = run(cfg(tmp_path, iterations=5, eval_every=0, checkpoint_every=0, population_size=8))
    steps = list(drift(tiny_llama(), res.output_dir))
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
    last = steps[-1]
    assert last["total"] == pytest.approx(sum(last["per_tensor"].values()))
    assert last["total"] == pytest.approx(last["expected"], rel=0.05)
    nonzero = sum(1 for r in seeds_log(res.output_dir) if np.ptp(r["fitness"]) > 0)
    assert last["expected"] == pytest.approx(0.02**2 * nonzero * last["num_params"] / 8, rel=1e-6)


def test_sample_batch_is_deterministic():
    assert sample_batch(1, 2, 50, 10) == sample_batch(1, 2, 50, 10)
    assert sample_batch(1, 2, 50, 10) != sample_batch(1, 3, 50, 10)
    assert len(set(sample_batch(1, 2, 50, 10))) == 10
    # without replacement: near the whole set a draw with replacement would repeat an index
    for iteration in range(5):
        assert sorted(set(sample_batch(1, iteration, 50, 45))) == sorted(sample_batch(1, iteration, 50, 45))
        assert len(sample_batch(1, iteration, 50, 45)) == 45
    assert sample_batch(1, 2, 5, 10) == [0, 1, 2, 3, 4]
    assert sample_batch(1, 2, 8, 8) == list(range(8))  # the paper's 200 of 200: the split in order


def test_presets_and_cli_args(tmp_path):
    from esft.cli import build_parser
    from esft.config import build_config
    from esft.es.es_config import PRESETS

    paper = preset("paper")
    assert (paper.sigma, paper.alpha, paper.population_size, paper.batch_size, paper.max_new_tokens) == \
        (0.0015, 0.00075, 30, 200, 1024)
    cpu = preset("cpu")
    assert cpu.population_size == 8 and cpu.format_bonus == 0.1 and cpu.task_kwargs() == {"max_passage_chars": 400}
    yml = tmp_path / "run.yaml"
    yml.write_text("preset: cpu\nsigma: 0.01\niterations: 7\ntask_options: {foo: 1}\n")
    args = build_parser().parse_args(["train", "es", "--config", str(yml), "--iterations", "9",
                                      "--no-antithetic", "--exclude", "norm,bias", "--resume", "runs/x"])
    assert args.resume_dir == "runs/x"  # `--resume RUN_DIR` (the CLI then reads RUN_DIR/config.yaml)
    names = set(ESConfig.__dataclass_fields__)
    c = build_config(ESConfig, PRESETS, args.preset, args.config, {k: v for k, v in vars(args).items() if k in names})
    assert c.sigma == 0.01 and c.iterations == 9 and c.population_size == 8 and c.exclude == ["norm", "bias"]
    assert c.resume is False and c.antithetic is False and c.task_kwargs() == {"foo": 1, "max_passage_chars": 400}
    assert ESConfig(task_options="{a: 2}").task_options == {"a": 2}
    # the preset's BoolQ passage cut does not follow an overridden task without passages
    assert preset("cpu", task="countdown:numbers=2").task_kwargs() == {}


def test_generation_options_reach_the_rollouts_and_cannot_override_es_fields():
    from esft.es.build import generation_config

    gen = generation_config(ESConfig(max_new_tokens=12, generation_options="{share_prefix: true, prefill_buckets: 4}"))
    assert (gen.share_prefix, gen.prefill_buckets, gen.max_new_tokens, gen.temperature) == (True, 4, 12, 0.0)
    assert generation_config(ESConfig()).share_prefix is False  # bit-exact plain prefill unless asked
    with pytest.raises(ValueError, match="temperature"):
        generation_config(ESConfig(generation_options={"temperature": 1.0}))
    with pytest.raises(ValueError, match="mapping"):
        ESConfig(generation_options="[1, 2]")


def test_progress_prints_every_held_out_evaluation_the_first_included(tmp_path, capsys):
    train_es(cfg(tmp_path, iterations=3, eval_every=3, checkpoint_every=0), model=tiny_llama(), tokenizer=None,
             task=ToyTask(), generate_fn=stub_generate, progress=True)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "step 0: held-out accuracy" in text and "step 3: held-out accuracy" in text


def test_the_printed_held_out_line_carries_its_interval_and_the_constant_answer_baseline(tmp_path, capsys):
    """ES printed `held-out accuracy 0.000 (format 0.00)`: a number from a dozen examples with neither its 95%
    interval nor what always answering "yes" scores on them, both of which metrics.jsonl records beside it."""
    train_es(cfg(tmp_path, iterations=1, eval_every=1, checkpoint_every=0), model=tiny_llama(), tokenizer=None,
             task=ToyTask(), generate_fn=stub_generate, progress=True)
    out = capsys.readouterr()
    ev = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][0]
    lo, hi = ev["test_ci95"]
    blo, bhi = ev["test_constant_baseline_ci95"]
    assert ev["test_constant_answer"] == "yes"
    assert (f"step 0: held-out accuracy {ev['test_accuracy']:.3f} [{lo:.3f}, {hi:.3f}]" in out.out + out.err)
    assert f"constant answer 'yes' {ev['test_constant_baseline']:.3f} [{blo:.3f}, {bhi:.3f}]" in out.out + out.err


def test_save_total_limit_keeps_the_newest_checkpoints(tmp_path):
    """save_total_limit deletes the oldest numbered checkpoints as new ones come (final is kept apart), and a
    resume from what is left equals the uninterrupted run."""
    full = run(cfg(tmp_path, "full", eval_every=0, checkpoint_every=1))
    config = cfg(tmp_path, "limited", eval_every=0, checkpoint_every=1, save_total_limit=2)
    trainer, _ = interrupted_run(config, at=4)
    assert [f.name for _, f in runlog.list_checkpoints(trainer.out)] == ["iter_000003", "iter_000004"]
    res = run(config.replace(resume=True))
    assert [f.name for _, f in runlog.list_checkpoints(res.output_dir)] == ["iter_000004", "iter_000005", "final"]
    assert bit_equal(runlog.read_checkpoint_tensors(res.final_checkpoint),
                     runlog.read_checkpoint_tensors(full.final_checkpoint))
    assert len(runlog.list_checkpoints(full.output_dir)) == 6  # 0 keeps all (iterations 1-5 and final)


def test_resuming_a_finished_run_changes_nothing(tmp_path):
    """A resume with as many iterations as the run has logged keeps its final checkpoint as final: no numbered
    copy of it (only an extension, with more iterations, demotes final), the same logs, the same weights."""
    config = cfg(tmp_path, iterations=2, eval_every=0, checkpoint_every=0)
    full = run(config)
    before = {name: (full.output_dir / name).read_bytes() for name in ("seeds.jsonl", "metrics.jsonl")}
    weights = runlog.read_checkpoint_tensors(full.final_checkpoint)
    res = run(config.replace(resume=True))
    assert res.steps == 2
    assert [(s, f.name) for s, f in runlog.list_checkpoints(res.output_dir)] == [(2, "final")]
    assert {name: (res.output_dir / name).read_bytes() for name in before} == before
    assert bit_equal(runlog.read_checkpoint_tensors(res.final_checkpoint), weights)


def test_resume_ignores_a_checkpoint_past_the_seed_log(tmp_path):
    """A seed log that lost its last lines (cut by hand, or a file system that lost unsynced data) is the truth:
    a checkpoint of a later step is not loaded, the run resumes from one the log reaches and redoes the rest."""
    full = run(cfg(tmp_path, "full", iterations=4, eval_every=0, checkpoint_every=2))
    config = cfg(tmp_path, "cut", iterations=4, eval_every=0, checkpoint_every=2)
    cut = run(config).output_dir
    lines = (cut / "seeds.jsonl").read_text().splitlines(keepends=True)
    (cut / "seeds.jsonl").write_text("".join(lines[:2]))
    res = run(config.replace(resume=True))
    assert seeds_log(res.output_dir) == seeds_log(full.output_dir)
    assert bit_equal(runlog.read_checkpoint_tensors(res.final_checkpoint),
                     runlog.read_checkpoint_tensors(full.final_checkpoint))


def test_resume_refuses_a_seed_log_of_another_stream(tmp_path):
    """config.yaml of another stage beside this stage's seed log: the config check passes (the configs agree),
    the seed log's stream does not."""
    config = cfg(tmp_path, iterations=1, eval_every=0, checkpoint_every=0, noise_stream=2)
    res = run(config)
    path = res.output_dir / "config.yaml"
    path.write_text(path.read_text().replace("noise_stream: 2", "noise_stream: 0"))
    with pytest.raises(ValueError, match="noise_stream 2"):
        run(config.replace(resume=True, noise_stream=0, iterations=2))
    assert len(seeds_log(res.output_dir)) == 1


def test_the_last_iteration_is_evaluated_when_eval_every_does_not_divide_it(tmp_path):
    """eval_every 3 over 4 iterations: steps 0 and 3 by the schedule, and step 4, the end of the run, too."""
    res = run(cfg(tmp_path, iterations=4, eval_every=3, checkpoint_every=3))
    evals = [m["step"] for m in runlog.read_jsonl(res.output_dir / "metrics.jsonl") if m["kind"] == "eval"]
    assert evals == [0, 3, 4] and res.last_eval["step"] == 4
    assert [(s, f.name) for s, f in runlog.list_checkpoints(res.output_dir)] == [(3, "iter_000003"), (4, "final")]


class Spy(LocalExecutor):
    """Records the examples of each unperturbed evaluation and the step the trainer gives with each update."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.center, self.updates = [], []

    def evaluate_center(self, examples):
        self.center.append(list(examples))
        return super().evaluate_center(examples)

    def on_update(self, update, step):
        self.updates.append(step)


def test_executor_sees_the_train_batch_of_each_evaluated_step_and_the_step_of_each_update(tmp_path):
    config = cfg(tmp_path, iterations=3, eval_every=3, checkpoint_every=0)
    trainer = ESTrainer(config, model=tiny_llama(), tokenizer=None, task=ToyTask(), generate_fn=stub_generate,
                        progress=False)
    trainer.executor = spy = Spy(trainer.model, None, trainer.weights, trainer.task, config.sigma, None,
                                 generate_fn=stub_generate)
    trainer.train()
    train_set = trainer.train_set
    batches = [[train_set[i] for i in sample_batch(5, step, len(train_set), 8)] for step in (0, 3)]
    assert batches[0] != batches[1]  # the steps draw different batches: the check below tells them apart
    assert spy.center == [batches[0], trainer.test_set, batches[1], trainer.test_set]
    assert spy.updates == [1, 2, 3]  # updates applied once this one is: what Ray workers count replicas by


def test_resume_of_a_folder_with_only_its_config_still_refuses_a_changed_config(tmp_path, monkeypatch):
    """Stopped in the step-0 evaluation: no log line and no checkpoint yet, but config.yaml is written; a resume
    that changes sigma is refused all the same."""
    config = cfg(tmp_path, iterations=2, checkpoint_every=0)

    def stop(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(ESTrainer, "evaluate", stop)
    with pytest.raises(KeyboardInterrupt):
        run(config)
    monkeypatch.undo()
    assert (tmp_path / "run" / "config.yaml").exists() and not (tmp_path / "run" / "seeds.jsonl").exists()
    with pytest.raises(ValueError, match="sigma"):
        run(config.replace(resume=True, sigma=0.1))
    assert run(config.replace(resume=True)).steps == 2


def test_verify_compares_every_checkpoint_of_the_last_step(tmp_path):
    """Two folders of the last step (final and a numbered copy): verify compares both, so a final that differs
    is reported even when the numbered one matches."""
    import shutil

    from safetensors.torch import load_file, save_file

    from esft.es.replay import verify

    res = run(cfg(tmp_path, iterations=2, eval_every=0, checkpoint_every=0))
    root = res.output_dir / "checkpoints"
    shutil.copytree(root / "final", root / "iter_000002")
    assert verify(res.output_dir, model=tiny_llama())["bit_identical"] is True
    for bad, good in (("final", "iter_000002"), ("iter_000002", "final")):  # the result names the one that differs
        path = root / bad / "model.safetensors"
        shutil.copy(root / good / "model.safetensors", tmp_path / "good.safetensors")
        save_file({k: t + 1 for k, t in load_file(str(path)).items()}, str(path), metadata={"format": "pt"})
        result = verify(res.output_dir, model=tiny_llama())
        assert result["bit_identical"] is False and result["checkpoint"] == str(root / bad)
        shutil.copy(tmp_path / "good.safetensors", path)  # mended before the other folder's turn


def test_a_resume_says_where_it_continues(tmp_path, capsys):
    """`esft train es --resume D` started a bar at 3/6 with no word on which checkpoint it had loaded: the first
    line names the iteration, the checkpoint and the logged updates replayed after it (none printed quietly)."""
    config = cfg(tmp_path, eval_every=0)
    interrupted_run(config, at=3)  # checkpoint iter_000002 and three seed-log lines
    capsys.readouterr()
    train_es(config.replace(resume=True, iterations=7), model=tiny_llama(), tokenizer=None, task=ToyTask(),
             generate_fn=stub_generate, progress=True)
    err = capsys.readouterr().err
    assert (f"esft: resuming {config.output_dir} at iteration 3 of 7 (checkpoint iter_000002, then 1 logged update "
            "replayed)\n") in err
    run(config.replace(resume=True, iterations=8))  # progress=False: nothing
    assert "resuming" not in capsys.readouterr().err


def test_a_resume_with_fewer_iterations_than_logged_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    """`esft train es --resume` refused `--iterations` below the logged ones, but the API took them: a finished run
    said it had nothing to do, and an unfinished one stopped at once and labelled its longer run final."""
    config = cfg(tmp_path, iterations=3, checkpoint_every=1)
    run(config)
    monkeypatch.setattr("esft.models.load_model", lambda *a, **k: pytest.fail("the model loaded"))
    for lower in (config.replace(resume=True, iterations=2), config.replace(resume=True, iterations=1)):
        with pytest.raises(ValueError) as refused:
            train_es(lower, task=ToyTask(), generate_fn=stub_generate, progress=False)
        assert str(refused.value) == (f"{config.output_dir} has 3 iterations logged; iterations {lower.iterations} "
                                      "would end before them (give at least 3 to continue it)")


def test_resuming_a_finished_run_does_nothing(tmp_path, capsys, monkeypatch):
    """`esft train es --resume D` on a finished run said "resuming D at iteration 3 of 3 (checkpoint final)", then
    opened its trackers and wrote the final checkpoint again. GRPO says there is nothing to do; so does ES now,
    and leaves every file as it was (config.yaml too: it records the settings and machine the run ran with, which
    replay reads), but still closes the executor it made and applies a lowered checkpoint limit. An evaluation
    that is still due (a stop during the last one) is still done."""
    config = cfg(tmp_path, iterations=3, checkpoint_every=1)
    done = run(config)
    folder = done.final_checkpoint
    files = {p: p.stat().st_mtime_ns for p in folder.iterdir()}
    logs = {name: (done.output_dir / name).read_text() for name in ("metrics.jsonl", "seeds.jsonl", "config.yaml")}
    assert [f.name for _, f in runlog.list_checkpoints(done.output_dir)] == ["iter_000001", "iter_000002", "final"]
    closed = []
    monkeypatch.setattr(LocalExecutor, "close", lambda self: closed.append(self))
    capsys.readouterr()
    res = train_es(config.replace(resume=True, eval_every=0, save_total_limit=1), model=tiny_llama(),
                   tokenizer=None, task=ToyTask(), generate_fn=stub_generate, progress=True)
    out, err = capsys.readouterr()
    assert out == f"{config.output_dir}: already trained for 3 iterations (iterations 3); nothing to do\n"
    assert "resuming" not in err
    assert (res.steps, res.final_checkpoint) == (3, folder)
    assert {p: p.stat().st_mtime_ns for p in folder.iterdir()} == files  # not written again
    assert {name: (done.output_dir / name).read_text() for name in logs} == logs
    assert len(closed) == 1
    assert [f.name for _, f in runlog.list_checkpoints(done.output_dir)] == ["iter_000002", "final"]
    monkeypatch.undo()

    # the last evaluation's record lost (a stop during it): the resume evaluates, and writes final again
    metrics = done.output_dir / "metrics.jsonl"
    records = runlog.read_jsonl(metrics)
    runlog.rewrite_jsonl(metrics, [r for r in records if not (r["kind"] == "eval" and r["step"] == 3)])
    res = run(config.replace(resume=True))
    assert [r["step"] for r in runlog.read_jsonl(metrics) if r["kind"] == "eval"] == [0, 3]
    assert (folder / runlog.STATE_FILE).stat().st_mtime_ns != files[folder / runlog.STATE_FILE]
