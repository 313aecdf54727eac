"""`esft train es --executor ray --worker-backend vllm` end to end on the embedded model, with a real vLLM engine.

3 iterations (N 4, B 4, 16 new tokens, bf16; fp32 on a CPU without native bf16) through the CLI, on a task of the
user's own (a data file and a reward function in a module of theirs, which the worker that scores imports): one Ray
actor holds the engine; the driver keeps its PyTorch replica. The reward is the completion's length in characters:
members of distinct weights write distinct texts, so fitness differs within every population (with BoolQ's 0/1
reward on 4 prompts, all members of a population could tie and leave nothing to check).
Checked: the run finishes; each update has norm alpha sqrt(d / N) (z-scored
fitness makes sum_k z_k^2 = N, and independent N(0, I) directions in d = 134.5M dimensions are orthogonal to
~1e-4, the law the local executor meets); the engine's masters equal the driver's at start-up and after every
update (checksum events in metrics.jsonl); `esft.es.replay` rebuilds the final weights from the base model and
the seed log, bit for bit.

Where vLLM runs (scripts/test_vllm.sh); skipped with the reason elsewhere.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest

from esft.es.distributed.vllm_backend import vllm_unavailable_reason

REASON = vllm_unavailable_reason()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=str(REASON))]

N, ALPHA, ITERATIONS = 4, 1e-3, 3


def test_train_es_with_vllm_workers_meets_the_random_walk_law_and_replays(tmp_path):
    from esft.es.replay import verify
    from esft.es.distributed.vllm_backend import platform_device_type

    from esft.generation.precision import cpu_flags, native_bf16_flags

    out = tmp_path / "run"
    rows = [{"question": f"Name {k} animals that live in {place}."}
            for k in range(2, 7) for place in ("the sea", "a forest", "a desert", "the Arctic")]
    (tmp_path / "animals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "length_reward.py").write_text(
        "def chars(completions, **kwargs):\n"
        "    return [len(c[0]['content']) / 100 for c in completions]\n")
    device = platform_device_type()
    # bf16 where it is native (GPUs, AVX512-BF16 / AMX CPUs); where vLLM's CPU build emulates it (a Zen 2: ~4
    # tokens/s) fp32, in which the engine runs as fast as esft's own (docs/results/bench/zen2-avx2-2026-12-06)
    dtype = "bfloat16" if device != "cpu" or native_bf16_flags(cpu_flags()) else "float32"
    esft = os.path.join(os.path.dirname(sys.executable), "esft")  # the CLI of this environment
    cmd = [esft if os.path.exists(esft) else "esft", "train", "es", "--model", "smollm2-135m",
           "--task", str(tmp_path / "animals.jsonl"), "--prompt-field", "question", "--reward", "length_reward:chars",
           "--population-size", str(N), "--batch-size", "4", "--max-new-tokens", "16",
           "--iterations", str(ITERATIONS), "--sigma", "0.01", "--alpha", str(ALPHA), "--dtype", dtype,
           "--device", device, "--eval-every", str(ITERATIONS), "--eval-limit", "4",
           "--executor", "ray", "--num-workers", "1", "--worker-backend", "vllm",
           # checksum after every update: the last one is compared at the final evaluation
           "--executor-options", json.dumps({"checksum_every": 1, "start_timeout_s": 900}),
           "--output-dir", str(out)]
    # the reward module imports from its folder, in the driver and the Ray worker that scores (docs/custom-tasks.md)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=path)
    env.pop("RAY_ADDRESS", None)  # a Ray instance of its own, whose workers inherit that PYTHONPATH
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("kind") == "train"]
    executor = [r for r in records if r.get("kind") == "executor"]
    start = next(r for r in executor if r["event"] == "start")
    assert [w["backend"] for w in start["workers"]] == ["vllm"] and start["workers"][0]["device_type"] == device
    d = start["workers"][0]["num_params"]
    assert d == 134_515_008 and len(train) == ITERATIONS

    law = ALPHA * math.sqrt(d / N)
    norms = [r["update_norm"] for r in train]
    assert not [r for r in train if r["zero_update"]], [r["fitness"] for r in train]  # fitness differed each time
    for n in norms:
        assert n == pytest.approx(law, rel=2e-3)
    # the engine's masters equal the driver's at start-up and after each of the 3 updates; nothing was re-sent
    checks = [r for r in executor if r["event"] == "checksum"]
    assert all(r["ok"] for r in checks) and len(checks) >= 1 + ITERATIONS
    assert not [r for r in executor if r["event"] in ("sync", "worker_lost")]

    result = verify(out)  # rebuild theta_3 from the base model and seeds.jsonl; compare with checkpoints/final
    assert result["step"] == ITERATIONS and result["bit_identical"] is True
    members = [r for r in executor if r["event"] == "members"]
    print(f"\nesft train es --worker-backend vllm: {ITERATIONS} iterations in {wall:.0f} s (wall, incl. Ray and "
          f"engine start); update norms {[round(n, 4) for n in norms]} vs alpha sqrt(d/N) = {law:.4f} "
          f"(ratios {[round(n / law, 5) for n in norms]}); members wall s "
          f"{[round(m['wall_s'], 1) for m in members]}; {len(checks)} checksum checks ok; replay bit-identical")
