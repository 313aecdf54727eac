#!/usr/bin/env bash
# Alternated A/B of the cpu-preset iteration: old = 6a226183 (a git worktree at /tmp/oldtree, first on PYTHONPATH),
# new = 652f15d3 (this checkout). Run from the repository root: bash docs/results/bench/zen5-2026-12-08/ab-kv-reuse/run.sh
D=docs/results/bench/zen5-2026-12-08/ab-kv-reuse
. .venv/bin/activate
for i in 1 2 3; do
  for v in old new; do
    if [ $v = old ]; then export PYTHONPATH=/tmp/oldtree/src; else unset PYTHONPATH; fi
    date -u > $D/$v-$i.start.txt
    /usr/bin/time -v -o $D/$v-$i.time.txt python -m esft bench --workloads cpu-preset --threads 2 --repeats 3 \
        --no-naive --no-vllm --json > $D/$v-$i.json 2> $D/$v-$i.err
  done
done
date -u > $D/done.txt
