"""Times the compiled decode-attention kernel alone, built from a given source file: one decode step's 30 layers of
attention for 32 rows, 9 query heads over 3 kv heads of 64 dimensions, 192 attended keys of a 384-key cache, fp32 and
bf16 caches, with and without a mask; reports the step time and the cache bytes read per second.
Usage: python attn_bench.py THREADS SOURCE.cpp [SOURCE2.cpp ...] (sources built in turn, timed in rounds)."""
import os, sys, time, torch
from torch.utils.cpp_extension import load
from esft.kernels import CFLAGS, LDFLAGS


def build(src, tag):
    folder = f"/tmp/attn_bench_build/{tag}"
    os.makedirs(folder, exist_ok=True)
    return load(name=f"attn_bench_{tag}", sources=[src], extra_cflags=CFLAGS, extra_ldflags=LDFLAGS,
                build_directory=folder, verbose=False)


def step_ms(K, dt, use_mask, n=20):
    R, H, KV, D, C, L, col = 32, 9, 3, 64, 384, 30, 191
    g = torch.Generator().manual_seed(0)
    kc = [torch.randn(R, KV, C // 64, D, 64, generator=g).to(dt) for _ in range(L)]
    vc = [torch.randn(R, KV, C, D, generator=g).to(dt) for _ in range(L)]
    mask = torch.ones(R, C, dtype=torch.bool)
    mask[:, :20] = False
    q, k, v = (torch.randn(R, h, D, generator=g).to(dt) for h in (H, KV, KV))
    cos, sin = torch.randn(R, D, generator=g), torch.randn(R, D, generator=g)
    run = lambda: [K.decode_attention(q, k, v, cos, sin, kc[i], vc[i], mask, col, 0.125, use_mask) for i in range(L)]
    run(); run()
    t = time.perf_counter()
    for _ in range(n):
        run()
    s = (time.perf_counter() - t) / n
    return s * 1e3, L * R * KV * (col + 1) * D * 2 * (4 if dt == torch.float32 else 2) / s / 1e9


if __name__ == "__main__":
    torch.set_num_threads(int(sys.argv[1]))
    kernels = [(src, build(src, f"k{i}")) for i, src in enumerate(sys.argv[2:])]
    for rnd in range(2):
        for dt in (torch.float32, torch.bfloat16):
            for use_mask in (False, True):
                for src, K in kernels:
                    ms, gbps = step_ms(K, dt, use_mask)
                    print(f"round {rnd} threads {sys.argv[1]} {os.path.basename(src):28s} {str(dt)[6:]:9s} "
                          f"mask={use_mask!s:5s} step {ms:7.2f} ms  {gbps:6.2f} GB/s", flush=True)
