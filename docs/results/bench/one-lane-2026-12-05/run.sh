#!/bin/bash
# peak RSS of the cpu preset (one lane, as shipped at 9e6b2bb) against evaluations of the same prompts
set -x
export HF_HUB_OFFLINE=1 PYTHONPATH=/work/wt-meas/src
PY=/work/main/.venv/bin/python
cd /tmp/meas
lscpu > lscpu.txt
git -C /work/wt-meas rev-parse HEAD > commit.txt
for i in 1 2 3; do
  rm -rf run-es-$i
  /usr/bin/time -v $PY -m esft train es --preset cpu --iterations 1 --eval-every 0 --output-dir run-es-$i > es-preset-cpu-$i.log 2> es-preset-cpu-$i.time.txt
done
for i in 1 2; do
  rm -rf ev-$i evf-$i
  /usr/bin/time -v $PY -m esft eval --tasks boolq --limit 16 --max-new-tokens 24 --max-passage-chars 400 --batch-size 16 --output-dir ev-$i > eval-$i.log 2> eval-$i.time.txt
  /usr/bin/time -v $PY -m esft eval --tasks boolq --limit 16 --max-new-tokens 24 --max-passage-chars 400 --batch-size 16 --generation-options fast --output-dir evf-$i > eval-fast-$i.log 2> eval-fast-$i.time.txt
done
rm -rf run-es-two
/usr/bin/time -v $PY -m esft train es --preset cpu --parallel-members 2 --iterations 1 --eval-every 0 --output-dir run-es-two > es-preset-cpu-two-lanes.log 2> es-preset-cpu-two-lanes.time.txt
# the bench: cpu-preset (its one lane) with naive iterations, pure generation (esft's and vLLM's), bf16 vs fp32
VLLM_LOGGING_LEVEL=ERROR /usr/bin/time -v ~/.cache/esft-vllm-venv/bin/python -m esft bench --workloads cpu-preset --repeats 3 --json > esft-bench-cpu-preset-one-lane.json 2> esft-bench-cpu-preset-one-lane.time.txt
echo done > DONE
