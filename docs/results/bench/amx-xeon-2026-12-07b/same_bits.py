"""The kernel built from two sources gives the same bits: outputs and both caches after the append, fp32 and bf16,
masked and not, at several columns (tile edges included), 13 rows on 2 threads. Usage: python same_bits.py A.cpp B.cpp"""
import sys, torch
from attn_bench import build

A, B = build(sys.argv[1], "same_a"), build(sys.argv[2], "same_b")
torch.set_num_threads(2)
R, H, KV, D, C = 13, 9, 3, 64, 384
bits = lambda t: t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)
checked = 0
for dt in (torch.float32, torch.bfloat16):
    for col in (0, 5, 63, 64, 191, 300, 383):
        for use_mask in (False, True):
            g = torch.Generator().manual_seed(col)
            kc = torch.randn(R, KV, C // 64, D, 64, generator=g).to(dt)
            vc = torch.randn(R, KV, C, D, generator=g).to(dt)
            mask = torch.rand(R, C, generator=g) > 0.3
            q, k, v = (torch.randn(R, h, D, generator=g).to(dt) for h in (H, KV, KV))
            cos, sin = torch.randn(R, D, generator=g), torch.randn(R, D, generator=g)
            k2, v2 = kc.clone(), vc.clone()
            o1 = A.decode_attention(q, k, v, cos, sin, kc, vc, mask, col, 0.125, use_mask)
            o2 = B.decode_attention(q, k, v, cos, sin, k2, v2, mask, col, 0.125, use_mask)
            assert torch.equal(bits(o1), bits(o2)) and torch.equal(bits(kc), bits(k2)) and torch.equal(bits(vc), bits(v2))
            checked += 1
print(f"same bits in {checked} cases")
