"""Which torch CPU kernel tier draws which noise bits: esft's noise (torch.randn from a seeded generator) and its
fused write (torch.add with alpha), hashed. Run once per tier: ATEN_CPU_CAPABILITY=default|avx2 python tiers.py"""
import hashlib

import torch

g = torch.Generator().manual_seed(3)
noise = torch.randn(1_000_003, generator=g)
written = torch.add(torch.ones(1_000_003), noise, alpha=0.0015)
print(torch.__version__, torch.backends.cpu.get_cpu_capability(), "threads", torch.get_num_threads(),
      "randn", hashlib.sha256(noise.numpy().tobytes()).hexdigest()[:16],
      "add", hashlib.sha256(written.numpy().tobytes()).hexdigest()[:16])
