"""Slices of the packed lm_head against the whole packed matrix (esft.generation.lean_step.LeanModel.head_logits):
bit equality over rows M, batch hints, slice sizes and thread counts, and the packing time of both.
Run: python slice_bits.py (the checkout's venv)."""
import time

import torch

from esft.generation.packed import pack_weight, packed_linear

torch.manual_seed(0)
W = torch.randn(49152, 576) * 0.05  # SmolLM2-135M's lm_head shape
for threads in (1, 2):
    torch.set_num_threads(threads)
    bad = total = 0
    for m in (1, 2, 3, 5, 8, 9, 13, 16, 32):
        h = torch.randn(m, 576)
        for hint in (m, 16):
            whole = packed_linear(h, pack_weight(W, hint))
            for rows in (1024, 4096, 5000, 6144, 8192, 12288, 16384):
                got = torch.cat([packed_linear(h, pack_weight(W[a:a + rows], hint))
                                 for a in range(0, W.shape[0], rows)], 1)
                total += 1
                if not torch.equal(got, whole):
                    bad += 1
                    print("differs:", threads, m, hint, rows, (got - whole).abs().max().item())
    print(f"threads {threads}: {total - bad} of {total} cases bit-identical")
torch.set_num_threads(1)
for _ in range(2):
    t = time.perf_counter()
    pack_weight(W, 16)
    whole_ms = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    for a in range(0, 49152, 8192):
        pack_weight(W[a:a + 8192], 16)
    print(f"pack, 1 thread: whole {whole_ms:.1f} ms, 8192-row slices {(time.perf_counter() - t) * 1e3:.1f} ms")
print(torch.__version__, torch.backends.mkldnn.is_available(), torch.backends.cpu.get_cpu_capability())
