"""The lean decode step (esft.generation.lean_step) on model variants the main tests (tests/test_lean.py) leave out,
and `unsupported_reason` / `fused_attention_reason` branch by branch.

Variants: a Llama with an untied lm_head (the logits must come from the lm_head, not the embedding), a Llama with
attention biases (o_proj has one too: Qwen2's q/k/v-only biases never exercise it), a Qwen3
whose rms_norm_eps is far from the 1e-6 default (the q/k norms must use it, as the HF modules do) and a bf16 Llama
(the exact path computes in bf16 with fp32 RMSNorm statistics, as HF does). The plain step must give the HF
forward's logits bit for bit; the opt-in fast kernels must stay within their ~1e-6 relative tolerance.

Run: pytest -q tests/test_lean_step_audit.py   (~10 s once the kernels are built)
"""

from __future__ import annotations

import pytest
import torch

from esft.generation import lean
from esft.generation.hf_step import hf_prefill
from esft.generation.lean_step import fused_attention_reason, unsupported_reason

from conftest import make_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


def _perturbed(model):
    """Random biases and norm gains (init gives zeros / ones), so that every code path reading them matters."""
    torch.manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval().requires_grad_(False)


def _variant(kind: str):
    if kind == "bf16":
        return _perturbed(make_tiny_model()).to(torch.bfloat16)
    common = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                  tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    if kind == "llama_bias":
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(attention_bias=True, **common))
        assert model.model.layers[0].self_attn.o_proj.bias is not None
    elif kind == "llama_untied":  # an lm_head of its own (Llama-3-8B, Qwen2.5-7B): the tiny models all tie it
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(**{**common, "tie_word_embeddings": False}))
        assert model.lm_head.weight is not model.model.embed_tokens.weight
    elif kind in ("qwen3", "qwen3_eps"):  # q/k norms; with the default eps and another
        from transformers import Qwen3Config, Qwen3ForCausalLM

        model = Qwen3ForCausalLM(Qwen3Config(**common, **({"rms_norm_eps": 0.05} if kind == "qwen3_eps" else {})))
    else:
        raise ValueError(kind)
    return _perturbed(model)


def _steps_against_hf(model, padded: bool, exact: bool, **lean_options) -> None:
    """Prefill 5 rows through HF, then 6 decode steps through both the HF forward (its own cache) and
    `decode_step` (the lean cache loaded from the same prefill); compare the logits at every step."""
    dtype = model.lm_head.weight.dtype
    b, w = 5, 9
    ids = torch.randint(3, 40000, (b, w), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(b, w, dtype=torch.long)
    if padded:
        mask[::2, :4] = 0
    with torch.inference_mode():
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        logits, hf_cache = hf_prefill(model, ids, mask, pos)
        lm = lean.LeanModel(model, **lean_options)
        cache = lean.KVCache(lm, b, w + 2, dtype, "cpu", key_tile=lm.key_tile)
        cache.load_prefill(hf_cache, mask)
        cos, sin = lm.rope_tables(64, logits)
        token, p = logits.argmax(-1), pos[:, -1] + 1
        for step in range(6):
            mask = torch.cat([mask, mask.new_ones(b, 1)], 1)
            ref = model(input_ids=token[:, None], attention_mask=mask, position_ids=p[:, None], cache=hf_cache,
                        use_cache=True).logits[:, -1]
            cache.ensure(cache.length + 1)
            ours = lean.decode_step(lm, cache, token, p, cos, sin)
            assert cache.length == w + step + 1
            if exact:
                assert torch.equal(ours, ref), (step, (ours - ref).abs().max())
            else:
                assert torch.allclose(ours, ref, atol=1e-5, rtol=1e-5), (step, (ours - ref).abs().max())
            token, p = ref.argmax(-1), p + 1


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("kind", ["qwen3", "llama_bias", "qwen3_eps", "bf16", "llama_untied"])
def test_plain_step_logits_bit_identical_to_hf_forward(kind, padded):
    _steps_against_hf(_variant(kind), padded, exact=True)


def _fast_options() -> list[dict]:
    options = []
    if lean.fused_attention_reason(torch.float32) is None:
        options.append(dict(fused_attention=True))
        if lean.packed_linear_reason(torch.float32) is None:
            options.append(dict(packed=True, fused_attention=True))  # stacked q|k|v, gate|up and compiled glue
    if not options:
        pytest.skip("the compiled attention kernel is not available here")
    return options


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("kind", ["llama_bias", "qwen3_eps", "llama_untied"])
def test_fast_step_logits_close_to_hf_forward(kind, padded):
    model = _variant(kind)
    for options in _fast_options():
        _steps_against_hf(model, padded, exact=False, **options)


# ---- unsupported_reason / fused_attention_reason -----------------------------------------------------------------

@pytest.mark.parametrize("change, words", [
    (dict(model_type="gpt2"), "model_type"),
    (dict(_attn_implementation="eager"), "eager"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(mlp_bias=True), "mlp_bias"),
    (dict(layer_types=["full_attention", "sliding_attention"]), "sliding"),
    (dict(use_sliding_window=True), "sliding"),
    (dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}), "dynamic"),
    (dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}), "longrope"),
])
def test_each_unsupported_config_has_its_reason(change, words):
    model = make_tiny_model()
    for key, value in change.items():
        setattr(model.config, key, value)
    reason = unsupported_reason(model)
    assert reason is not None and words in reason
    with pytest.raises(ValueError, match="does not support"):
        lean.LeanModel(model)


