#!/bin/bash
# After 681865d (fp32 lanes without the screen free their plain vocabulary matrix): peak RSS, the probe, the main
# job's first iterations against the committed run, and an alternated A/B of the cpu-preset iteration (old = 89cd8d6
# in /work/main, new = 681865d in /work/wt-lead), same venv, nothing else running.
set -x
export HF_HUB_OFFLINE=1
PY=/work/main/.venv/bin/python
cd "$(dirname "$0")"
NEW=/work/wt-lead/src OLD=/work/main/src
for i in 1 2; do
  rm -rf /tmp/zen2-es-new-$i
  PYTHONPATH=$NEW /usr/bin/time -v $PY -m esft train es --preset cpu --iterations 1 --eval-every 0 --output-dir /tmp/zen2-es-new-$i > es-preset-cpu-$i.log 2> es-preset-cpu-$i.time.txt
  cp /tmp/zen2-es-new-$i/metrics.jsonl es-preset-cpu-$i.metrics.jsonl
done
PYTHONPATH=$NEW $PY /work/wt-lead/scripts/memory_probe.py --preset cpu --members 4 > memory-probe-one-fp32-lane.jsonl 2> memory-probe.log
rm -rf /tmp/zen2-main-new
PYTHONPATH=$NEW /usr/bin/time -v -o main-job.time.txt $PY -m esft train es --preset cpu-countdown --iterations 3 --eval-every 0 --checkpoint-every 0 --output-dir /tmp/zen2-main-new > main-job.log 2>&1
cp /tmp/zen2-main-new/metrics.jsonl main-job.metrics.jsonl
$PY /work/main/scripts/compare_runs.py /work/main/docs/results/cpu-study/main-job-2026-12-03/metrics.jsonl main-job.metrics.jsonl > main-job-compare.txt 2>&1
for r in 1 2; do
  for v in old new; do
    src=$OLD; [ $v = new ] && src=$NEW
    PYTHONPATH=$src $PY -m esft bench --workloads cpu-preset --repeats 2 --no-naive --no-vllm --no-inference --threads 2 --json > ab-$v-$r.json 2> ab-$v-$r.log
  done
done
echo done > DONE
