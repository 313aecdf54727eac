"""The ES masters' passes of one cpu-preset iteration, alone, against the machine's memory rates.

SmolLM2-135M's 134.5M fp32 parameters as one flat array: a plain read (sum), an fp32 copy, one member's perturbation
into bf16 (add_rounded: reads master and noise, writes bf16: 10 bytes a parameter) and the table-noise update with
four members (add_update in 2^20-element blocks: reads master and four noise windows, writes master: 24 bytes).
An iteration of N members must move at least N x 10 + 24 bytes a parameter through these passes.
Run: python master_passes.py   (2 threads; fastest of 5)
"""
import time

import torch

from esft.kernels import load_param_passes

torch.set_num_threads(2)
pp = load_param_passes()
n = 134_515_008
m, e = torch.randn(n), torch.randn(n)
o16, o32 = torch.empty(n, dtype=torch.bfloat16), torch.empty(n)
windows = [torch.randn(n) for _ in range(3)]
acc = torch.empty(1 << 20)
B = 1 << 20


def update():
    for s in range(0, n, B):
        pp.add_update(m[s:s + B], [x[s:s + B] for x in (e, *windows)], [0.1, 0.2, 0.3, 0.4], 1e-9,
                      acc[:min(B, n - s)], None)


for name, f, nbytes in [("read (sum), 4 B", lambda: m.sum(), 4), ("fp32 copy, 4 B read + 4 B write", lambda: o32.copy_(m), 8),
                        ("perturbation into bf16, 10 B", lambda: pp.add_rounded(m, e, 0.003, o16), 10),
                        ("update, 4 members, 24 B", update, 24)]:
    f()
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    print(f"{name}: {best * 1e3:.1f} ms, {nbytes * n / best / 1e9:.1f} GB/s")
