"""Batched generation from chat prompts, shared by evaluation, ES members and analyses.

Prompts are rendered with the model's chat template and tokenised once; rows are sorted by prompt length so a
batch pads little; every batch is left-padded with an explicit attention mask (on pad == eos models such
as Llama and SmolLM2, masking by `ids != pad` would hide real eos tokens). Completions are returned as ids
(for token-aligned KL) and as text, in the caller's order.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from esft.tasks.base import Messages


@dataclass
class GenerationConfig:
    """How to generate. Names follow TRL / transformers where the concept is the same."""

    max_new_tokens: int = 1024
    """Upper bound on generated tokens per completion (the paper uses 1024)."""
    temperature: float = 0.0
    """0 means greedy decoding (the paper's evaluation protocol); > 0 samples."""
    top_p: float = 1.0
    """Nucleus sampling mass when temperature > 0."""
    batch_size: int = 32
    """Prompts per forward batch."""
    seed: int = 0
    """Seed for sampling (unused when greedy)."""
    engine: str = "esft"
    """"esft": our decode loop that drops finished rows from the batch and KV cache; "hf": `model.generate`."""
    min_new_tokens: int = 0
    """eos is suppressed before this many tokens (as transformers' `min_new_tokens`); benchmarks use it to force
    full-length completions."""
    lean: bool = True
    """esft engine only: use the lean decode step (`esft.lean`: preallocated KV cache, no per-step mask/cache
    plumbing) for the models it supports; others, and lean=False, step through the HF forward."""
    share_prefix: bool = False
    """lean path only: prefill the prompts' common token prefix (system prompt + template) once and reuse its KV
    for every row. Saves that share of the prefill, but logits then match a plain prefill to ~1e-6 relative
    rather than bit for bit, so greedy outputs can differ from `model.generate` on near-ties (opt-in)."""
    prefill_buckets: int = 1
    """lean path only: prefill the prompts (their remainders after a shared prefix) in up to this many groups of
    similar length instead of one batch padded to the longest; > 1 has the same ~1e-6 caveat as share_prefix."""
    packed_linear: bool = False
    """lean path only, fp32 CPU: run the decode matmuls through oneDNN with the weights reordered once per call
    (`esft.lean.LeanModel(packed=True)`): ~1.5x faster matmuls at small batch on CPU, same ~1e-6 caveat as
    share_prefix (another summation order). Ignored, with a warning, where torch has no oneDNN."""
    fused_attention: bool = False
    """lean path only, fp32 CPU: rotary, KV-cache append and attention of each decode step in one compiled kernel
    (`esft.kernels`, built with the local C++ compiler on first use, ~30 s): ~2x faster attention than torch's
    SDPA for one-token queries; ~1e-6 relative differences as share_prefix. Ignored, with a warning, where the
    kernel cannot be built (no compiler). With packed_linear it also stacks q|k|v and gate|up into one matmul
    each and runs the RMSNorm / residual / SwiGLU glue in compiled code."""
    screened_lm_head: bool = False
    """lean path, greedy decoding only, with packed_linear and fused_attention, on CPUs with fast bf16 (AVX512-BF16
    or AMX): compute the lm_head in bf16 first and the exact fp32 logits only for tokens a rigorous rounding-error
    bound cannot exclude as the argmax (`esft.lean.LMHeadScreen`; ~2 per row). The argmax is unchanged; the
    other logits are returned as -inf. Ignored when sampling, and with a warning where unavailable."""


@dataclass
class Generation:
    text: str
    """Decoded completion without special tokens."""
    completion_ids: list[int] = field(default_factory=list)
    """Generated token ids, up to and including the first eos."""
    prompt_tokens: int = 0
    """Number of prompt tokens (after the chat template)."""
    finished: bool = False
    """True when the completion ended with an eos token rather than the length limit."""


def eos_token_ids(model, tokenizer) -> list[int]:
    ids: set[int] = set()
    for source in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if source is None:
            continue
        ids.update(source if isinstance(source, (list, tuple)) else [source])
    return sorted(ids)


def encode_prompts(tokenizer, prompts: Sequence[Messages | str]) -> list[list[int]]:
    """Token ids of each prompt: chat messages through the chat template (with the generation prompt)."""
    out = []
    for p in prompts:
        if isinstance(p, str):
            out.append(tokenizer(p, add_special_tokens=False)["input_ids"])
        else:
            ids = tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "keys"):  # some tokenizers return a BatchEncoding
                ids = ids["input_ids"]
            out.append(list(ids))
    return out


