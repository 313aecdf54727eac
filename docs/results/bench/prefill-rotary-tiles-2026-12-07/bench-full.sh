# the full bench at the final code (vLLM venv, quiet machine)
VLLM_LOGGING_LEVEL=ERROR /usr/bin/time -v -o docs/results/bench/prefill-rotary-tiles-2026-12-07/bench-full.time.txt \
  ~/.cache/esft-vllm-venv/bin/python -m esft bench --threads 2 --repeats 3 --json \
  > docs/results/bench/prefill-rotary-tiles-2026-12-07/bench-full.json \
  2> docs/results/bench/prefill-rotary-tiles-2026-12-07/bench-full.log.txt
