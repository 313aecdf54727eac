"""Batched generation. Run: `pytest tests/test_generation.py -q`.

The esft decode loop (drops finished rows from the batch and KV cache) must give exactly the greedy tokens of
`model.generate` on the same inputs, whatever the batch composition.
"""

from __future__ import annotations

import pytest
import torch

from esft.generation import GenerationConfig, encode_prompts, generate, left_pad, sample_next

PROMPTS = [
    [{"role": "system", "content": "Answer with \\boxed{yes} or \\boxed{no}."},
     {"role": "user", "content": "Is water wet?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three primes and explain."}],
    "plain text prompt without template",
    [{"role": "user", "content": "x"}],
]


def test_left_pad_and_mask():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=2, device="cpu")
    assert ids.tolist() == [[5, 6, 7], [2, 2, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_chat_template_ends_with_generation_prompt(tokenizer):
    (ids,) = encode_prompts(tokenizer, PROMPTS[:1])
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


def test_esft_engine_matches_hf_generate_greedy(tiny_model, tokenizer):
    # An eos-heavy random model: bias the eos logit so some rows stop early and get dropped mid-batch.
    with torch.no_grad():
        tiny_model.lm_head.weight[2] += 0.02 * torch.randn_like(tiny_model.lm_head.weight[2])
    cfg = dict(max_new_tokens=24, batch_size=4)
    ours = generate(tiny_model, tokenizer, PROMPTS, GenerationConfig(engine="esft", **cfg))
    ref = generate(tiny_model, tokenizer, PROMPTS, GenerationConfig(engine="hf", **cfg))
    assert [g.completion_ids for g in ours] == [g.completion_ids for g in ref]
    assert [g.text for g in ours] == [g.text for g in ref]
    assert all(len(g.completion_ids) <= 24 for g in ours)


def test_hf_forward_step_matches_hf_generate_greedy(tiny_model, tokenizer):
    """lean=False decodes through HFStep (the model's own forward with its DynamicCache): the greedy tokens of
    `model.generate` on left-padded prompts of different lengths, rows dropped as they finish."""
    with torch.no_grad():
        tiny_model.lm_head.weight[2] += 0.1 * torch.randn_like(tiny_model.lm_head.weight[2])
    cfg = dict(max_new_tokens=24, batch_size=4)
    ours = generate(tiny_model, tokenizer, PROMPTS, GenerationConfig(engine="esft", lean=False, **cfg))
    ref = generate(tiny_model, tokenizer, PROMPTS, GenerationConfig(engine="hf", **cfg))
    assert [g.completion_ids for g in ours] == [g.completion_ids for g in ref]
    assert len({len(g.completion_ids) for g in ref}) > 1  # some row finished early and was dropped


def test_hf_engine_ignores_the_models_own_generation_defaults(tiny_model, tokenizer):
    """model.generate fills what a call leaves unset from the model's generation_config.json (Qwen2.5 Instruct
    ships repetition_penalty 1.05-1.1, sampling settings): the hf engine's greedy tokens stay plain greedy, those
    of the esft engine, whatever the model's file asks for."""
    cfg = dict(max_new_tokens=16, batch_size=4)
    ours = generate(tiny_model, tokenizer, PROMPTS, GenerationConfig(engine="esft", **cfg))
    tiny_model.generation_config.update(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.3,
                                        no_repeat_ngram_size=2, min_length=40)
    ref = generate(tiny_model, tokenizer, PROMPTS, GenerationConfig(engine="hf", **cfg))
    assert [g.completion_ids for g in ref] == [g.completion_ids for g in ours]
    assert any(len(set(g.completion_ids)) < len(g.completion_ids) for g in ours)  # repeats a penalty would change


def test_a_neutral_setting_this_transformers_lacks_is_not_passed_to_generate(tiny_model, tokenizer, monkeypatch):
    """generate() refuses a keyword its GenerationConfig does not know: a neutral setting a later transformers
    drops (or one an older release never had) is left out, not passed."""
    import esft.generation.engine as engine

    monkeypatch.setitem(engine._NO_MODEL_DEFAULTS, "penalty_of_another_release", 1.0)
    out = generate(tiny_model, tokenizer, PROMPTS[:2], GenerationConfig(engine="hf", max_new_tokens=4))
    assert [len(g.completion_ids) for g in out] == [4, 4]


def test_a_tokenizer_without_pad_or_eos_is_refused_by_name(tiny_model, tokenizer):
    """No pad token and no end-of-sequence id anywhere: a ValueError that says what to set, not an IndexError."""
    class NoEnd:  # the shared tokenizer with neither id (its own special tokens are left alone)
        pad_token_id = eos_token_id = None

        def __getattr__(self, name):
            return getattr(tokenizer, name)

    tiny_model.generation_config.eos_token_id = None
    with pytest.raises(ValueError, match="set tokenizer.pad_token"):
        generate(tiny_model, NoEnd(), PROMPTS[:1], GenerationConfig(max_new_tokens=2))


def test_hf_step_gives_the_models_own_logits_with_the_cache(tiny_model, tokenizer):
    """Prefill and each cached HFStep give the logits of one uncached forward over the whole left-padded sequence
    (mask and positions as `decode_hf` builds them), the row dropped by `keep` included."""
    from esft.generation.hf_step import HFStep, hf_prefill

    ids, mask = left_pad(encode_prompts(tokenizer, PROMPTS[:3]), tokenizer.pad_token_id, "cpu")
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits, cache = hf_prefill(tiny_model, ids, mask, pos)
        step = HFStep(tiny_model, cache, mask, pos[:, -1] + 1)
        for k in range(4):
            full = tiny_model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1, :]
            torch.testing.assert_close(logits, full, atol=1e-4, rtol=1e-4)
            token = torch.tensor([100 + k] * len(ids))
            if k == 2:  # drop the middle row, as decode_loop does for a finished one
                keep = torch.tensor([0, 2])
                step.keep(keep)
                ids, mask, pos, token = ids[keep], mask[keep], pos[keep], token[keep]
            ids = torch.cat([ids, token[:, None]], dim=1)
            mask = torch.cat([mask, mask.new_ones((len(ids), 1))], dim=1)
            pos = torch.cat([pos, pos[:, -1:] + 1], dim=1)
            logits = step(token, k)


def test_hf_decode_positions_count_real_tokens_from_zero(tiny_model, tokenizer):
    """lean=False: each row's positions are 0.. over its real (unpadded) prompt tokens, as `model.generate` numbers
    them, and every generated token takes the next one (no repeat of the prompt's last position)."""
    import functools

    seen = []
    forward = tiny_model.forward

    @functools.wraps(forward)
    def recording(*args, **kwargs):
        seen.append(kwargs["position_ids"].clone())
        return forward(*args, **kwargs)

    tiny_model.forward = recording
    lengths = [len(x) for x in encode_prompts(tokenizer, PROMPTS[2:4])]
    generate(tiny_model, tokenizer, PROMPTS[2:4], GenerationConfig(max_new_tokens=3, min_new_tokens=3,
                                                                   batch_size=2, lean=False))
    assert lengths[0] != lengths[1] and len(seen) == 3
    rows = sorted(lengths, reverse=True)  # the engine batches rows longest first
    assert [row[-n:].tolist() for row, n in zip(seen[0], rows)] == [list(range(n)) for n in rows]
    assert [p[:, 0].tolist() for p in seen[1:]] == [rows, [n + 1 for n in rows]]


def test_order_preserved_and_batch_size_invariant(tiny_model, tokenizer):
    a = generate(tiny_model, tokenizer, PROMPTS, GenerationConfig(max_new_tokens=8, batch_size=1))
    b = generate(tiny_model, tokenizer, PROMPTS[::-1], GenerationConfig(max_new_tokens=8, batch_size=3))
    assert [g.completion_ids for g in a] == [g.completion_ids for g in b[::-1]]
    assert [g.prompt_tokens for g in a] == [len(x) for x in encode_prompts(tokenizer, PROMPTS)]


def test_eos_truncation_and_finished_flag(tiny_model, tokenizer):
    with torch.no_grad():  # make eos (id 2) the argmax everywhere
        tiny_model.lm_head.weight[2] = tiny_model.model.embed_tokens.weight.abs().max() * 50
    (g,) = generate(tiny_model, tokenizer, PROMPTS[:1], GenerationConfig(max_new_tokens=5))
    assert g.completion_ids == [2] and g.finished and g.text == ""


def test_sampling_is_seeded_and_respects_top_p():
    logits = torch.tensor([[5.0, 4.0, -10.0, -10.0]] * 200)
    g1 = torch.Generator().manual_seed(1)
    g2 = torch.Generator().manual_seed(1)
    a = sample_next(logits, 1.0, 0.9, g1)
    b = sample_next(logits, 1.0, 0.9, g2)
    assert torch.equal(a, b)
    assert set(a.tolist()) <= {0, 1} and 0 in a.tolist() and 1 in a.tolist()
    assert set(sample_next(logits, 1.0, 0.5, g1).tolist()) == {0}  # nucleus of mass 0.5 is the top token
    assert sample_next(logits, 0.0, 1.0, None).tolist() == [0] * 200


def _flat_tiny_model():
    """The tiny model with its logits scaled down: temperature-1 samples spread over many tokens."""
    from conftest import make_tiny_model

    model = make_tiny_model()
    with torch.no_grad():
        model.lm_head.weight.mul_(0.1)
    return model


def test_sampled_streams_are_per_prompt_not_per_batch(tokenizer):
    """Each prompt samples from its own stream (seed, prompt index): a prompt repeated in other batches gets its
    own samples (one generator per batch, restarted from the seed, would give every copy of a prompt at batch_size
    1 the same completion), and a prompt's samples do not depend on batch_size."""
    model = _flat_tiny_model()
    q = [{"role": "user", "content": "Tell me a random animal."}]
    prompts = [q, "short", q, "a somewhat longer plain prompt here", q]
    runs = {bs: [g.completion_ids for g in generate(model, tokenizer, prompts, GenerationConfig(
        max_new_tokens=6, temperature=1.0, batch_size=bs, seed=3))] for bs in (1, 2, 5)}
    assert runs[1] == runs[2] == runs[5]
    copies = [runs[1][i] for i in (0, 2, 4)]
    assert len({tuple(c) for c in copies}) == 3  # three independent samples of the same prompt
    again = generate(model, tokenizer, prompts, GenerationConfig(max_new_tokens=6, temperature=1.0, batch_size=2,
                                                                  seed=3))
    assert [g.completion_ids for g in again] == runs[1]  # same seed, same samples
    other = generate(model, tokenizer, prompts, GenerationConfig(max_new_tokens=6, temperature=1.0, seed=4))
    assert [g.completion_ids for g in other] != runs[1]


def test_hf_engine_sampling_leaves_the_callers_random_state(tokenizer):
    model = _flat_tiny_model()
    torch.manual_seed(123)
    before = torch.get_rng_state()
    cfg = GenerationConfig(max_new_tokens=3, temperature=1.0, engine="hf", seed=9)
    a = generate(model, tokenizer, PROMPTS[:2], cfg)
    assert torch.equal(torch.get_rng_state(), before)
    b = generate(model, tokenizer, PROMPTS[:2], cfg)
    assert [g.completion_ids for g in a] == [g.completion_ids for g in b]


def test_inverse_cdf_draws_follow_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 4))
    edges = torch.tensor([0.0, 0.49, 0.51, 1 - 1e-12], dtype=torch.float64)  # the last rounds to 1.0 in fp32
    assert sample_next(logits, 1.0, 1.0, None, uniforms=edges).tolist() == [0, 0, 1, 3]
    # top_p 0.7 keeps {0, 1} (mass 0.8): a draw near 1 stays inside the nucleus
    assert sample_next(logits, 1.0, 0.7, None, uniforms=edges).tolist() == [0, 0, 0, 1]
    u = torch.rand(20000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    picks = sample_next(logits[:1].expand(20000, -1), 1.0, 1.0, None, uniforms=u)
    freq = torch.bincount(picks, minlength=4).double() / 20000
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64), atol=0.015)


