import sys, ctypes, os, time, threading
class MI2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena","ordblks","smblks","hblks","hblkhd","usmblks","fsmblks","uordblks","fordblks","keepcost")]
libc = ctypes.CDLL("libc.so.6"); libc.mallinfo2.restype = MI2
T0 = time.time()
def report(tag):
    m = libc.mallinfo2()
    print("ST", f"{time.time()-T0:6.2f}", tag, threading.current_thread().name, {f: getattr(m, f) >> 20 for f in ("arena", "hblks", "hblkhd", "uordblks", "fordblks")}, file=sys.stderr, flush=True)
import esft.es.lanes as lanes
import esft.es.executor as E
orig_rr = E.rollout_replica
def rr(*a, **k):
    report("replica before"); r = orig_rr(*a, **k); report("replica after"); return r
E.rollout_replica = rr
orig_mlb = E.map_large_blocks
def mlb(*a, **k):
    r = orig_mlb(*a, **k); report(f"map_large_blocks -> {r} cache {orig_mlb.cache_info()}"); return r
E.map_large_blocks = mlb
import esft.generation.lean as L
orig = L.decode_loop; calls = [0]
def dl(step, logits, *a, **k):
    calls[0] += 1
    if calls[0] == 2: report("decode 2")
    return orig(step, logits, *a, **k)
L.decode_loop = dl
from esft.cli import main
sys.exit(main(sys.argv[1:]))
