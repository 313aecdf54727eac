#!/bin/bash
# peak RSS of the README's main job (preset cpu-countdown: two lanes) and of one lane, against evaluations of the
# same task (16 puzzles, 40 new tokens, batch 16), with the exact engine and with the rollouts' fast engine
set -x
export HF_HUB_OFFLINE=1 PYTHONPATH=/work/wt-meas/src
PY=/work/main/.venv/bin/python
TASK="countdown:numbers=2,max_number=50,ops=+*,ask_format=1,shots=2"
cd /tmp/meas-cd
lscpu > lscpu.txt
git -C /work/wt-meas rev-parse HEAD > commit.txt
for i in 1 2; do
  rm -rf run-two-$i run-one-$i
  /usr/bin/time -v $PY -m esft train es --preset cpu-countdown --iterations 1 --eval-every 0 --output-dir run-two-$i > es-countdown-two-lanes-$i.log 2> es-countdown-two-lanes-$i.time.txt
  /usr/bin/time -v $PY -m esft train es --preset cpu-countdown --parallel-members 1 --iterations 1 --eval-every 0 --output-dir run-one-$i > es-countdown-one-lane-$i.log 2> es-countdown-one-lane-$i.time.txt
done
for i in 1 2; do
  rm -rf ev-$i evf-$i
  /usr/bin/time -v $PY -m esft eval --tasks "$TASK" --limit 16 --max-new-tokens 40 --batch-size 16 --output-dir ev-$i > eval-$i.log 2> eval-$i.time.txt
  /usr/bin/time -v $PY -m esft eval --tasks "$TASK" --limit 16 --max-new-tokens 40 --batch-size 16 --generation-options fast --output-dir evf-$i > eval-fast-$i.log 2> eval-fast-$i.time.txt
done
echo done > DONE
