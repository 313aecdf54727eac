"""Canonical tensor names and families, so analyses read the same on every architecture.

A checkpoint's tensor names depend on the architecture (Llama `self_attn.q_proj`, Phi-3 fused `qkv_proj`,
GPT-2 `attn.c_attn`, GPT-NeoX `attention.query_key_value`, OPT `fc1` / `self_attn.out_proj` ...). The study's
tables and figures are per family (attention q/k/v/o, MLP gate/up/down, norms, embeddings), so every stored
tensor is mapped onto canonical names `layers.<i>.<role>` (or `<role>` outside the layers, e.g.
`embed_tokens`, `norm`, `lm_head`), and a fused tensor is split into the views its split counterparts would
have: the q/k/v rows of a `qkv_proj`, the gate and up halves of a `gate_up_proj`, the q/k/v columns of GPT-2's
Conv1D `c_attn`, the per-head interleaved rows of NeoX's `query_key_value`, Falcon's three layouts of it. A split
is described by `TensorRef` (row segments and an optional column range), so readers can stream it without
materialising the fused tensor.

GPT-2 Conv1D weights are stored transposed ([in, out]); canonical views keep the stored orientation, which
changes no metric here (norms, sparsity, cosine and stable rank are all transpose-invariant).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

# role -> coarse kind (the grouping of Tables 4 / Figure 10)
ROLE_KIND: dict[str, str] = {
    "q_proj": "attention", "k_proj": "attention", "v_proj": "attention", "o_proj": "attention",
    "qkv_proj": "attention",  # only when a fused tensor could not be split (unknown layout)
    "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp", "gate_up_proj": "mlp",
    "input_layernorm": "norm", "post_attention_layernorm": "norm", "pre_feedforward_layernorm": "norm",
    "post_feedforward_layernorm": "norm", "q_norm": "norm", "k_norm": "norm", "norm": "norm",
    "embed_tokens": "embedding", "position_embeddings": "embedding",
    "lm_head": "lm_head",
}
#: families whose weight matrices enter the paper's stable-rank average (Table 4: attention QKVO, MLP up/down/gate)
STABLE_RANK_ROLES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# Layer-relative name suffix (without .weight/.bias) -> role. Ordered: first match wins.
_LAYER_ROLES: list[tuple[str, str]] = [
    # fused layouts first (their suffixes would not match the split ones anyway)
    (r"(self_attn|attn|attention|self_attention|mixer)\.(qkv_proj|c_attn|query_key_value|Wqkv|qkv)", "qkv_proj"),
    (r"mlp\.gate_up_proj", "gate_up_proj"),
    (r"(self_attn|attn|attention)\.(q_proj|wq|q|query)", "q_proj"),
    (r"(self_attn|attn|attention)\.(k_proj|wk|k|key)", "k_proj"),
    (r"(self_attn|attn|attention)\.(v_proj|wv|v|value)", "v_proj"),
    (r"(self_attn|attn|attention|self_attention)\.(o_proj|wo|c_proj|dense|out_proj|o)", "o_proj"),
    # a bare `mlp.gate` is a mixture-of-experts router (Qwen-MoE, OLMoE, DeepSeek), not a gate projection: it stays
    # under its own name ("other"), out of the stable-rank average, as do the experts' own projections
    (r"(mlp|feed_forward|ffn)\.(gate_proj|w1)", "gate_proj"),
    (r"(mlp|feed_forward|ffn)\.(up_proj|w3|c_fc|dense_h_to_4h|fc1|fc_in)", "up_proj"),
    (r"(mlp|feed_forward|ffn)\.(down_proj|w2|c_proj|dense_4h_to_h|fc2|fc_out)", "down_proj"),
    # OPT keeps its MLP's two matrices directly in the layer, with no `mlp.` module: `decoder.layers.<i>.fc1`, `fc2`
    (r"fc1", "up_proj"),
    (r"fc2", "down_proj"),
    (r"(self_attn|attn|attention)\.(q_norm|q_layernorm)", "q_norm"),
    (r"(self_attn|attn|attention)\.(k_norm|k_layernorm)", "k_norm"),
    (r"(input_layernorm|ln_1|attention_norm|self_attn_layer_norm|ln_attn)", "input_layernorm"),
    (r"(post_attention_layernorm|ln_2|ffn_norm|final_layer_norm|ln_mlp)", "post_attention_layernorm"),
    (r"pre_feedforward_layernorm", "pre_feedforward_layernorm"),
    (r"post_feedforward_layernorm", "post_feedforward_layernorm"),
]
_GLOBAL_ROLES: list[tuple[str, str]] = [
    (r"(embed_tokens|wte|embed_in|tok_embeddings|word_embeddings)", "embed_tokens"),
    (r"(wpe|embed_positions|position_embeddings)", "position_embeddings"),
    (r"(norm|ln_f|final_layer_norm|final_layernorm|norm_f)", "norm"),
    (r"(lm_head|embed_out|output)", "lm_head"),
]
_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|h|blocks|block|layer)\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class TensorRef:
    """A canonical tensor as a view of one stored tensor.

    `segments`: row ranges along dim 0 of the stored tensor, concatenated in order (None = all rows);
    `columns`: a range along the last dim (None = all). `shape` is the canonical view's shape.
    """

    canonical: str
    key: str
    shape: tuple[int, ...]
    segments: tuple[tuple[int, int], ...] | None = None
    columns: tuple[int, int] | None = None

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1


def parse_name(name: str) -> tuple[int | None, str, str]:
    """(layer index or None, role, 'weight'|'bias'|other leaf) of a stored tensor name; role 'other:<name>'
    when the name is not recognised (it then keeps its own name as canonical)."""
    base, _, leaf = name.rpartition(".")
    if leaf not in ("weight", "bias"):
        base, leaf = name, ""
    m = _LAYER_RE.search(base)
    if m:
        layer, rest = int(m.group(1)), m.group(2)
        for pattern, role in _LAYER_ROLES:
            if re.fullmatch(r"(?:.*\.)?" + pattern, rest):
                return layer, role, leaf
        return layer, "other:" + rest, leaf
    last = base.split(".")[-1] if base else base
    for pattern, role in _GLOBAL_ROLES:
        if re.fullmatch(pattern, last):
            return None, role, leaf
    return None, "other:" + base, leaf


def canonical_name(layer: int | None, role: str, leaf: str = "weight") -> str:
    stem = role.removeprefix("other:")
    name = f"layers.{layer}.{stem}" if layer is not None else stem
    return name if leaf in ("weight", "") else f"{name}.{leaf}"


def role_of(canonical: str) -> str:
    """The family (role) of a canonical name: 'layers.3.q_proj' -> 'q_proj', 'layers.3.q_proj.bias' -> 'q_proj.bias'."""
    parts = canonical.split(".")
    if parts[0] == "layers" and len(parts) >= 3:
        parts = parts[2:]
    return ".".join(parts)


def layer_of(canonical: str) -> int | None:
    parts = canonical.split(".")
    return int(parts[1]) if parts[0] == "layers" and len(parts) >= 3 and parts[1].isdigit() else None


def kind_of(canonical: str) -> str:
    """'attention', 'mlp', 'norm', 'embedding', 'lm_head', or 'other' (biases count with their matrix's kind)."""
    role = role_of(canonical).removesuffix(".bias")
    return ROLE_KIND.get(role, "other")


def is_matrix_family(canonical: str, shape: Sequence[int]) -> bool:
    """Weight matrices of attention and MLP (the paper's "large weight matrices")."""
    return len(shape) == 2 and role_of(canonical) in STABLE_RANK_ROLES


def _attention_dims(config: Mapping[str, Any] | None) -> tuple[int, int, int] | None:
    """(num heads, num kv heads, head dim) from an HF config dict, or None."""
    if not config:
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    heads = text.get("num_attention_heads") or text.get("n_head")
    hidden = text.get("hidden_size") or text.get("n_embd")
    if not heads:
        return None
    kv = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or (hidden // heads if hidden else None)
    if not head_dim:
        return None
    return int(heads), int(kv), int(head_dim)


def split_refs(key: str, shape: Sequence[int], config: Mapping[str, Any] | None = None) -> list[TensorRef]:
    """Canonical views of one stored tensor (one view unless the tensor is a known fused layout)."""
    shape = tuple(int(s) for s in shape)
    layer, role, leaf = parse_name(key)
    model_type = (config or {}).get("model_type", "")
    if role == "qkv_proj" and shape:
        parts = _split_qkv(key, shape, config, model_type)
        if parts is not None:
            return [TensorRef(canonical_name(layer, r, leaf), key, s, seg, col) for r, s, seg, col in parts]
    if role == "gate_up_proj" and len(shape) in (1, 2) and shape[0] % 2 == 0:
        half = shape[0] // 2  # Phi-3: gate first, then up (chunk(2) along the output dim)
        rest = shape[1:]
        return [TensorRef(canonical_name(layer, "gate_proj", leaf), key, (half, *rest), ((0, half),)),
                TensorRef(canonical_name(layer, "up_proj", leaf), key, (half, *rest), ((half, shape[0]),))]
    return [TensorRef(canonical_name(layer, role, leaf), key, shape)]


def _split_qkv(key: str, shape: tuple[int, ...], config, model_type: str):
    dims = _attention_dims(config)
    if key.endswith("c_attn.weight") or (key.endswith("c_attn.bias")):
        # GPT-2 Conv1D: weight [in, 3*hidden], bias [3*hidden]; q, k, v are equal thirds of the last dim
        width = shape[-1]
        if width % 3:
            return None
        w = width // 3
        if len(shape) == 2:
            return [(r, (shape[0], w), None, (i * w, (i + 1) * w))
                    for i, r in enumerate(("q_proj", "k_proj", "v_proj"))]
        return [(r, (w,), ((i * w, (i + 1) * w),), None) for i, r in enumerate(("q_proj", "k_proj", "v_proj"))]
    rest = shape[1:]
    if model_type == "falcon" and dims is not None:
        return _split_falcon(shape, config, dims)
    if model_type in ("gpt_neox", "bloom") and dims is not None:
        # rows grouped per head: [head 0: q(hd) k(hd) v(hd), head 1: ...]
        heads, _, hd = dims
        if shape[0] != 3 * heads * hd:
            return None
        out = []
        for j, r in enumerate(("q_proj", "k_proj", "v_proj")):
            segs = tuple((h * 3 * hd + j * hd, h * 3 * hd + (j + 1) * hd) for h in range(heads))
            out.append((r, (heads * hd, *rest), segs, None))
        return out
    if dims is not None:
        heads, kv, hd = dims
        q, k = heads * hd, kv * hd
        if shape[0] == q + 2 * k:  # Phi-3 and most fused q|k|v layouts: contiguous blocks
            bounds = [(0, q), (q, q + k), (q + k, q + 2 * k)]
            return [(r, (b - a, *rest), ((a, b),), None) for r, (a, b) in zip(("q_proj", "k_proj", "v_proj"), bounds)]
    if shape[0] % 3 == 0 and dims is None:
        third = shape[0] // 3  # no config: assume equal q|k|v blocks (multi-head attention)
        return [(r, (third, *rest), ((i * third, (i + 1) * third),), None)
                for i, r in enumerate(("q_proj", "k_proj", "v_proj"))]
    return None


def _split_falcon(shape: tuple[int, ...], config: Mapping[str, Any], dims: tuple[int, int, int]):
    """Falcon's `query_key_value` rows, in the three layouts its attention reads (as FalconAttention's forward
    splits them): the new decoder architecture groups them per kv head, [group g: its heads/kv query heads, one
    key, one value]; multi-query puts every query head first, then one key and one value; otherwise each head holds
    q, k, v."""
    heads, _, hd = dims
    rest = shape[1:]
    if config.get("new_decoder_architecture"):
        kv = int(config.get("num_kv_heads") or heads)
        per = heads // kv + 2  # rows of hd per group: the group's query heads, its key, its value
        if heads % kv or shape[0] != kv * per * hd:
            return None
        base = [g * per * hd for g in range(kv)]
        q = tuple((b, b + (per - 2) * hd) for b in base)
        k = tuple((b + (per - 2) * hd, b + (per - 1) * hd) for b in base)
        v = tuple((b + (per - 1) * hd, b + per * hd) for b in base)
        return [("q_proj", (heads * hd, *rest), q, None), ("k_proj", (kv * hd, *rest), k, None),
                ("v_proj", (kv * hd, *rest), v, None)]
    if config.get("multi_query", True):
        if shape[0] != (heads + 2) * hd:
            return None
        q = heads * hd
        return [("q_proj", (q, *rest), ((0, q),), None), ("k_proj", (hd, *rest), ((q, q + hd),), None),
                ("v_proj", (hd, *rest), ((q + hd, q + 2 * hd),), None)]
    if shape[0] != 3 * heads * hd:
        return None
    return [(r, (heads * hd, *rest), tuple((h * 3 * hd + j * hd, h * 3 * hd + (j + 1) * hd) for h in range(heads)),
             None) for j, r in enumerate(("q_proj", "k_proj", "v_proj"))]


def canonical_refs(shapes: Mapping[str, Sequence[int]], config: Mapping[str, Any] | None = None,
                   tied_aliases: Iterable[str] = ()) -> dict[str, TensorRef]:
    """Canonical name -> TensorRef for every stored tensor (`shapes`: stored name -> shape).

    `tied_aliases`: stored names that are another tensor under a second name (a tied lm_head); they are
    dropped so tied weights are counted once. A name that would map onto an existing canonical name keeps its
    stored name instead (no silent merging).
    """
    tied = set(tied_aliases)
    out: dict[str, TensorRef] = {}
    for key, shape in shapes.items():
        if key in tied:
            continue
        for ref in split_refs(key, shape, config):
            name = ref.canonical
            if name in out:
                name = key
            out[name] = TensorRef(name, ref.key, ref.shape, ref.segments, ref.columns)
    return out


def tied_lm_head(shapes: Mapping[str, Sequence[int]], config: Mapping[str, Any] | None) -> list[str]:
    """Stored names of an lm_head that is tied to the input embedding (dropped so it is counted once)."""
    from esft.models import ties_word_embeddings

    # only when transformers would tie them (the config's key, else its model_type's default): HF omits a tied
    # lm_head from its files anyway, and an untied one that happens to be stored must be counted
    if not ties_word_embeddings(config):
        return []
    heads = [k for k in shapes if parse_name(k)[1] == "lm_head"]
    embeds = [k for k in shapes if parse_name(k)[1] == "embed_tokens"]
    return heads if embeds else []
