"""The scratch memory of `MasterWeights.perturb` / `apply` (esft.es.noise) when several threads draw the noise:
each worker's buffers are sized to the tensors it draws, so a model whose embedding dwarfs its other tensors
holds one embedding-sized buffer (two for an update), not one per worker; the weights are the same bits.

Run: . .venv/bin/activate && pytest -q tests/test_es_noise_scratch.py   (~2 s)
"""

from __future__ import annotations

import pytest
import torch

from es_tiny import bit_equal, state, tiny_llama
from esft.es.noise import MasterWeights, Update


def scratch_sizes(monkeypatch) -> list[int]:
    sizes: list[int] = []
    make = MasterWeights._scratch

    def recorded(self, *args, **kwargs):
        buf = make(self, *args, **kwargs)
        sizes.append(buf.numel())
        return buf

    monkeypatch.setattr(MasterWeights, "_scratch", recorded)
    return sizes


@pytest.mark.parametrize("workers", [4, 8])
def test_noise_workers_hold_one_largest_buffer_not_one_each(monkeypatch, workers):
    model = tiny_llama(vocab_size=4096)  # embedding 262,144 elements; every other tensor 8,192 or fewer
    w = MasterWeights(model, workers=workers)
    numels = sorted((p.numel() for p in w.params.values()), reverse=True)
    largest, second = numels[0], numels[1]
    sizes = scratch_sizes(monkeypatch)
    w.perturb(3, 1, 0.05)
    assert sizes.count(largest) == 1 and sum(sizes) <= largest + (workers - 1) * second, sizes
    w.restore()
    sizes.clear()
    w.apply(Update(seeds=(3, 4), coefficients=(1.0, -0.5), scale=0.01))
    assert sizes.count(largest) == 2 and sum(sizes) <= 2 * (largest + (workers - 1) * second), sizes


@pytest.mark.parametrize("noise", ["per-tensor", "shared-seed"])
def test_perturb_and_update_are_the_same_bits_with_one_or_several_workers(noise):
    models = [tiny_llama(vocab_size=4096) for _ in range(2)]
    ws = [MasterWeights(m, noise=noise, workers=k) for m, k in zip(models, (1, 4))]
    for w in ws:
        w.perturb(7, -1, 0.05)
    assert bit_equal(state(models[0]), state(models[1]))
    norms = []
    for w in ws:
        w.restore()
        norms.append(w.apply(Update(seeds=(7, 8, 9), coefficients=(0.5, -1.0, 2.0), scale=0.02)))
    assert norms[0] == norms[1] and bit_equal(state(models[0]), state(models[1]))
    assert all(torch.equal(ws[0].master[n], ws[1].master[n]) for n in ws[0].master)
