#!/usr/bin/env bash
# The vLLM backend's tests against a real engine: tests/test_vllm_engine.py (perturb / restore / update inside the
# engine, greedy agreement with esft's decode loop, bf16 and fp32) and tests/test_vllm_train.py (a 3-iteration
# `esft train es --executor ray --worker-backend vllm` run, its update norms and its replay).
#
# Runs in the vLLM environment made (or reused) by scripts/vllm_venv.sh: vLLM's CPU build on any machine; on a GPU
# machine whose environment has the CUDA build, point ESFT_VLLM_VENV at it (scripts/gpu_check.sh does). Fails, rather
# than skipping, when vLLM cannot run. ~10 minutes on 2 CPU cores after the environment exists. Extra arguments go
# to pytest (e.g. -k greedy).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${ESFT_VLLM_SKIP_SETUP:-}" ]; then
    VENV=${ESFT_VLLM_VENV:?ESFT_VLLM_SKIP_SETUP needs ESFT_VLLM_VENV}
else
    VENV=$("$ROOT/scripts/vllm_venv.sh" | tail -n 1)
fi
cd "$ROOT"
# this checkout's esft, whichever checkout the shared environment's editable install points at (also in the Ray
# workers and vLLM's engine processes, which inherit the environment)
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1}
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-ERROR}
"$VENV/bin/python" - "$ROOT/src" <<'PY'
import os, sys
import esft
if not os.path.realpath(esft.__file__).startswith(os.path.realpath(sys.argv[1]) + os.sep):
    raise SystemExit(f"test_vllm: the environment imports esft from {esft.__file__}, not from {sys.argv[1]}")
from esft.es.distributed.vllm_backend import vllm_unavailable_reason, platform_device_type
r = vllm_unavailable_reason()
if r: raise SystemExit('test_vllm: vLLM cannot run here: ' + r)
print('test_vllm: vLLM platform:', platform_device_type(), '; esft from', os.path.dirname(esft.__file__))
PY
start=$(date +%s)
# -s: the tests print their measurements (agreement, margins, update norms, timings)
"$VENV/bin/python" -m pytest -q -s -rs -p no:cacheprovider tests/test_vllm_engine.py tests/test_vllm_train.py "$@"
echo "test_vllm: passed in $(( $(date +%s) - start )) s"
