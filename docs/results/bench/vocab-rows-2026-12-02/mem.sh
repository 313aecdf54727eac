#!/bin/bash
# Peak RSS at the final code (the commands of docs/results/bench/peak-rss-2026-12-02b), plus a bit check of three
# cpu-countdown iterations against the committed main job
set -x
. /work/main/.venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cd /tmp/ab && rm -rf mem && mkdir mem
git -C /work/main rev-parse HEAD > mem/commit.txt
E=/work/main/.venv/bin/esft
/usr/bin/time -v $E eval --tasks boolq --limit 16 --max-new-tokens 24 --max-passage-chars 400 --batch-size 16 --output-dir mem/eval-exact > mem/eval-exact.out 2> mem/eval-exact.time.txt
/usr/bin/time -v $E train es --preset cpu --iterations 2 --eval-every 0 --output-dir mem/es-shipped > mem/es-shipped.out 2> mem/es-shipped.time.txt
/usr/bin/time -v $E train es --preset cpu --iterations 2 --eval-every 0 --parallel-members 1 --output-dir mem/es-fp32-one-lane > mem/es-fp32-one-lane.out 2> mem/es-fp32-one-lane.time.txt
/usr/bin/time -v $E train es --preset cpu --iterations 2 --eval-every 0 --rollout-dtype auto --output-dir mem/es-auto > mem/es-auto.out 2> mem/es-auto.time.txt
/usr/bin/time -v $E train es --preset cpu --iterations 2 --eval-every 0 --rollout-dtype auto --parallel-members 1 --output-dir mem/es-auto-one-lane > mem/es-auto-one-lane.out 2> mem/es-auto-one-lane.time.txt
/usr/bin/time -v $E eval --tasks boolq --limit 16 --max-new-tokens 24 --max-passage-chars 400 --batch-size 16 --output-dir mem/eval-exact-2 > mem/eval-exact-2.out 2> mem/eval-exact-2.time.txt
/usr/bin/time -v $E train es --preset cpu-countdown --iterations 3 --eval-every 0 --checkpoint-every 0 --output-dir mem/countdown3 > mem/countdown3.out 2> mem/countdown3.time.txt
echo done > mem/done.txt
