#!/usr/bin/env bash
# GPU check of the vLLM backend, for a machine with an NVIDIA GPU (docs/distributed.md, "GPUs: one command"):
#
#   1. the environment with vLLM's CUDA build (scripts/vllm_venv.sh with ESFT_VLLM_BUILD=cuda; reused when present);
#   2. the real-engine tests of scripts/test_vllm.sh on the GPU: perturb / restore / update inside the engine bit for
#      bit, greedy agreement with esft's decode loop, a 3-iteration `esft train es --worker-backend vllm` run;
#   3. a timed 2-iteration paper-preset ES run (N 30, B 200, 1024 new tokens, Countdown) of a 1.5B hub model
#      through one vLLM worker, its seconds per iteration next to the prediction of docs/distributed.md, and its
#      replay. When the model is neither in the Hugging Face cache nor downloadable, the timed run cannot happen:
#      the script says so and exits 3, so that a check that did not measure anything never reads as passed.
#
#   ESFT_GPU_CHECK_MODEL (default Qwen/Qwen2.5-1.5B-Instruct)
#   ESFT_GPU_CHECK_OUT   the timed run's directory (default: a fresh temp folder; it holds checkpoints, GBs)
#   ESFT_GPU_CHECK_LOGS  a folder that receives gpu_check.log, everything the script prints (default: none)
#   Extra arguments go to the timed `esft train es` (e.g. --batch-size 64).
#   Exit status: 0 all checks ran and passed, 2 no GPU, 3 the timed run could not start, else a failed step.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# this checkout's esft, whichever checkout the environment's editable install points at (as scripts/test_vllm.sh)
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
MODEL=${ESFT_GPU_CHECK_MODEL:-Qwen/Qwen2.5-1.5B-Instruct}
RUN_DIR=${ESFT_GPU_CHECK_OUT:-$(mktemp -d)/es-vllm-gpu-check}
if [ -n "${ESFT_GPU_CHECK_LOGS:-}" ]; then
    mkdir -p "$ESFT_GPU_CHECK_LOGS"
    exec > >(tee -a "$ESFT_GPU_CHECK_LOGS/gpu_check.log") 2>&1
    TEE_PID=$!
    trap 'exec >&- 2>&-; wait "$TEE_PID"' EXIT  # the log is complete when the script returns
fi

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi finds none); on CPUs run scripts/test_vllm.sh" >&2
    exit 2
fi
nvidia-smi -L

VENV=$(ESFT_VLLM_BUILD=cuda "$ROOT/scripts/vllm_venv.sh" | tail -n 1)
# before any test: CUDA usable from torch (vLLM's platform check reads NVML only), the driver and the CUDA torch was
# built for side by side, and the C compiler and Python headers Triton builds its launchers with
"$VENV/bin/python" -c "
import os, shutil, subprocess, sys, sysconfig
import torch
driver = subprocess.run(['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'], capture_output=True,
                        text=True).stdout.strip()
print(f'gpu_check: torch {torch.__version__} (CUDA {torch.version.cuda}), NVIDIA driver {driver}')
if not torch.cuda.is_available():
    sys.exit('gpu_check: torch cannot use the GPU (a driver older than its CUDA ' + str(torch.version.cuda) + '?)')
x = torch.ones(256, 256, device='cuda')
assert float((x @ x).sum()) == 256 ** 3, 'a CUDA matmul gave a wrong result'
if not shutil.which('cc') and not shutil.which('gcc'):
    sys.exit('gpu_check: no C compiler (cc): Triton builds its kernel launchers with one (apt install gcc)')
if not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')):
    sys.exit('gpu_check: no Python.h for this interpreter: Triton needs it (apt install python3-dev, or '
             'python3.X-dev for the venv\'s Python)')
from esft.es.distributed.vllm_backend import platform_device_type, vllm_unavailable_reason
r = vllm_unavailable_reason()
assert r is None, r
assert platform_device_type() == 'cuda', 'vLLM does not see the GPU: platform ' + platform_device_type()"

echo "== gpu_check: real-engine tests on the GPU"
ESFT_VLLM_SKIP_SETUP=1 ESFT_VLLM_VENV="$VENV" "$ROOT/scripts/test_vllm.sh"

echo "== gpu_check: timed 2-iteration run of $MODEL"
if ! "$VENV/bin/python" - "$MODEL" <<'PY'
import os, sys
from huggingface_hub import snapshot_download
model = sys.argv[1]
patterns = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]
try:
    path = snapshot_download(model, allow_patterns=patterns, local_files_only=True)
    print(f"gpu_check: {model} is in the Hugging Face cache ({path})")
except Exception:
    os.environ.pop("HF_HUB_OFFLINE", None)
    try:
        path = snapshot_download(model, allow_patterns=patterns)
        print(f"gpu_check: downloaded {model} ({path})")
    except Exception as exc:
        print(f"gpu_check: SKIPPED the timed run: the Hugging Face hub is unreachable from here and {model} is not "
              f"in the local cache ({type(exc).__name__}: {str(exc)[:200]})")
        sys.exit(1)
PY
then
    echo "gpu_check: INCOMPLETE: the engine tests passed but the timed run did not happen (see above)" >&2
    exit 3
fi

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING}
start=$(date +%s)
"$VENV/bin/esft" train es --preset paper --model "$MODEL" --task countdown --iterations 2 --eval-every 0 \
    --dtype bfloat16 --device cuda --executor ray --num-workers 1 --worker-backend vllm --output-dir "$RUN_DIR" "$@"
wall=$(( $(date +%s) - start ))
"$VENV/bin/python" - "$RUN_DIR" "$wall" <<'PY'
import json, math, sys
from pathlib import Path

import yaml

out, wall = Path(sys.argv[1]), float(sys.argv[2])
recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
train = [r for r in recs if r.get("kind") == "train"]
start = next(r for r in recs if r.get("kind") == "executor" and r.get("event") == "start")
d = start["workers"][0]["num_params"]
cfg = yaml.safe_load((out / "config.yaml").read_text())
n, alpha = cfg["population_size"], cfg["alpha"]
print(f"gpu_check: {cfg['model']}: d = {d:,}, N = {n}, B = {cfg['batch_size']}, {cfg['max_new_tokens']} new tokens; "
      f"workers started in {start['seconds']:.0f} s; whole command {wall:.0f} s")
for r in train:
    t = r["time"]
    per_member = t["evaluate"] / n
    print(f"  iteration {r['iteration']}: {t['total']:.1f} s ({t['evaluate']:.1f} s members, {per_member:.2f} s per "
          f"member, update {t['update']:.2f} s); {r['tokens_generated']:,} tokens generated "
          f"(mean {r['tokens_generated'] / (n * cfg['batch_size']):.0f} per completion, "
          f"{r['generated_tokens_per_s']:,.0f} tokens/s); update norm {r['update_norm']:.4f} vs alpha sqrt(d/N) "
          f"{alpha * math.sqrt(d / n):.4f}")
later = train[1:] or train  # the first iteration includes the workers' start and vLLM's warm-up
print(f"gpu_check: {sum(r['time']['total'] for r in later) / len(later):.1f} s per iteration "
      "(prediction for a 1.5B model on one H100/H200-class GPU: docs/distributed.md)")
PY
"$VENV/bin/python" -m esft.es.replay verify "$RUN_DIR"
echo "gpu_check: done; run directory $RUN_DIR"