def left_pad(batch: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, row in enumerate(batch):
        if row:
            ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row):] = 1
    return ids.to(device), mask.to(device)


class GenerationCancelled(Exception):
    """Raised by a generation whose thread's cancel event was set (see `cancel_on`)."""


_CANCEL = threading.local()


@contextmanager
def cancel_on(event: threading.Event) -> Iterator[None]:
    """Within this block, generation on the calling thread raises `GenerationCancelled` soon after `event` is set:
    the esft engine checks once per decode step, both engines between batches (a `model.generate` call runs to its
    end). How a parallel lane of `esft.es.executor.LocalExecutor` stops when another lane fails or Ctrl-C
    arrives."""
    previous = getattr(_CANCEL, "event", None)
    _CANCEL.event = event
    try:
        yield
    finally:
        _CANCEL.event = previous


def check_cancelled() -> None:
    """Raise `GenerationCancelled` if this thread's `cancel_on` event is set (a thread-local read: ~0.1 us)."""
    event = getattr(_CANCEL, "event", None)
    if event is not None and event.is_set():
        raise GenerationCancelled("generation cancelled")


@torch.inference_mode()
def generate(
    model,
    tokenizer,
    prompts: Sequence[Messages | str],
    config: GenerationConfig | None = None,
    progress: bool = False,
    prompt_ids: list[list[int]] | None = None,
) -> list[Generation]:
    """Generate one completion per prompt; results in the order of `prompts`."""
    config = config or GenerationConfig()
    if config.max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    if config.batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    encoded = prompt_ids if prompt_ids is not None else encode_prompts(tokenizer, prompts)
    eos = eos_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    device = next(model.parameters()).device
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]), reverse=True)
    results: list[Generation | None] = [None] * len(encoded)
    if config.temperature > 0 and config.engine == "hf":
        torch.manual_seed(config.seed)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(encoded), desc="generate", unit="prompt", leave=False)
    for start in range(0, len(order), config.batch_size):
        check_cancelled()
        idx = order[start : start + config.batch_size]
        input_ids, attention_mask = left_pad([encoded[i] for i in idx], pad_id, device)
        if config.engine == "hf":
            new = _hf_generate(model, input_ids, attention_mask, config, pad_id, eos)
        elif config.engine == "esft":
            new = decode(model, input_ids, attention_mask, config, eos)
        else:
            raise ValueError(f"unknown generation engine {config.engine!r}; use 'esft' or 'hf'")
        for row, i in zip(new, idx):
            results[i] = _finish(row, eos, tokenizer, len(encoded[i]))
        if bar is not None:
            bar.update(len(idx))
    if bar is not None:
        bar.close()
    return results  # type: ignore[return-value]


def _hf_generate(model, input_ids, attention_mask, config, pad_id, eos) -> list[list[int]]:
    do_sample = config.temperature > 0
    kwargs = dict(max_new_tokens=config.max_new_tokens, do_sample=do_sample, pad_token_id=pad_id, eos_token_id=eos)
    if config.min_new_tokens:
        kwargs["min_new_tokens"] = config.min_new_tokens
    if do_sample:
        kwargs.update(temperature=config.temperature, top_p=config.top_p, top_k=0)
    else:
        kwargs.update(temperature=None, top_p=None, top_k=None)
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    return out[:, input_ids.shape[1]:].tolist()


