"""Low-rank (EGGROLL) weights on inputs the core tests leave out (esft.es.lowrank): an update whose coefficients
include exact zeros (a member with the mean fitness under z-scoring), and a model whose matrices the batched
population forward cannot perturb (refused before its weights load).

Run: PYTHONPATH=src pytest -q tests/test_es_lowrank_audit.py   (seconds, CPU)
"""

from __future__ import annotations

import math

import pytest
import torch

from es_tiny import one_thread  # noqa: F401  (autouse fixture)
from es_tiny import tiny_llama
from esft.es.lowrank import LowRankWeights
from esft.es.noise import Update

NAME = "model.layers.0.mlp.down_proj.weight"  # [64, 128] in tiny_llama


def test_a_zero_coefficient_skips_only_its_own_member():
    # z-scored fitness gives an exact 0 to a member at the mean; the members after it must still count
    w = LowRankWeights(tiny_llama(), rank=2)
    update = Update(seeds=(5, 6, 7), coefficients=(0.5, 0.0, -1.5), scale=1.0)
    want = torch.zeros_like(w.master[NAME], dtype=torch.float64)
    for seed, coef in ((5, 0.5), (7, -1.5)):
        a, b = w.factors(seed, NAME)
        want += coef * (a.double() @ b.double().t()) / math.sqrt(2)
    torch.testing.assert_close(w.direction(NAME, update).double(), want, rtol=0, atol=1e-5)
    leading_zero = Update(seeds=(6, 7), coefficients=(0.0, -1.5), scale=1.0)
    a, b = w.factors(7, NAME)
    torch.testing.assert_close(w.direction(NAME, leading_zero).double(),
                               -1.5 * (a.double() @ b.double().t()) / math.sqrt(2), rtol=0, atol=1e-5)


def test_a_model_the_population_forward_cannot_perturb_is_refused_before_its_weights_load(tmp_path, monkeypatch):
    """GPT-2's projections are transformers' Conv1D, not nn.Linear: the batched population forward cannot add their
    per-row terms. That used to surface after the weights loaded and the step-0 evaluation ran, leaving a run folder
    that only --resume could reuse; the model's skeleton says it before the weights load. A selection without a
    single matrix (norm gains only) is refused there too."""
    import esft.models
    from transformers import GPT2Config, GPT2LMHeadModel

    from esft.es import build
    from esft.es.es_config import ESConfig
    from esft.es.trainer import ESTrainer

    def gpt2():
        return GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=64, n_positions=32,
                                          bos_token_id=0, eos_token_id=0))

    gpt2().save_pretrained(tmp_path / "gpt2")
    tiny_llama(hidden=16, layers=1).save_pretrained(tmp_path / "llama")

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights loaded")

    monkeypatch.setattr(esft.models, "load_model", no_weights)
    config = dict(task="boolq", output_dir=str(tmp_path / "run"), noise="lowrank", device="cpu", population_size=2)
    with pytest.raises(NotImplementedError, match="Conv1D owning transformer.h.0.attn.c_attn.weight is not nn.Linear"):
        ESTrainer(ESConfig(model=str(tmp_path / "gpt2"), **config), progress=False)
    with pytest.raises(NotImplementedError, match="Conv1D"):  # on any device, not only where memory is checked
        build.check_lowrank_memory(ESConfig(model=str(tmp_path / "gpt2"), **{**config, "device": "cuda"}))
    with pytest.raises(ValueError, match="needs at least one selected 2-D weight matrix"):
        ESTrainer(ESConfig(model=str(tmp_path / "llama"), include=["norm"], **config), progress=False)
    with pytest.raises(AssertionError, match="the weights loaded"):  # a model it can perturb goes on to load
        ESTrainer(ESConfig(model=str(tmp_path / "llama"), **config), progress=False)
    # the executor checks a model given to it as well (the Python API), before any member runs
    from esft.es.lowrank import LowRankExecutor

    model = gpt2()
    with pytest.raises(NotImplementedError, match="Conv1D"):
        LowRankExecutor(model, None, LowRankWeights(model), None, 0.1, None)


def test_a_model_low_rank_noise_cannot_perturb_is_bad_input_at_the_command_line(tmp_path, monkeypatch, capsys):
    """The refusal is one line with exit 2, as for any option the run cannot take (it was exit 1, a run-time
    failure, as NotImplementedError)."""
    import esft.models
    from transformers import GPT2Config, GPT2LMHeadModel

    from esft.cli import main

    GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0,
                               eos_token_id=0)).save_pretrained(tmp_path / "gpt2")
    monkeypatch.setattr(esft.models, "load_model", lambda *a, **k: pytest.fail("the weights loaded"))
    capsys.readouterr()
    assert main(["train", "es", "--model", str(tmp_path / "gpt2"), "--task", "boolq", "--noise", "lowrank",
                 "--device", "cpu", "--output-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("esft: error: low-rank population forward: Conv1D owning") and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()
