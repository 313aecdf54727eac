"""Resident set of one fp32 lane (`esft train es --preset cpu --parallel-members 1`) through each member's phases.

    python trace_member_rss.py [--members 6] [--trim]

Builds the preset's trainer as `scripts/memory_probe.py` does, evaluates `--members` members of the first
population on the first batch, and samples VmRSS (/proc/self/statm) every ~3 ms from a background thread. The
phases are marked by wrapping the lean engine's LeanModel construction (packing), `layout_prefill` and
`decode_loop`. With `--trim`, glibc's `malloc_trim(0)` runs after each member's generation (timed), to see how
much of the resident set is freed heap that glibc keeps. Prints min/max RSS in MiB per phase.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import threading
import time

import torch  # noqa: F401

import esft.generation.lean as lean_module
from esft.es.es_config import preset
from esft.es.trainer import ESTrainer
from esft.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=6)
    ap.add_argument("--trim", action="store_true")
    args = ap.parse_args()
    config = preset("cpu", output_dir="/tmp/esft-trace-rss", eval_limit=0, eval_every=0, parallel_members=1)
    model, tok = load_model(config.model, dtype=config.dtype, device=config.device)
    trainer = ESTrainer(config, model=model, tokenizer=tok, progress=False)
    ex = trainer.executor
    batch = [trainer.train_set[i] for i in trainer.sample_batch(config.seed, 0, len(trainer.train_set),
                                                                 config.batch_size)]
    members = trainer.strategy.ask(0)[: args.members]
    page = os.sysconf("SC_PAGE_SIZE")
    samples: list[tuple[float, int]] = []
    marks: list[tuple[str, float]] = []
    done = threading.Event()

    def sampler() -> None:
        while not done.is_set():
            with open("/proc/self/statm") as f:
                samples.append((time.perf_counter(), int(f.read().split()[1]) * page >> 20))
            time.sleep(0.003)

    def marked(fn, before: str | None, after: str):
        def wrapper(*a, **k):
            if before:
                marks.append((before, time.perf_counter()))
            out = fn(*a, **k)
            marks.append((after, time.perf_counter()))
            return out
        return wrapper

    lean_module.layout_prefill = marked(lean_module.layout_prefill, "prefill start", "prefill end")
    lean_module.decode_loop = marked(lean_module.decode_loop, None, "decode end")
    base = lean_module.LeanModel

    class Traced(base):
        def __init__(self, *a, **k):
            marks.append(("pack start", time.perf_counter()))
            super().__init__(*a, **k)
            marks.append(("packed", time.perf_counter()))

    lean_module.LeanModel = Traced
    libc = ctypes.CDLL("libc.so.6")
    generate_fn = ex.generate_fn

    def generate(*a, **k):
        out = generate_fn(*a, **k)
        if args.trim:
            t0 = time.perf_counter()
            libc.malloc_trim(0)
            marks.append((f"trimmed ({time.perf_counter() - t0:.3f} s)", time.perf_counter()))
        return out

    ex.generate_fn = generate
    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    t0 = time.perf_counter()
    ex.evaluate_members(members, batch)
    done.set()
    thread.join()
    print("prompt tokens per row:", [len(x) for x in ex._prompts(batch)[1]["prompt_ids"]])
    points = [("start", t0), *marks, ("end", time.perf_counter())]
    for (n1, a), (n2, b) in zip(points, points[1:]):
        window = [r for t, r in samples if a <= t <= b]
        span = f"{min(window)}-{max(window)}" if window else "-"
        print(f"{n1:>22} -> {n2:<22} {b - a:6.2f} s   RSS MiB {span}")


if __name__ == "__main__":
    main()
