"""Compare two ES metrics.jsonl files record by record, timing fields aside (the refactor check of issue #20).

    python docs/results/es-cpu-demo/compare_metrics.py OLD/metrics.jsonl NEW/metrics.jsonl

Timing and memory fields (`time`, `seconds`, `peak_rss_mb`, tokens-per-second rates, wall clocks) differ between any
two runs; every other field must be equal. Prints the first difference, or how many records agree; exit 1 on a
difference or a different record count.
"""

import json
import sys

TIMING = {"time", "seconds", "peak_rss_mb", "tokens_per_s", "wall_s", "threads", "omp_wait_policy", "lanes"}


def strip(value):
    if isinstance(value, dict):
        return {k: strip(v) for k, v in value.items() if k not in TIMING and not k.endswith("_per_s")}
    if isinstance(value, list):
        return [strip(v) for v in value]
    return value


def main(old_path: str, new_path: str) -> int:
    old = [strip(json.loads(line)) for line in open(old_path) if line.strip()]
    new = [strip(json.loads(line)) for line in open(new_path) if line.strip()]
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            print(f"record {i} differs in {keys}: {[(k, a.get(k), b.get(k)) for k in keys][:3]}")
            return 1
    if len(old) != len(new):
        print(f"{min(len(old), len(new))} records agree, but the files hold {len(old)} and {len(new)} records")
        return 1
    print(f"all {len(old)} records equal, timing fields aside")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
