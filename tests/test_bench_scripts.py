"""scripts/bench_levers.py refuses an unknown configuration name in one line, before it loads a model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_an_unknown_engine_configuration_is_refused_before_the_model_loads():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_levers.py"), "generation",
                           "--model", "/nonexistent/model", "--configs", "esft-lean,bogus"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    # the model path does not exist: reaching the load would raise another error than this one
    assert "--configs: unknown 'bogus'; known: hf-generate," in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_count_below_one_is_refused_before_the_model_loads():
    """`--threads -1` ended in torch's traceback, `--repeats 0` loaded the model and measured nothing, and
    `--max-new 0` was read as no cap at all (`args.max_new or the workload's`), so it generated 256 tokens."""
    for flag, value in (("--threads", "-1"), ("--repeats", "0"), ("--max-new", "0")):
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_levers.py"), "generation",
                               "--model", "/nonexistent/model", flag, value],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert f"argument {flag}: {value} is not accepted; expected an integer >= 1" in proc.stderr
        assert "Traceback" not in proc.stderr
