"""Faster noise (esft.es.noise): threaded per-tensor draws and the shared noise table.

Run: pytest -q tests/test_es_noise_fast.py   (seconds; builds one 256 MB table once)
"""

from __future__ import annotations

import pytest
import torch

from es_tiny import one_thread  # noqa: F401  (autouse fixture)
from es_tiny import bit_equal, state, tiny_llama
from esft.es import noise as N
from esft.es import param_writes
from esft.es.noise import MasterWeights, Update

UPDATE = Update(seeds=(11, 12, 13), coefficients=(0.7, -1.3, 0.2), scale=0.01)


def _run(model, mode: str, workers: int | None):
    w = MasterWeights(model, noise=mode, workers=workers)
    w.perturb(11, -1, 0.05)
    perturbed = state(model)
    w.restore()
    norm = w.apply(UPDATE)
    return perturbed, state(model), norm


@pytest.mark.parametrize("mode", ["per-tensor", "table"])
def test_threaded_noise_is_bit_identical_to_one_thread(mode):
    p1, u1, n1 = _run(tiny_llama(), mode, workers=1)
    p2, u2, n2 = _run(tiny_llama(), mode, workers=3)
    assert bit_equal(p1, p2) and bit_equal(u1, u2) and n1 == n2


def test_threaded_bf16_perturb_and_adam_stay_exact():
    a, b = tiny_llama(dtype=torch.bfloat16), tiny_llama(dtype=torch.bfloat16)
    wa, wb = MasterWeights(a, workers=1), MasterWeights(b, workers=2)
    wa.perturb(5, 1, 0.1)
    wb.perturb(5, 1, 0.1)
    assert bit_equal(state(a), state(b))
    wa.restore()
    wb.restore()
    grad = Update(seeds=(5, 6), coefficients=(1.0, -0.5), scale=-0.3, kind="gradient")
    oa = torch.optim.Adam(list(wa.master.values()), lr=1e-3)
    ob = torch.optim.Adam(list(wb.master.values()), lr=1e-3)
    assert wa.apply(grad, oa) == wb.apply(grad, ob)
    assert bit_equal(state(a), state(b))


def test_table_is_deterministic_and_prefix_stable():
    small = N.noise_table(N.TABLE_MIN)
    assert small.dtype == torch.float32 and small.numel() == N.TABLE_MIN
    assert N.noise_table(N.TABLE_MIN) is small  # built once per process
    # a block is a pure function of its index: rebuild block 3 by hand
    gen = torch.Generator().manual_seed(N.tensor_seed(3, "noise-table"))
    block = torch.randn(N.TABLE_BLOCK, generator=gen)
    assert torch.equal(small[3 * N.TABLE_BLOCK:4 * N.TABLE_BLOCK], block)
    assert N.table_size(10) == N.TABLE_MIN and N.table_size(N.TABLE_MIN) == 2 * N.TABLE_MIN
    assert abs(float(small[: 1 << 22].mean())) < 2e-3 and abs(float(small[: 1 << 22].std()) - 1) < 2e-3
    with pytest.raises(ValueError, match="multiple"):  # a partial last block would be left uninitialised
        N.noise_table(N.TABLE_BLOCK + 8)


def test_table_window_of_a_tensor_the_size_of_the_table():
    table = torch.arange(12, dtype=torch.float32)
    assert torch.equal(N.table_window(5, "w", (3, 4), table), table.view(3, 4))  # fits exactly: offset 0
    with pytest.raises(ValueError, match="does not fit"):
        N.table_window(5, "w", (13,), table)


