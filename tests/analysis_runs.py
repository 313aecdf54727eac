"""Tiny synthetic ES and GRPO run directories for the analysis tests (no training, seconds to build).

Layout written (what esft.analysis.runs reads):
    <root>/base/                   tiny random Llama + the SmolLM2 tokenizer (HF folder)
    <root>/es/                     config.yaml (ESConfig), seeds.jsonl (synthetic z-scored updates),
                                   metrics.jsonl, checkpoints/final (= replay of seeds.jsonl, es_state.json)
    <root>/grpo/                   config.yaml, drift.jsonl, metrics.jsonl, checkpoints/final (= base + a
                                   sparse update whose per-step drift is logged)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import yaml

from conftest import make_tiny_model


def save_model(model, tokenizer, folder: Path, **kw) -> Path:
    model.save_pretrained(folder, **kw)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


def make_base(root: Path, tokenizer, hidden: int = 32, layers: int = 2) -> Path:
    model = make_tiny_model(hidden=hidden, layers=layers)
    return save_model(model, tokenizer, root / "base")


def make_es_run(root: Path, base: Path, steps: int = 4, population: int = 4, alpha: float = 0.01,
                sigma: float = 0.02, task: str = "boolq", seed: int = 42) -> Path:
    from esft.es.es_config import ESConfig, save_yaml
    from esft.es.replay import rebuild
    from esft.models import load_model

    run = root / "es"
    run.mkdir(parents=True)
    cfg = ESConfig(model=str(base), task=task, population_size=population, sigma=sigma, alpha=alpha,
                   batch_size=2, iterations=steps, max_new_tokens=3, seed=seed, output_dir=str(run),
                   dtype="float32", device="cpu", max_passage_chars=100)
    save_yaml(cfg, run / "config.yaml", extra={"num_params": None, "master_dtype": "float32"})
    rng = np.random.default_rng(seed)
    with open(run / "seeds.jsonl", "w") as fh:
        for it in range(steps):
            f = rng.random(population)
            z = (f - f.mean()) / (f.std() + 1e-8)
            seeds = [int(s) for s in rng.integers(0, 2**31, population)]
            fh.write(json.dumps({"iteration": it, "batch": [0, 1], "members": [[s, 1] for s in seeds],
                                 "fitness": f.tolist(), "shaped": z.tolist(), "seeds": seeds,
                                 "coefficients": z.tolist(), "scale": alpha / population, "kind": "sgd",
                                 "update_norm": 0.0}) + "\n")
    with open(run / "metrics.jsonl", "w") as fh:
        for step, acc in ((0, 0.0), (steps, 0.5)):
            fh.write(json.dumps({"kind": "eval", "step": step, "test_accuracy": acc, "test_n": 2,
                                 "test_ci95": [0.0, 1.0], "test_format_rate": acc}) + "\n")
    model, tok = load_model(str(base), dtype="float32", device="cpu")
    rebuild(model, run)
    final = save_model(model, tok, run / "checkpoints" / "final")
    (final / "es_state.json").write_text(json.dumps({"step": steps, "has_masters": False}))
    return run


def make_grpo_run(root: Path, base: Path, steps: int = 3, task: str = "boolq", seed: int = 42,
                  scale: float = 1e-3, keep: float = 0.1) -> Path:
    """A fake GRPO run: a sparse random update grown linearly over `steps`, with its drift logged per step."""
    from esft.models import load_model

    run = root / "grpo"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({
        "algorithm": "grpo", "model": str(base), "task": task, "seed": seed, "learning_rate": 3e-6,
        "num_generations": 4, "max_completion_length": 3, "max_passage_chars": 100}))
    model, tok = load_model(str(base), dtype="float32", device="cpu")
    g = torch.Generator().manual_seed(seed)
    names = [n for n, _ in model.named_parameters()]
    direction = {}
    for n, p in model.named_parameters():
        d = torch.randn(p.shape, generator=g) * scale
        d[torch.rand(p.shape, generator=g) > keep] = 0.0
        direction[n] = d
    with open(run / "drift.jsonl", "w") as fh:
        for t in range(1, steps + 1):
            per = {n: float(((t / steps) * direction[n].double()).pow(2).sum()) for n in names}
            fh.write(json.dumps({"step": t, "total": sum(per.values()), "per_tensor": per}) + "\n")
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.add_(direction[n])
    with open(run / "metrics.jsonl", "w") as fh:
        fh.write(json.dumps({"kind": "eval", "step": steps, "test_accuracy": 0.5, "test_n": 2}) + "\n")
    save_model(model, tok, run / "checkpoints" / "final")
    return run
