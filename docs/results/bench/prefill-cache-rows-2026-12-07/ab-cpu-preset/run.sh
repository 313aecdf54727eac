#!/bin/bash
# Alternated A/B: base = worktree of 64fb11ec (/tmp/ab/old), new = the checkout. cpu-preset ES iteration only.
cd /work/main
for i in 1 2 3; do
  for v in base new; do
    src=/work/main/src; [ $v = base ] && src=/tmp/ab/old/src
    PYTHONPATH=$src VLLM_LOGGING_LEVEL=ERROR .venv/bin/python -m esft bench --workloads ${W:-cpu-preset} --threads 2 \
      --repeats 2 --no-naive --no-vllm --no-compare-fp32 --json > /tmp/ab/es2/$v-$i.json 2>/tmp/ab/es2/$v-$i.err
    python3 -c "
import json;d=json.load(open('/tmp/ab/es2/$v-$i.json'));c=d['workloads']['${W:-cpu-preset}']
print('$v-$i', c['iteration_s'], c['overhead_fraction'], c['inference_ratio'], c['timings_s']['generate'], c['timings_s']['perturb'], c['timings_s']['update'])"
  done
done
