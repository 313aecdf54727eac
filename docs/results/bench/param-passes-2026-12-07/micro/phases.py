"""Minor page faults and time of the pieces of one bf16 cpu-preset ES iteration."""
import resource, time, sys, torch
import esft.bench.iterations as it
import esft.generation.lean_step as ls
import esft.es.noise as nz
from esft.models import load_model
from esft.bench.workloads import build_workload
torch.set_num_threads(2)
stats = {}
def wrap(mod, name, key):
    f = getattr(mod, name)
    def g(*a, **k):
        r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt; t0 = time.perf_counter()
        try: return f(*a, **k)
        finally:
            s = stats.setdefault(key, [0, 0.0, 0])
            s[0] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0; s[1] += time.perf_counter() - t0; s[2] += 1
    setattr(mod, name, g)
wrap(ls, "pack_weight", "pack")
wrap(ls, "fill_released", "fill")
wrap(nz.MasterWeights, "apply", "update")
wrap(nz.MasterWeights, "perturb", "perturb")
orig_ti = it.timed_iteration
def ti(*a, **k):
    stats.clear()
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    out = orig_ti(*a, **k)
    stats["iteration"] = [resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0, out["timings"]["iteration"], 1]
    for k2, v in sorted(stats.items()): print(f"  {k2:10s} faults {v[0]:8d}  {v[1]*1e3:8.1f} ms  calls {v[2]}")
    return out
it.timed_iteration = ti
model, tok = load_model("smollm2-135m", dtype="float32", device="cpu")
work = build_workload("cpu-preset", tok)
gen = {"share_prefix": True, "prefill_buckets": 4, "packed_linear": True, "fused_attention": True, "screened_lm_head": True}
for r in range(2):
    it.esft_iteration(model, tok, work, 4, "table", gen, 0, 1, 1, torch.bfloat16)
