#!/bin/bash
# Peak RSS, alternated: the ES cpu preset (1 iteration) at the new code (the checkout) and at the old code (a
# worktree of the parent commit at /tmp/ab/old, put first on PYTHONPATH), and the evaluation of the same prompts.
cd /tmp/mem2
E=/work/main/.venv/bin/esft
for i in 1 2 3; do
  /usr/bin/time -v -o es-new-$i.time.txt $E train es --preset cpu --iterations 1 --eval-every 0 \
      --output-dir run-new-$i > es-new-$i.log 2>&1
  PYTHONPATH=/tmp/ab/old/src /usr/bin/time -v -o es-old-$i.time.txt $E train es --preset cpu --iterations 1 \
      --eval-every 0 --output-dir run-old-$i > es-old-$i.log 2>&1
  /usr/bin/time -v -o eval-$i.time.txt $E eval --tasks boolq --limit 16 --max-new-tokens 24 --max-passage-chars 400 \
      --batch-size 16 --output-dir ev-$i > eval-$i.log 2>&1
done
date -u > done.txt
