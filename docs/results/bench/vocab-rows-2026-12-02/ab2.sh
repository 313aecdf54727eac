#!/bin/bash
# peak RSS of the shipped cpu preset (2 iterations, no evaluation): 488b5fe (first vocabulary-rows commit) against
# HEAD, alternated
. /work/main/.venv/bin/activate
export HF_HUB_OFFLINE=1
cd /tmp/ab && mkdir -p ab2
for round in 1 2; do
  for v in v1 head; do
    if [ $v = v1 ]; then PP=/tmp/v1/src; else PP=/work/main/src; fi
    rm -rf ab2/$v-$round
    PYTHONPATH=$PP /usr/bin/time -v python -m esft train es --preset cpu --iterations 2 --eval-every 0 --checkpoint-every 0 --output-dir ab2/$v-$round > ab2/$v-$round.log 2> ab2/$v-$round.time
  done
done
echo done > ab2/done
