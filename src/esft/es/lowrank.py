"""Low-rank ES populations (EGGROLL, "Evolution Strategies at the Hyperscale"): `--noise lowrank --rank r`.

Member (seed, sign) perturbs every selected weight matrix W [m, n] by sign * sigma * E with

    E = A B^T / sqrt(r),   A [m, r], B [n, r] standard normal from (member seed, tensor name)

(entries of E have unit variance, like full-rank noise, so sigma and alpha keep their meaning). Because
x (W + s E)^T = x W^T + (s / sqrt(r)) (x B) A^T, the whole population can answer in ONE batched generation: the
N x B (member, prompt) rows share the model's GEMMs and each row adds its own member's rank-r term. This module
does that with forward hooks on the nn.Linear / nn.Embedding modules that own selected matrices (a tied
embedding / lm_head pair is hooked twice with the same factors; a scaled word embedding, Gemma's, scales its term as it
scales its rows); the weights themselves are never touched, so "restore" is removing the hooks and is exact by
construction.

Per-row terms without a Python loop over members: the factors of all members are concatenated, A_cat [m, N r],
B_cat [n, N r] (member i owns columns i r .. i r + r - 1, its sign folded into A), and a 0/1 mask M [rows, N r]
keeps each row's own columns:  out += s ((x B_cat) * M) A_cat^T / sqrt(r). That costs N r / n of the layer's
GEMM on top (r = 1, N = 30, n = 576: ~5%), in exchange for two dense GEMMs instead of N small ones.

Non-matrix parameters (RMSNorm gains, biases) are left unperturbed and are never updated in this mode: a
per-row vector perturbation would need every norm layer re-implemented, and they are ~0.05% of the weights
(the study also finds that norm gains break the random-walk law). `LowRankWeights.frozen` lists them.

The update sum_k c_k E_k is built full rank in fp32, one tensor at a time, as a fixed-order sum of rank-1
outer products (torch.addr): each element is computed independently of thread count, so a replay of seeds.jsonl
rebuilds the weights bit for bit, as in full-rank mode. The generation loop is esft's decode loop (rows dropped
when they finish), tracking each row's member as rows leave the batch: the prefill runs through the Hugging Face
forward with the hooks, the decode steps through the lean step (esft.generation.lean), which adds the same per-row terms
itself (`add_linear` / `add_embedding`; bit-identical to the hook path). Rows per forward are the generation
config's batch_size: on CPU, set it to N x B so that the whole population shares each weight read.
"""

from __future__ import annotations

import math
import time
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from esft.es.executor import LocalExecutor, PopulationResult
from esft.es.noise import MasterWeights, Update, gaussian
from esft.es.strategy import ES, Member


