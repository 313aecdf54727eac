"""Seeded noise and fp32 master weights (esft.es.noise).

Run: . .venv/bin/activate && pytest -q tests/test_es_noise.py   (a few seconds, CPU, no model download)
"""

from __future__ import annotations

import pytest
import torch

from es_tiny import one_thread  # noqa: F401  (autouse fixture)
from es_tiny import bit_equal, state, tiny_llama
from esft.es.noise import MasterWeights, Update, gaussian, select_parameters, tensor_seed


def test_tensor_seed_is_stable_and_distinct():
    # stable across processes (sha256, not Python's salted hash)
    assert tensor_seed(7, "a.weight") == tensor_seed(7, "a.weight")
    assert tensor_seed(7, "a.weight") != tensor_seed(7, "b.weight")
    assert tensor_seed(7, "a.weight") != tensor_seed(8, "a.weight")
    assert 0 <= tensor_seed(123456789, "x") < 2**63
    import hashlib

    expected = int.from_bytes(hashlib.sha256(b"5:w").digest()[:8], "little") & (2**63 - 1)
    assert tensor_seed(5, "w") == expected
    assert tensor_seed(5, "w", mode="shared-seed") == tensor_seed(5, "v", mode="shared-seed") == 5
    with pytest.raises(ValueError):
        tensor_seed(5, "w", mode="bogus")


def test_gaussian_out_buffer_gives_same_values():
    buf = torch.empty(100)
    a = gaussian(3, "w", (4, 5))
    b = gaussian(3, "w", (4, 5), out=buf)
    assert torch.equal(a, b) and a.dtype == torch.float32


