"""Nucleus sampling, old (full sort) vs new (topk candidates), side by side in one process, 2 threads:
(1) sample_next alone on real SmolLM2-135M next-token logits, (2) a sampled `generate` (esft engine, fp32).
Run: PYTHONPATH=src python timing.py (from the repository root)."""
import platform, statistics, sys, time
import torch
sys.path.insert(0, "tests")
from test_sampling import _reference
from esft.generation import GenerationConfig, generate, loop, sample_next
from esft.models import load_model

torch.set_num_threads(2)
model, tok = load_model("smollm2-135m", dtype=torch.float32, device="cpu")
cpu = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")][0]
capability = torch.backends.cpu.get_cpu_capability()
print(f"{cpu}, torch {torch.__version__} ({capability}), threads {torch.get_num_threads()}")
texts = ["Question: Is the sky blue during a clear day? Think step by step, then answer with \\boxed{yes} or "
         "\\boxed{no}. The sky looks blue because shorter wavelengths scatter more in the atmosphere, so",
         "Using the numbers 12, 7 and 3, write an expression that equals 33. Let me try: 12 + 7 = 19, then"]
with torch.no_grad():  # one row per position: real next-token distributions
    real = torch.cat([model(tok(t, return_tensors="pt").input_ids).logits[0].float() for t in texts])
g = torch.Generator().manual_seed(0)
print(f"(1) sample_next on {real.shape[0]} real logit rows, vocabulary {real.shape[1]}; 150 calls each, interleaved")
for batch in (1, 16):
    for temperature, top_p in ((1.0, 0.95), (0.6, 0.95), (1.0, 0.9)):
        t_old, t_new, ratios = 0.0, 0.0, []
        for rep in range(150):
            x = real[torch.randint(0, real.shape[0], (batch,), generator=g)]
            u = torch.rand(batch, generator=g, dtype=torch.float64)
            fns = [("old", _reference), ("new", sample_next)][:: 1 if rep % 2 else -1]  # alternate who goes first
            took, out = {}, {}
            for name, fn in fns:
                start = time.perf_counter()
                out[name] = fn(x, temperature, top_p, None, uniforms=u)
                took[name] = time.perf_counter() - start
            assert torch.equal(out["old"], out["new"])
            t_old, t_new = t_old + took["old"], t_new + took["new"]
            ratios.append(took["old"] / took["new"])
        n = 150 * batch
        print(f"  batch {batch:2d}, T {temperature}, top_p {top_p}: old {t_old / n * 1e3:.2f} ms/row, new "
              f"{t_new / n * 1e3:.2f} ms/row; total ratio {t_old / t_new:.1f}x, median per-call "
              f"{statistics.median(ratios):.1f}x")
prompts = [[{"role": "user", "content": f"Tell me a short story about the number {i}."}] for i in range(16)]
config = GenerationConfig(max_new_tokens=32, min_new_tokens=32, batch_size=16, temperature=1.0, top_p=0.95, seed=0)
print("(2) generate: 16 prompts x 32 new tokens, T 1.0, top_p 0.95, batch 16, esft engine; old, new, old, new")
runs = {}
for name in ("old", "new", "old", "new"):
    if name == "old":
        loop.sample_next = lambda logits, t, p, gen, uniforms=None: _reference(logits, t, p, gen, uniforms)
    else:
        loop.sample_next = sample_next
    start = time.perf_counter()
    ids = [r.completion_ids for r in generate(model, tok, prompts, config)]
    runs.setdefault(name, []).append(time.perf_counter() - start)
    runs.setdefault(name + " ids", []).append(ids)
assert all(ids == runs["old ids"][0] for ids in runs["old ids"] + runs["new ids"])
print(f"  old {', '.join(f'{s:.1f}' for s in runs['old'])} s; new {', '.join(f'{s:.1f}' for s in runs['new'])} s; "
      f"identical completions; ratio {sum(runs['old']) / sum(runs['new']):.2f}x")
