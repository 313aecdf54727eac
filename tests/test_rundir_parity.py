"""The run directory of an ES run and of a GRPO run side by side (tiny random-init Llama, 2 steps each, a
checkpoint at step 1): what an analysis reads from both is where it reads it, under the same names.

Run: pytest -q tests/test_rundir_parity.py   (~20 s on 2 CPU cores; tiny random-init model, no download)
"""

from __future__ import annotations

import json

import pytest
import yaml

pytest.importorskip("trl")

from conftest import make_tiny_model  # noqa: E402
from esft.cli import main  # noqa: E402
from grpo_tiny import ParityTask, tiny_config  # noqa: E402

HF_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer):
    from esft.api import train_grpo  # as the command line: curve.png too

    root = tmp_path_factory.mktemp("parity")
    folder = root / "tiny"
    make_tiny_model(hidden=32, layers=2).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    data = root / "q.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say {i}.", "answer": str(i)}) + "\n" for i in range(20)))
    assert main(["train", "es", "--model", str(folder), "--task", str(data), "--iterations", "2",
                 "--population-size", "2", "--batch-size", "2", "--max-new-tokens", "3", "--eval-every", "1",
                 "--eval-limit", "2", "--checkpoint-every", "1", "--device", "cpu", "--dtype", "float32",
                 "--output-dir", str(root / "es")]) == 0
    train_grpo(tiny_config(root / "grpo", max_steps=2, save_steps=1, eval_every=1, eval_limit=2),
               model=make_tiny_model(hidden=32, layers=2), tokenizer=tokenizer, task=ParityTask(), progress=False)
    return root / "es", root / "grpo"


def files(folder):
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def test_both_layouts_hold_the_same_files_where_the_readme_promises_them(runs):
    es, grpo = runs
    for name in ("config.yaml", "metrics.jsonl", "curve.png"):
        assert (es / name).is_file() and (grpo / name).is_file(), name
    assert files(es / "samples") == files(grpo / "samples") == {
        "iter_000000.jsonl", "iter_000001.jsonl", "eval_000000.jsonl", "eval_000001.jsonl", "eval_000002.jsonl"}
    for checkpoint in ("iter_000001", "final"):
        assert HF_FILES <= files(es / "checkpoints" / checkpoint), checkpoint
        assert HF_FILES <= files(grpo / "checkpoints" / checkpoint), checkpoint


def test_config_yaml_names_its_algorithm_and_the_thread_count_in_both(runs):
    """An ES run's config.yaml did not say it was ES (GRPO's says `_run.algorithm: grpo`: a reader of `_run` had to
    guess from the fields), and a GRPO run's did not record the torch thread count that ES's timings are read
    against (README: "the GRPO runs ... did not record it")."""
    import torch

    es, grpo = (yaml.safe_load((run / "config.yaml").read_text())["_run"] for run in runs)
    assert es["algorithm"] == "es" and grpo["algorithm"] == "grpo"
    assert es["torch_threads"] == grpo["torch_threads"] == torch.get_num_threads()
    for key in ("omp_wait_policy", "numpy", "torch", "python", "machine", "esft", "device", "num_params",
                "master_dtype", "train_examples"):
        assert key in es and key in grpo, key


def test_metrics_records_share_the_keys_the_grpo_run_log_promises(runs):
    """esft.grpo.callbacks: a GRPO train record has ES's keys where they mean the same thing; eval records have
    esft.rundir.EVAL_KEYS in both."""
    from esft.rundir import EVAL_KEYS

    es, grpo = ([json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] for run in runs)
    shared = {"kind", "step", "iteration", "accuracy", "format_rate", "tokens_generated", "prompt_tokens",
              "finished_rate", "generated_tokens_per_s", "time", "peak_rss_mb"}
    for records in (es, grpo):
        train = [r for r in records if r["kind"] == "train"]
        assert [r["step"] for r in train] == [1, 2] and [r["iteration"] for r in train] == [0, 1]
        assert all(shared <= set(r) and {"generate", "score", "total"} <= set(r["time"]) for r in train)
        evals = [r for r in records if r["kind"] == "eval"]
        assert [r["step"] for r in evals] == [0, 1, 2] and all(set(EVAL_KEYS) <= set(r) for r in evals)
    assert "fitness" in es[1] and "reward" in grpo[1]  # the one documented difference of name


def test_held_out_sample_rows_carry_their_example_in_both(runs):
    """ES's held-out sample rows had no `example`, so a run's gold answers were in GRPO's files only: a look at
    what an ES run got wrong needed the dataset beside it."""
    es, grpo = ([json.loads(line) for line in (run / "samples" / "eval_000001.jsonl").read_text().splitlines()]
                for run in runs)
    for rows in (es, grpo):
        assert rows and all({"index", "score", "completion", "example"} <= set(r) for r in rows)
    data = [{"prompt": f"Say {i}.", "answer": str(i)} for i in range(20)]
    assert all({k: r["example"][k] for k in ("prompt", "answer")} in data for r in es)


def test_sample_rows_have_one_shape_in_both(runs):
    """ES's rows had `member`/`seed`/`sign` and no iteration, no `finished` and no lengths; GRPO's train rows had
    `reward` and an iteration, its held-out rows lengths and `finished`: a reader of one method's samples did not
    read the other's. Both now write esft.sample_rows' fields, and the lengths add up to what metrics.jsonl counts."""
    from esft.sample_rows import EVAL_SAMPLE_FIELDS, TRAIN_SAMPLE_FIELDS

    def rows(run, name):
        return [json.loads(line) for line in (run / "samples" / name).read_text().splitlines()]

    es, grpo = runs
    for run, extra, budget in ((es, {"member", "seed", "sign"}, 3), (grpo, {"reward"}, 6)):
        for step in (0, 1):
            train = rows(run, f"iter_{step:06d}.jsonl")
            assert train and all(set(r) - {"well_formed"} == set(TRAIN_SAMPLE_FIELDS) - {"well_formed"} | extra
                                 for r in train), (run.name, train[0])
            assert {r["iteration"] for r in train} == {step}
            assert all(isinstance(r["finished"], bool) and 1 <= r["completion_tokens"] <= budget for r in train)
            # a completion shorter than the budget ended with eos (GRPO's rows read eos as TRL does)
            assert all(r["finished"] or r["completion_tokens"] == budget for r in train)
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        for ev in (m for m in metrics if m["kind"] == "eval"):
            held = rows(run, f"eval_{ev['step']:06d}.jsonl")
            assert set(EVAL_SAMPLE_FIELDS) - {"well_formed"} <= set(held[0]), (run.name, held[0])
            assert sum(r["completion_tokens"] for r in held) == ev["test_tokens_generated"] > 0
            assert all(r["prompt_tokens"] > 0 for r in held)
    # the tiny GRPO model's eos bias ends most of its completions early: `finished` is read, not a constant
    assert any(r["finished"] for step in (0, 1) for r in rows(grpo, f"iter_{step:06d}.jsonl"))
