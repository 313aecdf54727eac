#!/usr/bin/env bash
# esft bench on the AMD EPYC Zen 2 (AVX2, no AVX-512) machine: both workloads, 3 repeats, in the vLLM venv so
# inference_ratio is also measured against vLLM's CPU build.
set -u
cd "$(dirname "$0")"
VLLM_LOGGING_LEVEL=ERROR /usr/bin/time -v -o esft-bench-zen2.time.txt ~/.cache/esft-vllm-venv/bin/python -m esft bench \
  --threads 2 --repeats 3 --json > esft-bench-zen2.json 2> esft-bench-zen2.log.txt
echo "rc $?" >> esft-bench-zen2.log.txt
