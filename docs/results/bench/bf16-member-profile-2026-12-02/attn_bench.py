import torch, time
import torch.nn.functional as F
torch.set_num_threads(1)
torch.manual_seed(0)
b, h, kv, t, past, d = 9, 9, 3, 136, 48, 64
L = past + t
q = torch.randn(b, h, t, d); k = torch.randn(b, kv, L, d); v = torch.randn(b, kv, L, d)
lens = torch.randint(90, t+1, (b,)); lens[0] = t
am = torch.zeros(b, L, dtype=torch.bool); am[:, :past] = True
for r in range(b): am[r, L - lens[r]:] = True
cols = torch.arange(L); rows = past + torch.arange(t)
allowed = am[:, None, :] & (cols[None, :] <= rows[:, None])[None]
allowed |= (cols[None, :] == rows[:, None])[None]
mask = allowed[:, None]
def tm(f, n=10):
    f(); s = time.perf_counter()
    for _ in range(n): r = f()
    return round((time.perf_counter() - s) / n * 1e3, 2), r
sc = 0.125
ref_t, ref = tm(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=sc, enable_gqa=True))
qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
b16_t, b16 = tm(lambda: F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=sc, enable_gqa=True))
def math(q, k, v, out_dtype=torch.float32):
    g = h // kv
    qq = q.reshape(b, kv, g * t, d)
    s = torch.matmul(qq, k.transpose(-1, -2)).view(b, kv, g, t, L).float()
    s.mul_(sc).masked_fill_(~mask.view(b, 1, 1, t, L), float("-inf"))
    p = torch.softmax(s, -1).to(v.dtype).view(b, kv, g * t, L)
    return torch.matmul(p, v).view(b, h, t, d).to(out_dtype)
m32_t, m32 = tm(lambda: math(q, k, v))
m16_t, m16 = tm(lambda: math(qb, kb, vb))
# fp32 inputs rounded through bf16 keys (what the decode kernel sees): reference with bf16-rounded k,v
refk_t, refk = tm(lambda: F.scaled_dot_product_attention(q, kb.float(), vb.float(), attn_mask=mask, scale=sc, enable_gqa=True))
print("ms: sdpa fp32", ref_t, "sdpa bf16", b16_t, "math fp32", m32_t, "math bf16", m16_t)
valid = am[:, past:][:, None, :, None].expand_as(ref)
def err(x): return ((x.float() - ref)[valid].abs().max().item(), ((x.float()-ref)[valid].norm()/ref[valid].norm()).item())
print("err vs fp32: sdpa bf16", err(b16), "math bf16", err(m16), "fp32 sdpa on bf16 kv", err(refk), "math fp32", err(m32))