def sample_next(logits: torch.Tensor, temperature: float, top_p: float,
                generator: torch.Generator | None) -> torch.Tensor:
    """Next token per row: argmax when temperature == 0, else nucleus sampling at that temperature."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, sorted_i = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
        drop = sorted_p.cumsum(dim=-1) - sorted_p > top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        choice = torch.multinomial(sorted_p, 1, generator=generator).squeeze(-1)
        return sorted_i.gather(-1, choice[:, None]).squeeze(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _cache_kwarg(model) -> str:
    """transformers >= 5.2x names the forward's KV-cache argument `cache`; older versions `past_key_values`."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _prefill(model, input_ids, attention_mask, position_ids, cache=None):
    """The prompt through the HF forward: (last-position logits [B, V], filled DynamicCache). With `cache`, the
    tokens extend it (attention_mask then covers the cached columns too)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config) if cache is None else cache
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                use_cache=True, logits_to_keep=1, **{_cache_kwarg(model): cache})
    return out.logits[:, -1, :], cache


def _sampler(config: GenerationConfig, eos: list[int]):
    """next-token rule of a decode loop: `sample_next`, with eos masked out before `min_new_tokens` (in place on
    the logits, as transformers' MinNewTokensLengthLogitsProcessor does)."""

    min_new = int(getattr(config, "min_new_tokens", 0) or 0)  # duck-typed configs may lack it

    def sample(logits: torch.Tensor, step: int, generator) -> torch.Tensor:
        if step < min_new:
            logits[:, eos] = -float("inf")
        return sample_next(logits, config.temperature, config.top_p, generator)

    return sample


def decode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, config: GenerationConfig,
           eos: list[int], delta: Any = None, on_keep: Callable[[torch.Tensor], None] | None = None
           ) -> list[list[int]]:
    """Prefill once, then decode token by token, removing finished rows from the batch and the KV cache.

    `model.generate` keeps computing rows that already emitted eos until the longest row ends; with verbose
    models and a 1024-token budget that is most of the work. Dropping them keeps every forward pass useful.
    Greedy outputs equal `model.generate`'s (tested). Supported architectures take the lean step
    (`esft.lean`, config.lean); the loop below is the fallback through the HF forward.

    `delta` (a low-rank population, esft.es.lowrank.PopulationPerturbation) owns forward hooks that perturb each
    row; the lean step, which bypasses module hooks, then adds the same terms through `delta` itself.
    `on_keep(indices)` is called with the rows kept whenever finished rows are dropped.
    """
    sample = _sampler(config, eos)
    if config.lean:
        from esft.lean import lean_decode, unsupported_reason

        if unsupported_reason(model, ignore_hooks=delta is not None) is None:
            return lean_decode(model, input_ids, attention_mask, config, eos, sample, _prefill, delta=delta,
                               on_keep=on_keep)
    return decode_hf(model, input_ids, attention_mask, config, eos, on_keep=on_keep)


def decode_hf(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, config: GenerationConfig,
              eos: list[int], on_keep: Callable[[torch.Tensor], None] | None = None) -> list[list[int]]:
    """The decode loop of `decode` through the Hugging Face forward (so forward hooks see every projection).
    `on_keep(indices)` is called whenever finished rows are dropped, with the indices of the rows kept, so a
    caller holding per-row state (e.g. the low-rank population's member of each row) can drop them too."""
    sample = _sampler(config, eos)
    batch = input_ids.shape[0]
    device = input_ids.device
    generator = None
    if config.temperature > 0:
        generator = torch.Generator(device=device).manual_seed(config.seed)
    cache_kw = _cache_kwarg(model)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits, cache = _prefill(model, input_ids, attention_mask, position_ids)
    next_pos = position_ids[:, -1] + 1
    rows = torch.arange(batch, device=device)  # original row index of each live row
    outputs: list[list[int]] = [[] for _ in range(batch)]
    eos_t = torch.tensor(eos, device=device)
    for step in range(config.max_new_tokens):
        check_cancelled()
        token = sample(logits, step, generator)
        for r, t in zip(rows.tolist(), token.tolist()):
            outputs[r].append(t)
        if step == config.max_new_tokens - 1:
            break
        alive = ~torch.isin(token, eos_t)
        if not bool(alive.all()):
            if not bool(alive.any()):
                break
            keep = alive.nonzero().squeeze(-1)
            cache.batch_select_indices(keep)
            if on_keep is not None:
                on_keep(keep)
            rows, token, next_pos, attention_mask = rows[keep], token[keep], next_pos[keep], attention_mask[keep]
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((attention_mask.shape[0], 1))], dim=1)
        out = model(input_ids=token[:, None], attention_mask=attention_mask, position_ids=next_pos[:, None],
                    use_cache=True, **{cache_kw: cache})
        logits = out.logits[:, -1, :]
        next_pos = next_pos + 1
    return outputs


def _finish(row: list[int], eos: list[int], tokenizer, prompt_tokens: int) -> Generation:
    cut = len(row)
    finished = False
    for k, t in enumerate(row):
        if t in eos:
            cut, finished = k + 1, True
            break
    ids = row[:cut]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    return Generation(text=text, completion_ids=ids, prompt_tokens=prompt_tokens, finished=finished)
