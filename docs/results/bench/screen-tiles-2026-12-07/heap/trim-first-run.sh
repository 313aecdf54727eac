cd /work/main; . .venv/bin/activate
for i in 1 2 3 4 5; do
for m in "" 1; do
ESFT_TRIM0=$m python /tmp/rss2/mallinfo.py train es --preset cpu --model smollm2-135m --iterations 1 --eval-every 0 --output-dir /tmp/rss2/t0$m$i 2>&1 >/dev/null | grep "^MI 8" | sed "s/^/trim0=$m run $i /"
done; done
