import sys, time, dataclasses, torch, collections
import torch.nn.functional as F
from esft.models import load_model
from esft.bench.workloads import build_workload
from esft.bench.inference import _lane_models
from esft.config import FAST_CPU_GENERATION
from esft.generation import GenerationConfig, encode_prompts, generate
torch.set_num_threads(1)
model, tok = load_model("smollm2-135m", dtype="float32", device="cpu")
model.eval(); model.requires_grad_(False)
work = build_workload(sys.argv[1], tok)
gen = GenerationConfig(max_new_tokens=work.max_new_tokens, min_new_tokens=work.min_new_tokens,
                       batch_size=work.generation_batch_size, temperature=0.0, engine="esft")
gen = dataclasses.replace(gen, **FAST_CPU_GENERATION)
m = _lane_models(model, 1, torch.bfloat16)[0]
ids = encode_prompts(tok, work.prompts)
orig = F.scaled_dot_product_attention
shapes = collections.Counter(); tm = collections.Counter()
def rec(q, k, v, **kw):
    t = time.perf_counter(); r = orig(q, k, v, **kw); tm[(tuple(q.shape), tuple(k.shape))] += time.perf_counter()-t
    shapes[(tuple(q.shape), tuple(k.shape))] += 1; return r
F.scaled_dot_product_attention = rec
with torch.no_grad():
    generate(m, tok, work.prompts, gen, prompt_ids=ids)
for s, n in shapes.items(): print(s, n, round(tm[s]*1e3/n, 2), "ms")
