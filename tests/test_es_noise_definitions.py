"""ES noise against its definitions (esft.es.noise_seeds, esft.es.noise): the documented table geometry, table windows
inside the table, each tensor's stream drawn from its documented seed, member noise regenerated identically,
parameter selection, exact restore and the update's bookkeeping.

Run: pytest -q tests/test_es_noise_definitions.py   (seconds; reuses the one 256 MB table of the process)
"""

from __future__ import annotations

import pytest
import torch

from es_tiny import one_thread  # noqa: F401  (autouse fixture)
from es_tiny import bit_equal, state, tiny_llama
from esft.es import noise_seeds as S
from esft.es.noise import MasterWeights, Update, gaussian, select_parameters


def test_table_geometry_is_the_documented_one():
    """Blocks of 2^22 floats; a table of at least 2^26 floats and at least twice the largest tensor, in whole
    blocks, and no larger than that needs."""
    assert S.TABLE_BLOCK == 1 << 22 and S.TABLE_MIN == 1 << 26
    for largest in (0, 1, 5, S.TABLE_MIN // 2 - 1, S.TABLE_MIN // 2, S.TABLE_MIN // 2 + 1, S.TABLE_MIN,
                    3 * S.TABLE_MIN + 12345):
        size = S.table_size(largest)
        need = max(S.TABLE_MIN, 2 * largest)
        assert size % S.TABLE_BLOCK == 0 and need <= size < need + S.TABLE_BLOCK, largest
    assert S.table_size(S.TABLE_MIN // 2 + 1) == S.TABLE_MIN + S.TABLE_BLOCK  # a partial block rounds up


def test_table_windows_stay_inside_the_table_and_reach_every_offset():
    """A window of n floats of a table of T is table[o:o + n] for an offset 0 <= o <= T - n, a view (no copy), and
    the hashed offsets of many members cover every admissible offset."""
    table = torch.arange(10, dtype=torch.float32)
    offsets = set()
    for seed in range(200):
        window = S.table_window(seed, "w", (2, 2), table)
        offset = int(window[0, 0])
        assert 0 <= offset <= 10 - 4
        assert torch.equal(window.flatten(), table[offset:offset + 4])
        same_storage = window.untyped_storage().data_ptr() == table.untyped_storage().data_ptr()
        assert same_storage
        offsets.add(offset)
    assert offsets == set(range(7))


def test_table_windows_differ_between_members_and_tensors():
    table = S.noise_table(S.TABLE_MIN)
    windows = [S.table_window(seed, name, (64,), table) for seed in range(20) for name in ("a", "b")]
    starts = {w.data_ptr() for w in windows}
    assert len(starts) == len(windows)  # 40 members x tensors: 40 distinct offsets into 2^26 floats


def test_member_noise_is_the_generator_stream_of_its_documented_seed():
    """per-tensor: torch's generator seeded with sha256("seed:name") (tensor_seed); shared-seed: the member seed
    itself for every tensor. `out` receives the values (no fresh tensor) and does not change them."""
    shape = (4, 5)
    for mode, seed_of in (("per-tensor", lambda s, n: S.tensor_seed(s, n)), ("shared-seed", lambda s, n: s)):
        for seed, name in ((3, "w"), (4, "w"), (3, "v")):
            want = torch.randn(shape, generator=torch.Generator().manual_seed(seed_of(seed, name)))
            assert torch.equal(gaussian(seed, name, shape, mode=mode), want)
            out = torch.full((30,), 7.0)
            got = gaussian(seed, name, shape, mode=mode, out=out)
            assert torch.equal(got, want) and got.data_ptr() == out.data_ptr()
            assert torch.equal(out[20:], torch.full((10,), 7.0))  # beyond the tensor: untouched
    assert S.tensor_seed(5, "w", mode="table") == S.tensor_seed(5, "w")


@pytest.mark.parametrize("mode", ["per-tensor", "shared-seed", "table"])
def test_a_member_is_regenerated_identically_on_another_replica(mode):
    """Noise is a function of (member seed, tensor name) only: a second MasterWeights (another replica), and the
    same one after perturbing and updating, rebuild exactly the noise of the first draw; it is what perturb adds."""
    a, b = MasterWeights(tiny_llama(seed=0), noise=mode), MasterWeights(tiny_llama(seed=1), noise=mode)
    first = {n: a.noise(21, n).clone() for n in a.names}
    a.perturb(21, 1, 0.1)
    a.restore()
    a.apply(Update(seeds=(21, 22), coefficients=(1.0, -1.0), scale=0.01))
    for name in a.names:
        assert torch.equal(b.noise(21, name), first[name]) and torch.equal(a.noise(21, name), first[name])
        shape = a.master[name].shape
        if mode == "table":
            table = S.noise_table(S.table_size(max(m.numel() for m in a.master.values())))
            assert torch.equal(first[name], S.table_window(21, name, shape, table))
            # a view of the model's table, no copy (documented: read-only)
            same_storage = a.noise(21, name).untyped_storage().data_ptr() == table.untyped_storage().data_ptr()
            assert same_storage  # (a bool: pytest would print the 256 MB storages of a failing comparison)
        else:
            assert torch.equal(first[name], gaussian(21, name, shape, mode=mode))
    assert not torch.equal(a.noise(21, a.names[0]), a.noise(22, a.names[0]))


def test_antithetic_members_are_mirror_images_of_each_other():
    """Members (s, +1) and (s, -1) move each weight by +sigma eps and -sigma eps (up to one rounding of the sum)."""
    model = tiny_llama()
    w = MasterWeights(model)
    moves = {}
    for sign in (1, -1):
        w.perturb(9, sign, 0.5)
        moves[sign] = {n: p.detach().double() - w.master[n].double() for n, p in w.params.items()}
        w.restore()
    for name in w.names:
        eps = w.noise(9, name).double()
        torch.testing.assert_close(moves[1][name], 0.5 * eps, rtol=0, atol=1e-6)
        torch.testing.assert_close(moves[-1][name], -0.5 * eps, rtol=0, atol=1e-6)


def test_update_is_zero_when_its_scale_or_every_coefficient_is():
    assert Update(seeds=(1,), coefficients=(1.0,), scale=0.0).is_zero
    assert Update(seeds=(1, 2), coefficients=(0.0, 0.0), scale=1.0).is_zero
    assert Update(seeds=(), coefficients=(), scale=1.0).is_zero
    assert not Update(seeds=(1, 2), coefficients=(0.0, 0.5), scale=1.0).is_zero
    assert not Update(seeds=(1,), coefficients=(-1.0,), scale=-0.1).is_zero


class _Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.alpha = torch.nn.Parameter(torch.ones(3))
        self.steps = torch.nn.Parameter(torch.arange(3), requires_grad=False)  # integer: never perturbed
        self.beta = torch.nn.Parameter(torch.ones(2, 2))
        self.gamma_norm = torch.nn.Parameter(torch.ones(4))


def test_selection_keeps_any_include_and_drops_any_exclude_in_registration_order():
    model = _Mixed()
    assert list(select_parameters(model)) == ["alpha", "beta", "gamma_norm"]
    assert list(select_parameters(model, include=["^alpha$", "gamma"])) == ["alpha", "gamma_norm"]
    assert list(select_parameters(model, exclude=["beta", "norm"])) == ["alpha"]
    assert list(select_parameters(model, include=["a"], exclude=["^b"])) == ["alpha", "gamma_norm"]
    with pytest.raises(ValueError, match="no parameters selected") as info:
        select_parameters(model, include=["alpha"], exclude=["alpha"])
    # the refusal shows how the model's parameters are named, so the user can write a pattern that matches
    assert str(info.value).endswith("among the model's 3 floating-point parameters, e.g. alpha, beta, gamma_norm")
    with pytest.raises(ValueError) as info:  # two parameters: each named once
        select_parameters(torch.nn.Linear(2, 2), include=["nomatch"])
    assert str(info.value).endswith("among the model's 2 floating-point parameters, e.g. weight, bias")
    w = MasterWeights(model)
    assert w.names == ["alpha", "beta", "gamma_norm"] and w.num_params == 3 + 4 + 4
    assert w.dtypes == {"float32": 3} and w.all_fp32()
    with pytest.raises(ValueError, match="unknown noise mode"):
        MasterWeights(model, noise="gaussian")


def test_dtypes_count_tensors_per_dtype():
    model = _Mixed()
    model.beta.data = model.beta.data.to(torch.bfloat16)
    w = MasterWeights(model)
    assert w.dtypes == {"float32": 2, "bfloat16": 1} and not w.all_fp32()
    assert all(m.dtype == torch.float32 for _, m in w.iter_masters())


def test_shared_masters_are_the_model_parameters_and_refuse_perturb():
    model = tiny_llama()
    w = MasterWeights(model, share_storage=True)
    assert w.shared and all(w.master[n].data_ptr() == p.data_ptr() for n, p in w.params.items())
    with pytest.raises(RuntimeError, match="share the model's storage"):
        w.perturb(1, 1, 0.1)
    assert w.perturbed is None
    bf16 = MasterWeights(tiny_llama(dtype=torch.bfloat16), share_storage=True)
    assert not bf16.shared  # no fp32 storage to share
    own = MasterWeights(model)
    assert not own.shared and all(own.master[n].data_ptr() != p.data_ptr() for n, p in own.params.items())


def test_perturbation_state_guards_apply_and_replace():
    model = tiny_llama()
    w = MasterWeights(model)
    w.perturb(3, -1, 0.2)
    assert w.perturbed == (3, -1)
    with pytest.raises(RuntimeError, match="restore"):
        w.apply(Update(seeds=(1,), coefficients=(1.0,), scale=0.1))
    w.perturb(4, 1, 0.2, replace=True)  # from the masters, not on top of member 3
    replaced = state(model)
    assert w.perturbed == (4, 1)
    w.restore()
    assert w.perturbed is None
    w.perturb(4, 1, 0.2)
    assert bit_equal(state(model), replaced)
    w.restore()


def test_a_perturbation_that_fails_part_way_is_marked_so_restore_undoes_it(monkeypatch):
    """perturb marks the weights perturbed before its first write: when it stops part-way (an error, Ctrl-C), the
    tensors already written are known to be off the centre, apply() refuses them and restore() brings all back."""
    model = tiny_llama()
    before = state(model)
    w = MasterWeights(model, workers=1)
    draw, drawn = w.noise, []

    def failing(seed, name, out=None):
        drawn.append(name)
        if len(drawn) == 3:
            raise RuntimeError("draw failed")
        return draw(seed, name, out=out)

    monkeypatch.setattr(w, "noise", failing)
    with pytest.raises(RuntimeError, match="draw failed"):
        w.perturb(5, -1, 0.1)
    assert not bit_equal(state(model), before)  # two tensors were written before the failure
    assert w.perturbed == (5, -1)
    with pytest.raises(RuntimeError, match="restore"):
        w.apply(Update(seeds=(1,), coefficients=(1.0,), scale=0.1))
    w.restore()
    assert w.perturbed is None and bit_equal(state(model), before)


def test_a_zero_gradient_update_does_not_step_the_optimizer():
    """A zero update is skipped entirely, the "gradient" kind included: Adam's momentum from an earlier step would
    otherwise move the masters on an iteration whose members all scored the same."""
    lin = torch.nn.Linear(6, 4)
    w = MasterWeights(lin)
    opt = torch.optim.Adam(list(w.master.values()), lr=0.01)
    assert w.apply(Update(seeds=(3,), coefficients=(1.0,), scale=-1.0, kind="gradient"), opt) > 0
    stepped = state(lin)
    for zero in (Update(seeds=(3, 4), coefficients=(0.0, 0.0), scale=-1.0, kind="gradient"),
                 Update(seeds=(3,), coefficients=(1.0,), scale=0.0, kind="gradient")):
        assert w.apply(zero, opt) == 0.0
        assert bit_equal(state(lin), stepped)
    assert all(int(s["step"]) == 1 for s in opt.state.values())


def test_masters_load_and_sync():
    model = tiny_llama()
    w = MasterWeights(model)
    saved = {n: torch.full_like(m, 0.25) for n, m in w.iter_masters()}
    with pytest.raises(KeyError, match="saved masters lack"):
        w.load_masters({n: t for n, t in list(saved.items())[1:]})
    w.load_masters(saved)
    assert all(torch.equal(w.master[n], saved[n]) and torch.equal(p, saved[n]) for n, p in w.params.items())
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(-1.0)
    w.sync_from_model()
    assert all(bool((m == -1.0).all()) for _, m in w.iter_masters())


def test_bind_refuses_a_model_that_does_not_match():
    model = tiny_llama()
    w = MasterWeights(model)
    with pytest.raises(ValueError, match="pass a copy"):
        w.bind(model)
    with pytest.raises(ValueError, match="names, shapes or dtypes"):
        w.bind(tiny_llama(hidden=32))
    with pytest.raises(ValueError, match="names, shapes or dtypes"):
        w.bind(tiny_llama(dtype=torch.bfloat16))
    ints = _Mixed()  # cast admits another floating dtype, never an integer one
    ints.alpha = torch.nn.Parameter(torch.ones(3, dtype=torch.int64), requires_grad=False)
    with pytest.raises(ValueError, match="names, shapes or dtypes"):
        MasterWeights(_Mixed()).bind(ints, cast=True)
    w.perturb(5, 1, 0.1)
    bound = w.bind(tiny_llama(seed=3, dtype=torch.bfloat16), cast=True)
    assert bound.perturbed is None  # a bound copy starts unperturbed whatever the state of the one it binds
    w.restore()
    bound.perturb(2, 1, 0.1)
    assert w.perturbed is None and bound.perturbed == (2, 1)  # each bound object has its own state
    for name, p in bound.params.items():
        assert torch.equal(p, torch.add(w.master[name], w.noise(2, name), alpha=0.1).to(torch.bfloat16))
    bound.restore()
    assert all(torch.equal(p, w.master[n].to(torch.bfloat16)) for n, p in bound.params.items())
    assert bound.deferred == [] and all(p.data_ptr() != w.params[n].data_ptr() for n, p in bound.params.items())


def test_update_norm_is_the_l2_norm_of_the_change_and_direction_skips_zero_terms():
    model = tiny_llama()
    w = MasterWeights(model)
    name = w.names[1]
    with_zero = w.direction(name, Update(seeds=(1, 2, 3), coefficients=(0.5, 0.0, -2.0), scale=1.0))
    assert torch.equal(with_zero, w.noise(1, name) * 0.5 + w.noise(3, name) * -2.0)
    before = {n: m.double().clone() for n, m in w.iter_masters()}
    norm = w.apply(Update(seeds=(1, 3), coefficients=(0.5, -2.0), scale=-0.01))
    change = sum(float((m.double() - before[n]).pow(2).sum()) for n, m in w.iter_masters()) ** 0.5
    assert change > 0 and norm == pytest.approx(change, rel=1e-5)


@pytest.mark.parametrize("mode", ["per-tensor", "table"])
def test_a_gradient_update_hands_scale_times_direction_to_the_optimizer(mode):
    """kind "gradient": master.grad = scale * direction, then optimizer.step(); with plain SGD (lr) the masters move
    by -lr * scale * direction, in every noise mode."""
    model = tiny_llama()
    w = MasterWeights(model, noise=mode)
    update = Update(seeds=(3, 4), coefficients=(1.0, -0.5), scale=-0.2, kind="gradient")
    before = {n: m.clone() for n, m in w.iter_masters()}
    want = {n: w.direction(n, update).double() * (-0.5 * -0.2) for n in w.names}
    w.apply(update, torch.optim.SGD(list(w.master.values()), lr=0.5))
    for name, m in w.iter_masters():
        torch.testing.assert_close(m.double() - before[name].double(), want[name], rtol=0, atol=1e-6)
        assert torch.equal(w.params[name], m)
