"""Nucleus sampling (esft.generation.sampling): the top-k shortcut picks exactly the token the full sort picks.

Run: pytest tests/test_sampling.py -q
"""

from __future__ import annotations

import torch

from esft.generation import sample_next


def _reference(logits, temperature, top_p, generator, uniforms=None):
    """The full-sort sampler, as esft sampled before the shortcut: softmax, sort the whole vocabulary, zero the
    tokens past the smallest prefix reaching top_p, draw a sorted position, map it back through the sort."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    order = None
    if top_p < 1.0:
        probs, order = probs.sort(dim=-1, descending=True)
        drop = probs.cumsum(dim=-1) - probs >= top_p
        drop[:, 0] = False
        probs = probs.masked_fill(drop, 0.0)
    if uniforms is None:
        choice = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    else:
        u = uniforms.to(dtype=probs.dtype)
        cdf = probs.cumsum(dim=-1)
        total = cdf[:, -1:].contiguous()
        picked = torch.searchsorted(cdf, u[:, None] * total, right=True)
        choice = torch.minimum(picked, torch.searchsorted(cdf, total)).squeeze(-1)
    return choice if order is None else order.gather(-1, choice[:, None]).squeeze(-1)


def _logits(kind: str, rows: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    """Random logits of one family: smooth, bf16-rounded (ties among likely tokens), small integers (large tie
    groups, in and across the nucleus boundary), an exactly repeated top, and eos-style -inf masks."""
    scale = float(torch.empty(1).uniform_(0.2, 12.0, generator=g))
    x = torch.randn(rows, vocab, generator=g) * scale
    if kind == "bf16":
        x = x.bfloat16().float()
    elif kind == "integer":
        x = torch.randint(-6, 7, (rows, vocab), generator=g).float() + torch.randint(0, 4, (rows, 1), generator=g)
    elif kind == "repeated_top":
        top = x.max(dim=-1, keepdim=True).values
        x[:, :3] = top
    elif kind == "masked":
        x[:, torch.randint(0, vocab, (vocab // 2,), generator=g)] = -float("inf")
        x[:, 0] = 0.0
        x[0, 1:] = -float("inf")  # one row with a single possible token
    return x


KINDS = ("smooth", "bf16", "integer", "repeated_top", "masked")
TOP_PS = (0.01, 0.3, 0.5, 0.8, 0.9, 0.95, 0.99, 0.999, 0.9999999, 1 - 1e-9)


def test_shortcut_picks_the_full_sorts_token_for_every_draw():
    g = torch.Generator().manual_seed(0)
    for case in range(300):
        kind = KINDS[case % len(KINDS)]
        vocab = (4096, 9000, 700, 2048, 20000, 65)[case % 6] if case % 25 else 49152
        logits = _logits(kind, rows=int(torch.randint(1, 9, (1,), generator=g)), vocab=vocab, g=g)
        temperature = (0.2, 0.6, 1.0, 1.3)[case % 4]
        top_p = TOP_PS[case % len(TOP_PS)]
        u = torch.rand(logits.shape[0], generator=g, dtype=torch.float64)
        u[: case % 3] = (0.0, 1 - 1e-12)[case % 2]  # the edges: first token, and a draw that rounds up to 1
        new = sample_next(logits, temperature, top_p, None, uniforms=u)
        assert torch.equal(new, _reference(logits, temperature, top_p, None, uniforms=u)), (case, kind, top_p)
        seed = 1000 + case
        g_new, g_ref = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        assert torch.equal(sample_next(logits, temperature, top_p, g_new), _reference(logits, temperature, top_p,
                                                                                       g_ref)), (case, kind, top_p)
        assert torch.equal(g_new.get_state(), g_ref.get_state())  # the generator moved on by as much


def test_many_draws_from_one_tied_row_match():
    """One row of bf16 logits (likely tokens tie) with a tie group of 10 near the top, drawn at 400 evenly spaced
    points: every draw that lands on a tied token is placed by the full sort's tie order."""
    g = torch.Generator().manual_seed(1)
    row = (torch.randn(1, 8192, generator=g) * 3).bfloat16().float()
    row[0, 100:110] = row.max() - 0.25
    logits = row.expand(400, -1)
    u = (torch.arange(400, dtype=torch.float64) + 0.5) / 400
    for top_p in (0.5, 0.9, 0.95):
        new = sample_next(logits, 1.0, top_p, None, uniforms=u)
        assert torch.equal(new, _reference(logits, 1.0, top_p, None, uniforms=u))
        assert len(set(new[u < 0.3].tolist()) & set(range(100, 110))) > 1  # the tie group was drawn from


