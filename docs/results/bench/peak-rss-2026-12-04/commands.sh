. /work/main/.venv/bin/activate
cd /tmp/rss
for v in base arena1; do
  rm -rf /tmp/rss/run-$v
  if [ $v = arena1 ]; then export MALLOC_ARENA_MAX=1; fi
  /usr/bin/time -v esft train es --preset cpu --iterations 1 --eval-every 0 --output-dir /tmp/rss/run-$v > $v.out 2> $v.time.txt
  grep "Maximum resident" $v.time.txt
done
