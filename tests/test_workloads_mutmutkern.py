"""esft.bench.workloads against its definition: which passages the decode-heavy workload takes, which batch the
cpu-preset workload is, and the pseudo-task's score range."""

from __future__ import annotations

import zlib

from esft import bench
from esft.generation import encode_prompts


def test_decode_heavy_takes_the_first_passages_that_fit_60_to_64_tokens_bounds_included(tokenizer):
    """The first 33 passages of BoolQ's pool: one fits only 44 tokens and is skipped, two fit exactly 60 (the
    lower bound, taken), the other 30 fit 61-64."""
    from esft.tasks.boolq import BoolQTask

    work = bench.build_workload("decode-heavy", tokenizer)
    pool = BoolQTask().load("train_pool")[:33]
    taken = [p[1]["content"].removeprefix("Explain this passage in detail:\n") for p in work.prompts]
    # each prompt is the head of its own passage, in pool order, with exactly one passage left out
    used = [next(i for i, ex in enumerate(pool) if " ".join(ex["passage"].split()).startswith(text))
            for text in taken]
    assert used == sorted(used) and len(set(range(33)) - set(used)) == 1
    lengths = sorted(len(ids) for ids in encode_prompts(tokenizer, work.prompts))
    assert lengths[:2] == [60, 60] and lengths[2] > 60 and lengths[-1] <= 64


def test_cpu_preset_workload_is_the_presets_first_training_batch(tokenizer):
    """The batch an ES run with the `cpu` preset (default seed) trains on at iteration 0."""
    from esft.es.build import sample_batch
    from esft.es.es_config import preset
    from esft.tasks import get_task

    cfg = preset("cpu")
    task = get_task(cfg.task, **cfg.task_kwargs())
    train = task.load("train")
    first = [task.prompt(train[i]) for i in sample_batch(cfg.seed, 0, len(train), cfg.batch_size)]
    work = bench.build_workload("cpu-preset", tokenizer)
    assert work.prompts == first and work.min_new_tokens == 0


def test_pseudo_score_spans_zero_to_one_inclusive():
    """crc32 % 1000 over 999: a completion whose crc32 ends in 999 scores 1.0, one ending in 000 scores 0.0."""
    task = bench.PseudoTask()
    assert zlib.crc32(b"x2211") % 1000 == 999 and task.score("x2211", {}) == 1.0
    assert zlib.crc32(b"x126") % 1000 == 0 and task.score("x126", {}) == 0.0
