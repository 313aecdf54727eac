cd /work/main; . .venv/bin/activate
for i in 1 2 3; do
for m in 1 ""; do
ESFT_OLDSCREEN=$m python /tmp/rss2/sampler.py /tmp/rss2/scr$m-$i.json python -m esft train es --preset cpu --model smollm2-135m --iterations 1 --eval-every 0 --output-dir /tmp/rss2/s$m$i
done; done
