"""The greedy lm_head screen's error bound and the native-bf16 check (esft.generation.packed).

`LMHeadScreen` promises |approx_v - exact_v| <= c_prod ||h|| ||w_v|| + c_out |approx_v| for every token: checked
here on inputs built to make bf16 rounding as large as it gets (h and w just under the midpoint above 1, a sum that
rounds down), with the bf16 logits, norms and constants the screen hands to its candidate kernel. The candidates'
values must be the fp32 logits and the pick the fp32 argmax, also on a near-tie that bf16 cannot resolve."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from esft.generation import packed
from esft.generation.vocab import VocabRows

pytestmark = pytest.mark.usefixtures("one_thread")

U = 2.0 ** -8  # bf16's unit roundoff
UP = 1 + 0.999 * U  # rounds down to 1.0 in bf16, losing almost a whole unit roundoff


def _kernels():
    from esft.generation.lean_step import fused_attention_reason
    from esft.kernels import load_decode_attention

    if packed.packed_linear_reason(torch.float32) or fused_attention_reason(torch.float32):
        pytest.skip("no oneDNN packed linear or no compiled kernel here")
    if not packed.onednn_bf16():
        pytest.skip("this torch's oneDNN has no bf16 matmul")
    return load_decode_attention()


class _Recording:
    """The candidate kernel, recording what the screen hands it."""

    def __init__(self, kernels):
        self.kernels, self.seen = kernels, {}

    def screen_candidates(self, approx, hnorm, wnorm, c_prod, c_out):
        self.seen = dict(approx=approx.clone(), hnorm=hnorm.clone(), wnorm=wnorm.clone(), c_prod=c_prod, c_out=c_out)
        return self.kernels.screen_candidates(approx, hnorm, wnorm, c_prod, c_out)


def test_screen_bound_holds_where_bf16_rounding_is_worst_and_the_pick_is_the_fp32_argmax():
    kernels = _Recording(_kernels())
    d, v = 257, 40  # 257 ones sum to 257, which bf16 rounds down to 256
    w = torch.randn(v, d, generator=torch.Generator().manual_seed(0))
    w[0], w[1], w[2] = UP, 1.0, -UP  # rows 0 and 1 tie in bf16 (256); row 0 wins by ~1 in fp32
    other = torch.randn(d, generator=torch.Generator().manual_seed(1))
    h = torch.stack([torch.full((d,), UP), torch.full((d,), -UP), other])
    screen = packed.LMHeadScreen(VocabRows(w), 4)
    out = screen.logits(h, kernels, torch.tensor([], dtype=torch.long))
    exact = F.linear(h, w)
    seen = kernels.seen
    approx = seen["approx"].float()
    assert seen["approx"].dtype == torch.bfloat16 and approx.shape == exact.shape
    assert approx[0, 0] == approx[0, 1] == 256 and exact[0, 0] > exact[0, 1] + 0.9
    bound = seen["c_prod"] * seen["hnorm"][:, None] * seen["wnorm"][None] + seen["c_out"] * approx.abs()
    ratio = (approx - exact).abs() / bound
    assert bool((ratio <= 1).all()), ratio.max()
    assert ratio.max() > 0.7  # these inputs come close to the bound: it has little room to shrink
    # the candidates' values are the fp32 logits, ruled-out tokens -inf, and the pick is the fp32 argmax
    finite = torch.isfinite(out.values)
    assert torch.equal(out.values[finite], exact[:, out.cols][finite])
    assert {0, 1} <= set(out.cols.tolist()) and torch.equal(out.greedy(), exact.argmax(-1))
    assert out.greedy().tolist()[:2] == [0, 2]


@pytest.mark.parametrize("avx512_bf16, amx, native", [(True, False, True), (False, True, True), (False, False, False)])
def test_bf16_matmul_is_native_with_either_instruction_set(monkeypatch, avx512_bf16, amx, native):
    """AVX512-BF16 or AMX each give native bf16 dot products (and oneDNN must run bf16 at all)."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(packed, "onednn_bf16", lambda: True)
    assert packed.bf16_matmul_is_native() is native
    monkeypatch.setattr(packed, "onednn_bf16", lambda: False)
    assert packed.bf16_matmul_is_native() is False


def test_a_suppressed_token_is_never_picked_even_where_it_dominates_every_row():
    """Suppressed ids (eos before min_new_tokens) leave the screen: the pick is the best other token's."""
    kernels = _kernels()
    d, v = 257, 40
    w = torch.randn(v, d, generator=torch.Generator().manual_seed(0))
    w[0], w[1], w[3] = UP, 1.0, 5.0  # token 3 is every row's argmax by far
    h = torch.stack([torch.full((d,), UP), torch.randn(d, generator=torch.Generator().manual_seed(1)).abs()])
    screen = packed.LMHeadScreen(VocabRows(w), 4)
    exact = F.linear(h, w)
    assert exact.argmax(-1).tolist() == [3, 3]
    out = screen.logits(h, kernels, torch.tensor([3]))
    assert 3 not in out.cols.tolist()
    exact[:, 3] = float("-inf")
    assert torch.equal(out.greedy(), exact.argmax(-1)) and out.greedy()[0] == 0


def test_a_row_without_a_finite_candidate_makes_the_screen_give_up_for_the_whole_batch():
    """A diverged member's hidden state (NaN) leaves its row no finite candidate, and no bound holds for it: the
    screen returns None (the caller then computes the full fp32 logits), even when the other rows screen fine."""
    kernels = _kernels()
    d, v = 64, 40
    w = torch.randn(v, d, generator=torch.Generator().manual_seed(0))
    h = torch.randn(3, d, generator=torch.Generator().manual_seed(1))
    screen = packed.LMHeadScreen(VocabRows(w), 4)
    none = torch.tensor([], dtype=torch.long)
    out = screen.logits(h, kernels, none)
    assert out is not None and torch.equal(out.greedy(), F.linear(h, w).argmax(-1))
    h[1] = float("nan")
    assert screen.logits(h, kernels, none) is None


@pytest.mark.parametrize("d", [64, 257, 576, 4096])
def test_screen_constants_are_the_documented_bound_with_a_small_margin(d):
    """c_prod covers both operands' bf16 rounding (2u + u^2) and fp32 accumulation over the hidden dimension d in
    both GEMMs (2 gamma_d), c_out the rounding of the bf16 result (2^-7): each at least that (a smaller constant
    could rule out the true argmax), and at most a few percent more (a looser one keeps needless candidates)."""
    if packed.packed_linear_reason(torch.float32) or not packed.onednn_bf16():
        pytest.skip("this torch's oneDNN has no bf16 matmul")
    screen = packed.LMHeadScreen(VocabRows(torch.randn(40, d, generator=torch.Generator().manual_seed(0))), 4)
    gamma = d * 2.0 ** -24 / (1 - d * 2.0 ** -24)
    rigorous = 2 * U + U * U + 2 * gamma
    assert rigorous <= screen.c_prod <= 1.01 * rigorous
    assert 2.0 ** -7 <= screen.c_out <= 1.02 * 2.0 ** -7
