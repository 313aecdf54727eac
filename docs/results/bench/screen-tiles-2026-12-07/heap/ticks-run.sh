cd /work/main; . .venv/bin/activate
for i in $(seq 1 12); do
XML=/tmp/s2-$i python stages2.py train es --preset cpu --model smollm2-135m --iterations 1 --eval-every 0 --output-dir /tmp/s2-$i 2>&1 >/dev/null | grep "^ST" > /tmp/s2-$i.log
grep "decode 2" /tmp/s2-$i.log | sed "s/^/run $i /" | cut -c1-170
done