def lowrank_factors(seed: int, name: str, shape: Sequence[int], rank: int,
                    device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(A [m, r], B [n, r]) fp32 standard normal for one member and matrix (independent streams per factor)."""
    m, n = int(shape[0]), int(shape[1])
    a = gaussian(seed, f"{name}:lowrank-A", (m, rank), device=device)
    b = gaussian(seed, f"{name}:lowrank-B", (n, rank), device=device)
    return a, b


def accumulate_outer(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, coef: float) -> torch.Tensor:
    """acc += coef / sqrt(r) * A B^T as r rank-1 updates in a fixed order (thread-count independent bits)."""
    r = a.shape[1]
    scale = float(coef) / math.sqrt(r)
    for col in range(r):
        acc.addr_(a[:, col], b[:, col], alpha=scale)
    return acc


class LowRankWeights(MasterWeights):
    """fp32 masters of the selected weight MATRICES with low-rank noise E = A B^T / sqrt(r) per (seed, tensor).

    perturb / restore / apply keep MasterWeights' semantics (the materialised perturbation, exact restore by copy,
    fp32 update), so replay, checkpoints and the random-walk analysis work unchanged; the fast path of a run is
    `PopulationPerturbation`, which never materialises E."""

    def __init__(self, model: torch.nn.Module, rank: int = 1, include: Iterable[str] | None = None,
                 exclude: Iterable[str] | None = None):
        if int(rank) < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        super().__init__(model, include=include, exclude=exclude, noise="per-tensor")
        self.rank = int(rank)
        self.mode = "lowrank"
        self.frozen = [n for n, p in self.params.items() if p.dim() != 2]
        for name in self.frozen:
            del self.params[name], self.master[name]
        if not self.params:
            raise ValueError("lowrank noise needs at least one selected 2-D weight matrix")
        self._largest = max(p.numel() for p in self.params.values())

    def factors(self, seed: int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.master[name]
        return lowrank_factors(seed, name, m.shape, self.rank, device=m.device)

    def noise(self, seed: int, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        """The materialised E = A B^T / sqrt(r) of one tensor (tests, and perturb/restore outside the fast path)."""
        m = self.master[name]
        e = torch.empty_like(m) if out is None else self._view(out, m)
        a, b = self.factors(seed, name)
        return accumulate_outer(e.zero_(), a, b, 1.0)

    @torch.no_grad()
    def direction(self, name: str, update: Update, acc: torch.Tensor | None = None,
                  scratch: torch.Tensor | None = None) -> torch.Tensor:
        """sum_k c_k A_k B_k^T / sqrt(r) for one tensor, in fp32, in a fixed order. Its rank is min(K r, m, n) for K
        seeds with a nonzero coefficient (N, or N / 2 with antithetic pairs), so full once K r >= min(m, n)."""
        m = self.master[name]
        acc = torch.empty_like(m) if acc is None else self._view(acc, m)
        acc.zero_()
        for seed, coef in zip(update.seeds, update.coefficients):
            if coef == 0.0:
                continue
            a, b = self.factors(seed, name)
            accumulate_outer(acc, a, b, coef)
        return acc


# ---- memory of the population's factors (checked before the model loads, esft.es.build) -----------------------------

def held_factor_bytes(shapes: Sequence[Sequence[int]], members: int, rank: int, itemsize: int) -> int:
    """Bytes of the factors a `PopulationPerturbation` holds once built: (A_cat^T [N r, m], B_cat [n, N r]) per
    selected matrix [m, n] (a tied matrix once), in the model's dtype (`itemsize` bytes per element)."""
    return sum(itemsize * members * rank * (int(m) + int(n)) for m, n in shapes)


def factor_bytes(shapes: Sequence[Sequence[int]], members: int, rank: int, itemsize: int) -> int:
    """Peak bytes of building a `PopulationPerturbation`'s factors for `members` members at `rank` on matrices of
    `shapes` (in the order it builds them: the model's parameter order): the matrices built so far, held as
    `held_factor_bytes` counts them, plus the fp32 scratch of `_concat` on the one being built (every member's A,
    sign folded in, and B, the last member's raw A; then the concatenated A with its transposed copy, or the kept
    A_cat^T with the concatenated B and its cast to the model's dtype). Linear in `rank`."""
    held = peak = 0
    nr = members * rank
    for m, n in ((int(m), int(n)) for m, n in shapes):
        parts = 4 * (nr * (m + n) + rank * m)
        a_phase = parts + 8 * nr * m  # the cat is freed before the cast: contiguous copy + cast <= 8 nr m
        b_phase = parts + itemsize * nr * m + 4 * nr * n + (itemsize * nr * n if itemsize != 4 else 0)
        peak = max(peak, held + a_phase, held + b_phase)
        held += itemsize * nr * (m + n)
    return max(peak, held)


def check_factor_memory(shapes: Sequence[Sequence[int]], members: int, rank: int, itemsize: int,
                        available: int | None) -> None:
    """Refuse a rank whose factors (`factor_bytes`) need more than `available` bytes (None: unknown, no refusal):
    any rank >= 1 is a valid noise, but one too large would otherwise run until the system kills it."""
    if available is None or not shapes:
        return
    need = factor_bytes(shapes, members, rank, itemsize)
    if need <= available:
        return
    fits = available // factor_bytes(shapes, members, 1, itemsize)  # exact: the bytes are linear in the rank
    largest = f"the largest rank that fits is {fits}" if fits >= 1 else "not even rank 1 fits"
    raise ValueError(f"noise 'lowrank' at rank {rank}: the factors of {members} members on {len(shapes)} matrices "
                     f"need ~{need / 2**30:.2f} GiB but {available / 2**30:.2f} GiB of memory is available; "
                     f"{largest}")


# ---- the batched population forward --------------------------------------------------------------------------------

def _output_scale_source(module: torch.nn.Module) -> float | torch.Tensor | None:
    """1.0 for a plain nn.Linear / nn.Embedding, a scaled word embedding's `embed_scale` (a tensor or a number), or
    None when the forward is unknown; reads no weight, so it also answers for a skeleton on the meta device."""
    base = torch.nn.Embedding if isinstance(module, torch.nn.Embedding) else torch.nn.Linear
    if type(module).forward is base.forward:
        return 1.0
    scale = getattr(module, "embed_scale", None)
    # a further parameter (T5Gemma2's end-of-image row) means the forward does more than scale the rows
    if base is torch.nn.Embedding and scale is not None and [n for n, _ in module.named_parameters()] == ["weight"]:
        return scale
    return None