def test_a_peaked_row_is_sampled_without_sorting_the_vocabulary(monkeypatch):
    """The point of the shortcut: a nucleus of a few tokens costs a topk, not a sort of all 49,152 tokens."""
    sorted_widths = []
    real_sort = torch.Tensor.sort

    def counting_sort(self, *args, **kwargs):
        sorted_widths.append(self.shape[-1])
        return real_sort(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "sort", counting_sort)
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 49152, generator=g) * 4
    u = torch.rand(4, generator=g, dtype=torch.float64)
    token = sample_next(logits, 1.0, 0.95, None, uniforms=u)
    monkeypatch.undo()
    assert sorted_widths == []
    assert torch.equal(token, _reference(logits, 1.0, 0.95, None, uniforms=u))


def test_top_p_one_draws_in_vocabulary_order():
    """top_p >= 1 samples the whole row in vocabulary order (the order `uniforms` is read in), not by descending
    probability: with probabilities 0.1, 0.6, 0.3 the draws at 0.05, 0.65 and 0.75 are tokens 0, 1 and 2."""
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3]] * 3))
    u = torch.tensor([0.05, 0.65, 0.75], dtype=torch.float64)
    assert sample_next(logits, 1.0, 1.0, None, uniforms=u).tolist() == [0, 1, 2]


def test_nucleus_is_the_smallest_prefix_reaching_top_p():
    """The nucleus (Holtzman et al.) is the smallest prefix of the sorted tokens whose mass reaches top_p: of four
    equally likely tokens (0.25 each, exact in fp32), top_p 0.5 keeps two, not three (the mass before the third is
    0.5, so it is not needed). The first token is kept whatever top_p is."""
    u = (torch.arange(400, dtype=torch.float64) + 0.5) / 400
    for vocab in (4, 4096):  # the full sort; the top-k shortcut (4 likely tokens, the rest impossible)
        logits = torch.full((400, vocab), -float("inf"))
        logits[:, :4] = 0.0
        for top_p, kept in ((0.25, 1), (0.5, 2), (0.75, 3), (0.8, 4), (0.0, 1)):
            drawn = sample_next(logits, 1.0, top_p, None, uniforms=u)
            assert len(set(drawn.tolist())) == kept, (vocab, top_p)
            assert torch.equal(drawn, _reference(logits, 1.0, top_p, None, uniforms=u))
        g = torch.Generator().manual_seed(0)
        assert len(set(sample_next(logits, 1.0, 0.5, g).tolist())) == 2


def test_a_draw_never_lands_on_a_zero_probability_token():
    """u = 0 and a draw at exactly a cumulative probability go past impossible tokens (`_inverse_cdf`)."""
    logits = torch.tensor([[-float("inf"), 0.0, -float("inf"), 0.0]] * 2)
    u = torch.tensor([0.0, 0.5], dtype=torch.float64)
    assert sample_next(logits, 1.0, 1.0, None, uniforms=u).tolist() == [1, 3]


def test_temperature_divides_the_logits():
    """Probabilities 0.6 / 0.4 become 0.69 / 0.31 at temperature 0.5 and 0.55 / 0.45 at temperature 2."""
    logits = torch.log(torch.tensor([[0.6, 0.4]]))
    for temperature, u, token in ((0.5, 0.65, 0), (2.0, 0.6, 1)):
        uniforms = torch.tensor([u], dtype=torch.float64)
        assert sample_next(logits, temperature, 1.0, None, uniforms=uniforms).tolist() == [token], temperature


