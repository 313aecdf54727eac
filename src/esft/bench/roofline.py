"""What an ES iteration executes and what this machine can do (esft.bench): the matmul FLOPs one generate call
of esft's lean engine really runs (`executed_flops`, from the model's shape and the prompts' token ids), the
measured matmul rates, and the roofline ratio of the two; the load average and CPU facts recorded beside them."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # pragma: no cover - platforms without getloadavg
        return None


def matmul_gflops(dtype: torch.dtype = torch.float32, size: int = 2048, reps: int = 5) -> float:
    """Best-of-`reps` GFLOP/s of a size^3 matmul (with the current torch thread setting)."""
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * size**3 / best / 1e9


def read_gbps(nbytes: int = 1 << 30, reps: int = 5) -> float:
    """Best-of-`reps` GB/s of summing an fp32 tensor of `nbytes` (with the current torch thread setting): the rate
    at which this machine streams data that is not in its caches. The default 1 GiB exceeds the caches of the CPUs
    seen so far (the largest L3 here: 480 MiB); a smaller tensor would measure a cache instead."""
    x = torch.ones(nbytes // 4)
    x.sum()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best / 1e9


EMULATED_BF16_MATMUL_SIZE = 512


def bf16_matmul_size(onednn: bool, bf16_rollouts: bool) -> int | None:
    """The size of the bf16 matmul the bench times, None for none. Where torch's oneDNN has bf16, 2048 as for fp32.
    bf16 rollouts execute bf16 FLOPs, which the report counts: without oneDNN's bf16 their rate is torch's emulated
    one, read at EMULATED_BF16_MATMUL_SIZE (2048^3 would take ~30 s a reading). It is far below fp32's, so the
    headline roofline (every FLOP at the best dtype's rate) takes fp32's; it also depends on the shape (on a Zen 2:
    1.4 GFLOP/s at 512^3, 0.7 at 1024^3, 3-7 on decode-shaped products), so no per-dtype roofline divides by it."""
    if onednn:
        return 2048
    return EMULATED_BF16_MATMUL_SIZE if bf16_rollouts else None


@dataclass(frozen=True)
class ModelShape:
    """The matmul dimensions of a Llama-family decoder, all that `executed_flops` needs."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def of(cls, model) -> ModelShape:
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cls(layers=cfg.num_hidden_layers, hidden=cfg.hidden_size, intermediate=cfg.intermediate_size,
                   heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads, head_dim=head_dim,
                   vocab=model.lm_head.weight.shape[0])

    @property
    def layer_weights(self) -> int:
        """Weights one position multiplies by in one layer: q, k, v, o and gate, up, down."""
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        return self.hidden * (2 * q + 2 * kv) + 3 * self.hidden * self.intermediate


def executed_flops(shape: ModelShape, prompts: Sequence[Sequence[int]], completion_lengths: Sequence[int], *,
                   batch_size: int, share_prefix: bool = False, prefill_buckets: int = 1,
                   screened_lm_head: bool = False, bucket_tokens: int | None = None,
                   min_prefix: int | None = None, bf16_weights: bool = False,
                   prefix_logit_row: bool = True, bf16_activations: bool = False) -> dict[str, int]:
    """Matmul FLOPs that one `esft.generation.generate` call of esft's lean engine executes on `prompts` (token
    ids) when it generates `completion_lengths[i]` tokens (eos included) for prompt i. The layout is the
    engine's: rows sorted by length, longest first, in batches of `batch_size`; per batch, with `share_prefix`,
    the common prefix (capped so every row keeps one token, unused below `min_prefix` tokens) prefilled once at
    batch 1, and the remainders in up to `prefill_buckets` groups (`esft.generation.prefill.length_buckets`,
    each group padded to its longest). Counted, as 2 FLOPs per multiply-add:

    * linear layers (q, k, v, o, gate, up, down): every position a forward computes, the bucket's padding
      included, the shared prefix once per batch;
    * lm_head: one position per prefill forward row, one per decode step; the prefix forward's row only with
      `prefix_logit_row` (the HF prefill computes it; the packed lean prefill projects only the rows it decodes
      from, `esft.generation.prefill.layout_prefill`'s `head`);
    * decode: a row that generates c tokens runs c - 1 steps (it leaves the batch once it emits eos);
    * attention (q.k and the weighted sum of v, every head): per unmasked (query, key) pair only, each token
      attending itself and its row's earlier tokens; masked columns are not counted, whatever a kernel does
      with them.

    Not counted: embedding lookups, norms, rotary, activations, softmax (no matmul), and the screened lm_head's
    fp32 logits of its few candidate tokens. With `screened_lm_head` the decode steps' lm_head is counted as bf16
    (the screen's full-vocabulary matmul); everything else is fp32. With `bf16_weights` (bf16 rollouts) every
    linear and the lm_head are bf16 matmuls and only the attention is fp32; with `bf16_activations` (bf16 weights
    off the packed path: the step computes in the weights' dtype, as the HF forward) every matmul is bf16, the
    attention's too. Returns the position counts and the FLOPs: {"prefill_positions", "prefill_logit_rows",
    "decode_rows", "attention_pairs", "fp32", "bf16"}."""
    from esft.generation.prefill import PREFILL_BUCKET_TOKENS, common_prefix, layout_prefill, length_buckets

    if bucket_tokens is None:
        bucket_tokens = PREFILL_BUCKET_TOKENS
    if min_prefix is None:
        import inspect

        min_prefix = inspect.signature(layout_prefill).parameters["min_prefix"].default
    if len(prompts) != len(completion_lengths):
        raise ValueError(f"{len(prompts)} prompts but {len(completion_lengths)} completion lengths")
    positions = logit_rows = pairs = 0
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]), reverse=True)
    for start in range(0, len(order), batch_size):
        rows = [list(prompts[i]) for i in order[start:start + batch_size]]
        lengths = [len(r) for r in rows]
        p = min(common_prefix(rows), min(lengths) - 1) if share_prefix and len(rows) > 1 else 0
        if p < min_prefix:
            p = 0
        if p:
            positions += p
            logit_rows += int(prefix_logit_row)
            pairs += p * (p + 1) // 2
        rest = [n - p for n in lengths]
        groups = length_buckets(rest, prefill_buckets, bucket_tokens) if prefill_buckets > 1 else [range(len(rows))]
        for group in groups:
            positions += len(group) * max(rest[r] for r in group)
            logit_rows += len(group)
        pairs += sum(s * p + s * (s + 1) // 2 for s in rest)
    decode_rows = 0
    for prompt, c in zip(prompts, completion_lengths):
        steps = max(int(c) - 1, 0)
        decode_rows += steps
        pairs += steps * len(prompt) + steps * (steps + 1) // 2  # step k attends the prompt and k new tokens
    linear = 2 * shape.layers * shape.layer_weights * (positions + decode_rows)
    attention = 4 * shape.layers * shape.heads * shape.head_dim * pairs
    head = 2 * shape.hidden * shape.vocab
    fp32 = linear + attention + head * logit_rows
    bf16 = 0
    if bf16_activations:
        fp32, bf16 = 0, fp32 + head * decode_rows
    elif bf16_weights:
        fp32, bf16 = attention, linear + head * (logit_rows + decode_rows)
    elif screened_lm_head:
        bf16 = head * decode_rows
    else:
        fp32 += head * decode_rows
    return {"prefill_positions": positions, "prefill_logit_rows": logit_rows, "decode_rows": decode_rows,
            "attention_pairs": pairs, "fp32": fp32, "bf16": bf16}


def decode_read_bytes(shape: ModelShape, prompt_lengths: Sequence[int], completion_lengths: Sequence[int], *,
                      batch_size: int, weight_bytes: int, cache_bytes: int, head_bytes: int) -> int:
    """Bytes the decode steps of one `esft.generation.generate` call must read from memory at least: at each step
    of a batch (rows sorted by prompt length, longest first, in batches of `batch_size`; a batch steps until its
    longest completion is done), every layer's projection weights once (`weight_bytes` each) and the lm_head once
    (`head_bytes` each: the bf16 screen's matrix, or the head in the weights' dtype), and for every row still
    generating, each cached key and value it attends (`cache_bytes` each), counted as `executed_flops` counts the
    attention's pairs. A lower bound: prefill, activations, norms and a lane's weight writes are left out. Weights
    that stay in a cache across steps (a model smaller than the last-level cache) would make it no bound."""
    if len(prompt_lengths) != len(completion_lengths):
        raise ValueError(f"{len(prompt_lengths)} prompts but {len(completion_lengths)} completion lengths")
    steps = [max(int(c) - 1, 0) for c in completion_lengths]
    order = sorted(range(len(steps)), key=lambda i: prompt_lengths[i], reverse=True)
    batch_steps = sum(max(steps[i] for i in order[k:k + batch_size]) for k in range(0, len(order), batch_size))
    pairs = sum(s * n + s * (s + 1) // 2 for s, n in zip(steps, prompt_lengths))
    per_step = shape.layers * shape.layer_weights * weight_bytes + shape.vocab * shape.hidden * head_bytes
    per_pair = 2 * shape.layers * shape.kv_heads * shape.head_dim * cache_bytes
    return batch_steps * per_step + pairs * per_pair


def bandwidth_bound(flops: dict[str, float], read_bytes: float, seconds: float, best_gflops: float,
                    gbps: float) -> dict[str, float]:
    """Where an iteration of `seconds` stands against this machine's two limits: `bandwidth_ratio`, the time its
    `read_bytes` need at `gbps` over `seconds` (1 = it streams at the measured rate), and `roofline_ceiling`, the
    highest roofline ratio (all `flops` at `best_gflops`) that the bandwidth leaves: the compute time over the
    longer of the compute and the memory times. Below 1, no engine that reads what `decode_read_bytes` counts can
    reach a roofline ratio above it."""
    compute = (flops.get("fp32", 0) + flops.get("bf16", 0)) / (best_gflops * 1e9)
    memory = read_bytes / (gbps * 1e9)
    return {"bandwidth_ratio": memory / seconds,
            "roofline_ceiling": compute / max(compute, memory) if max(compute, memory) > 0 else 1.0}


def roofline_ratio(flops: dict[str, float], seconds: float, gflops: float, gflops_bf16: float | None = None) -> float:
    """The shortest time `flops` ({"fp32": ..., "bf16": ...}) could take at the measured matmul rates (GFLOP/s),
    over the `seconds` they took: 1 means the work ran as fast as a 2048^3 matmul of its dtype."""
    ideal = flops.get("fp32", 0) / (gflops * 1e9)
    if flops.get("bf16", 0):
        if not gflops_bf16:
            raise ValueError("bf16 FLOPs need the measured bf16 matmul rate")
        ideal += flops["bf16"] / (gflops_bf16 * 1e9)
    return ideal / seconds


def best_dtype_roofline_ratio(flops: dict[str, float], seconds: float, rates: dict[str, float | None]) -> float:
    """All executed FLOPs at the machine's best measured matmul rate (any dtype), over the `seconds` they took:
    how far the iteration is from the fastest arithmetic this CPU offers, whatever dtype it chose."""
    best = max(r for r in rates.values() if r)
    return (flops.get("fp32", 0) + flops.get("bf16", 0)) / (best * 1e9) / seconds


def effective_layout(model, gen, dtype: torch.dtype | None = None) -> dict[str, Any]:
    """The prefill layout and lm_head `esft.generation.generate(model, ..., gen)` really runs (`executed_flops`
    options): the options the lean engine would drop on this model or machine (with a warning there) are off.
    `dtype`: the weights' dtype of the copies the rollouts ran on (bf16 rollouts), if not the model's."""
    from esft.generation.lean_step import fused_attention_reason, unsupported_reason
    from esft.generation.packed import packed_linear_reason, screen_lm_head_reason

    lean = gen.engine == "esft" and bool(gen.lean) and unsupported_reason(model) is None
    dtype = model.lm_head.weight.dtype if dtype is None else dtype
    packed = lean and bool(gen.packed_linear) and packed_linear_reason(dtype) is None
    fused = lean and bool(gen.fused_attention) and fused_attention_reason(dtype) is None
    if dtype == torch.bfloat16 and packed != fused:  # as esft.generation.lean: bf16 needs both or neither
        packed = fused = False
    screened = (lean and bool(gen.screened_lm_head) and gen.temperature == 0
                and screen_lm_head_reason(model, packed, fused) is None)
    return {"share_prefix": lean and bool(gen.share_prefix),
            "prefill_buckets": int(gen.prefill_buckets or 1) if lean else 1,
            "screened_lm_head": screened, "bf16_weights": lean and packed and dtype == torch.bfloat16,
            # off the packed path bf16 weights take bf16 activations (esft.generation.lean_step.LeanModel)
            "bf16_activations": lean and not packed and dtype == torch.bfloat16,
            # packed linears prefill through esft.generation.lean's own prefills, which project no prefix row
            "prefix_logit_row": not packed}


def cpu_info(path: str | os.PathLike = "/proc/cpuinfo") -> dict[str, Any]:
    """CPU model name and feature flags (Linux /proc/cpuinfo), and torch's CPU kernel capability. arm64 Linux lists
    the flags as "Features" and names no model: the core's implementer, part, variant and revision stand for it.
    On x86 also the family, model and stepping numbers: cloud VMs name every generation alike ("AMD EPYC" for a
    Zen 2 at family 23 model 49 and a Zen 4 at family 25 model 17), and the numbers tell the readings apart."""
    fields: dict[str, str] = {}
    try:
        with open(path) as f:
            for line in f:
                if not line.strip():  # the first processor's block is enough
                    if fields:
                        break
                    continue
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:  # pragma: no cover - not Linux
        pass
    model = fields.get("model name")
    if model is None and "CPU part" in fields:
        model = ", ".join(f"{k} {fields[k]}" if k == "CPU implementer" else f"{k.split()[1]} {fields[k]}"
                          for k in ("CPU implementer", "CPU part", "CPU variant", "CPU revision") if k in fields)
    flags = fields.get("flags", fields.get("Features"))
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: None)()
    info = {"model": model, "flags": None if flags is None else flags.split(), "torch_capability": capability}
    for name, key in (("family", "cpu family"), ("model_number", "model"), ("stepping", "stepping")):
        if fields.get(key, "").isdigit():
            info[name] = int(fields[key])
    return info


def count_params(model) -> int:
    """Parameters a forward pass multiplies by (tied embedding / lm_head counted once, as in 134.5M)."""
    return sum(p.numel() for p in model.parameters())