def _embedding_output_scale(module: torch.nn.Module) -> float | None:
    """The factor by which `module`'s output is its weight's rows (1.0 for a plain nn.Linear / nn.Embedding), or
    None when its forward is unknown. A scaled word embedding (Gemma and the other transformers classes that return
    `super().forward(input_ids) * self.embed_scale`) multiplies the perturbation's rows by embed_scale too, so the
    per-row term must be scaled alike to equal the forward of the materialised W + sigma E."""
    scale = _output_scale_source(module)
    # as those forwards multiply: a buffer (Gemma) cast to the weight's dtype, a Python float as it is
    return float(scale.to(module.weight.dtype)) if isinstance(scale, torch.Tensor) else scale


class UnsupportedModel(NotImplementedError, ValueError):
    """A model whose matrices the batched population forward cannot perturb: not implemented here, and bad input to
    a run that asks for low-rank noise (the command line exits 2, as for any refused option)."""


def matrix_owners(model: torch.nn.Module, params: dict[str, torch.Tensor]) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every module owning one of `params` (selected matrices by name), in the model's module
    order (a tied matrix once per owner). Raises UnsupportedModel (a NotImplementedError) where the batched
    population forward cannot add a matrix's per-row term: an owner that is not nn.Linear / nn.Embedding, one whose
    forward is unknown, a matrix no module owns. Reads no weight: esft.es.build runs it on the model's skeleton
    before the weights load."""
    by_id = {id(p): name for name, p in params.items()}
    owners: list[tuple[str, torch.nn.Module]] = []
    for module in model.modules():
        weight = getattr(module, "weight", None)
        name = by_id.get(id(weight)) if isinstance(weight, torch.Tensor) else None
        if name is None:
            continue
        if not isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            raise UnsupportedModel(f"low-rank population forward: {type(module).__name__} owning {name} "
                                   "is not nn.Linear / nn.Embedding")
        if _output_scale_source(module) is None:
            raise UnsupportedModel(f"low-rank population forward: {type(module).__name__} owning {name} "
                                   "overrides forward, so its per-row term is unknown")
        owners.append((name, module))
    missing = set(params) - {name for name, _ in owners}
    if missing:
        raise UnsupportedModel(f"selected matrices not owned by a Linear / Embedding: {sorted(missing)[:5]}")
    return owners


class PopulationPerturbation:
    """Forward hooks that make row k of every batch behave as member `member_of_row[k]` of `members`.

    Usage: `with PopulationPerturbation(model, weights, members, sigma) as pert: pert.set_rows(idx); model(...)`;
    when rows leave the batch (finished generations), `pert.select(keep)` keeps the mapping aligned."""

    def __init__(self, model: torch.nn.Module, weights: LowRankWeights, members: Sequence[Member], sigma: float):
        self.members = list(members)
        if not self.members:  # torch.cat of no factors would fail later with a message that says nothing of this
            raise ValueError("PopulationPerturbation needs at least one member, got an empty population")
        self.rank = weights.rank
        self.scale = float(sigma) / math.sqrt(self.rank)
        dtype = next(iter(weights.params.values())).dtype
        self.factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._handles: list[Any] = []
        self._mask: torch.Tensor | None = None
        owners = matrix_owners(model, weights.params)  # checked before any factor or hook exists
        try:
            for name, module in owners:
                if name not in self.factors:
                    self.factors[name] = self._concat(weights, name, dtype)
                hook = self._embedding_hook(name, _embedding_output_scale(module)) \
                    if isinstance(module, torch.nn.Embedding) else self._linear_hook(name)
                self._handles.append(module.register_forward_hook(hook))
        except BaseException:  # a later matrix's factors failing (memory, Ctrl-C) must not leave the model hooked
            self.close()
            raise

    def _concat(self, weights: LowRankWeights, name: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(A_cat^T [N r, m], B_cat [n, N r]) in the model's dtype, member signs folded into A."""
        a_parts, b_parts = [], []
        for seed, sign in self.members:
            a, b = weights.factors(seed, name)
            a_parts.append(a * float(sign))
            b_parts.append(b)
        a_cat_t = torch.cat(a_parts, dim=1).t().contiguous().to(dtype)
        b_cat = torch.cat(b_parts, dim=1).contiguous().to(dtype)
        return a_cat_t, b_cat

    # -- row mapping
    def set_rows(self, member_of_row: torch.Tensor | Sequence[int]) -> None:
        """Member index (into `members`) of each row of the next forward passes."""
        idx = torch.as_tensor(member_of_row, dtype=torch.long)
        n, r = len(self.members), self.rank
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise IndexError(f"member index out of range 0..{n - 1}")
        device = next(iter(self.factors.values()))[0].device
        dtype = next(iter(self.factors.values()))[0].dtype
        mask = torch.zeros(idx.numel(), n, r, dtype=dtype)
        mask[torch.arange(idx.numel()), idx] = 1.0
        self._mask = mask.view(idx.numel(), n * r).to(device)

    def select(self, keep: torch.Tensor) -> None:
        """Rows `keep` stay in the batch (same order)."""
        mask = self._mapped()
        self._mask = mask[keep.to(mask.device)]

    def _mapped(self) -> torch.Tensor:
        if self._mask is None:
            raise RuntimeError("no batch rows are mapped to population members yet: call "
                               "PopulationPerturbation.set_rows(member_of_row), one member index per row, before "
                               "a forward pass or select()")
        return self._mask

    def _row_mask(self, x: torch.Tensor, broadcast: bool = False) -> torch.Tensor:
        """The mask viewed to broadcast over `x`'s dimensions; `broadcast`: `x` may also be one row for the batch."""
        mask = self._mapped()
        if mask.shape[0] != x.shape[0] and not (broadcast and x.shape[0] == 1):
            raise RuntimeError(f"batch has {x.shape[0]} rows but {mask.shape[0]} rows are mapped to members")
        return mask.view(mask.shape[0], *([1] * (x.dim() - 2)), mask.shape[1])

    # -- the per-row terms (forward hooks for the HF forward; called directly by the lean decode step)
    def add_linear(self, name: str, x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """output += sigma/sqrt(r) * (x B_i) A_i^T for each row's member i, in place."""
        a_cat_t, b_cat = self.factors[name]
        xb = torch.matmul(x, b_cat)                      # [rows, ..., N r]: every member's x B_i
        xb.mul_(self._row_mask(x))                         # keep the row's own member
        return output.add_(torch.matmul(xb, a_cat_t), alpha=self.scale)

    def add_embedding(self, name: str, ids: torch.Tensor, output: torch.Tensor, embed_scale: float = 1.0
                      ) -> torch.Tensor:
        """output += embed_scale * sigma/sqrt(r) * A_i[token] B_i^T for each row's member i, in place (embed_scale:
        the factor a scaled word embedding multiplies its rows by, Gemma's sqrt(hidden))."""
        a_cat_t, b_cat = self.factors[name]
        rows = a_cat_t.t()[ids] * self._row_mask(output, broadcast=True)  # [rows, T, N r]: each row's member's A_i
        term = torch.matmul(rows, b_cat.t())
        if term.shape[0] != output.shape[0]:
            # one row of ids for the whole batch (GPT-Neo's position embedding looks up [1, T] positions and
            # broadcasts): each row's member needs its own term, so the output grows to one row per batch row
            return torch.add(output, term, alpha=self.scale * embed_scale)
        return output.add_(term, alpha=self.scale * embed_scale)

    def _linear_hook(self, name: str):
        def hook(module, inputs, output):
            return self.add_linear(name, inputs[0], output)
        return hook

    def _embedding_hook(self, name: str, embed_scale: float = 1.0):
        def hook(module, inputs, output):
            return self.add_embedding(name, inputs[0], output, embed_scale)
        return hook

    # -- lifetime
    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._mask = None

    def __enter__(self) -> "PopulationPerturbation":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---- generation of the whole population in one pass -----------------------------------------------------------------

def _decode_rows(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, config: Any, eos: list[int],
                 pert: PopulationPerturbation) -> list[list[int]]:
    """esft's decode loop (prefill, then one token per step, finished rows dropped from batch, KV cache and
    member mapping). The prefill runs through the Hugging Face forward, where the hooks see every projection;
    the decode steps take the lean path (esft.generation.lean) with the same per-row terms added explicitly
    (`delta=pert`), or the HF forward where the lean path does not support the model."""
    from esft.generation import decode

    return decode(model, input_ids, attention_mask, config, eos, delta=pert, on_keep=pert.select)


@torch.inference_mode()
def generate_population(model, tokenizer, prompt_ids: Sequence[list[int]], member_of_row: Sequence[int],
                        pert: PopulationPerturbation, config: Any) -> list[Any]:
    """One completion per row (prompt ids, member index); rows of all members share every forward pass.
    Rows are sorted by prompt length (copies of one prompt for different members land together, so batches pad
    little) and cut into batches of config.batch_size rows. Returns esft.generation.Generation per row."""
    from esft.generation import eos_token_ids, left_pad, to_generation as _finish

    eos = eos_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    device = next(model.parameters()).device
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]), reverse=True)
    results: list[Any] = [None] * len(prompt_ids)
    for start in range(0, len(order), config.batch_size):
        idx = order[start:start + config.batch_size]
        input_ids, mask = left_pad([list(prompt_ids[i]) for i in idx], pad_id, device)
        pert.set_rows([member_of_row[i] for i in idx])
        new = _decode_rows(model, input_ids, mask, config, eos, pert)
        for row, i in zip(new, idx):
            results[i] = _finish(row, eos, tokenizer, len(prompt_ids[i]))
    return results


