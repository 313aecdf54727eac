#!/bin/bash
# Transparent huge pages for torch's CPU allocations: THP_MEM_ALLOC_ENABLE=1 (allocations of 2 MiB and more are
# 2 MiB-aligned and madvise(MADV_HUGEPAGE)d; this kernel's THP mode is "madvise") against =0 (torch's default),
# alternated, same code and venv, nothing else running: the cpu-preset and decode-heavy bench iterations, and the
# `cpu` preset's training iteration with /usr/bin/time -v (wall time and peak RSS).
set -x
export HF_HUB_OFFLINE=1
PY=/work/main/.venv/bin/python
export PYTHONPATH=/work/wt-thp/src  # this commit's code, whatever /work/main holds meanwhile
cd "$(dirname "$0")"
lscpu > lscpu.txt
cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag > thp-mode.txt
git -C /work/wt-thp rev-parse HEAD > commit.txt
run() {  # run NAME THP CMD...
  local name=$1 thp=$2; shift 2
  if [ "$thp" = on ]; then
    THP_MEM_ALLOC_ENABLE=1 /usr/bin/time -v -o $name.time.txt "$@" > $name.out 2> $name.log
  else
    THP_MEM_ALLOC_ENABLE=0 /usr/bin/time -v -o $name.time.txt "$@" > $name.out 2> $name.log
  fi
}
for r in 1 2 3; do
  for v in off on; do
    run cpu-preset-$v-$r $v $PY -m esft bench --workloads cpu-preset --repeats 2 --no-naive --no-vllm --no-inference --threads 2 --json
  done
done
for r in 1 2; do
  for v in off on; do
    rm -rf /tmp/thp-es-$v-$r
    run train-$v-$r $v $PY -m esft train es --preset cpu --iterations 1 --eval-every 0 --output-dir /tmp/thp-es-$v-$r
    cp /tmp/thp-es-$v-$r/metrics.jsonl train-$v-$r.metrics.jsonl
  done
done
for r in 1 2; do
  for v in off on; do
    run decode-heavy-$v-$r $v $PY -m esft bench --workloads decode-heavy --repeats 1 --no-naive --no-vllm --no-inference --threads 2 --json
  done
done
echo done > DONE
