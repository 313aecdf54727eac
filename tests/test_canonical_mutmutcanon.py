"""esft.analysis.canonical: GPT-2's fused c_attn split where the mutation audit of 2026-12-05 (mutcanon) found no
test: a width that is a multiple of 3 but not of 4.

Run: PYTHONPATH=src pytest -q tests/test_canonical_mutmutcanon.py   (a second)
"""

from __future__ import annotations

from esft.analysis import canonical as C


def test_a_c_attn_whose_width_is_three_times_an_odd_number_splits_into_column_thirds():
    """c_attn stores q|k|v along its last dim (Conv1D, [in, 3 * hidden]): any width divisible by 3 splits into
    three equal column ranges, whatever else divides it (15 = 3 * 5); the bias splits the same way by rows."""
    q, k, v = C.split_refs("transformer.h.2.attn.c_attn.weight", (5, 15))
    assert [(r.canonical, r.shape, r.segments, r.columns) for r in (q, k, v)] == [
        ("layers.2.q_proj", (5, 5), None, (0, 5)), ("layers.2.k_proj", (5, 5), None, (5, 10)),
        ("layers.2.v_proj", (5, 5), None, (10, 15))]
    q, k, v = C.split_refs("transformer.h.2.attn.c_attn.bias", (15,))
    assert [(r.canonical, r.shape, r.segments) for r in (q, k, v)] == [
        ("layers.2.q_proj.bias", (5,), ((0, 5),)), ("layers.2.k_proj.bias", (5,), ((5, 10),)),
        ("layers.2.v_proj.bias", (5,), ((10, 15),))]
