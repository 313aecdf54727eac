"""`esft ...` with glibc's malloc_trim(0) called once, at the first member's start (after the lane copy, the
noise table and everything else made before it), when ESFT_TRIM_FIRST=1; prints mallinfo2 (MiB) at that
moment and at member 1's prefill. Usage: ESFT_TRIM_FIRST=1 python trim_first.py train es --preset cpu ..."""
import sys, ctypes, os
import esft.generation.lean as L
import esft.generation.engine as E
class MI2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena","ordblks","smblks","hblks","hblkhd","usmblks","fsmblks","uordblks","fordblks","keepcost")]
libc = ctypes.CDLL("libc.so.6"); libc.mallinfo2.restype = MI2
member = [0]
def report(tag):
    d = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "VmHWM"): d[k] = int(v.split()[0]) // 1024
    m = libc.mallinfo2()
    print("\nST", member[0], tag, d, {f: getattr(m, f) >> 20 for f in ("arena", "hblkhd", "uordblks", "fordblks")}, file=sys.stderr, flush=True)
orig = L.lean_decode
def ld(*a, **k):
    member[0] += 1
    if member[0] == 1:
        report("start")
        if os.environ.get("ESFT_TRIM_FIRST") == "1":
            libc.malloc_trim(0); report("trimmed")
    r = orig(*a, **k)
    if member[0] in (1, 8): report("end")
    return r
L.lean_decode = ld; E.lean_decode = ld
from esft.cli import main
sys.exit(main(sys.argv[1:]))
