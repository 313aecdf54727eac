. /work/main/.venv/bin/activate
for r in 1 2; do
 for pm in 1 2; do
  /usr/bin/time -v esft bench --workloads cpu-preset --repeats 2 --no-naive --no-vllm --no-inference --no-compare-fp32 --rollout-dtype float32 --parallel-members $pm --json > /tmp/lanes/pm$pm-$r.json 2> /tmp/lanes/pm$pm-$r.err
 done
done
echo done > /tmp/lanes/done
