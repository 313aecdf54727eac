"""Which stage of a member holds the ES run's peak RSS: a thread samples VmRSS every 2 ms while the lean engine
marks its stages (LeanModel built, each prefill group, the prefill's lm_head, the decode loop). Prints, per member,
the highest sample and the stage it fell in. Usage: python peak_stage.py train es --preset cpu ..."""
import sys, threading, time, os
import esft.generation.lean as L
import esft.generation.engine as E
import esft.generation.lean_step as LS
stage = ["setup"]; member = [0]; best = {}
def rss_kb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
def sampler():
    while True:
        r = rss_kb(); key = (member[0], stage[0])
        if r > best.get(key, 0): best[key] = r
        time.sleep(0.002)
threading.Thread(target=sampler, daemon=True).start()
def marked(fn, name):
    def w(*a, **k):
        prev = stage[0]; stage[0] = name
        try: return fn(*a, **k)
        finally: stage[0] = prev
    return w
orig_ld = L.lean_decode
def ld(*a, **k):
    member[0] += 1; stage[0] = "lean+other"
    try: return orig_ld(*a, **k)
    finally: stage[0] = "between"
L.lean_decode = ld; E.lean_decode = ld
orig_lp = L._lean_prefill
L._lean_prefill = lambda lean: marked(orig_lp(lean), "prefill-layers")
LS.LeanModel.head_logits = marked(LS.LeanModel.head_logits, "prefill-head")
L.decode_loop = marked(L.decode_loop, "decode")
import atexit
@atexit.register
def dump():
    for (m, s), r in sorted(best.items()):
        print("PEAK", m, s, r, file=sys.stderr)
from esft.cli import main
sys.exit(main(sys.argv[1:]))
