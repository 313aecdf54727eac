import torch, time, sys
from esft.models import load_model
from esft.bench.workloads import build_workload
from esft.bench.iterations import esft_iteration
from esft.bench.inference import esft_generation
from esft.config import FAST_CPU_GENERATION
torch.set_num_threads(2)
model, tok = load_model("smollm2-135m", dtype="float32", device="cpu")
model.requires_grad_(False)
with torch.no_grad():
    snap = {n: p.clone() for n, p in model.named_parameters()}
    for p in model.parameters(): p.add_(0)
work = build_workload(sys.argv[1] if len(sys.argv) > 1 else "cpu-preset", tok)
for r in range(3):
    it = esft_iteration(model, tok, work, 4, "table", dict(FAST_CPU_GENERATION), 0, 1, 2, torch.bfloat16)
    with torch.no_grad():
        for n, p in model.named_parameters(): p.copy_(snap[n])
    t = it["timings"]
    pure = esft_generation(model, tok, work, 4, dict(FAST_CPU_GENERATION), 2, torch.bfloat16)
    print(r, "iteration", round(t["iteration"], 2), "evaluate", round(t["evaluate"], 2), "generate/lane", round(t["generate"] / 2, 2),
          "perturb/lane", round(t["perturb"] / 2, 2), "update", round(t["update"], 3), "| pure", pure["seconds"],
          "tokens it/pure", it.get("generated_tokens"), pure["generated_tokens"], flush=True)