def test_table_windows_behave_like_independent_noise():
    table = N.noise_table(N.TABLE_MIN)
    a = N.table_window(1, "w", (1000, 1000), table)
    b = N.table_window(2, "w", (1000, 1000), table)
    c = N.table_window(1, "v", (1000, 1000), table)
    assert torch.equal(a, N.table_window(1, "w", (1000, 1000), table))
    for x, y in ((a, b), (a, c)):
        corr = float((x * y).mean() / (x.std() * y.std()))
        assert abs(corr) < 5e-3  # |corr| of independent 1e6-vectors is ~1e-3
    # gaussian() in table mode returns a copy with the same values, with or without `out`; `out` receives them
    # at its start (no fresh tensor) and is untouched beyond the tensor
    g = N.gaussian(1, "w", (1000, 1000), mode="table", table=table)
    out = torch.full((2_000_000,), 7.0)
    into = N.gaussian(1, "w", (1000, 1000), mode="table", table=table, out=out)
    assert torch.equal(g, a) and torch.equal(into, a)
    assert into.data_ptr() == out.data_ptr() and torch.equal(out[1_000_000:], torch.full((1_000_000,), 7.0))
    assert torch.equal(N.gaussian(1, "w", (1000, 1000), mode="table"), a)  # default: the table sized for it
    kept = a.clone()  # `a` is a view of the table: compare with the values, not with the view
    g.add_(1.0)
    into.add_(1.0)
    assert torch.equal(N.table_window(1, "w", (1000, 1000), table), kept)  # the table itself is untouched


def test_the_table_is_built_with_the_weights_not_at_the_first_perturbation(monkeypatch):
    """Table noise: MasterWeights builds (or fetches) its table when it is made, a one-time cost of the run; perturb,
    update and a bound copy read that table and never ask for one again."""
    model = tiny_llama()
    w = MasterWeights(model, noise="table")

    def refuse(*args, **kwargs):
        raise AssertionError("noise_table() called after MasterWeights was made")

    monkeypatch.setattr(N, "noise_table", refuse)
    w.perturb(3, 1, 0.1)
    w.restore()
    assert w.apply(UPDATE) > 0
    bound = w.bind(tiny_llama(seed=1))
    bound.perturb(3, 1, 0.1)
    name = w.names[0]
    assert torch.equal(bound.params[name], torch.add(w.master[name], w.noise(3, name), alpha=0.1))


def test_table_mode_perturb_restore_update_formula():
    model = tiny_llama()
    before = state(model)
    w = MasterWeights(model, noise="table")
    w.perturb(7, 1, 0.1)
    for name, p in w.params.items():
        eps = w.noise(7, name)
        assert torch.equal(p, torch.add(before[name], eps, alpha=0.1))
    w.restore()
    assert bit_equal(state(model), before)
    w.apply(UPDATE)
    for name, p in w.params.items():
        acc = torch.zeros_like(p)
        for seed, coef in zip(UPDATE.seeds, UPDATE.coefficients):
            acc.add_(w.noise(seed, name), alpha=coef)
        assert torch.equal(p, before[name] + acc * UPDATE.scale)
    with pytest.raises(ValueError):
        N.table_window(1, "w", (N.TABLE_MIN + 1,), N.noise_table(N.TABLE_MIN))


@pytest.mark.parametrize("shared, dtype", [(False, torch.float32), (True, torch.float32), (False, torch.bfloat16)])
def test_blocked_table_update_equals_whole_tensor_passes(monkeypatch, shared, dtype):
    """The table-noise "sgd" update runs block by block (UPDATE_BLOCK, small here so every tensor spans several
    blocks and most end in a partial one): masters bit for bit the whole-tensor passes of `direction`, scale and
    add, parameters their copy (rounded for a bf16 model), and a norm within 1e-6 of the float64 norm."""
    monkeypatch.setattr(param_writes, "UPDATE_BLOCK", 96)
    monkeypatch.setattr(param_writes, "NORM_ROW", 32)
    model = tiny_llama(dtype=dtype)
    w = MasterWeights(model, noise="table", share_storage=shared)
    assert w.shared == (shared and dtype == torch.float32)
    before = {n: m.clone() for n, m in w.iter_masters()}
    assert any(m.numel() % 96 for m in before.values()) and max(m.numel() for m in before.values()) > 10 * 96
    norm = w.apply(UPDATE)
    sq = 0.0
    for name, m in w.iter_masters():
        acc = w.direction(name, UPDATE).mul_(UPDATE.scale)
        assert torch.equal(m, before[name] + acc)
        assert torch.equal(w.params[name], m.to(dtype))
        sq += float(acc.double().pow(2).sum())
    assert norm == pytest.approx(sq ** 0.5, rel=1e-6)


