"""The bf16 linears of a SmolLM2-135M decode step alone: oneDNN's packed matmul (what the lean engine ran before)
against esft's AMX linear, on weights that do not fit in the caches (30 layers' q|k|v, o, gate|up and down, each
its own tensor, as in an ES lane) and on one weight that does. Run with the project venv:
    python linears.py THREADS
"""
import sys
import time

import torch

from esft.generation.packed import pack_weight, packed_linear
from esft.kernels import load_amx_linear

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
amx = load_amx_linear()
assert amx is not None, "no AMX here"
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (N, K): q|k|v, o, gate|up, down
weights = [torch.randn(n, k).to(torch.bfloat16) for _ in range(30) for n, k in SHAPES]
nbytes = sum(w.numel() * 2 for w in weights)
onednn = [(torch.ops.mkldnn._reorder_linear_weight(w, 32), w.shape[1]) for w in weights]
tiles = [(pack_weight(w, 32), w.shape[1]) for w in weights]


def run_onednn(x):
    return [torch.ops.mkldnn._linear_pointwise(x[k], p, None, "none", [], "") for p, k in onednn]


def run_amx(x):
    return [packed_linear(x[k], p) for p, k in tiles]


print(f"threads {torch.get_num_threads()}; {len(weights)} weights, {nbytes / 1e6:.0f} MB of bf16")
for rows in (32, 16):
    x = {k: torch.randn(rows, k).to(torch.bfloat16) for k in (576, 1536)}
    for rep in range(3):
        for name, f in (("onednn", run_onednn), ("amx", run_amx)):
            f(x)
            t = time.perf_counter()
            for _ in range(4):
                f(x)
            dt = (time.perf_counter() - t) / 4
            print(f"rows {rows:3d} {name:7s} one step's linears {dt * 1e3:6.1f} ms  {nbytes / dt / 1e9:5.2f} GB/s")
for rows in (32, 400, 2048):  # one weight, in cache after the first call (prefill shapes for the larger rows)
    for n, k in SHAPES:
        w = torch.randn(n, k).to(torch.bfloat16)
        x = torch.randn(rows, k).to(torch.bfloat16)
        one, tile = torch.ops.mkldnn._reorder_linear_weight(w, rows), pack_weight(w, rows)
        for name, f in (("onednn", lambda: torch.ops.mkldnn._linear_pointwise(x, one, None, "none", [], "")),
                        ("amx", lambda: packed_linear(x, tile))):
            f()
            reps = 20
            t = time.perf_counter()
            for _ in range(reps):
                f()
            dt = (time.perf_counter() - t) / reps
            print(f"rows {rows:5d} N {n:5d} K {k:5d} {name:7s} {dt * 1e3:7.3f} ms {2 * rows * n * k / dt / 1e9:6.0f} GFLOP/s")
