import sys, ctypes, os, time
class MI2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena","ordblks","smblks","hblks","hblkhd","usmblks","fsmblks","uordblks","fordblks","keepcost")]
libc = ctypes.CDLL("libc.so.6"); libc.mallinfo2.restype = MI2
libc.fopen.restype = ctypes.c_void_p
T0 = time.time()
def rss():
    d = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "VmHWM"): d[k] = int(v.split()[0]) // 1024
    return d
def report(tag):
    m = libc.mallinfo2()
    print("ST", f"{time.time()-T0:6.2f}", tag, rss(), {f: getattr(m, f) >> 20 for f in ("arena", "hblkhd", "uordblks", "fordblks")}, "thr", len(os.listdir("/proc/self/task")), file=sys.stderr, flush=True)
def xml(path):
    f = libc.fopen(path.encode(), b"w"); libc.malloc_info(0, ctypes.c_void_p(f)); libc.fclose(ctypes.c_void_p(f))
import esft.models as M
import esft.es.executor as E
import esft.generation.lean as L
import esft.es.build as B
def wrap(mod, name, tag, after=True):
    f = getattr(mod, name)
    def g(*a, **k):
        if not after: report(tag + " before")
        r = f(*a, **k)
        report(tag)
        return r
    setattr(mod, name, g)
orig_ensure = E.LocalExecutor._ensure_lanes
def ensure(self, lanes):
    report("ensure before"); r = orig_ensure(self, lanes); report("ensure after"); return r
E.LocalExecutor._ensure_lanes = ensure
orig = L.decode_loop; calls = [0]
def dl(step, logits, *a, **k):
    calls[0] += 1
    if calls[0] <= 2:
        report(f"decode {calls[0]}")
        xml(os.environ["XML"] + f".{calls[0]}.xml")
    return orig(step, logits, *a, **k)
L.decode_loop = dl
for name in dir(B):
    pass
import threading
def ticker():
    while calls[0] < 2:
        report("tick"); time.sleep(0.25)
threading.Thread(target=ticker, daemon=True).start()
report("imports")
from esft.cli import main
rc = main(sys.argv[1:])
report("end")
sys.exit(rc)
