"""A bf16 ES member's projections written for the AMX linear, before and after `rounded_tiles`.

SmolLM2-135M's projections as the lean engine packs them (30 layers of q|k|v 960x576, o 576x576, gate|up 3072x576,
down 576x1536: 106.2M parameters). before: round(master + step * eps) into bf16 weights (param_passes' add_rounded),
then `pack` into the tile layout (the torch.cat of q|k|v and gate|up that also ran before is left out, so "before" is
flattered). after: `rounded_tiles`, one pass. plain write: add_rounded alone (a lower bound: no layout change).
First, on one layer's q|k|v with a NaN and an inf among the masters, whether both give the same bits.
Run: python tiles.py [threads]   (prints the fastest of 5 per variant, twice, alternated)
"""
import sys
import time

import torch

from esft.kernels import load_amx_linear, load_param_passes

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
amx, pp = load_amx_linear(), load_param_passes()
g = torch.Generator().manual_seed(0)
shapes = [(576, 576), (192, 576), (192, 576)]
ms = [torch.randn(s, generator=g) for s in shapes]
es = [torch.randn(s, generator=g) for s in shapes]
ms[0][3, 5], ms[1][0, 0] = float("nan"), float("inf")


def written_then_packed(step):
    outs = []
    for m, e in zip(ms, es):
        o = torch.empty(m.shape, dtype=torch.bfloat16)
        if step is None:
            o.copy_(m)
        else:
            pp.add_rounded(m.view(-1), e.view(-1), step, o.view(-1))
        outs.append(o)
    return amx.pack(torch.cat(outs))


for step in (0.003, None):
    a = written_then_packed(step)
    b = amx.rounded_tiles(ms, [] if step is None else es, 0.0 if step is None else step)
    nan = a.isnan()
    print("member" if step else "centre", "same NaNs:", torch.equal(nan, b.isnan()), "same bits elsewhere:",
          torch.equal(a[~nan], b[~nan]))

big = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30
ms = [torch.randn(s) for s in big]
es = [torch.randn(s) for s in big]


def before():
    for m, e in zip(ms, es):
        o = torch.empty(m.shape, dtype=torch.bfloat16)
        pp.add_rounded(m.view(-1), e.view(-1), 0.003, o.view(-1))
        amx.pack(o)


def after():
    for m, e in zip(ms, es):
        amx.rounded_tiles([m], [e], 0.003)


def plain_write():
    for m, e in zip(ms, es):
        o = torch.empty(m.shape, dtype=torch.bfloat16)
        pp.add_rounded(m.view(-1), e.view(-1), 0.003, o.view(-1))


print(f"threads {torch.get_num_threads()}, {sum(m.numel() for m in ms) / 1e6:.1f}M parameters")
for f in (before, after, plain_write) * 2:
    f()
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    print(f"{f.__name__}: {best * 1e3:.1f} ms")
