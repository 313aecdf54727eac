#!/bin/bash
# peak RSS of `esft train es --preset cpu` (one iteration) against evaluations of the same prompts, on this CPU
set -x
export HF_HUB_OFFLINE=1
PY=/work/main/.venv/bin/python
cd "$(dirname "$0")"
for i in 1 2; do
  rm -rf /tmp/zen2-es-$i
  /usr/bin/time -v $PY -m esft train es --preset cpu --iterations 1 --eval-every 0 --output-dir /tmp/zen2-es-$i > es-preset-cpu-$i.log 2> es-preset-cpu-$i.time.txt
  cp /tmp/zen2-es-$i/metrics.jsonl es-preset-cpu-$i.metrics.jsonl
done
for i in 1 2; do
  rm -rf /tmp/zen2-ev-$i /tmp/zen2-evf-$i
  /usr/bin/time -v $PY -m esft eval --tasks boolq --limit 16 --max-new-tokens 24 --max-passage-chars 400 --batch-size 16 --output-dir /tmp/zen2-ev-$i > eval-$i.log 2> eval-$i.time.txt
  /usr/bin/time -v $PY -m esft eval --tasks boolq --limit 16 --max-new-tokens 24 --max-passage-chars 400 --batch-size 16 --generation-options fast --output-dir /tmp/zen2-evf-$i > eval-fast-$i.log 2> eval-fast-$i.time.txt
done
echo done > DONE
