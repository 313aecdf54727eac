import sys, time, json, tempfile, functools, ctypes
from pathlib import Path
T=int(sys.argv[1]); dtype=sys.argv[2] if len(sys.argv)>2 else "auto"
import esft.es.executor as E
libc=ctypes.CDLL("libc.so.6")
E.map_large_blocks = functools.lru_cache(maxsize=1)(lambda threshold=T: bool(libc.mallopt(-3, threshold)))
from esft.es.es_config import preset
from esft.es.trainer import ESTrainer
from esft.models import load_model
def st(k):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(k): return int(line.split()[1])//1024
config = preset("cpu", output_dir=tempfile.mkdtemp(), eval_limit=0, eval_every=0, rollout_dtype=dtype)
model, tok = load_model(config.model, dtype=config.dtype, device=config.device)
tr = ESTrainer(config, model=model, tokenizer=tok, progress=False)
ex=tr.executor; ex.start()
batch=[tr.train_set[i] for i in tr.sample_batch(config.seed,0,len(tr.train_set),config.batch_size)]
for it in range(4):
    members=tr.strategy.ask(it)[:4]
    r=ex.evaluate_members(members,batch)
    print(it, {k:round(v,3) for k,v in r.timings.items()}, "rss", st("VmRSS"), "hwm", st("VmHWM"), flush=True)