def test_empty_prompt_is_refused_by_name(tiny_model, tokenizer):
    """A prompt of no tokens (an empty plain-text prompt) has nothing to predict from: it is refused, naming it,
    instead of being generated from a fully masked row (mixed batches) or failing inside the model's forward."""
    for prompts in (["hello there", ""], [""]):
        for engine in ("esft", "hf"):
            with pytest.raises(ValueError, match=f"prompt {len(prompts) - 1} encodes to no tokens"):
                generate(tiny_model, tokenizer, prompts, GenerationConfig(max_new_tokens=2, engine=engine))
    (g,) = generate(tiny_model, tokenizer, [" "], GenerationConfig(max_new_tokens=2))  # whitespace is a token
    assert g.prompt_tokens == 1 and len(g.completion_ids) == 2


def test_hf_engine_sampling_is_seeded_by_the_config_not_the_callers_state(tokenizer):
    """The hf engine seeds torch's generator with config.seed for the call: the caller's random state before the
    call does not change the samples, config.seed does."""
    model = _flat_tiny_model()
    cfg = GenerationConfig(max_new_tokens=4, temperature=1.0, engine="hf", seed=9)
    runs = []
    for state in (1, 2):
        torch.manual_seed(state)
        runs.append([g.completion_ids for g in generate(model, tokenizer, PROMPTS[:2], cfg)])
    assert runs[0] == runs[1]
    other = generate(model, tokenizer, PROMPTS[:2], GenerationConfig(max_new_tokens=4, temperature=1.0, engine="hf",
                                                                      seed=10))
    assert [g.completion_ids for g in other] != runs[0]


