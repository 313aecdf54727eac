"""`generate`: prompts in, completions out, through the esft engine (`decode`) or `model.generate`.

Prompts are tokenised once; rows are sorted by prompt length so a batch pads little; completions come back in
the caller's order, as ids (for token-aligned KL) and as text.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import torch

from esft.generation.cancel import check_cancelled
from esft.generation.generation_config import Generation, GenerationConfig
from esft.generation.hf_step import decode_hf
from esft.generation.lean import lean_decode
from esft.generation.lean_step import unsupported_reason
from esft.generation.packed import fill_released, releasing
from esft.generation.prompts import encode_prompts, eos_token_ids, left_pad, to_generation
from esft.tasks.base import Messages


@torch.inference_mode()
def generate(
    model,
    tokenizer,
    prompts: Sequence[Messages | str],
    config: GenerationConfig | None = None,
    progress: bool = False,
    prompt_ids: list[list[int]] | None = None,
) -> list[Generation]:
    """Generate one completion per prompt; results in the order of `prompts`.

    Sampling (temperature > 0) on the esft engine draws prompt i's tokens from its own stream, keyed by
    (config.seed, i): a prompt's samples do not depend on batch_size or on which prompts share its batch (beyond
    the logits' rounding), and a prompt repeated in one call gets independent samples. The "hf" engine samples
    from torch's global generator, seeded with config.seed for this call and restored afterwards."""
    config = config or GenerationConfig()
    if config.max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    if config.batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    encoded = prompt_ids if prompt_ids is not None else encode_prompts(tokenizer, prompts)
    empty = [i for i, ids in enumerate(encoded) if len(ids) == 0]
    if empty:  # a row with no tokens has no position to predict from: its whole attention row would be masked
        raise ValueError(f"prompt {empty[0]} encodes to no tokens ({len(empty)} empty prompt(s)); give each prompt "
                         "at least one token")
    eos = eos_token_ids(model, tokenizer)
    if tokenizer.pad_token_id is None and not eos:
        raise ValueError("the tokenizer has no pad token and neither it nor the model's generation_config names an "
                         "end-of-sequence token: set tokenizer.pad_token (and eos_token, or no completion ends "
                         "before max_new_tokens)")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    device = next(model.parameters()).device
    batches = generation_batches(encoded, config.batch_size)
    results: list[Generation | None] = [None] * len(encoded)
    hf_sampling = config.temperature > 0 and config.engine == "hf"
    # model.generate samples from the global generator: seeded for this call, the caller's state restored after it
    forked = torch.random.fork_rng(devices=[device] if device.type == "cuda" else []) if hf_sampling else None
    with forked or contextlib.nullcontext():
        if hf_sampling:
            torch.manual_seed(config.seed)
        _run_batches(model, tokenizer, encoded, batches, config, pad_id, eos, device, results, progress)
    return results  # type: ignore[return-value]


def _run_batches(model, tokenizer, encoded, batches, config, pad_id, eos, device, results, progress) -> None:
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(encoded), desc="generate", unit="prompt", leave=False)
    try:
        _each_batch(model, tokenizer, encoded, batches, config, pad_id, eos, device, results, bar)
    finally:  # cleared before whatever follows is printed, Ctrl-C's message too
        if bar is not None:
            bar.close()


def _each_batch(model, tokenizer, encoded, batches, config, pad_id, eos, device, results, bar) -> None:
    for number, idx in enumerate(batches):
        check_cancelled()
        input_ids, attention_mask = left_pad([encoded[i] for i in idx], pad_id, device)
        if config.engine == "hf":
            fill_released()  # model.generate reads every weight
            new = _hf_generate(model, input_ids, attention_mask, config, pad_id, eos)
        elif config.engine == "esft":
            # weights freed once packed (`releasing`, an ES lane's copy) are packed again by the next batch: freed
            # by the last batch only
            with contextlib.nullcontext() if number == len(batches) - 1 else releasing(()):
                new = decode(model, input_ids, attention_mask, config, eos, row_keys=idx)
        else:
            raise ValueError(f"unknown generation engine {config.engine!r}; use 'esft' or 'hf'")
        for row, i in zip(new, idx):
            results[i] = to_generation(row, eos, tokenizer, len(encoded[i]))
        if bar is not None:
            bar.update(len(idx))


