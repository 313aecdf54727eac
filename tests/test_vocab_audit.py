"""esft.generation.vocab.VocabRows in detail: when reads come from the weight and when from the owner's `rows`,
the one shared block buffer, and a freed weight written back before it is read whole.

Run: pytest -q tests/test_vocab_audit.py   (~1 s)
"""

from __future__ import annotations

import pytest
import torch

from esft.generation import releasing
from esft.generation.vocab import ROW_ALIGNMENT, VocabRows


def _source(calls):
    """An owner's `rows`: row i of a [V, D] weight is filled with 1000 + i (so reads through it are recognisable)."""
    def rows(weight, index, out):
        picked = torch.arange(weight.shape[0])[index]
        calls.append((index, out))
        values = (1000.0 + picked.to(weight.dtype))[:, None].expand(-1, weight.shape[1])
        return values.clone() if out is None else out.copy_(values)

    return rows


def _fill(calls):
    def fill(weights):
        calls.append(weights)
        for w in weights:
            w.untyped_storage().resize_(w.numel() * w.element_size())
            w.copy_(torch.arange(w.numel(), dtype=w.dtype).view_as(w))

    return fill


def test_a_computed_matrix_is_read_in_place_until_it_is_freed():
    """Before free() the weight holds its values and every read (rows, embeddings, blocks) is the weight itself,
    the owner never asked; after free() every read is asked of the owner: row ids, then one slice per block."""
    weight = torch.randn(10, 64)
    calls = []
    with releasing([weight], rows=_source(calls)):
        vocab = VocabRows(weight)
        assert vocab.computed
        ids = torch.tensor([[3, 1], [9, 3]])
        assert torch.equal(vocab.embed(ids), weight[ids])
        assert [(s, b.data_ptr()) for s, b in vocab.blocks(4)] == [(0, weight[0:].data_ptr()),
                                                                   (4, weight[4:].data_ptr()),
                                                                   (8, weight[8:].data_ptr())]
        assert calls == []
        vocab.free()
        assert weight.untyped_storage().nbytes() == 0
        assert torch.equal(vocab.take(torch.tensor([3, 1])), torch.tensor([[1003.0], [1001.0]]).expand(-1, 64))
        blocks = [(s, b[:, 0].tolist()) for s, b in vocab.blocks(4)]
    assert blocks == [(0, [1000.0, 1001.0, 1002.0, 1003.0]), (4, [1004.0, 1005.0, 1006.0, 1007.0]),
                      (8, [1008.0, 1009.0])]
    assert [index for index, _ in calls[1:]] == [slice(0, 4), slice(4, 8), slice(8, 10)]


def test_computed_blocks_share_one_buffer_no_larger_than_the_matrix():
    """Every computed block is written into the same buffer (its rows only); a block size beyond the matrix
    allocates the matrix's rows, not the block size's."""
    weight = torch.randn(10, 64)
    calls = []
    with releasing([weight], rows=_source(calls)):
        vocab = VocabRows(weight)
        vocab.free()
        list(vocab.blocks(4))
        outs = [out for _, out in calls]
        assert [tuple(o.shape) for o in outs] == [(4, 64), (4, 64), (2, 64)]
        assert len({o.untyped_storage().data_ptr() for o in outs}) == 1
        calls.clear()
        assert [s for s, _ in vocab.blocks(1000)] == [0]
        (_, out), = calls
        assert out.shape == (10, 64) and out.untyped_storage().nbytes() == 10 * 64 * 4


def test_rows_are_computed_only_for_a_multiple_of_64_elements():
    """ROW_ALIGNMENT is 64: a 96-wide matrix (a multiple of 32 only) is read from the weight, a 128-wide one
    computed."""
    assert ROW_ALIGNMENT == 64
    narrow, wide = torch.randn(4, 96), torch.randn(4, 128)
    with releasing([narrow, wide], rows=_source([])):
        assert [VocabRows(narrow).computed, VocabRows(wide).computed] == [False, True]


def test_a_freed_weight_read_from_itself_is_written_first_and_only_then():
    """A weight the owner left unwritten (freed) is filled when a VocabRows reading it in place is made, and when
    whole() is asked for; one that holds its values is not rewritten."""
    odd, held = torch.randn(6, 40), torch.randn(6, 40)
    odd.untyped_storage().resize_(0)
    before = held.clone()
    filled = []
    with releasing([odd, held], fill=_fill(filled)):
        VocabRows(odd)
        assert len(filled) == 1 and filled[0][0] is odd
        assert torch.equal(odd, torch.arange(240.0).view(6, 40))
        VocabRows(held).whole()
        assert len(filled) == 1 and torch.equal(held, before)
    aligned = torch.randn(6, 64)
    with releasing([aligned], fill=_fill(filled), rows=_source([])):
        vocab = VocabRows(aligned)
        vocab.free()
        assert vocab.whole() is aligned and torch.equal(aligned, torch.arange(384.0).view(6, 64))
    assert len(filled) == 2


def test_embed_keeps_the_shape_of_the_ids():
    weight = torch.randn(10, 64)
    vocab = VocabRows(weight)
    assert vocab.embed(torch.tensor([[1, 2, 3]])).shape == (1, 3, 64)
    assert vocab.embed(torch.zeros((2, 0), dtype=torch.long)).shape == (2, 0, 64)


@pytest.mark.parametrize("fast", [False, True])
def test_a_computed_vocabulary_matrix_is_kept_by_the_plain_step_and_freed_once_the_stacked_path_packs_the_head(fast):
    """An ES lane's copy inside `releasing(rows=...)`, without the bf16 screen (sampling, or a CPU without native
    bf16). The plain lean step (exact options) multiplies by the weight itself, so the matrix keeps its storage. The
    stacked path packs the whole head first and then reads only token rows, which the rows source computes, so the
    plain matrix is freed for the rest of the call. The completions are those generated outside the context."""
    from conftest import make_tiny_model
    from esft.generation import GenerationConfig
    from esft.generation.engine import decode
    from esft.generation.lean import fused_attention_reason, packed_linear_reason

    options = {}
    if fast:
        if packed_linear_reason(torch.float32) or fused_attention_reason(torch.float32):
            pytest.skip("no oneDNN packed linear or no compiled kernel here")
        options = dict(packed_linear=True, fused_attention=True)

    model = make_tiny_model()
    weight = model.model.embed_tokens.weight  # tied lm_head; 64 columns: rows may be computed
    master = weight.detach().clone()
    ids = torch.randint(3, 40000, (3, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    config = GenerationConfig(max_new_tokens=6, batch_size=3, **options)
    computed = []

    def rows(w, index, out):
        computed.append(index)
        return master[index]

    with torch.inference_mode():
        ref = decode(model, ids, mask, config, [2])
        with releasing([weight], fill=lambda weights: None, rows=rows):
            ours = decode(model, ids, mask, config, [2])
    assert ours == ref
    if fast:
        assert weight.untyped_storage().nbytes() == 0 and computed  # freed; the token rows were computed
    else:
        assert weight.untyped_storage().nbytes() == weight.numel() * weight.element_size() and not computed
