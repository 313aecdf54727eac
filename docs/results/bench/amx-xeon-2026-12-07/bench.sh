#!/usr/bin/env bash
# esft bench on a 2-core Intel Xeon with AVX-512-BF16 and AMX (the real SmolLM2-135M, torch 2.13): both workloads,
# 3 repeats, in the vLLM venv so inference_ratio is also measured against vLLM's CPU build.
set -u
cd "$(dirname "$0")"
VLLM_LOGGING_LEVEL=ERROR /usr/bin/time -v -o esft-bench-amx.time.txt ~/.cache/esft-vllm-venv/bin/python -m esft bench \
  --threads 2 --repeats 3 --json > esft-bench-amx.json 2> esft-bench-amx.log.txt
echo "rc $?" >> esft-bench-amx.log.txt
