#!/bin/bash
# peak RSS of held-out evaluations on the lanes: cpu-countdown, 1 iteration, evaluations at 0 and 1 of 128 puzzles,
# old (0552ac0) against the final code, alternated, idle
. /work/main/.venv/bin/activate
export HF_HUB_OFFLINE=1
cd /tmp/ab && mkdir -p evalmem && git -C /work/main rev-parse HEAD > evalmem/commit.txt
for round in 1 2; do
  for v in old head; do
    if [ $v = old ]; then PP=/tmp/old/src; else PP=/work/main/src; fi
    rm -rf evalmem/$v-$round
    PYTHONPATH=$PP /usr/bin/time -v python -m esft train es --preset cpu-countdown --iterations 1 --eval-every 1 --eval-limit 128 --checkpoint-every 0 --output-dir evalmem/$v-$round > evalmem/$v-$round.log 2> evalmem/$v-$round.time
  done
done
echo done > evalmem/done
