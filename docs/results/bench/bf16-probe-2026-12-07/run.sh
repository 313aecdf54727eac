#!/bin/bash
# The bf16 start-up probe (esft.generation.precision.probe_bf16_speedup) read 6 times in fresh processes with 2
# torch threads, idle and while another process runs 2-thread fp32 2048^3 matmuls on the 2 cores ("busy"), at the
# old code (64fb11ec: two threads, fp32 timed then bf16, one call per timing; a worktree at /tmp/ab/old) and the new
# (the checkout: one thread, the dtypes alternated, 8 calls per timing).
cd /work/main
PY=/work/main/.venv/bin/python
read_probe() {  # $1 = source folder
  PYTHONPATH=$1 $PY -c "
import time, torch; torch.set_num_threads(2)
from esft.generation.precision import probe_bf16_speedup
t = time.perf_counter(); s = probe_bf16_speedup(); print(f'{s:.3f} {time.perf_counter() - t:.2f}s')"
}
for load in idle busy; do
  if [ $load = busy ]; then
    $PY -c "
import torch; torch.set_num_threads(2); a = torch.randn(2048, 2048)
while True: a @ a" & HOG=$!; sleep 2
  fi
  for i in 1 2 3 4 5 6; do
    for v in old new; do
      src=/work/main/src; [ $v = old ] && src=/tmp/ab/old/src
      echo "$load $v $i $(read_probe $src)"
    done
  done
  [ $load = busy ] && kill $HOG
done