def test_hf_engine_samples_beyond_transformers_default_top_k(tokenizer):
    """temperature > 0 and top_p 1 sample the whole vocabulary on the hf engine too (top_k off: transformers would
    otherwise keep only the 50 most likely tokens). On the flat tiny model nearly every sampled token ranks far
    below the top 50 of its step's logits."""
    model = _flat_tiny_model()
    (g,) = generate(model, tokenizer, ["a plain prompt"], GenerationConfig(max_new_tokens=6, temperature=1.0,
                                                                            engine="hf", seed=0))
    (prompt,) = encode_prompts(tokenizer, ["a plain prompt"])
    with torch.no_grad():
        logits = model(torch.tensor([prompt + g.completion_ids])).logits[0, len(prompt) - 1: -1]
    ranks = [int((row > row[t]).sum()) for row, t in zip(logits, g.completion_ids)]
    assert max(ranks) >= 50, ranks


def test_lean_false_steps_through_the_hf_forward_once_per_token(tiny_model, tokenizer):
    """lean=False decodes through the model's forward: the prefill and one forward per further token (the last
    token costs none). The lean step calls the forward for the prefill only."""
    import functools

    calls = []
    forward = tiny_model.forward

    @functools.wraps(forward)
    def counting(*args, **kwargs):
        calls.append(1)
        return forward(*args, **kwargs)

    tiny_model.forward = counting
    for lean, forwards in ((False, 4), (True, 1)):
        calls.clear()
        (g,) = generate(tiny_model, tokenizer, PROMPTS[:1], GenerationConfig(max_new_tokens=4, min_new_tokens=4,
                                                                             lean=lean))
        assert len(calls) == forwards, lean
        assert len(g.completion_ids) == 4 and not g.finished  # ended by the length limit, not by eos


