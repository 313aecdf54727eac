import time, sys
from esft.models import load_model
from esft.tasks import get_task
from esft.evaluation import load_examples, evaluate_task
from esft.generation import GenerationConfig
from esft.config import FAST_CPU_GENERATION
import torch
torch.set_num_threads(2)
m, tok = load_model("smollm2-135m", dtype="float32", device="cpu")
t = get_task("countdown:numbers=2,max_number=50,ops=+*,ask_format=1,shots=2")
ex = load_examples(t, "test", 400, balanced=True)[:80]
for name, opts in [("default", {}), ("fast", FAST_CPU_GENERATION), ("default", {}), ("fast", FAST_CPU_GENERATION)]:
    g = GenerationConfig(max_new_tokens=40, batch_size=40, **opts)
    t0 = time.perf_counter(); s = evaluate_task(m, tok, t, ex, g, progress=False); dt = time.perf_counter()-t0
    print(name, round(dt,1), s["accuracy"], s["prompt_tokens"], s["completion_tokens"], flush=True)
