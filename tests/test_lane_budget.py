"""Lanes that do not fit in memory are not made: the estimate of a lane copy, the memory the process can still take
(/proc/meminfo and cgroup limits), and LocalExecutor lowering parallel_members with a warning, results unchanged."""

from __future__ import annotations

import warnings

import pytest
import torch

from es_tiny import ToyTask, stub_generate, tiny_llama
from esft.es import executor as executor_module
from esft.es.executor import LocalExecutor
from esft.es.lanes import LANE_PEAK_OVER_WEIGHTS, available_memory, lane_bytes, lanes_that_fit
from esft.es.noise import MasterWeights
from esft.es.strategy import ES

GiB = 2**30


@pytest.mark.parametrize("lanes, lane_zero, available, expected", [
    (2, 0, 10 * GiB, 2),  # lane 0 on the model, one copy of 1 GiB: fits
    (2, 0, GiB - 1, 1),  # one byte short of the copy
    (2, 1, 2 * GiB, 2),  # every lane a copy: two of them
    (2, 1, 2 * GiB - 1, 1),
    (4, 0, 2 * GiB + 5, 3),  # as many as fit, not all or nothing
    (2, 1, 0, 1),  # one lane is never refused
    (3, 0, None, 3),  # unknown memory: as asked
    (1, 1, 0, 1),
])
def test_lanes_that_fit(lanes, lane_zero, available, expected):
    assert lanes_that_fit(lanes, lane_zero, GiB, available) == expected


def test_lanes_that_fit_counts_whole_copies_of_any_size():
    # a copy of one byte is still a copy: no spare byte, no second lane
    assert lanes_that_fit(2, 0, 1, 0) == 1
    assert lanes_that_fit(3, 1, 1, 2) == 2
    assert lanes_that_fit(3, 0, 7, 13) == 2  # floor(13 / 7) = 1 copy beside lane 0


def test_lane_bytes_counts_tied_weights_once_in_the_rollout_dtype():
    model = tiny_llama()
    unique = {id(p): p for p in model.parameters()}.values()
    fp32 = sum(p.numel() * 4 for p in unique)
    assert lane_bytes(model) == int(fp32 * LANE_PEAK_OVER_WEIGHTS)
    assert lane_bytes(model, torch.bfloat16) == int(fp32 // 2 * LANE_PEAK_OVER_WEIGHTS)
    if model.config.tie_word_embeddings:
        every = sum(p.numel() * 4 for p in model.parameters())  # parameters() yields a tied weight once too
        assert lane_bytes(model) <= int(every * LANE_PEAK_OVER_WEIGHTS)


def _fs(tmp_path, meminfo_kb, files):
    tmp_path.mkdir()
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: 24683568 kB\nMemFree: 1 kB\nMemAvailable: {meminfo_kb} kB\n")
    cgroup = tmp_path / "cgroup"
    for name, text in files.items():
        (cgroup / name).parent.mkdir(parents=True, exist_ok=True)
        (cgroup / name).write_text(text)
    return str(meminfo), str(cgroup)


def test_available_memory_reads_meminfo_and_cgroup_limits(tmp_path):
    meminfo, cgroup = _fs(tmp_path / "a", 8 * 2**20, {})
    assert available_memory(meminfo, cgroup) == 8 * GiB  # no cgroup files: the kernel's figure
    # cgroup v2: limit 4 GiB, usage 3 GiB of which 1 GiB is inactive page cache -> 2 GiB left
    meminfo, cgroup = _fs(tmp_path / "b", 8 * 2**20, {"memory.max": f"{4 * GiB}\n", "memory.current": f"{3 * GiB}",
                                                      "memory.stat": f"anon 5\ninactive_file {GiB}\nactive_file 7\n"})
    assert available_memory(meminfo, cgroup) == 2 * GiB
    # the smaller of the two
    meminfo, cgroup = _fs(tmp_path / "c", 2**20, {"memory.max": f"{4 * GiB}", "memory.current": "0"})
    assert available_memory(meminfo, cgroup) == GiB
    # v2 without a limit, and v1's "unlimited" (a huge page-aligned number)
    meminfo, cgroup = _fs(tmp_path / "d", 2**20, {"memory.max": "max\n", "memory.current": "123"})
    assert available_memory(meminfo, cgroup) == GiB
    meminfo, cgroup = _fs(tmp_path / "e", 2**20, {"memory/memory.limit_in_bytes": "9223372036854771712",
                                                  "memory/memory.usage_in_bytes": "5"})
    assert available_memory(meminfo, cgroup) == GiB
    # cgroup v1 with a limit
    meminfo, cgroup = _fs(tmp_path / "f", 8 * 2**20, {"memory/memory.limit_in_bytes": f"{3 * GiB}",
                                                      "memory/memory.usage_in_bytes": f"{GiB}"})
    assert available_memory(meminfo, cgroup) == 2 * GiB
    assert available_memory(str(tmp_path / "none"), str(tmp_path / "none")) is None
    # a limit from 2^60 bytes up is no limit: with MemAvailable unreadable, nothing is known
    _, cgroup = _fs(tmp_path / "g", 1, {"memory.max": f"{1 << 60}", "memory.current": "5"})
    assert available_memory(str(tmp_path / "none"), cgroup) is None
    _, cgroup = _fs(tmp_path / "h", 1, {"memory.max": f"{(1 << 60) - 4096}", "memory.current": f"{GiB}"})
    assert available_memory(str(tmp_path / "none"), cgroup) == (1 << 60) - 4096 - GiB


def test_available_memory_here_is_a_plausible_number():
    got = available_memory()
    assert got is None or 0 < got < 1 << 50


@pytest.mark.parametrize("available, lanes", [(None, 2), (0, 1)])
def test_executor_lowers_lanes_that_do_not_fit_and_results_stay(monkeypatch, two_threads, available, lanes):
    monkeypatch.setattr(executor_module, "available_memory", lambda: available)
    batch = ToyTask().load("train")[:4]
    members = ES(population_size=4, sigma=0.05, alpha=0.01, seed=3).ask(0)
    results = []
    for parallel in (1, 2):
        model = tiny_llama()
        ex = LocalExecutor(model, None, MasterWeights(model, noise="table"), ToyTask(), 0.05, None,
                           generate_fn=stub_generate, parallel_members=parallel)
        if parallel == 2 and lanes == 1:
            with pytest.warns(UserWarning, match="parallel_members=2 lowered to 1: a lane's model copy needs"):
                assert ex.lanes_for(4) == 1
        elif parallel == 2:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # every lane fits: nothing lowered, nothing to warn about
                assert ex.lanes_for(4) == 2
        assert ex.lanes_for(4) == (lanes if parallel == 2 else 1)
        results.append(ex.evaluate_members(members, batch))
        assert len(ex._lanes) == (lanes - 1 if parallel == 2 else 0)  # no copy made for a lane that does not fit
        ex.close()
    assert results[0].texts == results[1].texts and (results[0].scores == results[1].scores).all()
