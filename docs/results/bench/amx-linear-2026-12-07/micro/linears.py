"""The bf16 linears of a SmolLM2-135M decode step alone: oneDNN's packed matmul (what the lean engine ran before)
against esft's AMX linear. Run with the project venv, from anywhere:
    python linears.py
Part 1: 30 layers' q|k|v, o, gate|up and down, each its own tensor as in an ES lane (232 MB of bf16, beyond the
caches), 32 and 16 rows, on one thread, then on two lanes at once (two Python threads of one torch thread each, as
ES lanes run; each lane its own copy of the weights). Part 2: one weight, warm in the cache after the first call,
at decode and prefill row counts, one thread.
"""
import threading
import time

import torch

from esft.generation.packed import pack_weight, packed_linear
from esft.kernels import load_amx_linear

assert load_amx_linear() is not None, "no AMX here"
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (N, K): q|k|v, o, gate|up, down
NBYTES = 30 * sum(n * k * 2 for n, k in SHAPES)


def layer_weights(kind):
    weights = [torch.randn(n, k).to(torch.bfloat16) for _ in range(30) for n, k in SHAPES]
    if kind == "onednn":
        return [(torch.ops.mkldnn._reorder_linear_weight(w, 32), w.shape[1]) for w in weights]
    return [(pack_weight(w, 32), w.shape[1]) for w in weights]


def step(kind, handles, x):
    if kind == "onednn":
        return [torch.ops.mkldnn._linear_pointwise(x[k], p, None, "none", [], "") for p, k in handles]
    return [packed_linear(x[k], p) for p, k in handles]


def timed_steps(kind, handles, rows, out, slot):
    torch.set_num_threads(1)
    x = {k: torch.randn(rows, k).to(torch.bfloat16) for k in (576, 1536)}
    step(kind, handles, x)
    start = time.perf_counter()
    for _ in range(6):
        step(kind, handles, x)
    out[slot] = (time.perf_counter() - start) / 6


print(f"part 1: {NBYTES / 1e6:.0f} MB of bf16 weights per lane; ms per decode step's linears and GB/s per lane")
weights = {kind: [layer_weights(kind), layer_weights(kind)] for kind in ("onednn", "amx")}
for rep in range(3):
    for rows in (32, 16):
        for kind in ("onednn", "amx"):
            one = {}
            timed_steps(kind, weights[kind][0], rows, one, 0)
            two = {}
            lanes = [threading.Thread(target=timed_steps, args=(kind, weights[kind][i], rows, two, i)) for i in (0, 1)]
            [t.start() for t in lanes]
            [t.join() for t in lanes]
            print(f"  rows {rows:2d} {kind:6s} one lane {one[0] * 1e3:5.1f} ms {NBYTES / one[0] / 1e9:5.2f} GB/s | "
                  + " | ".join(f"two lanes {v * 1e3:5.1f} ms {NBYTES / v / 1e9:5.2f} GB/s" for v in two.values()))
del weights
torch.set_num_threads(1)
print("part 2: one weight, warm, one thread")
for rows in (32, 400, 2048):
    for n, k in SHAPES:
        w = torch.randn(n, k).to(torch.bfloat16)
        x = torch.randn(rows, k).to(torch.bfloat16)
        one, tile = torch.ops.mkldnn._reorder_linear_weight(w, rows), pack_weight(w, rows)
        line = f"  rows {rows:5d} N {n:5d} K {k:5d}"
        for name, f in (("onednn", lambda: torch.ops.mkldnn._linear_pointwise(x, one, None, "none", [], "")),
                        ("amx", lambda: packed_linear(x, tile))):
            f()
            start = time.perf_counter()
            for _ in range(20):
                f()
            dt = (time.perf_counter() - start) / 20
            line += f"  {name} {dt * 1e3:7.3f} ms {2 * rows * n * k / dt / 1e9:5.0f} GFLOP/s"
        print(line)
