#!/bin/bash
# decode-heavy, alternated: base = 1359826b (the full bench's commit), final = working tree (parallel_range in the attention kernel)
cd /tmp/ab3
for round in 1 2; do
  for code in base final; do
    if [ $code = base ]; then src=<worktree of 1359826b>/src; else src=<checkout>/src; fi
    date -u > $code-$round.date
    PYTHONPATH=$src /usr/bin/time -v /work/main/.venv/bin/python -m esft bench --workloads decode-heavy --threads 2 --repeats 1 --no-naive --no-vllm --no-compare-fp32 --json > $code-$round.json 2> $code-$round.log
  done
done
date -u > done
