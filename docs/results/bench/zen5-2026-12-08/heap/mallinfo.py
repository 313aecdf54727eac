import sys, ctypes, os
import esft.generation.lean as L
class MI2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena","ordblks","smblks","hblks","hblkhd","usmblks","fsmblks","uordblks","fordblks","keepcost")]
libc = ctypes.CDLL("libc.so.6"); libc.mallinfo2.restype = MI2
orig = L.decode_loop; calls = [0]
def rss():
    d = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "VmHWM"): d[k] = int(v.split()[0]) // 1024
    return d
def wrapped(step, logits, *a, **k):
    calls[0] += 1
    if calls[0] in (1, 2, 5, 8):
        m = libc.mallinfo2()
        print("MI", calls[0], rss(), {f: getattr(m, f) >> 20 for f in ("arena", "hblkhd", "uordblks", "fordblks", "keepcost")}, "threads", len(os.listdir("/proc/self/task")), file=sys.stderr, flush=True)
    return orig(step, logits, *a, **k)
L.decode_loop = wrapped
from esft.cli import main
sys.exit(main(sys.argv[1:]))
