#!/bin/bash
# A/B timing: esft bench cpu-preset (fp32 rollouts as the preset), old code 0552ac0 vs new, alternated, idle
. /work/main/.venv/bin/activate
export HF_HUB_OFFLINE=1
cd /tmp/ab
for round in 1 2; do
  for v in old new; do
    if [ $v = old ]; then PP=/tmp/old/src; else PP=/work/main/src; fi
    PYTHONPATH=$PP /usr/bin/time -v python -m esft bench --workloads cpu-preset --repeats 2 --no-naive --no-vllm --json > bench-$v-$round.json 2> bench-$v-$round.log
  done
done
echo done > /tmp/ab/BENCHDONE