class LowRankExecutor(LocalExecutor):
    """Evaluates the whole population in one batched generation (rows = members x batch examples).

    With a custom `generate_fn` (tests), it is called once on all N x B prompts (member-major) and must keep the
    rows in order and in one forward batch; the default path is `generate_population`."""

    def __init__(self, model: Any, tokenizer: Any, weights: LowRankWeights, task: Any, strategy: ES | float,
                 gen_config: Any, generate_fn: Any = None):
        if not isinstance(weights, LowRankWeights):
            raise TypeError("LowRankExecutor needs LowRankWeights (config noise='lowrank')")
        matrix_owners(model, weights.params)  # a model it cannot perturb fails here, not after an evaluation
        self._custom = generate_fn is not None
        super().__init__(model, tokenizer, weights, task, strategy, gen_config, generate_fn=generate_fn)

    def evaluate_members(self, members: Sequence[Member], batch: Sequence[dict]) -> PopulationResult:
        n, b = len(members), len(batch)
        result = self._empty(n, b)
        if not n or not b:
            return result
        t0 = time.perf_counter()
        prompts = [self.task.prompt(ex) for ex in batch]
        ids = None if self._custom else self._encode(prompts)
        pert = PopulationPerturbation(self.model, self.weights, members, self.sigma)
        result.timings["perturb"] += time.perf_counter() - t0
        member_of_row = [i for i in range(n) for _ in range(b)]
        t0 = time.perf_counter()
        try:
            if self._custom:
                pert.set_rows(member_of_row)
                gens = self.generate_fn(self.model, self.tokenizer, [p for _ in range(n) for p in prompts],
                                        self.gen_config)
            else:
                gens = generate_population(self.model, self.tokenizer, [ids[j] for _ in range(n) for j in range(b)],
                                           member_of_row, pert, self.gen_config)
        finally:
            t1 = time.perf_counter()
            pert.close()  # the weights were never changed: removing the hooks is the exact restore
            t2 = time.perf_counter()
        if len(gens) != n * b:  # enumerated, a short list would leave the last members unscored
            raise ValueError(f"generate returned {len(gens)} completions for {n * b} prompts ({n} members x {b}); "
                             "it must return one per prompt, in the prompts' order")
        for row, gen in enumerate(gens):
            i, j = divmod(row, b)
            result.record(i, j, gen, self.task, batch[j])
        result.timings["generate"] += t1 - t0
        result.timings["restore"] += t2 - t1
        result.timings["score"] += time.perf_counter() - t2
        return result


def population_logits(model: torch.nn.Module, weights: LowRankWeights, members: Sequence[Member], sigma: float,
                      input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [N, B, T, V] of every member on the same B sequences from ONE forward over N x B rows (tests,
    benchmarks)."""
    n, b = len(members), input_ids.shape[0]
    rows = input_ids.repeat(n, 1)
    mask = None if attention_mask is None else attention_mask.repeat(n, 1)
    with torch.inference_mode(), PopulationPerturbation(model, weights, members, sigma) as pert:
        pert.set_rows(np.repeat(np.arange(n), b).tolist())
        logits = model(input_ids=rows, attention_mask=mask).logits
    return logits.view(n, b, *logits.shape[1:])


__all__ = ["LowRankWeights", "LowRankExecutor", "PopulationPerturbation", "generate_population", "lowrank_factors",
           "accumulate_outer", "check_factor_memory", "factor_bytes", "held_factor_bytes", "matrix_owners",
           "population_logits", "UnsupportedModel"]