def test_sq_norm_is_accurate_where_one_fp32_reduction_is_not():
    """2^24 equal values: one fp32 reduction drifts (measured 4e-4 relative on a SmolLM2 update); the blocked norm
    stays within 1e-6 of the exact value."""
    t = torch.full((1 << 24,), 0.1)
    exact = float(t.double().pow(2).sum())
    assert param_writes.sq_norm(t) == pytest.approx(exact, rel=1e-6)


@pytest.mark.parametrize("numel", [0, 3, 1 << 10, (1 << 10) + 7, 3 * (1 << 10) + 1000])
def test_sq_norm_counts_every_element_whole_rows_and_the_tail(numel):
    """Whole rows of NORM_ROW elements and a shorter tail: every element's square is in the sum, once."""
    torch.manual_seed(numel)
    t = torch.randn(numel)
    exact = float(t.double().pow(2).sum())
    assert param_writes.sq_norm(t) == pytest.approx(exact, rel=1e-6, abs=0.0)
    assert param_writes.sq_norm(t.view(1, -1) if numel else t) == param_writes.sq_norm(t)  # shape does not matter


class _TransposedWeight(torch.nn.Module):
    """A parameter stored transposed (not contiguous), as a model may hold one after loading or tying."""

    def __init__(self, dtype):
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(6, 5).t().to(dtype))
        self.v = torch.nn.Parameter(torch.randn(7).to(dtype))


@pytest.mark.parametrize("mode", ["table", "per-tensor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_non_contiguous_parameter_is_perturbed_restored_and_updated(mode, dtype):
    """Coefficients of exactly 1.0 and 0.0 included: a centred-rank antithetic pair of the best and the worst
    member folds to 1.0, and a zero coefficient is skipped."""
    model = _TransposedWeight(dtype)
    assert not model.w.is_contiguous()
    assert not MasterWeights(model, noise=mode, share_storage=True).shared  # shared masters must be contiguous
    before = state(model)
    w = MasterWeights(model, noise=mode)
    masters = {n: m.clone() for n, m in w.iter_masters()}
    w.perturb(7, -1, 0.1)
    for name, p in w.params.items():
        assert torch.equal(p, torch.add(masters[name], w.noise(7, name), alpha=-0.1).to(dtype))
    w.restore()
    assert bit_equal(state(model), before)
    update = Update(seeds=(3, 4, 5), coefficients=(1.0, 0.0, -0.5), scale=0.1)
    w.apply(update)
    for name, m in w.iter_masters():
        acc = w.noise(3, name).clone().add_(w.noise(5, name), alpha=-0.5)
        assert torch.equal(m, masters[name] + acc * 0.1)
        assert torch.equal(w.params[name], m.to(dtype))


def test_blocked_bf16_perturbation_is_the_rounded_fp32_sum(monkeypatch):
    """add_rounded writes a bf16 copy block by block (ROUNDING_BLOCK, small here so tensors span several blocks
    and most end in a partial one): each element is round(master + step * eps), as in one whole-tensor add."""
    monkeypatch.setattr(param_writes, "ROUNDING_BLOCK", 96)
    model = tiny_llama(dtype=torch.bfloat16)
    w = MasterWeights(model)
    assert max(m.numel() for _, m in w.iter_masters()) > 10 * 96
    w.perturb(9, 1, 0.05)
    for name, p in w.params.items():
        assert torch.equal(p, torch.add(w.master[name], w.noise(9, name), alpha=0.05).to(torch.bfloat16))