def generation_batches(encoded: Sequence[Sequence[int]], batch_size: int) -> list[list[int]]:
    """The batches `generate` runs, as prompt indices: longest prompt first (a stable sort, so ties keep their
    order), `batch_size` at a time, so a batch pads little. A batch's greedy completions depend on that batch
    alone: whole batches handed, in this order, to separate `generate` calls come back the same."""
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]), reverse=True)
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


#: `model.generate` fills every setting a call leaves unset from the model's generation_config.json (Qwen2.5
#: Instruct's repetition_penalty 1.05-1.1, a min_p, a num_beams...): set to "off", so the hf engine decodes as
#: GenerationConfig says (greedy or temperature / top_p), as the esft engine does. (min_length: min_new_tokens,
#: always passed, replaces it.)
_NO_MODEL_DEFAULTS = dict(
    num_beams=1, num_return_sequences=1, repetition_penalty=1.0, no_repeat_ngram_size=0, bad_words_ids=None,
    sequence_bias=None, suppress_tokens=None, begin_suppress_tokens=None, forced_bos_token_id=None,
    forced_eos_token_id=None, exponential_decay_length_penalty=None, min_p=None, typical_p=1.0,
    epsilon_cutoff=0.0, eta_cutoff=0.0, top_h=None, guidance_scale=None, watermarking_config=None, stop_strings=None,
    max_time=None)


def _known_generation_flags() -> dict[str, Any]:
    """The settings of _NO_MODEL_DEFAULTS that this transformers' GenerationConfig has: generate() refuses a
    keyword it does not know, and a later release may drop one (transformers is not pinned above)."""
    from transformers import GenerationConfig as HFGenerationConfig

    known = HFGenerationConfig()
    return {k: v for k, v in _NO_MODEL_DEFAULTS.items() if hasattr(known, k)}


def _hf_generate(model, input_ids, attention_mask, config, pad_id, eos) -> list[list[int]]:
    do_sample = config.temperature > 0
    kwargs = dict(_known_generation_flags(), max_new_tokens=config.max_new_tokens, min_new_tokens=config.min_new_tokens,
                  do_sample=do_sample, pad_token_id=pad_id, eos_token_id=eos)
    if do_sample:
        kwargs.update(temperature=config.temperature, top_p=config.top_p, top_k=0)
    else:
        kwargs.update(temperature=None, top_p=None, top_k=None)
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    return out[:, input_ids.shape[1]:].tolist()


def decode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, config: GenerationConfig,
           eos: list[int], delta: Any = None, on_keep: Callable[[torch.Tensor], None] | None = None,
           row_keys: Sequence[int] | None = None) -> list[list[int]]:
    """The esft engine on one left-padded batch: prefill once, then `loop.decode_loop`, which drops finished rows
    from the batch and the KV cache. Supported architectures take the lean step (`lean.lean_decode`,
    config.lean); others step through the HF forward (`hf_step.decode_hf`). Greedy outputs equal
    `model.generate`'s (tested).

    `delta` (a low-rank population, esft.es.lowrank.PopulationPerturbation) owns forward hooks that perturb each
    row; the lean step, which bypasses module hooks, then adds the same terms through `delta` itself.
    `on_keep(indices)` is called with the rows kept whenever finished rows are dropped. `row_keys` key the rows'
    sampling streams with config.seed (`generate` passes the prompts' indices; default: the rows' positions).
    """
    if config.lean and unsupported_reason(model, ignore_hooks=delta is not None) is None:
        return lean_decode(model, input_ids, attention_mask, config, eos, delta=delta, on_keep=on_keep,
                           row_keys=row_keys)
    fill_released()  # the HF forward reads every weight
    return decode_hf(model, input_ids, attention_mask, config, eos, on_keep=on_keep, row_keys=row_keys)