def test_a_peaked_and_a_flat_row_match_the_full_sort_with_either_draw():
    """A fast slice of the 300-case check: one row whose nucleus lies in its first 512 candidates and one whose
    nucleus needs more than 4096 (the full sort), drawn from uniforms and from a generator."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 20000, generator=g)
    logits[0] *= 12.0
    logits[1] *= 0.2
    u = torch.rand(2, generator=g, dtype=torch.float64)
    drawn = sample_next(logits, 1.0, 0.95, None, uniforms=u)
    assert torch.equal(drawn, _reference(logits, 1.0, 0.95, None, uniforms=u))
    g_new, g_ref = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert torch.equal(sample_next(logits, 1.0, 0.95, g_new), _reference(logits, 1.0, 0.95, g_ref))


def _float64_nucleus_draws(logits: torch.Tensor, temperature: float, top_p: float, u: torch.Tensor) -> list[int]:
    """Independent reference, row by row in float64 Python: the nucleus is the smallest set of most probable tokens
    whose mass reaches top_p, and a draw u takes the first of them (most probable first) at which the cumulative
    mass exceeds u times the nucleus's mass."""
    tokens = []
    for row, draw in zip(logits.double().tolist(), u.tolist()):
        peak = max(row)
        weights = [0.0 if x == -float("inf") else 2.718281828459045 ** ((x - peak) / temperature) for x in row]
        total = sum(weights)
        order = sorted(range(len(row)), key=lambda i: -weights[i])
        nucleus, mass = [], 0.0
        for i in order:
            nucleus.append(i)
            mass += weights[i] / total
            if mass >= top_p:
                break
        target, running = draw * mass, 0.0
        for i in nucleus:
            running += weights[i] / total
            if running > target:
                tokens.append(i)
                break
        else:
            tokens.append(nucleus[-1])
    return tokens


def test_nucleus_draws_match_a_float64_reference_in_every_group():
    """One batch of rows of every peakedness (nuclei of a few tokens, of hundreds, of thousands: the 512 and 4096
    candidate groups and the full sort), untied logits, drawn at fixed points: each row takes the token the float64
    definition of the nucleus gives. Draws and top_p sit away from float32 rounding of the boundaries."""
    g = torch.Generator().manual_seed(5)
    scales = torch.tensor([8.0, 0.3, 3.0, 0.05, 1.0, 12.0])  # row 3: nucleus of ~18k tokens; row 5: a handful
    logits = torch.randn(6, 20000, generator=g, dtype=torch.float64) * scales[:, None]
    u = torch.tensor([0.1, 0.35, 0.5, 0.62, 0.8, 0.97], dtype=torch.float64)
    for temperature, top_p in ((1.0, 0.9), (0.7, 0.5), (1.3, 0.95)):
        drawn = sample_next(logits.float(), temperature, top_p, None, uniforms=u)
        assert drawn.tolist() == _float64_nucleus_draws(logits.float(), temperature, top_p, u), (temperature, top_p)


def test_a_tied_row_behind_a_flat_row_is_placed_by_its_own_sort():
    """A peaked row with a tie among its likely tokens, batched behind a flat row (which goes to the full sort):
    the tied draw is resolved by sorting that row, so it gets the token it gets alone and the full sort gives."""
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(2, 8192, generator=g)
    logits[1] *= 6.0
    logits[1, 10:14] = logits[1].max() + 1.0  # four tokens tie at the top
    logits[0] *= 0.05
    u = torch.tensor([0.4, 0.3], dtype=torch.float64)
    together = sample_next(logits, 1.0, 0.9, None, uniforms=u)
    assert together[1] == sample_next(logits[1:], 1.0, 0.9, None, uniforms=u[1:])[0]
    assert torch.equal(together, _reference(logits, 1.0, 0.9, None, uniforms=u))
    assert 10 <= int(together[1]) < 14


