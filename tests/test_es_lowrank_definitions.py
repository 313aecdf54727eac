"""Low-rank (EGGROLL) noise against its definitions (esft.es.lowrank): E = A B^T / sqrt(r) from two independent
seeded factors, the per-row terms sigma / sqrt(r) (x B_i) A_i^T and sigma / sqrt(r) A_i[token] B_i^T of each row's
member, antithetic members as exact negatives, and the row mapping's checks.

Run: pytest -q tests/test_es_lowrank_definitions.py   (seconds, CPU)
"""

from __future__ import annotations

import math
import time

import pytest
import torch

from es_tiny import one_thread  # noqa: F401  (autouse fixture)
from es_tiny import tiny_llama
from esft.es.lowrank import LowRankWeights, PopulationPerturbation, accumulate_outer, lowrank_factors
from esft.es.noise import gaussian
from esft.es.strategy import Member

NAME = "model.layers.0.mlp.down_proj.weight"  # [64, 128] in tiny_llama
EMBED = "model.embed_tokens.weight"


def test_accumulate_outer_adds_coef_over_sqrt_r_times_a_b_transposed():
    g = torch.Generator().manual_seed(0)
    for r in (1, 4, 9):
        a, b = torch.randn(5, r, generator=g), torch.randn(3, r, generator=g)
        acc = torch.randn(5, 3, generator=g)
        want = acc.double() + (-0.75 / math.sqrt(r)) * (a.double() @ b.double().t())
        got = accumulate_outer(acc, a, b, -0.75)
        assert got is acc
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)


def test_factors_are_two_independent_seeded_standard_normal_streams():
    a, b = lowrank_factors(7, "w", (6, 6), 3)
    assert a.shape == b.shape == (6, 3) and not torch.equal(a, b)
    assert torch.equal(a, gaussian(7, "w:lowrank-A", (6, 3))) and torch.equal(b, gaussian(7, "w:lowrank-B", (6, 3)))
    a8, b8 = lowrank_factors(8, "w", (6, 6), 3)
    assert not torch.equal(a, a8) and not torch.equal(b, b8)


def test_weights_keep_only_matrices_and_materialise_the_documented_noise():
    model = tiny_llama()
    w = LowRankWeights(model, rank=3)
    matrices = {n for n, p in model.named_parameters() if p.dim() == 2}
    assert set(w.names) == set(w.master) == matrices and w.rank == 3 and w.mode == "lowrank"
    assert set(w.frozen) == {n for n, p in model.named_parameters() if p.dim() != 2} != set()
    assert w.num_params == sum(p.numel() for n, p in model.named_parameters() if n in matrices)
    a, b = w.factors(4, NAME)
    e = w.noise(4, NAME)
    torch.testing.assert_close(e, a @ b.t() / math.sqrt(3), rtol=0, atol=1e-5)
    out = torch.full((w.master[NAME].numel() + 10,), 9.0)
    assert torch.equal(w.noise(4, NAME, out=out), e)  # a dirty buffer: zeroed before the sum
    with pytest.raises(ValueError, match="2-D weight matrix"):
        LowRankWeights(tiny_llama(), rank=1, include=["norm"])


def _zeros_plus(pert, name, x, member_rows, width):
    pert.set_rows(member_rows)
    return pert.add_linear(name, x, torch.zeros(x.shape[0], width))


def test_linear_rows_add_their_own_members_term_and_antithetic_rows_are_exact_negatives():
    model = tiny_llama()
    w = LowRankWeights(model, rank=2)
    sigma = 0.3
    members = [Member(5, 1), Member(5, -1), Member(6, 1)]
    m, n = w.master[NAME].shape
    x = torch.randn(3, n, generator=torch.Generator().manual_seed(1))
    with PopulationPerturbation(model, w, members, sigma) as pert:
        assert pert.scale == pytest.approx(sigma / math.sqrt(2))
        a_cat_t, b_cat = pert.factors[NAME]
        a5, b5 = w.factors(5, NAME)
        assert torch.equal(a_cat_t[0:2], a5.t()) and torch.equal(a_cat_t[2:4], -a5.t())  # sign folded into A
        assert torch.equal(b_cat[:, 0:2], b5) and torch.equal(b_cat[:, 2:4], b5)
        out = _zeros_plus(pert, NAME, x[[0, 0, 0]], [0, 1, 2], m)
        assert torch.equal(out[0], -out[1])  # (s, +1) and (s, -1): exact negatives
        for row, (seed, sign) in enumerate(members):
            want = sign * sigma * (x[0].double() @ w.noise(seed, NAME).double().t())
            torch.testing.assert_close(out[row].double(), want, rtol=0, atol=1e-5)
        scrambled = _zeros_plus(pert, NAME, x, [2, 0, 1], m)
        for row, member in enumerate([2, 0, 1]):
            seed, sign = members[member]
            want = sign * sigma * (x[row].double() @ w.noise(seed, NAME).double().t())
            torch.testing.assert_close(scrambled[row].double(), want, rtol=0, atol=1e-5)


