"""Low-rank (EGGROLL) weights on an input the core tests leave out (esft.es.lowrank): an update whose coefficients
include exact zeros (a member with the mean fitness under z-scoring).

Run: PYTHONPATH=src pytest -q tests/test_es_lowrank_audit.py   (seconds, CPU)
"""

from __future__ import annotations

import math

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
