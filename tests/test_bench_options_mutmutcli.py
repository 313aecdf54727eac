"""`esft bench` options (esft.bench.options): the documented default population and the smallest one accepted.
Run: `pytest tests/test_bench_options_mutmutcli.py -q`."""

from __future__ import annotations

import pytest

from esft.bench.options import BenchConfig


def test_the_default_population_is_the_four_members_docs_performance_states():
    assert BenchConfig().population == 4  # docs/performance.md: "4 members by default"


def test_two_members_are_the_smallest_population_the_bench_runs():
    BenchConfig(population=2).check()
    with pytest.raises(ValueError, match="--population must be >= 2"):
        BenchConfig(population=1).check()


def test_bf16_rollouts_are_refused_with_ray_workers_only_not_on_the_local_executor():
    BenchConfig(rollout_dtype="bfloat16").check()  # workers 1: the local executor's lanes
    with pytest.raises(ValueError, match="--rollout-dtype bfloat16"):
        BenchConfig(rollout_dtype="bfloat16", workers=2).check()
