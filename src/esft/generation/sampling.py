"""The next-token rule of the decode loop: argmax, or nucleus (top-p) sampling at a temperature.

Nucleus sampling keeps the smallest prefix of the tokens, in descending probability, whose mass reaches top_p.
Sorting the whole vocabulary of every row at every step finds it, but on a CPU that sort costs several ms per row
(most of a small model's sampled decode step), while the nucleus is usually a few dozen tokens. On a CPU,
`sample_next` therefore reads each row's nucleus off its top k probabilities (`topk`), k growing for the rows whose
candidates do not yet provably hold it, and picks the same token as the full sort would for the same draw:

- the sorted probability values are the same whichever order ties take, `topk`'s sorted values are their first k,
  and the cumulative sum is a running sum, so its first k entries are the full sort's (tests/test_sampling.py);
- the nucleus ends inside the k candidates once candidate k-1 is dropped: every later token has a cumulative sum
  no smaller and a probability no larger, so (rounding being monotone) it is dropped too;
- the draw (inverse CDF, or `torch.multinomial` on the same full-width masked row) then lands on the same sorted
  position, and that position holds the same token unless its probability is tied with another token's: the order
  of tied tokens is whatever torch's unstable sort gives, so such rows are sorted in full, as before (a row's sort
  does not depend on the other rows of the batch: tested).

Other devices sort in full (their cumulative sums are parallel scans, whose rounding the argument does not cover).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_FIRST_K = 512  # candidates tried first: on a 49k vocabulary topk(512) costs what topk(64) does, ~1/7 of a sort
_GROWTH = 8     # then 4096, ...: while k is at most a quarter of the vocabulary, past that the full sort


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None,
                uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """Next token per row: argmax when temperature == 0, else nucleus sampling at that temperature.

    `uniforms` (float [n] in [0, 1), one per row): row r takes the first token, in the order sampled from (vocabulary
    order, or descending probability under top_p), at which the cumulative probability exceeds uniforms[r] times
    the row's total (inverse CDF), so each row's draw depends on its own number only. Without it, rows draw from
    `generator` through `torch.multinomial`, one after another."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = _finite_rows(torch.softmax(logits.float() / temperature, dim=-1), logits)
    if top_p >= 1.0:
        return _draw(probs, generator, uniforms)
    groups = _nucleus_groups(probs, top_p)
    if uniforms is None:  # one multinomial call over full-width rows, as many numbers drawn as by the full sort
        full = torch.zeros_like(probs)
        for group in groups:
            full[group.rows, : group.kept.shape[-1]] = group.kept
        position = _draw(full, generator, None)
    else:
        position = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
        for group in groups:
            position[group.rows] = _draw(group.kept, None, uniforms[group.rows.cpu()])
    token = torch.empty_like(position)
    for group in groups:
        token[group.rows] = group.token_at(probs, position[group.rows])
    return token


def _finite_rows(probs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """`probs` with each row that is not a distribution (NaN or infinite logits: an ES member whose weights
    diverged) replaced by certainty on the greedy token, argmax of its logits, so that the row draws that token as
    greedy decoding would pick it, where the draw would otherwise land past the vocabulary or fail. Other rows keep
    their bits and their draws."""
    bad = ~torch.isfinite(probs).all(dim=-1)
    if bool(bad.any()):
        probs = probs.clone()
        rows = bad.nonzero().squeeze(-1)
        probs[rows] = 0.0
        probs[rows, logits[rows].argmax(dim=-1)] = 1.0
    return probs


@dataclass
class _Group:
    """Rows whose nucleus lies in their top `values` (descending; `index`: the tokens), `kept` = `values` with the
    tokens past the nucleus zeroed. `complete`: `values` is the whole sorted row (the full sort)."""

    rows: torch.Tensor
    values: torch.Tensor
    index: torch.Tensor
    kept: torch.Tensor
    complete: bool

    def token_at(self, probs: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """The token at each row's drawn sorted `position`. A candidate whose probability is tied with another
        token's is placed by the sort's tie order, so those rows are sorted in full."""
        position = position[:, None]
        token = self.index.gather(-1, position).squeeze(-1)
        if self.complete:
            return token
        picked = self.values.gather(-1, position)
        # `values` holds every token more probable than its last entry, so a tie shows up among the candidates
        unique = ((self.values == picked).sum(dim=-1) == 1) & (picked[:, 0] > self.values[:, -1])
        if not bool(unique.all()):
            tied = (~unique).nonzero().squeeze(-1)
            order = probs[self.rows[tied]].sort(dim=-1, descending=True).indices
            token[tied] = order.gather(-1, position[tied]).squeeze(-1)
        return token


def _nucleus_groups(probs: torch.Tensor, top_p: float) -> list[_Group]:
    """Every row in one group: its top k candidates for the smallest k tried (512, 4096, ...) that holds its
    nucleus, or its full sort (always on devices other than the CPU)."""
    vocab = probs.shape[-1]
    pending = torch.arange(probs.shape[0], device=probs.device)
    groups = []
    k = _FIRST_K if probs.device.type == "cpu" else vocab
    while k <= vocab // 4 and pending.numel():
        values, index = probs[pending].topk(k, dim=-1)
        kept, drop = _nucleus(values, top_p)
        done = drop[:, -1]  # candidate k-1 dropped: the nucleus ends inside the candidates
        if bool(done.any()):
            groups.append(_Group(pending[done], values[done], index[done], kept[done], complete=False))
            pending = pending[~done]
        k *= _GROWTH
    if pending.numel():
        values, index = probs[pending].sort(dim=-1, descending=True)
        groups.append(_Group(pending, values, index, _nucleus(values, top_p)[0], complete=True))
    return groups


def _nucleus(sorted_probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities with the tokens past the nucleus zeroed, the drop mask): the smallest prefix whose mass
    reaches top_p is kept (the first token always is). A token goes once the mass before it reaches top_p: it is
    not needed, as in transformers' TopPLogitsWarper (0.5, 0.5 at top_p 0.5 keeps one token)."""
    drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p
    drop[..., 0] = False
    return sorted_probs.masked_fill(drop, 0.0), drop


def _draw(probs: torch.Tensor, generator: torch.Generator | None, uniforms: torch.Tensor | None) -> torch.Tensor:
    """Index drawn per row of `probs`: by inverse CDF from `uniforms`, else by `torch.multinomial`."""
    if uniforms is None:
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return _inverse_cdf(probs, uniforms.to(device=probs.device, dtype=probs.dtype))


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row, the first index whose cumulative probability exceeds uniforms * total: never a zero-probability
    token (its cumulative sum equals its predecessor's), and at most the first index reaching the total (u * total
    can round up to the total itself)."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:].contiguous()
    picked = torch.searchsorted(cdf, uniforms[:, None] * total, right=True)
    return torch.minimum(picked, torch.searchsorted(cdf, total)).squeeze(-1)
