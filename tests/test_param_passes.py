"""The compiled passes over the ES masters (esft/kernels/param_passes.cpp, esft.es.param_writes).

They replace torch ops, so they must give the torch ops' bits: a member's weights round(master + step * eps) in bf16
or fp32, and the update master += scale * sum_k c_k eps_k with its squared norm, for any length (vector tails,
outputs not aligned for streaming stores, outputs large enough for them), any thread count and special values
(NaN, infinities, subnormals, ties of the bf16 rounding). `MasterWeights` must run them where they load. Skipped,
with the build error, where no C++ compiler is available (the torch ops then run).
"""

from __future__ import annotations

import pytest
import torch

from esft import kernels
from esft.es import param_writes
from esft.es.noise import MasterWeights, Update
from esft.es.param_writes import add_rounded_torch, add_update, add_update_torch


@pytest.fixture(scope="module")
def passes():
    module = kernels.load_param_passes()
    if module is None:
        pytest.skip(f"param_passes kernel not built: {kernels.build_error('param_passes')}")
    return module


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _special(n: int, g: torch.Generator) -> torch.Tensor:
    """Normal values with NaN, infinities, subnormals, signed zeros, the largest float and bf16 rounding ties."""
    x = torch.randn(n, generator=g)
    bits = torch.randint(0, 1 << 16, (n,), generator=g, dtype=torch.int32)
    ties = (torch.randn(n, generator=g).view(torch.int32) & ~0xFFFF) | 0x8000  # exactly halfway between two bf16
    specials = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 1e-40, -1e-40, 0.0, -0.0,
                             3.4e38, -3.4e38, 1.17e-38])
    x[::7] = ties.view(torch.float32)[::7]
    x[3::11] = (bits[3::11] | 0x00010000).view(torch.float32)  # tiny magnitudes, some subnormal after the add
    x[: min(n, len(specials))] = specials[: min(n, len(specials))]
    return x


# lengths: below one vector, ragged tails, and past the streaming-store threshold (1 MiB of output) in both dtypes
LENGTHS = [1, 15, 16, 31, 33, 1000, (1 << 19) + 37, (1 << 20) + 5]


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_perturbation_has_the_torch_ops_bits(passes, threads, n, dtype):
    g = torch.Generator().manual_seed(n)
    master, eps = _special(n, g), torch.randn(n, generator=g)
    eps[5::13] = _special(n, g)[5::13]
    for offset in (0, 1, 3):  # an output not aligned to 64 bytes: streaming stores start after a scalar head
        want, got = torch.empty(n + offset, dtype=dtype), torch.empty(n + offset, dtype=dtype)
        for step in (0.05, -0.003, 1e-30, 1.0):
            add_rounded_torch(master, eps, step, want[offset:])
            passes.add_rounded(master, eps, step, got[offset:])
            same = want[offset:].view(torch.int16 if dtype == torch.bfloat16 else torch.int32) == \
                got[offset:].view(torch.int16 if dtype == torch.bfloat16 else torch.int32)
            assert bool(same.all()), (dtype, n, offset, step, int((~same).sum()))


def test_a_nan_rounds_to_the_bf16_torch_writes(passes):
    """torch's vectorised fp32 -> bf16 conversion writes every NaN as 0xFFFF; a scalar conversion would write
    0x7FC0. The kernel must write what the tensor op writes, in its vector body and in its tail."""
    x = torch.full((37,), float("nan"))
    x[1] = -float("nan")
    out = torch.empty(37, dtype=torch.bfloat16)
    passes.add_rounded(x, torch.zeros(37), 0.5, out)
    assert torch.equal(out.view(torch.int16), x.to(torch.bfloat16).view(torch.int16))