def test_budget_and_batch_size_changed_after_construction_are_still_refused(tiny_model, tokenizer):
    """GenerationConfig checks its fields when built; `generate` checks the two it divides by or loops over again,
    so a config edited afterwards (a plain attribute write) is refused rather than returning empty completions."""
    for field in ("max_new_tokens", "batch_size"):
        cfg = GenerationConfig()
        setattr(cfg, field, 0)
        with pytest.raises(ValueError, match=f"{field} must be >= 1"):
            generate(tiny_model, tokenizer, ["hello"], cfg)


@pytest.mark.parametrize("engine", ["esft", "hf"])
def test_ctrl_c_clears_the_progress_bar_before_anything_else_is_printed(tiny_model, tokenizer, monkeypatch, capsys,
                                                                       engine):
    """Ctrl-C during generation: the bar (leave=False) is cleared before the caller's message, not after it (the
    interrupted `esft eval` printed its message and then a stray cleared bar line)."""
    import sys

    import esft.generation.engine as engine_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(engine_module, "decode", interrupted)
    monkeypatch.setattr(engine_module, "_hf_generate", interrupted)
    try:
        generate(tiny_model, tokenizer, ["Hi", "Hello there"], GenerationConfig(max_new_tokens=2, engine=engine),
                 progress=True)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    err = capsys.readouterr().err
    assert err.startswith("\rgenerate:") and err.endswith(" \rinterrupted\n"), repr(err)
