# Run from the repository root with the project venv active, nothing else on the machine.
set -x
D=docs/results/bench/amx-xeon-2026-12-07b
date -u > $D/started.txt; lscpu > $D/lscpu.txt; git rev-parse HEAD > $D/commit.txt
# (as run, the old source was a committed copy in this folder; it is the file of commit 192ef976)
K=src/esft/kernels/decode_attention.cpp OLD=/tmp/decode_attention_192ef976.cpp
git show 192ef976:$K > $OLD
(cd $D && python same_bits.py $OLD ../../../../$K) > $D/same_bits.txt 2>&1
for t in 1 2; do
  (cd $D && /usr/bin/time -v python attn_bench.py $t $OLD ../../../../$K) > $D/attn_bench_t$t.txt 2> $D/attn_bench_t$t.time.txt
done
# one decode-heavy member, old and new kernel in alternation (a worktree of 192ef976 at /tmp/wt-base); as run, a copy of
# that prof_member.py that takes its thread count from T (T=1: the same one thread)
for r in 1 2; do for dt in bf16 fp32; do for tree in /tmp/wt-base /work/main; do
  echo "round $r $tree $dt $(T=1 PYTHONPATH=$tree/src python docs/results/bench/amx-xeon-2026-12-07/prof_member.py decode-heavy $dt 2>&1 | tail -1)"
done; done; done > $D/member_ab.txt
/usr/bin/time -v python -m esft bench --workloads cpu-preset --threads 2 --repeats 3 --no-naive --no-vllm --json \
  > $D/bench-cpu-preset.json 2> $D/bench-cpu-preset.log.txt
date -u > $D/finished.txt
