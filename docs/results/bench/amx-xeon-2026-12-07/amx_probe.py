"""What esft's bf16 dispatch sees on this CPU (2 threads, like the project's machines)."""
import json, sys, time
import torch
torch.set_num_threads(2)
from esft.generation.precision import cpu_flags, native_bf16_flags, probe_bf16_speedup, resolve_rollout_dtype
from esft.bench.roofline import matmul_gflops, cpu_info
out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu": cpu_info()}
out["native_bf16_flags"] = native_bf16_flags(cpu_flags())
out["amx_flags"] = [f for f in cpu_flags() if f.startswith("amx")]
out["probe_bf16_speedup"] = probe_bf16_speedup()
out["auto_on_fast_path"] = resolve_rollout_dtype("auto", generation_options={"packed_linear": True, "fused_attention": True}).record()
for size in (2048, 512):
    out[f"matmul_gflops_{size}"] = {str(d).removeprefix("torch."): round(matmul_gflops(d, size=size), 1) for d in (torch.float32, torch.bfloat16)}
a32 = torch.randn(32, 576); w32 = torch.randn(1536, 576)
for d in (torch.float32, torch.bfloat16):
    a, w = a32.to(d), w32.to(d)
    for _ in range(20): torch.nn.functional.linear(a, w)
    t = time.perf_counter()
    for _ in range(500): torch.nn.functional.linear(a, w)
    s = (time.perf_counter() - t) / 500
    out[f"decode_linear_32x576x1536_{str(d).removeprefix('torch.')}_gflops"] = round(2 * 32 * 576 * 1536 / s / 1e9, 1)
print(json.dumps(out, indent=1))
json.dump(out, open(sys.argv[1], "w"), indent=1)
