"""The RNG states saved with an interrupt checkpoint leave CUDA alone in a process that never initialised it
(esft.grpo.interrupt.rng_states): reading its generators would initialise CUDA on a CPU run.

Run: PYTHONPATH=src pytest -q tests/test_interrupt_mutmutmisc.py   (< 1 s)
"""

from __future__ import annotations

import torch

from esft.grpo.interrupt import rng_states


def test_rng_states_skip_an_uninitialised_cuda(monkeypatch):
    def touched():
        raise AssertionError("read the CUDA generators of a process that never used CUDA")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda.random, "get_rng_state_all", touched)
    assert set(rng_states()) == {"python", "numpy", "cpu"}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda.random, "get_rng_state_all", lambda: ["state"])
    assert rng_states()["cuda"] == ["state"]
