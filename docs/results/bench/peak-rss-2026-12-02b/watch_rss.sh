# usage: watch_rss.sh outprefix cmd...
# Samples /proc/PID/status VmRSS of the command, sleeping 50 ms between reads (~76 ms apart in practice).
out=$1; shift
"$@" > $out.log 2>&1 &
pid=$!
start=$(date +%s.%N)
while kill -0 $pid 2>/dev/null; do
  r=$(grep VmRSS /proc/$pid/status 2>/dev/null | awk '{print $2}')
  echo "$(echo "$(date +%s.%N) - $start" | bc) $r" >> $out.rss
  sleep 0.05
done
