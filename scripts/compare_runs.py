"""Compare the train records of two ES runs' metrics.jsonl, iteration by iteration.

    python scripts/compare_runs.py REFERENCE/metrics.jsonl NEW/metrics.jsonl

Every iteration the new run logged must have the reference's fitness summary, accuracy, format and finished rates
and token counts exactly (the runs are bit-reproducible on any CPU in fp32), and an update of the same norm.
Prints one line per iteration and ALL SAME or DIFFERENT; exits 1 when different.
"""

from __future__ import annotations

import json
import sys

EXACT = ("fitness", "accuracy", "format_rate", "tokens_generated", "prompt_tokens", "finished_rate", "update_norm")


def train_records(path: str) -> dict[int, dict]:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {r["iteration"]: r for r in rows if r.get("kind") == "train"}


def main(reference: str, new: str) -> int:
    ref, got = train_records(reference), train_records(new)
    if not got:
        print(f"no train records in {new}")
        return 1
    ok = True
    for it, row in sorted(got.items()):
        want = ref.get(it)
        diff = ["missing in the reference"] if want is None else [k for k in EXACT if want.get(k) != row.get(k)]
        ok &= not diff
        print(f"iteration {it}: " + ("same" if not diff else "DIFF " + ", ".join(diff))
              + f" (fitness mean {row['fitness']['mean']:.6f})")
    print("ALL SAME" if ok else "DIFFERENT")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
