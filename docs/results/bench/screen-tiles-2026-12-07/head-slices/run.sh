cd /work/main; . .venv/bin/activate
for i in 1 2 3 4; do
for m in 8192 2048; do
ESFT_HSR=$m python /tmp/rss2/sampler.py /tmp/rss2/hsr$m-$i.json python -m esft train es --preset cpu --model smollm2-135m --iterations 1 --eval-every 0 --output-dir /tmp/rss2/h$m$i
done; done
