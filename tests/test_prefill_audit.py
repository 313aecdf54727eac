"""The prefill layout (esft.generation.prefill) checked against independent definitions: `length_buckets` against a
brute-force search over every grouping of small length lists, `common_prefix` at its edges, and `layout_prefill`'s
cache columns, next positions and forwards for left-padded rows of a tiny random model.

Run: pytest -q tests/test_prefill_audit.py   (~5 s)
"""

from __future__ import annotations

import random

import pytest
import torch

from esft.generation import prefill
from esft.generation.hf_step import hf_prefill
from esft.generation.lean_step import LeanModel
from esft.generation.prompts import left_pad

from conftest import make_tiny_model


pytestmark = pytest.mark.usefixtures("one_thread")


# ---- common_prefix ----------------------------------------------------------------------------------------------

def test_common_prefix_edges():
    """A row that is a prefix of the others bounds the answer (no index past its end), identical rows share all,
    a single row shares itself, and a mismatch at the first token or an empty row gives 0."""
    assert prefill.common_prefix([[1, 2], [1, 2, 3]]) == 2
    assert prefill.common_prefix([[1, 2, 3], [1, 2]]) == 2
    assert prefill.common_prefix([[4, 5, 6], [4, 5, 6]]) == 3
    assert prefill.common_prefix([[7, 8, 9]]) == 3
    assert prefill.common_prefix([[1, 2, 3], [1, 2, 3], [1, 2, 4]]) == 2  # only the last row differs
    assert prefill.common_prefix([[1, 2, 3], [], [1, 2]]) == 0
    assert prefill.common_prefix([[9, 2], [1, 2]]) == 0


# ---- length_buckets ---------------------------------------------------------------------------------------------

def _partitions(items: list[int]):
    """Every set partition of `items` (Bell(n) of them), groups in no particular order."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        yield [[first]] + part
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]


def _cost(lengths: list[int], groups: list[list[int]], bucket_tokens: int) -> int:
    return sum(len(g) * max(lengths[i] for i in g) + bucket_tokens for g in groups)


def test_length_buckets_is_optimal_over_every_grouping():
    """For random small length lists (ties included), every max_buckets and several forward costs: the groups
    partition the rows, are non-empty, number at most max_buckets, and cost exactly the minimum of
    sum(rows x longest) + bucket_tokens per group over all set partitions, contiguous in length or not."""
    rng = random.Random(0)
    cases = [[50, 10, 10], [3, 2, 1], [5], [4, 4, 4, 4], [1, 9, 1, 9, 1]]
    cases += [[rng.randint(1, 12) for _ in range(rng.randint(1, 6))] for _ in range(60)]
    for lengths in cases:
        n = len(lengths)
        every = [(len(p), _cost(lengths, p, 0)) for p in _partitions(list(range(n)))]
        for max_buckets in range(1, n + 2):
            for bucket_tokens in (0, 1, 5, 20):
                groups = prefill.length_buckets(lengths, max_buckets, bucket_tokens)
                case = (lengths, max_buckets, bucket_tokens, groups)
                assert sorted(i for g in groups for i in g) == list(range(n)), case
                assert all(groups) and len(groups) <= max_buckets, case
                best = min(padded + k * bucket_tokens for k, padded in every if k <= max_buckets)
                assert _cost(lengths, groups, bucket_tokens) == best, case


def test_length_buckets_splits_off_a_single_long_row():
    """[50, 10, 10] in two groups: the long row alone (50 + 2 x 10 = 70), not with a short one (2 x 50 + 10)."""
    assert prefill.length_buckets([50, 10, 10], 2) == [[0], [1, 2]]
    assert prefill.length_buckets([10, 10, 50], 2) == [[2], [0, 1]]



def test_length_buckets_charges_nothing_per_group_by_default():
    """Without a forward cost (the default), saving a single padded position is worth another group: [10, 9] in
    one group pads 1 position (cost 20), in two none (19). A cost of 1 per group makes them tie (21 each): one."""
    assert prefill.length_buckets([10, 9], 2) == [[0], [1]]
    assert prefill.length_buckets([10, 9], 2, 1) == [[0, 1]]

# ---- layout_prefill ---------------------------------------------------------------------------------------------

PREFIX = [11, 12, 13, 14, 15, 16, 17, 18, 19]  # 9 tokens: at least min_prefix = 8 once one is left to each row


def _rows() -> list[list[int]]:
    g = random.Random(1)
    tails = [1, 12, 5, 3]
    return [PREFIX + [g.randint(20, 900) for _ in range(t)] for t in tails]


class _NaNCache(prefill.KVCache):
    """A KVCache whose fresh buffers hold NaN, as uninitialised memory may: what the layout leaves unwritten shows."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for buf in self.k + self.v:
            buf.fill_(float("nan"))


def _layout(model, rows, share, buckets, monkeypatch, **kwargs):
    ids, mask = left_pad(rows, 2, "cpu")
    calls = []

    def recorded(model, ids, mask, positions, cache=None):
        calls.append((tuple(ids.shape), positions.tolist()))
        return hf_prefill(model, ids, mask, positions, cache)

    monkeypatch.setattr(prefill, "KVCache", _NaNCache)
    monkeypatch.setattr(prefill, "PREFILL_BUCKET_TOKENS", 0)  # split by padding alone: several buckets
    with torch.inference_mode():
        lm = LeanModel(model)
        out = prefill.layout_prefill(model, lm, ids, mask, recorded, 3, share, buckets, **kwargs)
        plain = hf_prefill(model, ids, mask, (mask.cumsum(-1) - 1).clamp(min=0))
    return ids, mask, out, plain, calls


