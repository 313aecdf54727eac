import time, collections, sys, torch
torch.set_num_threads(2)
from esft.models import load_model
from esft.bench.workloads import build_workload
from esft.bench.inference import _lane_models
from esft.config import FAST_CPU_GENERATION
from esft.generation import GenerationConfig, encode_prompts, generate
from esft.kernels import load_amx_linear, load_decode_attention, load_param_passes
import dataclasses
amx = load_amx_linear(); load_decode_attention(); load_param_passes()
model, tok = load_model("smollm2-135m", dtype="float32", device="cpu")
work = build_workload(sys.argv[1] if len(sys.argv) > 1 else "cpu-preset", tok)
gen = GenerationConfig(max_new_tokens=work.max_new_tokens, min_new_tokens=work.min_new_tokens,
                       batch_size=work.generation_batch_size, temperature=0.0, engine="esft", **FAST_CPU_GENERATION)
m = _lane_models(model, 1, torch.bfloat16)[0]
ids = encode_prompts(tok, work.prompts)
stats = collections.defaultdict(lambda: [0, 0.0, 0])
orig = amx.linear
def timed(x, w, b):
    t0 = time.perf_counter(); y = orig(x, w, b); dt = time.perf_counter() - t0
    s = stats["prefill" if x.shape[0] > 64 else "decode"]; s[0] += 1; s[1] += dt
    s[2] += 2 * x.shape[0] * w.shape[0] * w.shape[1] * 32 * 32
    return y
with torch.no_grad():
    generate(m, tok, work.prompts, gen, prompt_ids=ids)
    for mode in ("plain", "timed", "plain"):
        amx.linear = timed if mode == "timed" else orig
        stats.clear()
        t0 = time.perf_counter(); g = generate(m, tok, work.prompts, gen, prompt_ids=ids); dt = time.perf_counter() - t0
        print(mode, f"{dt:.3f} s", {k: (v[0], round(v[1], 3), round(v[2] / v[1] / 1e9)) for k, v in stats.items()})
    if len(sys.argv) > 2:
        amx.linear = orig
        t0 = time.perf_counter()
        for _ in range(int(sys.argv[2])): generate(m, tok, work.prompts, gen, prompt_ids=ids)
        print("loop", (time.perf_counter() - t0) / int(sys.argv[2]))
