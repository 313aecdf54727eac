"""One decode-heavy member on one thread, bf16 or fp32 lane weights, repeated (for py-spy --native). Usage:
python member_loop.py bf16|fp32 [calls]"""
import sys, time, dataclasses, torch
from esft.models import load_model
from esft.bench.workloads import build_workload
from esft.bench.inference import _lane_models
from esft.config import FAST_CPU_GENERATION
from esft.generation import GenerationConfig, encode_prompts, generate
torch.set_num_threads(1)
dt = {"fp32": None, "bf16": torch.bfloat16}[sys.argv[1]]
model, tok = load_model("smollm2-135m", dtype="float32", device="cpu")
model.eval(); model.requires_grad_(False)
work = build_workload("decode-heavy", tok)
gen = GenerationConfig(max_new_tokens=work.max_new_tokens, min_new_tokens=work.min_new_tokens,
                       batch_size=work.generation_batch_size, temperature=0.0, engine="esft")
gen = dataclasses.replace(gen, **FAST_CPU_GENERATION)
m = _lane_models(model, 1, dt)[0]
ids = encode_prompts(tok, work.prompts)
with torch.no_grad():
    generate(m, tok, work.prompts, gen, prompt_ids=ids)
    for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 2):
        t = time.perf_counter(); generate(m, tok, work.prompts, gen, prompt_ids=ids)
        print(sys.argv[1], "member s", round(time.perf_counter() - t, 3), flush=True)
