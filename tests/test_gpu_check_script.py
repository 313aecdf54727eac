"""scripts/gpu_check.sh's exit status and log, run on a stand-in GPU machine: a fake `nvidia-smi` and a fake
vLLM environment whose python passes every step but finds no model (no hub, empty cache)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/usr/bin/env bash
# stands in for the vLLM environment's python: every check passes; the model download finds nothing
if [ "$1" = "-" ]; then
    body=$(cat)
    case "$body" in
        *snapshot_download*) echo "gpu_check: SKIPPED the timed run: no hub, no cache"; exit 1 ;;
    esac
fi
exit 0
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_check_without_model_fails_and_logs(tmp_path: Path):
    bin_dir, venv, logs = tmp_path / "bin", tmp_path / "venv", tmp_path / "logs"
    (venv / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/usr/bin/env bash\necho 'GPU 0: Stand-in (UUID: GPU-0)'\n")
    py = venv / "bin" / "python"
    py.write_text(FAKE_PYTHON)
    for f in (smi, py):
        f.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", ESFT_VLLM_VENV=str(venv),
               ESFT_GPU_CHECK_LOGS=str(logs), ESFT_GPU_CHECK_OUT=str(tmp_path / "run"))
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env=env, capture_output=True,
                          text=True, timeout=120)
    # a check that measured nothing must not read as passed
    assert proc.returncode == 3, proc.stdout + proc.stderr
    log = (logs / "gpu_check.log").read_text()
    assert "Stand-in" in log and "SKIPPED the timed run" in log and "INCOMPLETE" in log
    assert not (tmp_path / "run").exists()
