"""Where an ES run's resident memory goes, stage by stage (Linux: /proc/self/status).

    python scripts/memory_probe.py --preset cpu [--rollout-dtype float32|auto] [--members 2] [--set key=value ...]

Builds the trainer of `esft train es --preset ...` and reports, after each stage, the resident set (VmRSS) and the
peak within that stage (VmHWM, reset before each stage through /proc/self/clear_refs), in MB: imports, model load,
trainer (masters, noise table, executor), lanes, one population of `--members` members (one per lane), the update,
a checkpoint. torch's allocations are invisible to tracemalloc, so resident memory is what is measured; the
`torch_tensors_mb` column sums the storages of the tensors the probe can reach (model, lanes, masters, table).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path


def _status() -> dict[str, float]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) / 1024
    return out


def _reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS (Linux >= 4.0)
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--rollout-dtype", default=None)
    ap.add_argument("--members", type=int, default=2, help="population members evaluated (N is left as preset)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="ESConfig overrides (JSON values)")
    ap.add_argument("--checkpoint", action="store_true", help="also time a checkpoint save")
    args = ap.parse_args(argv)
    rows: list[dict] = []
    t0 = time.perf_counter()

    def stage(name: str, extra: dict | None = None) -> None:
        gc.collect()
        rows.append({"stage": name, "seconds": round(time.perf_counter() - t0, 1),
                     **{k: round(v, 1) for k, v in _status().items()}, **(extra or {})})
        print(json.dumps(rows[-1]), flush=True)
        _reset_peak()

    _reset_peak()
    import torch  # noqa: F401

    from esft.es.es_config import preset
    from esft.es.trainer import ESTrainer

    stage("imports")
    overrides = {k: json.loads(v) if v[:1] in "[{0123456789-tfn\"" else v
                 for k, v in (s.split("=", 1) for s in args.set)}
    if args.rollout_dtype:
        overrides["rollout_dtype"] = args.rollout_dtype
    out = tempfile.mkdtemp(prefix="esft-memprobe-")
    config = preset(args.preset, output_dir=out, eval_limit=0, eval_every=0, **overrides)
    from esft.models import load_model

    model, tokenizer = load_model(config.model, dtype=config.dtype, device=config.device)
    stage("model loaded")
    trainer = ESTrainer(config, model=model, tokenizer=tokenizer, progress=False)
    stage("trainer (masters, table, executor)", {"rollout_dtype": trainer.config.rollout_dtype})
    ex = trainer.executor
    ex.start()
    stage("lanes made")
    batch = [trainer.train_set[i] for i in trainer.sample_batch(config.seed, 0, len(trainer.train_set),
                                                                 config.batch_size)]
    members = trainer.strategy.ask(0)[: args.members]
    ex.evaluate_members(members, batch)
    stage(f"population of {len(members)}")
    ex.evaluate_members(members, batch)
    stage(f"population of {len(members)} again")
    update = trainer.strategy.tell(members, [float(i) for i in range(len(members))])
    trainer.weights.apply(update, trainer.optimizer)
    stage("update applied")
    if args.checkpoint:
        trainer._prepare_dir()
        trainer.checkpoint()
        stage("checkpoint saved")
    print(json.dumps({"peak_rss_mb_overall": max(r["VmHWM"] for r in rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
