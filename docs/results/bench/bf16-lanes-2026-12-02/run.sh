# bf16 rollouts: one lane with 2 threads against two lanes with 1 thread each, alternating, same process setup
set -x
. /work/main/.venv/bin/activate
export HF_HUB_OFFLINE=1
for r in 1 2; do
  for p in 1 2; do
    /usr/bin/time -v esft bench --workloads cpu-preset --no-naive --no-inference --no-compare-fp32 --parallel-members $p --json > cpu-p$p-r$r.json 2> cpu-p$p-r$r.log.txt
  done
done
for p in 1 2; do
  /usr/bin/time -v esft bench --workloads decode-heavy --no-naive --no-inference --no-compare-fp32 --parallel-members $p --json > dh-p$p.json 2> dh-p$p.log.txt
done
echo done > done.txt
