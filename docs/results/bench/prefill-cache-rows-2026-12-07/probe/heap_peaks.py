import ctypes, sys, time, threading
class MI2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL("libc.so.6"); libc.mallinfo2.restype = MI2
mx = [0]
def cur(): m = libc.mallinfo2(); return (m.uordblks + m.hblkhd) >> 20
def loop():
    while True:
        mx[0] = max(mx[0], cur()); time.sleep(0.0005)
threading.Thread(target=loop, daemon=True).start()
def used(tag): print(f"{tag:34s} now {cur():5d} max-since-last {mx[0]:5d}", file=sys.stderr); mx[0] = 0
import esft.generation.lean as L
import esft.generation.kv_cache as KV
n = [0]
origLM, origLP, origDL, origPF = L.LeanModel, L.layout_prefill, L.decode_loop, L._lean_prefill
class LM(origLM):
    def __init__(s, *a, **k):
        n[0] += 1
        if n[0] <= 2: used(f"m{n[0]} before LeanModel")
        super().__init__(*a, **k)
        if n[0] <= 2: used(f"m{n[0]} after LeanModel")
def lp(*a, **k):
    r = origLP(*a, **k)
    if n[0] <= 2: used(f"m{n[0]} after layout_prefill")
    return r
def dl(*a, **k):
    r = origDL(*a, **k)
    if n[0] <= 2: used(f"m{n[0]} after decode_loop")
    return r
def pf(lean):
    f = origPF(lean)
    def g(model, ids, *a, **k):
        if n[0] <= 2: used(f"m{n[0]}  before prefill {tuple(ids.shape)}")
        r = f(model, ids, *a, **k)
        if n[0] <= 2: used(f"m{n[0]}  after prefill")
        return r
    return g
oKI = KV.KVCache.__init__
def ki(s, lean, rows, cap, *a, **k):
    used(f"   before KVCache {rows}x{cap}"); oKI(s, lean, rows, cap, *a, **k); used("   after KVCache")
KV.KVCache.__init__ = ki
L.LeanModel, L.layout_prefill, L.decode_loop, L._lean_prefill = LM, lp, dl, pf
from esft.cli import main
try: main(sys.argv[1:])
except SystemExit: pass