@pytest.mark.parametrize("buckets", [1, 3])
def test_layout_columns_positions_and_keys_of_left_padded_rows(monkeypatch, buckets):
    """Shared prefix (9 tokens) and remainders 1, 12, 5, 3 long: the cache holds the prefix in columns 0..8 of
    every row, each row's own tokens in the last columns of the suffix width (right-aligned), and nothing else
    attended; the K/V there are the plain prefill's for the same token, every other column is finite (padding a
    bucket's forward wrote, or zeros where none wrote); next positions are the prompt lengths and the logits
    those of the plain prefill. (PREFILL_BUCKET_TOKENS = 0: three buckets make forwards of 1, 1 and 2 rows.)"""
    model = make_tiny_model()
    rows = _rows()
    ids, mask, (logits, cache, next_pos), (ref, ref_cache), calls = _layout(model, rows, True, buckets, monkeypatch)
    p, width = len(PREFIX), ids.shape[1]
    assert calls[0] == ((1, p), [list(range(p))])  # the prefix once, at batch 1, positions 0..p-1
    assert sorted(s[0] for s, _ in calls[1:]) == ([4] if buckets == 1 else [1, 1, 2])
    assert cache.length == width and next_pos.tolist() == [len(r) for r in rows]
    assert cache.capacity >= width + 3  # room for the extra_columns asked for
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=1e-5)
    expected = torch.zeros(len(rows), width, dtype=torch.bool)
    expected[:, :p] = True
    for r, row in enumerate(rows):
        expected[r, width - (len(row) - p):] = True
    assert torch.equal(cache.mask[:, :width], expected)
    for i, layer in enumerate(ref_cache.layers):
        keys, values = cache.keys(i), cache.v[i][:, :, :width]
        assert keys.isfinite().all() and values.isfinite().all()  # masked columns too: 0 * NaN would leak
        for r, row in enumerate(rows):
            n = len(row)
            plain_cols = [width - n + t for t in range(n)]  # where the plain prefill put token t
            ours = list(range(p)) + plain_cols[p:]
            torch.testing.assert_close(keys[r][:, ours], layer.keys[r][:, plain_cols], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(values[r][:, ours], layer.values[r][:, plain_cols], atol=1e-5, rtol=1e-5)


def test_a_row_that_is_all_prefix_keeps_its_last_token(monkeypatch):
    """When one prompt is exactly the shared prefix, the shared part stops one token short of it, so that row
    still has a token of its own to compute the logits from."""
    model = make_tiny_model()
    rows = [PREFIX, PREFIX + [30, 31, 32], PREFIX + [40]]
    ids, mask, (logits, cache, next_pos), (ref, _), calls = _layout(model, rows, True, 1, monkeypatch)
    assert calls[0][0] == (1, len(PREFIX) - 1)
    assert calls[1][0] == (3, 4)
    assert next_pos.tolist() == [9, 12, 10]
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("min_prefix, shared", [(9, True), (10, False)])
def test_min_prefix_is_inclusive(monkeypatch, min_prefix, shared):
    """A usable prefix of exactly min_prefix tokens is shared; one token fewer than min_prefix is not."""
    model = make_tiny_model()
    rows = [PREFIX + [30], PREFIX + [40, 41]]
    ids, mask, (logits, cache, next_pos), (ref, _), calls = _layout(model, rows, True, 1, monkeypatch,
                                                                    min_prefix=min_prefix)
    assert [s for s, _ in calls] == ([(1, 9), (2, 2)] if shared else [(2, 11)])
    assert next_pos.tolist() == [10, 11]
    assert cache.capacity >= ids.shape[1] + 3
    if not shared:
        assert torch.equal(logits, ref)  # the plain prefill, bit for bit


def test_one_row_is_never_split_into_prefix_and_rest(monkeypatch):
    """With a single prompt there is nothing to share: one forward of the whole row, the plain prefill."""
    model = make_tiny_model()
    rows = [PREFIX + [30, 31, 32]]
    ids, mask, (logits, cache, next_pos), (ref, _), calls = _layout(model, rows, True, 1, monkeypatch)
    assert [s for s, _ in calls] == [(1, 12)]
    assert torch.equal(logits, ref) and next_pos.tolist() == [12]


def test_buckets_without_a_shared_prefix_still_split_the_prefill():
    """prefill_buckets on its own (share_prefix off, or no usable prefix) groups the rows by length as well: rows
    of 10, 21, 14 and 12 tokens in up to 3 buckets are 3 forwards (1, 1 and 2 rows, padded to their group's longest
    only), none of them a prefix; the logits stay those of one plain batch (to ~1e-6) and each row continues at its
    own length."""
    model = make_tiny_model()
    rows = _rows()
    with pytest.MonkeyPatch.context() as monkeypatch:
        ids, mask, (logits, cache, next_pos), (ref, _), calls = _layout(model, rows, False, 3, monkeypatch)
    assert sorted(s[0] for s, _ in calls) == [1, 1, 2]
    assert sorted(s[1] for s, _ in calls) == [12, 14, 21]  # no forward padded to the batch's longest but its own
    assert next_pos.tolist() == [len(r) for r in rows]
    assert torch.allclose(logits, ref, atol=1e-5, rtol=1e-5)
