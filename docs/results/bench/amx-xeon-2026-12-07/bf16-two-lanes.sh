#!/bin/bash
# Peak RSS (and the iteration's time, on a machine also running the test suite: not a speed reading) of the `cpu`
# preset with bf16 rollouts on two lanes, against the evaluations of after.sh.
set -x
export HF_HUB_OFFLINE=1
PY=/work/main/.venv/bin/python
cd "$(dirname "$0")"
for i in 1 2; do
  rm -rf /tmp/amx-esb2-$i
  /usr/bin/time -v $PY -m esft train es --preset cpu --iterations 1 --eval-every 0 --rollout-dtype auto --parallel-members 2 --output-dir /tmp/amx-esb2-$i > es-preset-cpu-bf16-p2-$i.log 2> es-preset-cpu-bf16-p2-$i.time.txt
  cp /tmp/amx-esb2-$i/metrics.jsonl es-preset-cpu-bf16-p2-$i.metrics.jsonl
done
