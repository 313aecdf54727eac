cd /work/main
PY=/work/main/.venv/bin/python
PYTHONPATH=/tmp/wt-old (git worktree at 5b1c2d79)/src $PY -c "from esft.kernels import load_decode_attention as l; print(l())" > docs/results/bench/param-passes-2026-12-07/ab/warm.txt 2>&1
$PY -c "from esft.kernels import load_param_passes as l; print(l())" >> docs/results/bench/param-passes-2026-12-07/ab/warm.txt 2>&1
for i in 1 2 3; do
  for v in old new; do
    if [ $v = old ]; then export PYTHONPATH=/tmp/wt-old (git worktree at 5b1c2d79)/src; else export PYTHONPATH=/work/main/src; fi
    /usr/bin/time -v $PY -m esft bench --workloads cpu-preset --no-naive --no-vllm --repeats 2 --threads 2 --json > docs/results/bench/param-passes-2026-12-07/ab/$v-$i.json 2>docs/results/bench/param-passes-2026-12-07/ab/$v-$i.err
  done
done
echo done > docs/results/bench/param-passes-2026-12-07/ab/DONE
