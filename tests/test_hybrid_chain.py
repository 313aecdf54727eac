"""A `grpo->es` chain on a tiny random Llama, through the real loader of the ES step (esft.models.load_model, as a
spec run without test hooks loads it): the ES step's start weights are the GRPO step's final checkpoint, bit for
bit, in the model and in ES's fp32 masters; in bf16 the masters still are, and the model holds their rounding.
The other way round (`es->grpo`), the GRPO step starts from the ES step's fp32 masters, not their bf16 rounding.

Run: pytest -q tests/test_hybrid_chain.py   (~20 s on 2 CPU cores; tiny random-init model, no download)
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")

from es_tiny import one_thread  # noqa: E402,F401  (autouse: tiny matmuls on one thread)
from esft.experiments import load_spec, run_experiment  # noqa: E402
from experiments_tiny import ES_BLOCK, GRPO_BLOCK, TinyHooks, write_spec  # noqa: E402


def run_chain(tmp_path, tokenizer, monkeypatch, **es_options):
    """Runs the chain; returns (the ES step's model state and masters when its weights were made, its start
    model, the GRPO step's final checkpoint folder, the tiny base model's state)."""
    import esft.es.trainer as es_trainer
    from esft.experiments.runner import Hooks

    starts = []
    make_weights = es_trainer.make_weights

    def recording(model, config):
        weights = make_weights(model, config)
        starts.append(({n: p.detach().clone() for n, p in model.state_dict().items()},
                       {n: t.detach().clone() for n, t in weights.master.items()}, config.model))
        return weights

    monkeypatch.setattr(es_trainer, "make_weights", recording)
    tiny = TinyHooks(tokenizer)
    # the GRPO step gets the tiny model; the ES step loads its start model itself, as a real run does. Weight decay
    # moves GRPO's weights even where a tiny batch has no reward spread (no gradient)
    hooks = Hooks(load_model=tiny.load_model, progress=False, collect_garbage=False,
                  train_kwargs=lambda step, config: tiny.train_kwargs(step, config) if step.algorithm == "grpo" else {})
    spec = write_spec(tmp_path / "chain.yaml", "single-task", ["boolq"],
                      {"grpo->es": {"grpo": {**GRPO_BLOCK, "max_steps": 2, "weight_decay": 0.1},
                                    "es": {**ES_BLOCK, "iterations": 1, **es_options}}})
    out = tmp_path / "out"
    assert run_experiment(load_spec(spec), out, hooks).ok
    [(model_state, masters, start)] = starts
    return model_state, masters, start, next(out.glob("**/run-1-grpo/checkpoints/final")), tiny.load_model("tiny")[0]


def test_the_es_step_of_a_chain_starts_from_the_grpo_checkpoint_bit_for_bit(tmp_path, tokenizer, monkeypatch):
    from safetensors.torch import load_file

    model_state, masters, start, grpo_final, base = run_chain(tmp_path, tokenizer, monkeypatch)
    assert start == str(grpo_final.resolve())
    saved = load_file(str(grpo_final / "model.safetensors"))
    assert saved and set(saved) <= set(model_state)
    base = base.state_dict()
    assert any(not torch.equal(saved[k], base[k]) for k in saved)  # GRPO moved the weights: the check can fail
    for name, tensor in saved.items():
        assert model_state[name].dtype == tensor.dtype == torch.float32, name
        assert torch.equal(model_state[name], tensor), name
    for name, master in masters.items():
        assert torch.equal(master, saved[name]), name


def test_an_es_step_in_bf16_starts_its_masters_from_the_grpo_checkpoint_bit_for_bit(tmp_path, tokenizer,
                                                                                    monkeypatch):
    """In bf16 (the default dtype on a bf16-capable GPU) the ES step's fp32 masters were taken from the rounded
    checkpoint, most of GRPO's small update rounded away; they are read from the checkpoint's fp32 tensors now,
    and the model holds their bf16 rounding."""
    from safetensors.torch import load_file

    model_state, masters, _, grpo_final, _ = run_chain(tmp_path, tokenizer, monkeypatch, dtype="bfloat16")
    saved = load_file(str(grpo_final / "model.safetensors"))
    assert masters and all(saved[name].dtype == torch.float32 for name in masters)
    assert any(not torch.equal(saved[name], saved[name].bfloat16().float()) for name in masters)  # it can fail
    for name, master in masters.items():
        assert torch.equal(master, saved[name]), name
        assert model_state[name].dtype == torch.bfloat16 and torch.equal(model_state[name], saved[name].bfloat16())


def test_the_grpo_step_after_an_es_step_in_bf16_starts_from_its_fp32_masters(tmp_path, tokenizer):
    """An `es->grpo` chain: the ES step in bf16 leaves its weights rounded in the model file and exact in
    masters.safetensors. GRPO trains fp32 weights of its own; it loaded the model file, so it started from the
    rounding of the ES weights (every weight off by it, which a weight comparison of the two steps would count as
    GRPO's update). It starts from the masters now, as an ES step after another one does."""
    from safetensors.torch import load_file
    from transformers import TrainerCallback

    from conftest import make_tiny_model
    from esft.experiments.runner import Hooks

    base = tmp_path / "tiny"  # fp32 weights off the bf16 grid: the ES masters start from them (exact_start)
    make_tiny_model().save_pretrained(base)
    tokenizer.save_pretrained(base)
    starts = []

    class StartWeights(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            starts.append({n: p.detach().clone() for n, p in model.named_parameters()})

    # both steps load their start model themselves, as a spec run does
    hooks = Hooks(progress=False, collect_garbage=False,
                  train_kwargs=lambda step, config: {"callbacks": [StartWeights()]} if step.algorithm == "grpo" else {})
    spec = write_spec(tmp_path / "chain.yaml", "single-task", ["boolq"],
                      {"es->grpo": {"es": {**ES_BLOCK, "iterations": 1, "dtype": "bfloat16"},
                                    "grpo": {**GRPO_BLOCK}}}, model=str(base))
    out = tmp_path / "out"
    assert run_experiment(load_spec(spec), out, hooks).ok
    [start] = starts
    masters = load_file(str(next(out.glob("**/run-1-es/checkpoints/final")) / "masters.safetensors"))
    assert masters and set(masters) <= set(start)
    assert any(not torch.equal(m, m.bfloat16().float()) for m in masters.values())  # the check can fail
    for name, master in masters.items():
        assert start[name].dtype == torch.float32 and torch.equal(start[name], master), name
