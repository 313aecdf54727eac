"""Low-rank (EGGROLL) weights on inputs the core tests leave out (esft.es.lowrank): an update whose coefficients
include exact zeros (a member with the mean fitness under z-scoring), and a scaled word embedding whose fp32 scale
buffer sits next to a bf16 weight.

Run: PYTHONPATH=src pytest -q tests/test_es_lowrank_audit.py   (seconds, CPU)
"""

from __future__ import annotations

import math

import torch

from es_tiny import one_thread  # noqa: F401  (autouse fixture)
from es_tiny import tiny_llama
from esft.es.lowrank import LowRankWeights, _embedding_output_scale
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


def test_an_fp32_scale_buffer_of_a_bf16_embedding_is_rounded_as_its_forward_rounds_it():
    # Gemma-style forward: rows * embed_scale.to(weight.dtype). With the buffer left in fp32 and the weight in bf16,
    # the per-row term must use the bf16-rounded scale, or it differs from the materialised W + sigma E forward.
    class BufferScaled(torch.nn.Embedding):
        def __init__(self):
            super().__init__(5, 3)
            self.embed_scale = torch.nn.Buffer(torch.tensor(3 ** 0.5))

        def forward(self, ids):
            return super().forward(ids) * self.embed_scale.to(self.weight.dtype)

    module = BufferScaled()
    module.weight.data = module.weight.data.to(torch.bfloat16)
    assert module.embed_scale.dtype == torch.float32
    rounded = float(torch.tensor(3 ** 0.5).to(torch.bfloat16))
    assert rounded != float(torch.tensor(3 ** 0.5))
    assert _embedding_output_scale(module) == rounded
    ids = torch.tensor([[1, 4]])
    assert torch.equal(module(ids), (module.weight[ids] * rounded).to(torch.bfloat16))
