"""fp32 and bf16 matmul rates on this CPU (2 threads), as `esft bench` times them (esft.bench.roofline.matmul_gflops):
what forced bf16 rollouts meet where oneDNN has no bf16 matmul (torch's own bf16 kernels)."""
import json

import torch

from esft.bench.roofline import matmul_gflops
from esft.generation.packed import onednn_bf16

if __name__ == "__main__":
    torch.set_num_threads(2)
    out = {"onednn_bf16": onednn_bf16(), "torch_capability": torch.backends.cpu.get_cpu_capability()}
    for size in (512, 1024):
        out[f"fp32_{size}"] = round(matmul_gflops(torch.float32, size=size, reps=3), 2)
        out[f"bf16_{size}"] = round(matmul_gflops(torch.bfloat16, size=size, reps=3), 2)
    # a decode-shaped product: 16 rows against SmolLM2's 576 x 1536 MLP projection
    import time
    for dtype in (torch.float32, torch.bfloat16):
        x, w = torch.randn(16, 576, dtype=dtype), torch.randn(1536, 576, dtype=dtype)
        torch.nn.functional.linear(x, w)
        t = time.perf_counter()
        for _ in range(20):
            torch.nn.functional.linear(x, w)
        out[f"decode_linear_{str(dtype)[6:]}_gflops"] = round(20 * 2 * 16 * 576 * 1536 / (time.perf_counter() - t) / 1e9, 2)
    print(json.dumps(out))
