"""Share of one ES iteration's main-thread samples (py-spy raw output of `esft bench`, frames under timed_iteration)
by the innermost esft line. Run: python aggregate_es.py <raw.txt>"""
import collections
import sys

counts, total = collections.Counter(), 0
for line in open(sys.argv[1]).read().splitlines():
    stack, _, n = line.rpartition(" ")
    if "timed_iteration" not in stack:
        continue
    frames = [f for f in stack.split(";") if "(esft/" in f]
    total += int(n)
    counts[frames[-1][:75] if frames else "?"] += int(n)
for key, n in counts.most_common(40):
    print(n, round(100 * n / total, 1), key)
print("total", total)