def test_selection_excludes_norms_and_counts_tied_once():
    model = tiny_llama()
    allp = select_parameters(model)
    assert "lm_head.weight" not in allp and "model.embed_tokens.weight" in allp  # tied: once
    d = sum(p.numel() for p in allp.values())
    assert d == sum(p.numel() for p in model.parameters())  # parameters() de-duplicates too
    no_norm = select_parameters(model, exclude=["norm"])
    assert all("norm" not in n for n in no_norm) and len(no_norm) < len(allp)
    only_mlp = select_parameters(model, include=[r"\.mlp\."])
    assert only_mlp and all(".mlp." in n for n in only_mlp)
    with pytest.raises(ValueError):
        select_parameters(model, include=["nothing-matches"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_restore_is_exact(dtype):
    model = tiny_llama(dtype=dtype)
    before = state(model)
    w = MasterWeights(model)
    for seed, sign in [(1, 1), (1, -1), (99, 1)]:
        w.perturb(seed, sign, sigma=0.01)
        assert not bit_equal(state(model), before)
        w.restore()
        assert bit_equal(state(model), before)
    with pytest.raises(RuntimeError):
        w.perturb(1, 1, 0.01)
        w.perturb(2, 1, 0.01)
    w.restore()
    assert bit_equal(state(model), before)


def test_perturbation_is_master_plus_sigma_eps():
    model = tiny_llama()
    w = MasterWeights(model)
    name = "model.layers.0.mlp.up_proj.weight"
    base = w.master[name].clone()
    w.perturb(11, -1, 0.02)
    expected = base + (-1 * 0.02) * gaussian(11, name, base.shape)
    assert torch.allclose(w.params[name], expected, rtol=0, atol=1e-8)  # fused add may round once less
    again = w.params[name].clone()
    w.restore()
    w.perturb(11, -1, 0.02)
    assert torch.equal(w.params[name], again)  # deterministic
    w.restore()


def test_per_tensor_streams_are_independent_and_shared_seed_is_not():
    model = tiny_llama()
    a, b = "model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.q_proj.weight"
    per = MasterWeights(model)
    na, nb = per.noise(5, a), per.noise(5, b)
    assert na.shape == nb.shape and not torch.equal(na, nb)
    corr = torch.corrcoef(torch.stack([na.flatten(), nb.flatten()]))[0, 1]
    assert abs(float(corr)) < 0.05
    shared = MasterWeights(model, noise="shared-seed")
    assert torch.equal(shared.noise(5, a), shared.noise(5, b))  # the public-code trap, reproduced on purpose
    assert not torch.equal(per.noise(5, a), per.noise(6, a))


def test_antithetic_pair_cancels():
    from esft.es.strategy import ES

    model = tiny_llama()
    before = state(model)
    w = MasterWeights(model)
    name = "model.layers.1.mlp.down_proj.weight"
    w.perturb(3, 1, 0.01)
    plus = w.params[name].clone()
    w.restore()
    w.perturb(3, -1, 0.01)
    minus = w.params[name].clone()
    w.restore()
    assert torch.allclose((plus + minus) / 2, w.master[name], atol=1e-8)  # mirrored around the centre
    es = ES(population_size=4, sigma=0.01, alpha=0.1, seed=0, antithetic=True)
    members = es.ask(0)
    assert members[0].seed == members[1].seed and (members[0].sign, members[1].sign) == (1, -1)
    # each pair scores equally -> the pair's terms cancel exactly (folded per seed) -> weights untouched
    upd = es.tell(members, [0.2, 0.2, 0.9, 0.9])
    assert upd.coefficients == (0.0, 0.0) and len(upd.seeds) == 2
    assert w.apply(upd) == 0.0
    assert bit_equal(state(model), before)


def test_zero_update_is_skipped():
    model = tiny_llama()
    before = state(model)
    w = MasterWeights(model)
    assert w.apply(Update(seeds=(1, 2), coefficients=(0.0, 0.0), scale=0.1)) == 0.0
    assert bit_equal(state(model), before)


def test_sgd_update_matches_formula():
    model = tiny_llama()
    w = MasterWeights(model)
    base = {n: m.clone() for n, m in w.iter_masters()}
    upd = Update(seeds=(4, 9), coefficients=(1.5, -0.5), scale=1e-3)
    norm = w.apply(upd)
    sq = 0.0
    for n, m in w.iter_masters():
        d = 1e-3 * (1.5 * gaussian(4, n, m.shape) - 0.5 * gaussian(9, n, m.shape))
        assert torch.allclose(m - base[n], d, atol=1e-7)
        assert torch.equal(w.params[n], m)  # fp32 model: param is the master
        sq += float(d.double().pow(2).sum())
    assert norm == pytest.approx(sq**0.5, rel=1e-4)


def test_gradient_update_returns_the_norm_of_the_optimizer_step():
    lin = torch.nn.Linear(40, 30)
    w = MasterWeights(lin)
    base = {n: m.clone() for n, m in w.iter_masters()}
    opt = torch.optim.Adam(list(w.master.values()), lr=0.01)
    norm = w.apply(Update(seeds=(3, 4), coefficients=(1.0, -0.5), scale=-2.0, kind="gradient"), opt)
    change = sum(float((m.double() - base[n].double()).pow(2).sum()) for n, m in w.iter_masters()) ** 0.5
    assert change > 0.1 and norm == pytest.approx(change, rel=1e-5)
    assert all(torch.equal(w.params[n], m) for n, m in w.iter_masters())


def test_apply_refuses_a_gradient_without_optimizer_and_unknown_kinds():
    lin = torch.nn.Linear(4, 3)
    w = MasterWeights(lin)
    before = state(lin)
    with pytest.raises(ValueError, match="needs an optimizer"):
        w.apply(Update(seeds=(1,), coefficients=(1.0,), scale=-0.5, kind="gradient"))
    with pytest.raises(ValueError, match="unknown update kind"):
        w.apply(Update(seeds=(1,), coefficients=(1.0,), scale=0.5, kind="adam"), torch.optim.SGD(lin.parameters()))
    # a zero update is refused the same: a caller's malformed update cannot pass while its values happen to be zero
    with pytest.raises(ValueError, match="needs an optimizer"):
        w.apply(Update(seeds=(1,), coefficients=(0.0,), scale=-0.5, kind="gradient"))
    with pytest.raises(ValueError, match="unknown update kind"):
        w.apply(Update(seeds=(1,), coefficients=(1.0,), scale=0.0, kind="adam"))
    assert bit_equal(state(lin), before)


def test_bf16_tiny_updates_accumulate_in_fp32_master():
    model = tiny_llama(dtype=torch.bfloat16)
    w = MasterWeights(model)
    name = "model.layers.0.mlp.up_proj.weight"
    base = w.master[name].clone()
    param0 = w.params[name].clone()
    upd = Update(seeds=(1,), coefficients=(1.0,), scale=1e-6)  # far below bf16 resolution of weights ~0.02
    for _ in range(3):
        w.apply(upd)
    moved = w.master[name] - base
    assert torch.allclose(moved, 3e-6 * gaussian(1, name, base.shape), rtol=1e-3, atol=2e-8)  # fp32 ulp at |w|~0.05 is 4e-9
    assert float((w.params[name] != param0).float().mean()) < 0.05  # the bf16 params barely change...
    assert torch.equal(w.params[name], w.master[name].to(torch.bfloat16))  # ...but are the rounded master
    # the master keeps all of it: 1000 steps move the bf16 weights as they should
    big = Update(seeds=(1,), coefficients=(1.0,), scale=1e-3)
    w.apply(big)
    assert torch.equal(w.params[name], w.master[name].to(torch.bfloat16))
    assert float((w.params[name] != param0).float().mean()) > 0.5