def test_embedding_rows_add_their_members_rows_of_e():
    model = tiny_llama()
    w = LowRankWeights(model, rank=3)
    sigma = 0.2
    members = [Member(8, -1), Member(8, 1)]
    ids = torch.tensor([[3, 7, 3], [250, 0, 9]])
    with PopulationPerturbation(model, w, members, sigma) as pert:
        pert.set_rows([1, 0])
        out = pert.add_embedding(EMBED, ids, torch.zeros(2, 3, w.master[EMBED].shape[1]))
    e = w.noise(8, EMBED).double()
    torch.testing.assert_close(out[0].double(), sigma * e[ids[0]], rtol=0, atol=1e-5)
    torch.testing.assert_close(out[1].double(), -sigma * e[ids[1]], rtol=0, atol=1e-5)
    with PopulationPerturbation(model, w, members, sigma) as pert:
        pert.set_rows([0, 1])
        same = pert.add_embedding(EMBED, ids[[0, 0]], torch.zeros(2, 3, w.master[EMBED].shape[1]))
    assert torch.equal(same[0], -same[1])


def test_row_mapping_checks_member_indices_and_follows_kept_rows():
    model = tiny_llama()
    w = LowRankWeights(model, rank=1)
    members = [Member(1, 1), Member(2, 1)]
    x = torch.randn(3, w.master[NAME].shape[1], generator=torch.Generator().manual_seed(2))
    with PopulationPerturbation(model, w, members, 0.1) as pert:
        for bad in ([0, -1], [2], [0, 1, 5]):
            with pytest.raises(IndexError, match="out of range"):
                pert.set_rows(bad)
        full = _zeros_plus(pert, NAME, x, [1, 0, 1], w.master[NAME].shape[0])
        pert.select(torch.tensor([2, 0]))
        kept = pert.add_linear(NAME, x[[2, 0]], torch.zeros(2, w.master[NAME].shape[0]))
        torch.testing.assert_close(kept, full[[2, 0]], rtol=0, atol=1e-6)
        pert.set_rows([])
        assert pert.add_linear(NAME, x[:0], torch.zeros(0, w.master[NAME].shape[0])).shape[0] == 0
        # one mapped row would broadcast to every row of a larger batch: all rows silently member 0's
        pert.set_rows([0])
        with pytest.raises(RuntimeError, match="3 rows but 1 rows are mapped"):
            pert.add_linear(NAME, x, torch.zeros(3, w.master[NAME].shape[0]))
        with pytest.raises(RuntimeError, match="2 rows but 1 rows are mapped"):
            pert.add_embedding(EMBED, torch.tensor([[3, 4], [5, 6]]), torch.zeros(2, 2, w.master[EMBED].shape[1]))
    with pytest.raises(RuntimeError, match="set_rows"):  # closed: no row is mapped any more
        pert.select(torch.tensor([0]))


class _OwnMatrix(torch.nn.Module):
    """A 2-D `weight` owned by a module that is neither Linear nor Embedding."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 3))

    def forward(self, x):
        return x @ self.weight.t()


class _LooseMatrix(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 4)
        self.table = torch.nn.Parameter(torch.randn(4, 3))  # 2-D, but no module owns it as its weight


def test_matrices_outside_linear_and_embedding_are_refused_without_leaving_hooks():
    for model, message in ((_OwnMatrix(), "not nn.Linear / nn.Embedding"), (_LooseMatrix(), "not owned")):
        w = LowRankWeights(model, rank=1)
        with pytest.raises(NotImplementedError, match=message):
            PopulationPerturbation(model, w, [Member(1, 1)], 0.1)
        assert all(not m._forward_hooks for m in model.modules())


def test_a_scaled_word_embedding_gets_the_scaled_term_of_the_materialised_perturbation():
    """Gemma's embedding returns W[token] * sqrt(hidden): the perturbed W + sigma E gives (W + sigma E)[token] * that
    scale, so the batched forward's per-row term is scaled alike (it was added unscaled, and the population's
    logits differed from the members' by ~10)."""
    from transformers import GemmaConfig, GemmaForCausalLM

    from esft.es.lowrank import population_logits

    torch.manual_seed(0)
    config = GemmaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=32)
    model = GemmaForCausalLM(config).eval()
    assert float(model.model.embed_tokens.embed_scale) == pytest.approx(32 ** 0.5)
    w = LowRankWeights(model, rank=2)
    assert "model.embed_tokens.weight" in w.names
    members = [Member(3, 1), Member(4, -1)]
    x = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    batched = population_logits(model, w, members, 0.5, x)
    for i, (seed, sign) in enumerate(members):
        w.perturb(seed, sign, 0.5)
        with torch.inference_mode():
            single = model(input_ids=x).logits
        w.restore()
        torch.testing.assert_close(batched[i], single, rtol=1e-4, atol=1e-4)


