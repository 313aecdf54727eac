"""esft.analysis.canonical: a fused q|k|v tensor read without a model config (the mutation audit of 2026-12-05
found its split untested).

Run: PYTHONPATH=src pytest -q tests/test_canonical_mutmutbench.py   (a second)
"""

from __future__ import annotations

from esft.analysis import canonical as C


def test_a_fused_qkv_without_a_config_splits_into_three_contiguous_equal_blocks():
    """No config: q, k and v are assumed equal blocks of rows, in that order (multi-head attention), whatever the
    number of columns; a bias splits the same way."""
    refs = C.split_refs("model.layers.1.self_attn.qkv_proj.weight", (12, 4))
    assert [(r.canonical, r.shape, r.segments, r.columns) for r in refs] == [
        ("layers.1.q_proj", (4, 4), ((0, 4),), None), ("layers.1.k_proj", (4, 4), ((4, 8),), None),
        ("layers.1.v_proj", (4, 4), ((8, 12),), None)]
    bias = C.split_refs("model.layers.1.self_attn.qkv_proj.bias", (6,))
    assert [(r.canonical, r.shape, r.segments) for r in bias] == [
        ("layers.1.q_proj.bias", (2,), ((0, 2),)), ("layers.1.k_proj.bias", (2,), ((2, 4),)),
        ("layers.1.v_proj.bias", (2,), ((4, 6),))]
