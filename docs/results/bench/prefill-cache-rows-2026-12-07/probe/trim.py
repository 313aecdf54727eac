"""The cpu preset's one iteration with (TRIM=1) or without (TRIM=0) malloc_trim(0) after each member's LeanModel
(its packing); prints the process's VmHWM and the time spent trimming. Not kept in esft: see ../README.md."""
import ctypes, sys, time, os
libc = ctypes.CDLL("libc.so.6")
import esft.generation.lean as L
mode = os.environ.get("TRIM", "0")
origLM = L.LeanModel
tt = [0.0]
class LM(origLM):
    def __init__(s, *a, **k):
        super().__init__(*a, **k)
        if mode == "1":
            t = time.perf_counter(); libc.malloc_trim(0); tt[0] += time.perf_counter() - t
L.LeanModel = LM
from esft.cli import main
try: main(sys.argv[1:])
except SystemExit: pass
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print("TRIM", mode, "HWM kB", hwm, "trim s", round(tt[0], 3), file=sys.stderr)