class _DoubledLinear(torch.nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


def test_a_linear_whose_forward_is_overridden_is_refused():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), _DoubledLinear(3, 4))
    w = LowRankWeights(model, rank=1)
    with pytest.raises(NotImplementedError, match="overrides forward"):
        PopulationPerturbation(model, w, [Member(1, 1)], 0.1)
    assert all(not m._forward_hooks for m in model.modules())  # the plain Linear's hook is removed too


def test_the_embedding_scale_is_the_one_its_forward_multiplies_by():
    """A buffer is cast to the weight's dtype before the product (Gemma), a Python float is used as it is (BART)."""
    from esft.es.lowrank import _embedding_output_scale

    class FloatScaled(torch.nn.Embedding):
        def __init__(self):
            super().__init__(5, 3)
            self.embed_scale = 3 ** 0.5

        def forward(self, ids):
            return super().forward(ids) * self.embed_scale

    class BufferScaled(torch.nn.Embedding):
        def __init__(self):
            super().__init__(5, 3)
            self.embed_scale = torch.nn.Buffer(torch.tensor(3 ** 0.5))

        def forward(self, ids):
            return super().forward(ids) * self.embed_scale.to(self.weight.dtype)

    assert _embedding_output_scale(torch.nn.Embedding(5, 3)) == 1.0 == _embedding_output_scale(torch.nn.Linear(3, 2))
    assert _embedding_output_scale(FloatScaled().to(torch.bfloat16)) == 3 ** 0.5
    bf16 = BufferScaled().to(torch.bfloat16)
    assert _embedding_output_scale(bf16) == float(torch.tensor(3 ** 0.5).to(torch.bfloat16)) != 3 ** 0.5
    # the buffer left in fp32 beside a bf16 weight: the forward still multiplies by the bf16-rounded scale, so the
    # per-row term must use that one (else it differs from the materialised W + sigma E forward)
    mixed = BufferScaled()
    mixed.weight.data = mixed.weight.data.to(torch.bfloat16)
    assert mixed.embed_scale.dtype == torch.float32
    assert _embedding_output_scale(mixed) == float(torch.tensor(3 ** 0.5).to(torch.bfloat16))
    ids = torch.tensor([[1, 4]])
    assert torch.equal(mixed(ids), (mixed.weight[ids] * _embedding_output_scale(mixed)).to(torch.bfloat16))


def test_the_executor_times_every_phase_of_the_batched_pass():
    from es_tiny import ToyTask, stub_generate
    from esft.es.lowrank import LowRankExecutor

    model = tiny_llama()
    w = LowRankWeights(model, rank=1)
    task = ToyTask()
    start = time.perf_counter()
    result = LowRankExecutor(model, None, w, task, 0.05, None, generate_fn=stub_generate).evaluate_members(
        [Member(1, 1), Member(1, -1)], task.load("train")[:2])
    wall = time.perf_counter() - start
    assert result.scores.shape == (2, 2)
    assert set(result.timings) == {"perturb", "generate", "score", "restore"}
    assert all(t > 0 for t in result.timings.values()), result.timings
    assert sum(result.timings.values()) <= wall  # the phases are disjoint parts of the call
    executor = LowRankExecutor(model, None, w, task, 0.05, None, generate_fn=stub_generate)
    for members, batch in (([], task.load("train")[:2]), ([Member(1, 1)], [])):  # nothing to evaluate: no pass
        empty = executor.evaluate_members(members, batch)
        assert empty.scores.shape == (len(members), len(batch))


