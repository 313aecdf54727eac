# The runs of this folder beyond ../peak-rss-2026-12-02/commands.sh, from this folder (the checkout's venv).
E=$(git rev-parse --show-toplevel)/.venv/bin/esft
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# the exact-path evaluation three more times (its peak turned out bimodal)
for i in 2 3 4; do
  /usr/bin/time -v $E eval --tasks boolq --limit 16 --max-new-tokens 24 --max-passage-chars 400 --batch-size 16 \
    --output-dir /tmp/mem2/eval-exact-$i > eval-exact-$i.out 2> eval-exact-$i.time.txt
done
# the one-fp32-lane command with its resident set sampled (intermediate-9520c7e/ at commit 9520c7e, this folder's
# es-fp32-one-lane.rss-samples.txt at 7c6907b): watch_rss.sh writes <prefix>.log and <prefix>.rss (seconds, kB)
bash watch_rss.sh one-lane $E train es --preset cpu --iterations 2 --eval-every 0 --parallel-members 1 \
  --output-dir /tmp/mem3/one
# the lm_head slices against the whole packed matrix (bits, packing time): slice_bits.txt
python slice_bits.py > slice_bits.txt