def test_bad_input_is_refused(passes):
    with pytest.raises(RuntimeError, match="eps must be a contiguous CPU tensor of 8"):
        passes.add_rounded(torch.zeros(8), torch.zeros(7), 0.1, torch.empty(8))
    with pytest.raises(RuntimeError, match="master must be a contiguous"):
        passes.add_rounded(torch.zeros(8, dtype=torch.float64), torch.zeros(8), 0.1, torch.empty(8))
    with pytest.raises(RuntimeError, match="out must be a contiguous"):
        passes.add_rounded(torch.zeros(8), torch.zeros(8), 0.1, torch.empty(16)[::2])
    with pytest.raises(RuntimeError, match="one coefficient per noise window"):
        passes.add_update(torch.zeros(8), [torch.zeros(8)], [1.0, 2.0], 0.1, torch.empty(8), None)


@pytest.mark.parametrize("out_dtype", [None, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("terms", [1, 4])
def test_update_has_the_torch_ops_bits_and_norm(passes, threads, monkeypatch, out_dtype, terms):
    monkeypatch.setattr(param_writes, "UPDATE_BLOCK", 4096)  # several blocks and a ragged last one, quickly
    g = torch.Generator().manual_seed(terms)
    n = 3 * 4096 + 1001
    master = _special(n, g)
    master[:11] = torch.randn(11, generator=g)  # a NaN master would make the norms NaN: compared apart below
    windows = [(torch.randn(n, generator=g), float(c)) for c in torch.randn(terms, generator=g)]
    windows[0][0][100:110] = _special(10, g)[:10].nan_to_num()
    results = []
    for use_kernel in (False, True):
        m = master.clone()
        out = None if out_dtype is None else torch.empty(n, dtype=out_dtype)
        buf = param_writes.update_buffer(n, "cpu")
        run = add_update if use_kernel else add_update_torch
        results.append((run(m, windows, 3e-4, buf, out), m, out))
    (sq_t, m_t, o_t), (sq_k, m_k, o_k) = results
    assert sq_k == sq_t
    assert torch.equal(m_k.view(torch.int32), m_t.view(torch.int32))
    if out_dtype is not None:
        bits = torch.int16 if out_dtype == torch.bfloat16 else torch.int32
        assert torch.equal(o_k.view(bits), o_t.view(bits))


def test_master_weights_run_the_kernel_and_keep_the_torch_bits(passes, monkeypatch):
    """A bf16 copy's perturbation, an fp32 model's perturbation and a table-noise update, once through the
    compiled passes and once through torch's: the same parameters and masters, and the kernel really ran."""
    from conftest import make_tiny_model

    calls = {"add_rounded": 0, "add_update": 0}

    class Counting:
        def __getattr__(self, name):
            def call(*args):
                calls[name] += 1
                return getattr(passes, name)(*args)
            return call

    def run(compiled: bool):
        monkeypatch.setattr(param_writes, "compiled_passes",
                            (lambda *t, out=None: Counting()) if compiled else (lambda *t, out=None: None))
        torch.manual_seed(0)
        model = make_tiny_model()
        weights = MasterWeights(model, noise="table")
        copy = make_tiny_model().to(torch.bfloat16)
        bound = weights.bind(copy, cast=True)
        bound.perturb(seed=7, sign=-1, sigma=0.02)
        low = {n: p.detach().clone() for n, p in copy.named_parameters()}
        weights.perturb(seed=3, sign=1, sigma=0.05)
        high = {n: p.detach().clone() for n, p in model.named_parameters()}
        weights.restore()
        norm = weights.apply(Update(seeds=(3, 5, 9), coefficients=(0.5, -1.0, 0.25), scale=0.01))
        return low, high, {n: m.clone() for n, m in weights.iter_masters()}, norm

    torch_run = run(compiled=False)
    assert calls == {"add_rounded": 0, "add_update": 0}
    kernel_run = run(compiled=True)
    assert calls["add_rounded"] > 0 and calls["add_update"] > 0
    for want, got in zip(torch_run[:3], kernel_run[:3]):
        assert want.keys() == got.keys()
        for name in want:
            assert torch.equal(want[name], got[name]), name
    assert kernel_run[3] == torch_run[3]
