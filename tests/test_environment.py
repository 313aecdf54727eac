"""Machine-dependent choices made at start-up (esft.environment). Run: `pytest tests/test_environment.py -q`."""

from __future__ import annotations

import os
import sys

import pytest

from esft import cli, environment


def test_wait_policy_rule():
    assert environment.choose_omp_wait_policy(None) is None  # unknown (not Linux): OpenMP's default
    assert environment.choose_omp_wait_policy(0.1) is None  # idle: let threads spin briefly
    assert environment.choose_omp_wait_policy(0.5) == "PASSIVE"  # others hold half a core: sleep when idle
    assert environment.choose_omp_wait_policy(3.0) == "PASSIVE"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux")
def test_busy_cores_is_a_fraction_of_the_machine():
    busy = environment.busy_cores(0.05)
    assert busy is not None and 0.0 <= busy <= (os.cpu_count() or 1) + 1e-9


@pytest.mark.parametrize("busy, command, expected", [
    (1.5, ["env"], None),            # not a compute command: no sampling, nothing set
    (1.5, ["bench", "--help"], "PASSIVE"),
    (0.0, ["train", "--help"], None),
])
def test_cli_sets_the_policy_only_for_compute_commands(monkeypatch, busy, command, expected):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    sampled = []
    monkeypatch.setattr(environment, "busy_cores", lambda: sampled.append(1) or busy)
    with pytest.raises(SystemExit):
        cli.main(command + ["--help"] if command == ["env"] else command)
    assert os.environ.get("OMP_WAIT_POLICY") == expected
    assert bool(sampled) == (command[0] in cli.COMPUTE_COMMANDS)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)


def test_explicit_policy_wins(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.setattr(environment, "busy_cores", lambda: pytest.fail("must not sample"))
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_env_report_names_the_fast_kernels():
    import shutil

    import torch

    from esft.generation.packed import bf16_matmul_is_native, packed_linear_reason

    report = environment.environment_report()
    assert report["packed_linear"] == (packed_linear_reason(torch.float32) or "available")
    assert report["fused_attention"].startswith("buildable") == (shutil.which("c++") is not None)
    assert report["screened_lm_head"].startswith("available") == bf16_matmul_is_native()
    assert report["omp_wait_policy"] == os.environ.get("OMP_WAIT_POLICY", "OpenMP default")
