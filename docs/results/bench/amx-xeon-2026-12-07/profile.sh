#!/bin/bash
# Where a decode-heavy member's time goes on this AMX CPU: the decode step's linears per dtype and row count, and
# one member (32 prompts x 256 tokens) on one thread, fp32 and bf16 lane weights, with torch profiler tables.
set -x
export HF_HUB_OFFLINE=1
PY=/work/main/.venv/bin/python
cd "$(dirname "$0")"
/usr/bin/time -v -o matmul_shapes.time.txt $PY matmul_shapes.py > matmul_shapes.txt 2>&1
/usr/bin/time -v -o prof-member-bf16.time.txt $PY prof_member.py decode-heavy bf16 p > prof-member-bf16.txt 2>&1
/usr/bin/time -v -o prof-member-fp32.time.txt $PY prof_member.py decode-heavy fp32 p > prof-member-fp32.txt 2>&1
echo done > PROFILE_DONE
