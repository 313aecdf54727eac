import sys, time, torch
sys.path.insert(0, '.')
from loadk import loadk
from esft.es.param_writes import add_rounded
K = loadk('fused_perturb.cpp')
torch.set_num_threads(2)
sizes = [49152*576] + [576*576*2+576*192*2 + 576*1536*3]*30
g = torch.Generator().manual_seed(0)
ms = [torch.randn(n, generator=g) for n in sizes]; es = [torch.randn(n, generator=g) for n in sizes]
for dt in (torch.bfloat16, torch.float32):
    outs = [torch.empty(n, dtype=dt) for n in sizes]
    for m, e, o in zip(ms, es, outs): add_rounded(m, e, 0.01, o)
    ref = [o.clone() for o in outs]
    for m, e, o in zip(ms, es, outs): K.add_scaled(m, e, 0.01, o)
    assert all(torch.equal(a.view(torch.int16 if dt == torch.bfloat16 else torch.int32), b.view(torch.int16 if dt == torch.bfloat16 else torch.int32)) for a, b in zip(ref, outs)), "bits differ"
    for rnd in range(3):
        t = time.perf_counter()
        for m, e, o in zip(ms, es, outs): add_rounded(m, e, 0.01, o)
        a = time.perf_counter() - t
        t = time.perf_counter()
        for m, e, o in zip(ms, es, outs): K.add_scaled(m, e, 0.01, o)
        b = time.perf_counter() - t
        print(dt, f"add_rounded {a*1e3:.1f} ms  fused {b*1e3:.1f} ms", flush=True)
