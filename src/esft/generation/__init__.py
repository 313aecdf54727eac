"""Batched generation from chat prompts, shared by evaluation, ES members and analyses.

`generate` (engine.py) encodes the prompts, batches them by length and runs each batch through `model.generate`
or through esft's decode loop (loop.py), which drops finished rows from the batch and its KV cache. The loop
takes a step function: the Hugging Face forward (hf_step.py) or, for the models it supports, the lean step
(lean.py: the lean engine; its parts lean_step.py, kv_cache.py, packed.py, prefill.py), and picks each next
token with `sample_next` (sampling.py).
"""

from esft.generation.cancel import GenerationCancelled, cancel_on, check_cancelled
from esft.generation.generation_config import (ENGINE_OPTIONS, Generation, GenerationConfig, engine_options,
                                               options_mapping, options_refusal)
from esft.generation.engine import decode, generate, generation_batches
from esft.generation.hf_step import decode_hf
from esft.generation.kv_cache import KVBuffers, reusing_kv
from esft.generation.sampling import sample_next
from esft.generation.packed import releasing
from esft.generation.prompts import encode_prompts, eos_token_ids, left_pad, to_generation

__all__ = [
    "ENGINE_OPTIONS", "Generation", "GenerationCancelled", "GenerationConfig", "KVBuffers", "cancel_on",
    "check_cancelled", "decode", "decode_hf", "encode_prompts", "engine_options", "eos_token_ids", "generate",
    "generation_batches", "left_pad", "options_mapping", "options_refusal", "releasing", "reusing_kv", "sample_next",
    "to_generation",
]