def test_population_logits_with_a_full_attention_mask_equal_those_without():
    from esft.es.lowrank import population_logits

    model = tiny_llama()
    w = LowRankWeights(model, rank=2)
    members = [Member(1, 1), Member(1, -1), Member(2, 1)]
    x = torch.randint(3, 256, (2, 4), generator=torch.Generator().manual_seed(3))
    plain = population_logits(model, w, members, 0.05, x)
    masked = population_logits(model, w, members, 0.05, x, torch.ones_like(x))
    assert plain.shape == (3, 2, 4, 256)
    torch.testing.assert_close(masked, plain, rtol=0, atol=1e-6)


def test_population_logits_follow_each_sequences_attention_mask():
    """A left-padded sequence: every member's logits are those of its materialised perturbation with that mask."""
    from esft.es.lowrank import population_logits

    model = tiny_llama()
    w = LowRankWeights(model, rank=2)
    members = [Member(1, 1), Member(2, -1)]
    x = torch.randint(3, 256, (2, 4), generator=torch.Generator().manual_seed(4))
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    batched = population_logits(model, w, members, 0.05, x, mask)
    for i, (seed, sign) in enumerate(members):
        w.perturb(seed, sign, 0.05)
        with torch.inference_mode():
            single = model(input_ids=x, attention_mask=mask).logits
        w.restore()
        torch.testing.assert_close(batched[i][mask.bool()], single[mask.bool()], rtol=1e-4, atol=1e-5)


def test_a_bf16_model_gets_its_members_terms_in_bf16():
    """A bf16 model (Linear and Embedding rows alike): the factors and the row mask are cast to the model's dtype,
    so the per-row terms run in its GEMMs, and each member's logits are those of its materialised perturbation."""
    from esft.es.lowrank import population_logits

    model = tiny_llama().to(torch.bfloat16)
    w = LowRankWeights(model, rank=2)
    members = [Member(3, 1), Member(3, -1), Member(4, 1)]
    x = torch.randint(3, 256, (2, 4), generator=torch.Generator().manual_seed(5))
    with PopulationPerturbation(model, w, members, 0.05) as pert:
        assert all(a.dtype == b.dtype == torch.bfloat16 for a, b in pert.factors.values())
    batched = population_logits(model, w, members, 0.05, x)
    assert batched.dtype == torch.bfloat16
    with torch.inference_mode():
        centre = model(input_ids=x).logits.float()
    for i, (seed, sign) in enumerate(members):
        w.perturb(seed, sign, 0.05)
        with torch.inference_mode():
            single = model(input_ids=x).logits.float()
        w.restore()
        # bf16 rounding differs between W + sigma E and W x + term; the member's own shift is far larger
        assert (batched[i].float() - single).abs().max() < 0.25 * (single - centre).abs().max()


class _DoubledLinear(torch.nn.Linear):
    """A Linear whose forward is its own (not x W^T): the per-row term x B A^T would not be its perturbation."""

    embed_scale = 2.0  # an attribute of that name makes it no scaled word embedding

    def forward(self, x):
        return 2.0 * super().forward(x)


@pytest.mark.parametrize("bias", [False, True])
def test_a_linear_that_overrides_forward_is_refused_whatever_its_attributes(bias):
    model = torch.nn.Sequential(_DoubledLinear(4, 3, bias=bias))
    weights = LowRankWeights(model, rank=1)
    with pytest.raises(NotImplementedError, match="overrides forward"):
        PopulationPerturbation(model, weights, [Member(1, 1)], 0.1)


def test_a_failure_while_building_the_factors_leaves_no_hook_on_the_model(monkeypatch):
    """Hooks registered for the matrices built before the failure would otherwise stay on the model, and every
    later forward of it (the centre's evaluation, a checkpoint's eval) would fail on an unmapped batch."""
    model = tiny_llama()
    w = LowRankWeights(model, rank=1)
    built = []
    concat = PopulationPerturbation._concat

    def failing(self, weights, name, dtype):
        if len(built) == 2:
            raise KeyboardInterrupt
        built.append(name)
        return concat(self, weights, name, dtype)

    monkeypatch.setattr(PopulationPerturbation, "_concat", failing)
    with pytest.raises(KeyboardInterrupt):
        PopulationPerturbation(model, w, [Member(1, 1), Member(2, -1)], 0.1)
    assert len(built) == 2
    assert all(not m._forward_hooks for m in model.modules())
    model(input_ids=torch.tensor([[1, 2, 3]]))  # the plain model runs again
