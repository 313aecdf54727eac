#!/usr/bin/env bash
# cpu-preset (the preset's one lane), the same command in the project venv and in the vLLM venv, alternated:
# does the process that can import vLLM run esft's iteration differently?
set -u
cd "$(dirname "$0")"
for r in 1 2; do
  for v in main vllm; do
    PY=/work/main/.venv/bin/python; [ $v = vllm ] && PY=~/.cache/esft-vllm-venv/bin/python
    /usr/bin/time -v -o venv-ab-$v-$r.time.txt $PY -m esft bench --workloads cpu-preset --threads 2 --repeats 2 \
      --no-naive --no-vllm --no-compare-fp32 --json > venv-ab-$v-$r.json 2> venv-ab-$v-$r.log.txt
  done
done
echo done > VENV_AB_DONE
