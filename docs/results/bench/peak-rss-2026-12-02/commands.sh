# Run from this folder: bash commands.sh (the checkout's venv; the model cache already built)
set -x
E=$(git rev-parse --show-toplevel)/.venv/bin/esft
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
/usr/bin/time -v $E eval --tasks boolq --limit 16 --max-new-tokens 24 --max-passage-chars 400 --batch-size 16 --output-dir /tmp/mem2/eval-exact > eval-exact.out 2> eval-exact.time.txt
/usr/bin/time -v $E eval --tasks boolq --limit 16 --max-new-tokens 24 --max-passage-chars 400 --batch-size 16 --generation-options fast --output-dir /tmp/mem2/eval-fast > eval-fast.out 2> eval-fast.time.txt
/usr/bin/time -v $E train es --preset cpu --iterations 2 --eval-every 0 --output-dir /tmp/mem2/es-shipped > es-shipped.out 2> es-shipped.time.txt
/usr/bin/time -v $E train es --preset cpu --iterations 2 --eval-every 0 --rollout-dtype auto --output-dir /tmp/mem2/es-auto > es-auto.out 2> es-auto.time.txt
/usr/bin/time -v $E train es --preset cpu --iterations 2 --eval-every 0 --rollout-dtype auto --parallel-members 1 --output-dir /tmp/mem2/es-auto-one-lane > es-auto-one-lane.out 2> es-auto-one-lane.time.txt
/usr/bin/time -v $E train es --preset cpu --iterations 2 --eval-every 0 --parallel-members 1 --output-dir /tmp/mem2/es-fp32-one-lane > es-fp32-one-lane.out 2> es-fp32-one-lane.time.txt
echo done > done.txt
