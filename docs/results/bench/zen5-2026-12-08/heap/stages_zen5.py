"""VmHWM / VmRSS / glibc mallinfo2 (MiB) at each stage of every member of `esft train es --preset cpu` (the lean
engine's LeanModel built, prefill laid out, decode done). Usage: python stages_zen5.py train es --preset cpu ..."""
import sys, ctypes, time
import esft.generation.lean as L
class MI2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena","ordblks","smblks","hblks","hblkhd","usmblks","fsmblks","uordblks","fordblks","keepcost")]
libc = ctypes.CDLL("libc.so.6"); libc.mallinfo2.restype = MI2
T0 = time.time(); member = [0]
def report(tag):
    d = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "VmHWM"): d[k] = int(v.split()[0]) // 1024
    m = libc.mallinfo2()
    print("ST", f"{time.time()-T0:6.2f}", member[0], f"{tag:<10}", d, {f: getattr(m, f) >> 20 for f in ("arena", "hblkhd", "uordblks", "fordblks")}, file=sys.stderr, flush=True)
def wrap(name, before=None, after=None):
    orig = getattr(L, name)
    def w(*a, **k):
        if before: report(before)
        r = orig(*a, **k)
        if after: report(after)
        return r
    setattr(L, name, w)
orig_ld = L.lean_decode
def ld(*a, **k):
    member[0] += 1; report("start"); r = orig_ld(*a, **k); report("end"); return r
L.lean_decode = ld
import esft.generation.engine as E
E.lean_decode = ld
wrap("LeanModel", after="lean")
wrap("layout_prefill", after="prefill")
from esft.cli import main
sys.exit(main(sys.argv[1:]))
