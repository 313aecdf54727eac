#!/bin/bash
# A/B: peak RSS of --preset cpu (2 iterations, no held-out eval), old code (0552ac0) vs new (488b5fe), alternated
. /work/main/.venv/bin/activate
export HF_HUB_OFFLINE=1
cd /tmp/ab
for round in 1 2; do
  for v in new old; do
    rm -rf /tmp/ab/$v-$round
    if [ $v = old ]; then PP=/tmp/old/src; else PP=/work/main/src; fi
    date -u +%H:%M:%S > $v-$round.start
    PYTHONPATH=$PP /usr/bin/time -v python -m esft train es --preset cpu --iterations 2 --eval-every 0 --checkpoint-every 0 --output-dir /tmp/ab/$v-$round > $v-$round.log 2> $v-$round.time
  done
done
# bit check against the committed main job: 3 iterations of cpu-countdown, no evaluation
PYTHONPATH=/work/main/src /usr/bin/time -v python -m esft train es --preset cpu-countdown --iterations 3 --eval-every 0 --checkpoint-every 0 --output-dir /tmp/ab/countdown3 > countdown3.log 2> countdown3.time
echo done > /tmp/ab/ALLDONE
