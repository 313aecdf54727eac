"""What to generate (`GenerationConfig`) and what comes back per prompt (`Generation`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from esft.config import ConfigError, check_fields
from esft.config_rules import Rule, at_least, in_range, non_negative, one_of


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
    """Seed for sampling (unused when greedy); the esft engine keys each prompt's stream by (seed, its index)."""
    engine: str = "esft"
    """"esft": our decode loop that drops finished rows from the batch and KV cache; "hf": `model.generate`."""
    min_new_tokens: int = 0
    """eos is suppressed before this many tokens (as transformers' `min_new_tokens`); benchmarks use it to force
    full-length completions."""
    lean: bool = True
    """esft engine only: use the lean decode step (`esft.generation.lean`: preallocated KV cache, no per-step
    mask/cache plumbing) for the models it supports; others, and lean=False, step through the HF forward."""
    share_prefix: bool = False
    """lean path only: prefill the prompts' common token prefix (system prompt + template) once and reuse its KV
    for every row. Saves that share of the prefill, but logits then match a plain prefill to ~1e-6 relative
    rather than bit for bit, so greedy outputs can differ from `model.generate` on near-ties (opt-in)."""
    prefill_buckets: int = 1
    """lean path only: prefill the prompts (their remainders after a shared prefix) in up to this many groups of
    similar length instead of one batch padded to the longest; > 1 has the same ~1e-6 caveat as share_prefix."""
    packed_linear: bool = False
    """lean path only, fp32 CPU: run the decode matmuls through oneDNN with the weights reordered once per call
    (`esft.generation.lean_step.LeanModel(packed=True)`): ~1.5x faster matmuls at small batch on CPU, same ~1e-6
    caveat as share_prefix (another summation order). Ignored, with a warning, where torch has no oneDNN."""
    fused_attention: bool = False
    """lean path only, fp32 CPU: rotary, KV-cache append and attention of each decode step in one compiled kernel
    (`esft.kernels`, built with the local C++ compiler on first use, ~30 s): ~2x faster attention than torch's
    SDPA for one-token queries; ~1e-6 relative differences as share_prefix. Ignored, with a warning, where the
    kernel cannot be built (no compiler). With packed_linear it also stacks q|k|v and gate|up into one matmul
    each and runs the RMSNorm / residual / SwiGLU glue in compiled code."""
    screened_lm_head: bool = False
    """lean path, greedy decoding only, with packed_linear and fused_attention, on CPUs with fast bf16 (AVX512-BF16
    or AMX): compute the lm_head in bf16 first and the exact fp32 logits only for tokens a rigorous rounding-error
    bound cannot exclude as the argmax (`esft.generation.packed.LMHeadScreen`; ~2 per row). The argmax is
    unchanged; the other logits are returned as -inf. Skipped silently when sampling, under a low-rank population
    and on CPUs without native bf16 (there the fp32 head is the faster; `esft env` says which this is); skipped
    with a warning where packed_linear or fused_attention cannot run or the lm_head has a bias."""

    def __post_init__(self) -> None:
        # checked when built, before any model loads: a negative temperature decoded greedily and top_p 0 (or
        # above 1) sampled from one token (or all of them) without a word
        check_fields(self, GENERATION_RULES)


#: what each GenerationConfig field accepts beyond its type (esft.config.check_fields, ConfigError otherwise)
GENERATION_RULES: dict[str, Rule] = {
    "max_new_tokens": at_least(1), "temperature": non_negative(), "top_p": in_range(0.0, 1.0),
    "batch_size": at_least(1), "min_new_tokens": at_least(0), "engine": one_of("esft", "hf"),
    "prefill_buckets": at_least(1),
}


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


#: GenerationConfig fields that choose *how* the engine runs (not *what* it generates): what evaluation and the
#: experiment specs accept as `generation_options`
ENGINE_OPTIONS: dict[str, type] = {"engine": str, "lean": bool, "share_prefix": bool, "prefill_buckets": int,
                                   "packed_linear": bool, "fused_attention": bool, "screened_lm_head": bool}


def options_mapping(value: object) -> dict[str, object]:
    """`generation_options` as given (None, "exact", "fast", a mapping, or a mapping as YAML / JSON text from a
    command line) -> a new dict, keys not yet checked (`engine_options` checks them). "fast" is
    esft.config.FAST_CPU_GENERATION. Raises ValueError naming what is accepted."""
    from esft.config import FAST_CPU_GENERATION

    if isinstance(value, str) and value not in ("fast", "exact"):
        import yaml

        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or "not valid YAML"  # one line, not YAML's marked excerpt
            raise ValueError(f"generation_options: {value!r} is not 'fast', 'exact' or YAML ({problem})") from None
    if value is None or value == "exact":
        return {}
    if value == "fast":
        return dict(FAST_CPU_GENERATION)
    if not isinstance(value, dict):
        raise ValueError(f"generation_options must be 'fast', 'exact' or a mapping of {', '.join(ENGINE_OPTIONS)}; "
                         f"got {value!r}")
    return dict(value)


def engine_options(value: object) -> dict[str, object]:
    """`generation_options` as given (see `options_mapping`) -> GenerationConfig fields, each an ENGINE_OPTIONS key
    of the right type. "fast", the ES CPU presets' rollout path: ~5x faster greedy evaluation on CPU, logits equal
    to the exact path's to ~1e-6 relative (docs/performance.md). Raises ValueError naming what is accepted."""
    out: dict[str, object] = {}
    for key, val in options_mapping(value).items():
        kind = ENGINE_OPTIONS.get(key)
        if kind is None:
            raise ValueError(f"generation_options: unknown option {key!r}; accepted: {', '.join(ENGINE_OPTIONS)}")
        if not isinstance(val, kind) or (kind is int and (isinstance(val, bool) or val < 1)):
            wanted = 'a positive integer' if kind is int else 'true or false' if kind is bool else 'esft or hf'
            raise ValueError(f"generation_options.{key} = {val!r} is not accepted; expected {wanted}")
        if key == "engine" and val not in ("esft", "hf"):
            raise ValueError(f"generation_options.engine = {val!r} is not accepted; expected esft or hf")
        out[key] = val
    return out


def options_refusal(value: object, exc: ValueError) -> ConfigError:
    """The ConfigError for `generation_options` = `value` refused with `exc` (`engine_options`' ValueError), which
    build_config locates at the flag or file line the value came from."""
    problem = str(exc).removeprefix("generation_options: ").removeprefix("generation_options must be ")
    # the problem is worded as an error of its own ("unknown option 'x'; accepted: ..."): it follows "expected" as
    # the reason, not as the accepted value; a value that is no mapping already names them
    accepted = problem if problem.startswith("'fast'") else f"valid engine options ({problem})"
    return ConfigError("generation_options", value, accepted)
