"""The greedy screen's fp32 row norms of a bf16 [49152, 576] lm_head (SmolLM2's shape), one thread: ATen's
vector_norm(dtype=float32) on the bf16 matrix against esft.generation.packed.row_norms (2048-row blocks widened to
fp32), and a check that the two agree bit for bit. Usage: python row_norms.py"""
import time

import torch

from esft.generation.packed import row_norms

torch.set_num_threads(1)
w = torch.randn(49152, 576, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)


def ms(f, n=10):
    f()
    start = time.perf_counter()
    for _ in range(n):
        out = f()
    return (time.perf_counter() - start) / n * 1e3, out


aten, a = ms(lambda: torch.linalg.vector_norm(w, dim=1, dtype=torch.float32))
blocked, b = ms(lambda: row_norms(w))
print(f"vector_norm(bf16, dtype=float32): {aten:.1f} ms; row_norms (blocks): {blocked:.1f} ms; "
      f"bit-identical: {torch.equal(a, b)}")
