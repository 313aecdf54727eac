cd /work/main; . .venv/bin/activate
for i in 1 2 3 4; do
python /tmp/rss2/sampler.py /tmp/rss2/arena-def-$i.json python -m esft train es --preset cpu --model smollm2-135m --iterations 1 --eval-every 0 --output-dir /tmp/rss2/ad$i
MALLOC_ARENA_MAX=1 python /tmp/rss2/sampler.py /tmp/rss2/arena-1-$i.json python -m esft train es --preset cpu --model smollm2-135m --iterations 1 --eval-every 0 --output-dir /tmp/rss2/a1$i
done
