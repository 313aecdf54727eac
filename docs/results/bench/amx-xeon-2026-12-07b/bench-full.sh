#!/usr/bin/env bash
# The morning's full bench (../amx-xeon-2026-12-07/bench.sh) again at the session's final code: both workloads,
# 3 repeats, naive iterations, fp32-rollout pairs and vLLM's CPU build, in the vLLM venv, on the quiet machine.
set -u
cd "$(dirname "$0")"
git rev-parse HEAD > bench-full.commit.txt
VLLM_LOGGING_LEVEL=ERROR /usr/bin/time -v -o bench-full.time.txt ~/.cache/esft-vllm-venv/bin/python -m esft bench \
  --threads 2 --repeats 3 --json > bench-full.json 2> bench-full.log.txt
echo "rc $?" >> bench-full.log.txt
