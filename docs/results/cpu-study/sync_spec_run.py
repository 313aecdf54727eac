"""Copy the light files of an `esft experiment run` folder (plan, spec, stage records, evaluation summaries, each
run's config / metrics / seed log) into docs/results, without checkpoints or completions.

    python docs/results/cpu-study/sync_spec_run.py runs/cpu-study docs/results/cpu-study/spec-run
"""

import shutil
import sys
from pathlib import Path

KEEP = ("plan.json", "spec.yaml", "result.json", "status.json", "config.yaml", "metrics.jsonl", "seeds.jsonl",
        "invocations.jsonl", "drift.jsonl")

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
for path in sorted(src.rglob("*")):
    rel = path.relative_to(src)
    if not path.is_file() or "checkpoints" in rel.parts or "samples" in rel.parts or ".lock" in path.name:
        continue
    summary = rel.parts[-2:-1] == ("eval",) and path.suffix == ".json"
    if path.name in KEEP or summary:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dst / rel)
print(f"copied the light files of {src} to {dst}")
