import sys, time, torch
from loadk import loadk
K = loadk(sys.argv[2])
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
R, H, KV, D, C, L = 32, 9, 3, 64, 384, 30
for dt in (torch.float32, torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    kc = [torch.randn(R, KV, C // 64, D, 64, generator=g).to(dt) for _ in range(L)]
    vc = [torch.randn(R, KV, C, D, generator=g).to(dt) for _ in range(L)]
    mask = torch.ones(R, C, dtype=torch.bool); mask[:, :20] = False
    q = torch.randn(R, H, D).to(dt); k = torch.randn(R, KV, D).to(dt); v = torch.randn(R, KV, D).to(dt)
    cos = torch.randn(R, D); sin = torch.randn(R, D)
    for use_mask in (False, True):
        col = 191
        for _ in range(2):
            for i in range(L): K.decode_attention(q, k, v, cos, sin, kc[i], vc[i], mask, col, 0.125, use_mask)
        n = 20; t = time.perf_counter()
        for _ in range(n):
            for i in range(L): K.decode_attention(q, k, v, cos, sin, kc[i], vc[i], mask, col, 0.125, use_mask)
        dtm = (time.perf_counter() - t) / n
        byts = L * R * KV * (col + 1) * D * 2 * (4 if dt == torch.float32 else 2)
        print(f"{str(dt):15s} mask={use_mask!s:5s} step {dtm*1e3:7.2f} ms  {byts/dtm/1e9:6.2f} GB/s", flush=True)
