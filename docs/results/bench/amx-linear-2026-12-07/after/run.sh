#!/bin/bash
# cpu-preset, alternated: base = 1359826b (prefetch on every row block), final = working tree (prefetch on the first)
cd /tmp/ab2
for round in 1 2; do
  for code in base final; do
    if [ $code = base ]; then src=<worktree of 1359826b>/src; else src=<checkout>/src; fi
    date -u > $code-$round.date
    PYTHONPATH=$src /usr/bin/time -v /work/main/.venv/bin/python -m esft bench --workloads cpu-preset --threads 2 --repeats 2 --no-naive --no-vllm --no-compare-fp32 --json > $code-$round.json 2> $code-$round.log
  done
done
date -u > done