def test_supported_variants_have_no_reason():
    model = make_tiny_model()
    model.config.layer_types = ["full_attention", "full_attention"]
    model.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}  # position-independent
    assert unsupported_reason(model) is None


def test_parameters_off_the_cpu_are_refused():
    model = make_tiny_model().to("meta")
    assert "CPU" in unsupported_reason(model)


def test_pre_hooks_and_global_hooks_force_the_hf_forward_unless_ignored():
    """A forward pre-hook on any submodule and a global module hook would not run under the lean step's direct
    F.linear calls: both are refused, except where the caller re-applies its hooks itself (ignore_hooks)."""
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    model = make_tiny_model()
    handle = model.model.layers[1].self_attn.v_proj.register_forward_pre_hook(lambda m, args: None)
    try:
        assert "forward hooks on model.layers.1.self_attn.v_proj" == unsupported_reason(model)
        assert unsupported_reason(model, ignore_hooks=True) is None
    finally:
        handle.remove()
    assert unsupported_reason(model) is None
    for register in (register_module_forward_hook, register_module_forward_pre_hook):
        handle = register(lambda *args: None)
        try:
            assert "global" in unsupported_reason(model)
            assert unsupported_reason(model, ignore_hooks=True) is None
        finally:
            handle.remove()
    assert unsupported_reason(model) is None


def test_fused_attention_reason_accepts_fp32_and_bf16_weights_only():
    """The kernel runs fp32 activations for fp32 or bf16 weights: both dtypes get the same answer (None where the
    kernel builds), any other dtype a reason naming it."""
    assert fused_attention_reason(torch.bfloat16) == fused_attention_reason(torch.float32)
    assert "float16" in fused_attention_reason(torch.float16)


def test_bf16_packed_weights_are_refused_without_the_fused_kernel_or_with_a_delta():
    """bf16 packed weights take fp32 activations only on the stacked path (packed + fused attention, no low-rank
    delta): LeanModel refuses them elsewhere rather than run bf16 matmuls on a path that never widens them."""
    if lean.packed_linear_reason(torch.bfloat16) is not None:
        pytest.skip("this torch's oneDNN has no bf16 packed linear")
    model = _variant("bf16")
    with pytest.raises(ValueError, match="need fused_attention and no low-rank delta"):
        lean.LeanModel(model, packed=True)
    if lean.fused_attention_reason(torch.bfloat16) is None:
        with pytest.raises(ValueError, match="need fused_attention and no low-rank delta"):
            lean.LeanModel(model, packed=True, fused_attention=True, delta=object())
        assert lean.LeanModel(model, packed=True, fused_attention=True).low_precision
