"""A lever not built: the prompt's SDPA attending, per block of queries, only to the columns up to the block's last
position (with an explicit mask, SDPA computes every block, the causal half included). One layer of the cpu-preset
prefill's shape (16 prompts, 200 positions, left padding of 0-50, 9 query heads, 3 kv heads, head_dim 64, fp32);
whole against 2 and 4 query blocks: same bits?, time (fastest of 10). Run: python sdpa_chunks.py
"""
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(2)
b, H, KV, t, D = 16, 9, 3, 200, 64
g = torch.Generator().manual_seed(0)
q = torch.randn(b, t, H, D, generator=g).transpose(1, 2)
k = torch.randn(b, t, KV, D, generator=g).transpose(1, 2)
v = torch.randn(b, t, KV, D, generator=g).transpose(1, 2)
lengths = torch.randint(150, 201, (b,), generator=g)
real = torch.arange(t)[None] >= (t - lengths)[:, None]
cols, rows = torch.arange(t), torch.arange(t)
allowed = real[:, None, :] & (cols[None, :] <= rows[:, None])[None]
allowed |= (cols[None, :] == rows[:, None])[None]
mask = allowed[:, None]


def whole():
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125, enable_gqa=True)


def blocks(n):
    step, outs = (t + n - 1) // n, []
    for i0 in range(0, t, step):
        i1 = min(t, i0 + step)
        outs.append(F.scaled_dot_product_attention(q[:, :, i0:i1], k[:, :, :i1], v[:, :, :i1],
                                                   attn_mask=mask[:, :, i0:i1, :i1], scale=0.125, enable_gqa=True))
    return torch.cat(outs, 2)


ref = whole()
for n in (2, 4):
    out = blocks(n)
    print(f"{n} blocks: same bits {torch.equal(ref, out)}, largest difference {(ref - out).abs().max().item():.3g}")
for name, f in [("whole", whole), ("2 blocks", lambda: blocks(2)), ("4 blocks", lambda: blocks(4))] * 2:
    f()
    best = 1e9
    for _ in range(10):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    print(f"{name}: {best * 1e3:.2f} ms")
