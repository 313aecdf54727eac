. /work/main/.venv/bin/activate
cd /work/main
for i in 1 2 3; do
  for v in def mal; do
    if [ $v = mal ]; then export MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=1073741824; else unset MALLOC_MMAP_THRESHOLD_ MALLOC_TRIM_THRESHOLD_; fi
    python -m esft bench --workloads cpu-preset --no-naive --no-vllm --repeats 2 --threads 2 --json > docs/results/bench/param-passes-2026-12-07/tried/malloc/$v-$i.json 2>docs/results/bench/param-passes-2026-12-07/tried/malloc/$v-$i.err
  done
done
echo done > docs/results/bench/param-passes-2026-12-07/tried/malloc/DONE
