cd /work/main
for i in 1 2 3; do
python /tmp/rss2/sampler.py /tmp/rss2/es$i.json python -m esft train es --preset cpu --model smollm2-135m --iterations 1 --eval-every 0 --output-dir /tmp/rss2/es$i
python /tmp/rss2/sampler.py /tmp/rss2/ev$i.json python -m esft eval --model smollm2-135m --tasks boolq --limit 16 --max-new-tokens 24 --max-passage-chars 400 --batch-size 16 --output-dir /tmp/rss2/ev$i
done
