"""The prefill's residual + RMSNorm (`add_rms_norm`) and RMSNorm at prefill row counts (3,200 rows of 576: 16 prompts
of ~200 tokens), bf16 output as with bf16 rollouts. Run once with the old code on PYTHONPATH and once with the new:
python norms.py   (2 threads, fastest of 10)
"""
import time

import torch

from esft.kernels import load_decode_attention

K = load_decode_attention()
torch.set_num_threads(2)
x, w = torch.randn(3200, 576), torch.randn(576)
d = torch.randn(3200, 576).bfloat16()
for name, f in [("add_rms_norm", lambda: K.add_rms_norm(x, d, w, 1e-5, True)),
                ("rms_norm", lambda: K.rms_norm(x, w, 1e-5, True))]:
    f()
    best = 1e9
    for _ in range(10):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    print(f"{name}: {best * 1e3:.2f} ms")
