import time, torch, threading, os
from esft.es.es_config import preset
from esft.es.trainer import ESTrainer
from esft.models import load_model
config = preset("cpu", output_dir="/tmp/exp/out2", eval_limit=0, eval_every=0, parallel_members=1)
model, tok = load_model(config.model, dtype=config.dtype, device=config.device)
tr = ESTrainer(config, model=model, tokenizer=tok, progress=False)
ex = tr.executor
batch = [tr.train_set[i] for i in tr.sample_batch(config.seed, 0, len(tr.train_set), config.batch_size)]
members = tr.strategy.ask(0)
page = os.sysconf("SC_PAGE_SIZE")
samples = []; marks = []
stop = False
def sampler():
    while not stop:
        with open("/proc/self/statm") as f:
            samples.append((time.perf_counter(), int(f.read().split()[1]) * page >> 20))
        time.sleep(0.003)
import esft.generation.lean as L
import esft.generation.prefill as P
orig_lp, orig_dl = L.layout_prefill, L.decode_loop
def lp(*a, **k):
    marks.append(("prefill start", time.perf_counter())); r = orig_lp(*a, **k); marks.append(("prefill end", time.perf_counter())); return r
import ctypes, os as _os
libc = ctypes.CDLL("libc.so.6")
TRIM = _os.environ.get("TRIM") == "1"
def dl(*a, **k):
    r = orig_dl(*a, **k); marks.append(("decode end", time.perf_counter())); return r
orig_gen = None
L.layout_prefill, L.decode_loop = lp, dl
orig_lm = L.LeanModel
class LM(orig_lm):
    def __init__(s, *a, **k):
        marks.append(("lean init", time.perf_counter())); super().__init__(*a, **k); marks.append(("lean built", time.perf_counter()))
L.LeanModel = LM
import esft.generation.engine as E
og = E.generate
from esft.es import executor as X
orig_generate_fn = ex.generate_fn
def gen(*a, **k):
    r = orig_generate_fn(*a, **k)
    if TRIM:
        t = time.perf_counter(); libc.malloc_trim(0); marks.append(("trimmed %.3f" % (time.perf_counter() - t), time.perf_counter()))
    return r
ex.generate_fn = gen
th = threading.Thread(target=sampler, daemon=True); th.start()
t0 = time.perf_counter()
ex.evaluate_members(members[:6], batch)
stop = True; th.join()
print("tokens per prompt:", [len(x) for x in ex._prompts(batch)[1]["prompt_ids"]])
def rss_between(a, b):
    v = [r for t, r in samples if a <= t <= b]; return (min(v), max(v)) if v else None
pts = [("start", t0)] + [(n, t) for n, t in marks] + [("end", time.perf_counter())]
for (n1, a), (n2, b) in zip(pts, pts[1:]):
    print(f"{n1:>14} -> {n2:<14} {b-a:6.2f}s  rss min/max MiB {rss_between(a, b)}")
