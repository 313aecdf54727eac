#!/bin/bash
# After the bench, on the same idle 2-core AMX Xeon: the matmul rates in two thread settings, peak RSS of the
# `cpu` preset (fp32 as shipped, and bf16 rollouts) against evaluations of the same prompts, and the main job's
# first iterations against the committed run (fp32 rollouts: the same bits on every CPU is the claim).
set -x
export HF_HUB_OFFLINE=1
PY=/work/main/.venv/bin/python
cd "$(dirname "$0")"
OMP_NUM_THREADS=2 $PY amx_probe.py amx_probe_omp2.json > amx_probe_omp2.log 2>&1
env -u OMP_NUM_THREADS $PY amx_probe.py amx_probe_unset.json > amx_probe_unset.log 2>&1
for i in 1 2; do
  rm -rf /tmp/amx-es-$i /tmp/amx-esb-$i
  /usr/bin/time -v $PY -m esft train es --preset cpu --iterations 1 --eval-every 0 --output-dir /tmp/amx-es-$i > es-preset-cpu-$i.log 2> es-preset-cpu-$i.time.txt
  cp /tmp/amx-es-$i/metrics.jsonl es-preset-cpu-$i.metrics.jsonl
  /usr/bin/time -v $PY -m esft train es --preset cpu --iterations 1 --eval-every 0 --rollout-dtype auto --output-dir /tmp/amx-esb-$i > es-preset-cpu-bf16-$i.log 2> es-preset-cpu-bf16-$i.time.txt
  cp /tmp/amx-esb-$i/metrics.jsonl es-preset-cpu-bf16-$i.metrics.jsonl
done
for i in 1 2; do
  rm -rf /tmp/amx-ev-$i /tmp/amx-evf-$i
  /usr/bin/time -v $PY -m esft eval --tasks boolq --limit 16 --max-new-tokens 24 --max-passage-chars 400 --batch-size 16 --output-dir /tmp/amx-ev-$i > eval-$i.log 2> eval-$i.time.txt
  /usr/bin/time -v $PY -m esft eval --tasks boolq --limit 16 --max-new-tokens 24 --max-passage-chars 400 --batch-size 16 --generation-options fast --output-dir /tmp/amx-evf-$i > eval-fast-$i.log 2> eval-fast-$i.time.txt
done
rm -rf /tmp/amx-main
/usr/bin/time -v -o main-job.time.txt $PY -m esft train es --preset cpu-countdown --iterations 3 --eval-every 0 --checkpoint-every 0 --output-dir /tmp/amx-main > main-job.log 2>&1
cp /tmp/amx-main/metrics.jsonl main-job.metrics.jsonl
$PY /work/main/scripts/compare_runs.py /work/main/docs/results/cpu-study/main-job-2026-12-03/metrics.jsonl main-job.metrics.jsonl > main-job-compare.txt 2>&1
echo done > DONE
