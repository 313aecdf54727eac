#!/bin/bash
# the bf16 overhead at the final code: esft bench cpu-preset, HEAD against 0552ac0, alternated, idle
while [ ! -f /tmp/ab/ab2/done ]; do sleep 5; done
. /work/main/.venv/bin/activate
export HF_HUB_OFFLINE=1
cd /tmp/ab && mkdir -p bench2
git -C /work/main rev-parse HEAD > bench2/commit.txt
for round in 1 2; do
  for v in head old; do
    if [ $v = old ]; then PP=/tmp/old/src; else PP=/work/main/src; fi
    PYTHONPATH=$PP /usr/bin/time -v python -m esft bench --workloads cpu-preset --repeats 2 --no-naive --no-vllm --json > bench2/$v-$round.json 2> bench2/$v-$round.log
  done
done
echo done > bench2/done
