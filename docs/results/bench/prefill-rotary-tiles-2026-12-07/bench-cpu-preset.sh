# the cpu-preset workload alone, all comparisons (vLLM venv, quiet machine), after the full bench
VLLM_LOGGING_LEVEL=ERROR /usr/bin/time -v -o docs/results/bench/prefill-rotary-tiles-2026-12-07/bench-cpu-preset.time.txt \
  ~/.cache/esft-vllm-venv/bin/python -m esft bench --workloads cpu-preset --threads 2 --repeats 3 --json \
  > docs/results/bench/prefill-rotary-tiles-2026-12-07/bench-cpu-preset.json \
  2> docs/results/bench/prefill-rotary-tiles-2026-12-07/bench-cpu-preset.log.txt
