#!/bin/bash
# alternated A/B: old = HEAD 2e017258 (oneDNN bf16 linears), new = working tree (AMX linear)
cd /tmp/ab
for round in 1 2; do
  for code in old new; do
    if [ $code = old ]; then src=/tmp/wt-old/src; else src=<checkout>/src; fi
    date -u > $code-$round.date
    PYTHONPATH=$src /usr/bin/time -v /work/main/.venv/bin/python -m esft bench --threads 2 --repeats 2 --no-naive --no-vllm --no-compare-fp32 --json > $code-$round.json 2> $code-$round.log
  done
done
date -u > done
