import time, torch
"""SmolLM2-135M-shaped masters (random), table-noise windows: one bf16 perturbation and one four-member update,
torch ops (esft.es.param_writes.*_torch) against the compiled passes (esft/kernels/param_passes.cpp), bits compared.
Run from the repository root: python docs/results/bench/param-passes-2026-12-07/micro/bench.py"""
from esft.es import param_writes as pw
from esft.kernels import load_param_passes
torch.set_num_threads(2)
K = load_param_passes()
g = torch.Generator().manual_seed(0)
shapes = [(49152, 576)] + [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536), (576,), (576,)] * 30
table = torch.randn(1 << 26, generator=g)
masters = [torch.randn(*s, generator=g) * 0.05 for s in shapes]
def windows(seed):
    gg = torch.Generator().manual_seed(seed); out = []
    for m in masters:
        off = int(torch.randint(0, table.numel() - m.numel(), (1,), generator=gg))
        out.append(table[off:off + m.numel()].view(m.shape))
    return out
outs = [torch.empty(s, dtype=torch.bfloat16) for s in shapes]
step = 0.0013
def torch_perturb(E):
    for m, e, o in zip(masters, E, outs): pw.add_rounded_torch(m, e, step, o)
def k_perturb(E):
    for m, e, o in zip(masters, E, outs): K.add_rounded(m.view(-1), e.reshape(-1), step, o.view(-1))
E = windows(1)
torch_perturb(E); ref = [o.clone() for o in outs]
k_perturb(E); assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(ref, outs))
print("perturb bits equal")
for rep in range(3):
    for name, fn in (("torch", lambda: torch_perturb(E)), ("kernel", lambda: k_perturb(E))):
        t = time.perf_counter(); fn(); print(f"perturb {name:8s} {1e3*(time.perf_counter()-t):7.1f} ms")
# update
Es = [windows(s) for s in (2, 3, 4, 5)]; coefs = [0.7, -1.3, 0.2, 0.9]; scale = 1e-4
buf = pw.update_buffer(max(m.numel() for m in masters), "cpu")
def torch_update(ms):
    sq = 0.0
    for i, m in enumerate(ms): sq += pw.add_update_torch(m, [(E_[i], c) for E_, c in zip(Es, coefs)], scale, buf)
    return sq
def k_update(ms):
    sq = 0.0
    for i, m in enumerate(ms): sq += pw.add_update(m, [(E_[i], c) for E_, c in zip(Es, coefs)], scale, buf)
    return sq
m1 = [m.clone() for m in masters]; m2 = [m.clone() for m in masters]
a = torch_update(m1); b = k_update(m2)
assert a == b and all(torch.equal(x, y) for x, y in zip(m1, m2)), (a, b)
print("update bits equal", a)
for rep in range(3):
    t = time.perf_counter(); torch_update(m1); t1 = time.perf_counter(); k_update(m2); t2 = time.perf_counter()
    print(f"update torch {1e3*(t1-t):7.1f} ms  kern {1e3*(t2-t1):7.1f} ms")
