#!/usr/bin/env bash
# The lane split on this AMX CPU: cpu-preset with two lanes (one thread each) instead of the preset's one, and
# decode-heavy with one lane of two threads instead of its two lanes; bf16 rollouts against fp32 in each run.
set -u
cd "$(dirname "$0")"
PY=/work/main/.venv/bin/python
/usr/bin/time -v -o lanes-cpu-preset-2.time.txt $PY -m esft bench --workloads cpu-preset --parallel-members 2 \
  --threads 2 --repeats 3 --no-naive --no-vllm --json > lanes-cpu-preset-2.json 2> lanes-cpu-preset-2.log.txt
/usr/bin/time -v -o lanes-decode-heavy-1.time.txt $PY -m esft bench --workloads decode-heavy --parallel-members 1 \
  --threads 2 --repeats 1 --no-naive --no-vllm --json > lanes-decode-heavy-1.json 2> lanes-decode-heavy-1.log.txt
echo done > LANES_DONE
