"""One member of a bench workload (cpu-preset / decode-heavy) on one thread, fp32 or bf16 lane weights: a warm-up
call, two timed calls, and with a third argument a torch profiler table. Usage: python prof_member.py cpu-preset bf16 [p]"""
import sys, time, dataclasses, torch
from esft.models import load_model
from esft.bench.workloads import build_workload
from esft.bench.inference import _lane_models
from esft.config import FAST_CPU_GENERATION
from esft.generation import GenerationConfig, encode_prompts, generate
torch.set_num_threads(1)
wl = sys.argv[1]; dt = {"fp32": None, "bf16": torch.bfloat16}[sys.argv[2]]
model, tok = load_model("smollm2-135m", dtype="float32", device="cpu")
model.eval(); model.requires_grad_(False)
work = build_workload(wl, tok)
gen = GenerationConfig(max_new_tokens=work.max_new_tokens, min_new_tokens=work.min_new_tokens,
                       batch_size=work.generation_batch_size, temperature=0.0, engine="esft")
gen = dataclasses.replace(gen, **FAST_CPU_GENERATION)
m = _lane_models(model, 1, dt)[0]
ids = encode_prompts(tok, work.prompts)
with torch.no_grad():
    generate(m, tok, work.prompts, gen, prompt_ids=ids)
    ts=[]
    for _ in range(2):
        t=time.perf_counter(); generate(m, tok, work.prompts, gen, prompt_ids=ids); ts.append(time.perf_counter()-t)
    print(sys.argv[2], "member s", [round(x,3) for x in ts])
    if len(sys.argv) > 3:
        from torch.profiler import profile
        with profile() as p:
            generate(m, tok, work.prompts, gen, prompt_ids=ids)
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