def test_top_p_zero_keeps_the_first_token_with_either_draw():
    """top_p 0 (or below) still keeps the most probable token, so both draws, from a generator and from uniforms,
    give the argmax rather than failing on a row of zeros."""
    logits = torch.tensor([[0.1, 2.0, 1.0, -1.0]] * 8)
    for top_p in (0.0, -0.5):
        assert sample_next(logits, 1.0, top_p, torch.Generator().manual_seed(0)).tolist() == [1] * 8
        u = torch.linspace(0, 0.999, 8, dtype=torch.float64)
        assert sample_next(logits, 1.0, top_p, None, uniforms=u).tolist() == [1] * 8


def test_top_p_one_with_a_generator_draws_the_softmax_from_that_generator():
    """Without uniforms, top_p >= 1 is one torch.multinomial draw per row from softmax(logits / T) with the given
    generator: the same seed gives the same tokens, whatever the global random state."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(64, 50, generator=g)
    want = torch.multinomial(torch.softmax(logits / 0.7, dim=-1), 1,
                             generator=torch.Generator().manual_seed(11)).squeeze(-1)
    for global_seed in (0, 1):
        torch.manual_seed(global_seed)
        got = sample_next(logits, 0.7, 1.0, torch.Generator().manual_seed(11))
        assert torch.equal(got, want)


def test_low_precision_logits_are_sampled_in_float32():
    """bf16 logits (a bf16 model's lm_head) are sampled from their float32 softmax, so a draw resolves the CDF to
    float32 precision rather than to bf16's 8 bits: V equally likely tokens drawn at the middle of each token's
    interval of the CDF give every token once, in order, with and without top_p."""
    vocab = 1024
    logits = torch.zeros(vocab, vocab, dtype=torch.bfloat16)
    u = (torch.arange(vocab, dtype=torch.float64) + 0.5) / vocab
    assert sample_next(logits, 1.0, 1.0, None, uniforms=u).tolist() == list(range(vocab))
    drawn = sample_next(logits, 1.0, 0.9999, None, uniforms=u)  # the nucleus: every token (ties: any order)
    assert sorted(drawn.tolist()) == list(range(vocab))
    peaked = torch.randn(3, 5000, generator=torch.Generator().manual_seed(0)).mul(4).bfloat16()
    v = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64)
    assert torch.equal(sample_next(peaked, 0.8, 0.9, None, uniforms=v),
                       sample_next(peaked.float(), 0.8, 0.9, None, uniforms=v))


def test_a_diverged_row_draws_its_greedy_token_and_leaves_the_others_alone():
    """Logits with NaN or infinity (an ES member whose weights diverged): the draw used to land past the vocabulary
    (the inverse CDF of NaN probabilities) or fail (`torch.multinomial`), ending the run in an IndexError. Such a
    row now takes its argmax, the token greedy decoding picks, and every other row draws what it drew before."""
    g = torch.Generator().manual_seed(5)
    clean = torch.randn(4, 300, generator=g) * 3
    logits = clean.clone()
    logits[1, 7] = float("nan")
    logits[2, 11] = float("inf")
    u = torch.rand(4, generator=g, dtype=torch.float64)
    for top_p in (1.0, 0.9):
        for uniforms in (u, None):
            gens = [torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)]
            got = sample_next(logits, 0.8, top_p, gens[0], uniforms=uniforms)
            want = sample_next(clean, 0.8, top_p, gens[1], uniforms=uniforms)
            assert got[1] == logits[1].argmax() == 7 and got[2] == 11, (top_p, uniforms is None)
            if uniforms is not None:  # per-row draws: the finite rows keep theirs
                assert got[[0, 3]].tolist() == want[[0, 3]].tolist()
            assert ((got >= 0) & (got < 300)).all()
