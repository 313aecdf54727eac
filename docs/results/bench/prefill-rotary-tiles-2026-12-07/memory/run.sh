#!/bin/bash
# peak RSS: ES cpu preset (1 iteration) and the evaluation of the same prompts, alternated, at the checkout's code
cd /tmp/mem
E=/work/main/.venv/bin/esft
for i in 1 2 3; do
  /usr/bin/time -v -o es-$i.time.txt $E train es --preset cpu --iterations 1 --eval-every 0 --output-dir run-es-$i > es-$i.log 2>&1
  /usr/bin/time -v -o eval-$i.time.txt $E eval --tasks boolq --limit 16 --max-new-tokens 24 --max-passage-chars 400 \
      --batch-size 16 --output-dir ev-$i > eval-$i.log 2>&1
done
date -u > done.txt
