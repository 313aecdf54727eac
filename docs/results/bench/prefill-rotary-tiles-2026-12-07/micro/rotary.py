"""The lean prefill's rotary before (torch ops on strided views) and after (`rotary_qkv`, one compiled pass).

One layer of the cpu-preset prefill's shape: 16 prompts x 200 positions, 9 query heads, 3 kv heads, head_dim 64, the
q|k|v projection fp32 or bf16 (bf16 rollouts). Checks the bits and strides of q, k and v against the torch ops, then
times both (fastest of 10). Run: python rotary.py
"""
import time

import torch

from esft.generation.lean_step import rotate_half
from esft.kernels import load_decode_attention

torch.set_num_threads(2)
K = load_decode_attention()
torch.manual_seed(0)
b, t, H, KV, D = 16, 200, 9, 3, 64
for dtype in (torch.float32, torch.bfloat16):
    qkv = torch.randn(b * t, (H + 2 * KV) * D).to(dtype)
    cos, sin = torch.randn(b, t, D), torch.randn(b, t, D)

    def torch_ops():
        x = qkv.to(torch.float32)
        q = x[:, :H * D].view(b, t, H, D).transpose(1, 2)
        k = x[:, H * D:(H + KV) * D].view(b, t, KV, D).transpose(1, 2)
        v = x[:, (H + KV) * D:].view(b, t, KV, D).transpose(1, 2)
        c, s = cos[:, None], sin[:, None]
        return (q * c) + (rotate_half(q) * s), (k * c) + (rotate_half(k) * s), v

    def kernel():
        return tuple(y.view(b, t, -1, D).transpose(1, 2)
                     for y in K.rotary_qkv(qkv, cos.reshape(b * t, D), sin.reshape(b * t, D), H, KV))

    ref, new = torch_ops(), kernel()
    print(dtype, "same bits (q, k, v):", [torch.equal(x, y) for x, y in zip(ref, new)],
          "strides q, k:", [x.stride() for x in ref[:2]], [y.stride() for y in new[:2]])
    for f in (torch_ops, kernel):
        f()
        best = 1e9
        for _ in range(10):
            t0 = time.perf_counter()
            f()
            best = min(best, time.perf_counter() - t0)
        print(f"  {f.__name__}: {best * 1e3:.2f} ms per layer")
