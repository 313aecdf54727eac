"""Evolution Strategies as ask/tell (evosax style), with fitness shaping as pure functions.

esft MAXIMISES fitness (reward): a member with higher fitness pulls the weights towards its perturbation.

    strategy = ES(population_size=30, sigma=1.5e-3, alpha=7.5e-4, seed=42)
    members = strategy.ask(iteration)          # [(seed, sign), ...], a pure function of (run seed, iteration)
    update = strategy.tell(members, fitness)   # esft.es.noise.Update, applied by MasterWeights.apply

`ask` keeps no RNG state: the seeds of iteration t come from numpy's SeedSequence([run seed, t]), so a resumed
run asks exactly what the uninterrupted run asked. A noise stream k > 0 (`stream`, ESConfig.noise_stream) draws
from SeedSequence([run seed, t, k]) instead: the stages of a sequential chain share the run seed and each starts
at iteration 0, so without their own streams they would all search the same N directions at every t. The paper's
update (SGD) is

    theta += (alpha / N) * sum_n z_n * eps_n,   z = (f - mean f) / (population std f + 1e-8).

Alternatively the estimate is handed to a `torch.optim` optimizer (e.g. Adam) as the gradient
-(1 / (N sigma)) * sum_n z_n eps_n: torch minimises, so the sign is flipped to maximise reward. An iteration
whose fitness has no spread gives a zero estimate and no optimizer step at all (MasterWeights.apply skips zero
updates), so Adam's moments and bias-correction step count advance only on iterations that carry a signal.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch

from esft.es.noise import Update

FitnessShaping = Callable[[np.ndarray], np.ndarray]


class Member(NamedTuple):
    """One population member: perturbation theta + sign * sigma * eps(seed)."""

    seed: int
    sign: int


# ---- fitness shaping (pure: (fitness) -> shaped, same length) ------------------------------------------------

def zscore(fitness: np.ndarray) -> np.ndarray:
    """(f - mean) / (population std + 1e-8), as in the paper. All-equal fitness -> exact zeros (no update)."""
    f = np.asarray(fitness, dtype=np.float64)
    if f.size == 0 or np.ptp(f) == 0.0:
        # Guard: mean() of equal non-representable values can differ from them by one ulp, which the +1e-8
        # would turn into a tiny spurious step; equal fitness carries no signal, so the update must be zero.
        return np.zeros_like(f)
    return (f - f.mean()) / (f.std() + 1e-8)


def centered_rank(fitness: np.ndarray) -> np.ndarray:
    """Ranks mapped linearly to [-0.5, 0.5] (Salimans et al. 2017). Ties get their average rank, so equal
    fitness values get equal weights and an all-equal population gives exact zeros."""
    f = np.asarray(fitness, dtype=np.float64)
    n = f.size
    if n <= 1:
        return np.zeros_like(f)
    order = np.argsort(f, kind="stable")
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = np.arange(n, dtype=np.float64)
    # average the ranks within each group of ties
    uniq, inverse = np.unique(f, return_inverse=True)
    if uniq.size < n:
        sums = np.bincount(inverse, weights=ranks)
        counts = np.bincount(inverse)
        ranks = (sums / counts)[inverse]
    return ranks / (n - 1) - 0.5


def rank_correlation(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation of two fitness vectors of one population (ties get their average rank): the
    Pearson correlation of their centred ranks, an affine map of the average ranks. NaN when either vector is
    constant (no order to compare). How much a change of rollout (bf16 vs fp32) reorders the members."""
    x, y = centered_rank(np.asarray(a, dtype=np.float64)), centered_rank(np.asarray(b, dtype=np.float64))
    if len(x) != len(y):
        raise ValueError(f"{len(x)} vs {len(y)} members")
    x, y = x - x.mean(), y - y.mean()
    denom = float(np.sqrt((x * x).sum() * (y * y).sum()))
    return float((x * y).sum() / denom) if denom > 0 else float("nan")


def raw(fitness: np.ndarray) -> np.ndarray:
    """No shaping (for experiments); note the step then scales with the reward's magnitude."""
    return np.asarray(fitness, dtype=np.float64).copy()


FITNESS_SHAPING: dict[str, FitnessShaping] = {"zscore": zscore, "centered_rank": centered_rank, "raw": raw}


def get_shaping(name: str) -> FitnessShaping:
    try:
        return FITNESS_SHAPING[name]
    except KeyError:
        raise ValueError(f"unknown fitness shaping {name!r}; choose one of {sorted(FITNESS_SHAPING)}") from None


# ---- member seeds ---------------------------------------------------------------------------------------------

def member_seeds(run_seed: int, iteration: int, count: int, stream: int = 0) -> list[int]:
    """`count` distinct 32-bit seeds for one iteration, a pure function of (run seed, iteration, noise stream).

    Every member seed of every executor, noise mode and fitness rule comes from here (through `ES.ask`). Stream 0
    is SeedSequence([run seed, t]) exactly, so runs logged without a stream resume and re-run bit-identically.
    Stream k > 0 appends k: SeedSequence pads short entropy with zeros, so [s, t, k] equals [s, t] only for k = 0,
    and the streams are independent draws (two share a 32-bit seed only by chance, ~N^2 / 2^32 per iteration).
    """
    if int(stream) < 0:
        raise ValueError(f"noise stream must be >= 0, got {stream}")
    entropy = [int(run_seed), int(iteration)] + ([int(stream)] if int(stream) else [])
    ss = np.random.SeedSequence(entropy)
    seeds: list[int] = []
    extra = 0
    while len(seeds) < count:  # collisions are ~never; re-draw deterministically if they happen
        state = ss.generate_state(count + extra, dtype=np.uint32)
        seeds = list(dict.fromkeys(int(s) for s in state))[:count]
        extra += 1
    return seeds


# ---- the strategy -------------------------------------------------------------------------------------------------

OPTIMIZERS = ("sgd", "adam")


class ES:
    """Isotropic Gaussian ES (OpenAI-ES / the paper's variant). esft maximises fitness.

    population_size: N members per iteration (even when antithetic).
    sigma: perturbation scale. alpha: step size (SGD) or learning rate (Adam).
    antithetic: members come in mirrored pairs (seed, +1), (seed, -1) sharing one noise draw.
    fitness_shaping: "zscore" (paper), "centered_rank" or "raw".
    optimizer: "sgd" (paper rule, no state) or "adam" (torch.optim.Adam on the fp32 masters).
    stream: noise stream of the member seeds (see `member_seeds`); 0 for a single run.
    """

    def __init__(self, population_size: int, sigma: float, alpha: float, seed: int = 0, antithetic: bool = False,
                 fitness_shaping: str = "zscore", optimizer: str = "sgd",
                 adam_betas: tuple[float, float] = (0.9, 0.999), adam_eps: float = 1e-8, stream: int = 0):
        if population_size < 1:
            raise ValueError("population_size must be >= 1")
        if antithetic and population_size % 2:
            raise ValueError(f"antithetic sampling needs an even population, got {population_size}")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {OPTIMIZERS}")
        for name, value in (("sigma", sigma), ("alpha", alpha)):
            # as ESConfig: a negative sigma puts member (seed, +1) at theta - |sigma| eps while the SGD step adds
            # +z eps (descent); sigma 0 perturbs nothing and divides Adam's scale by zero; alpha <= 0 never ascends
            if not (np.isfinite(float(value)) and float(value) > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        self.population_size = int(population_size)
        self.sigma = float(sigma)
        self.alpha = float(alpha)
        self.seed = int(seed)
        self.antithetic = bool(antithetic)
        self.shaping_name = fitness_shaping
        self.shaping = get_shaping(fitness_shaping)
        self.optimizer_name = optimizer
        self.adam_betas = tuple(adam_betas)
        self.adam_eps = float(adam_eps)
        if int(stream) < 0:
            raise ValueError(f"noise stream must be >= 0, got {stream}")
        self.stream = int(stream)

    def ask(self, iteration: int) -> list[Member]:
        """Members of an iteration, deterministic in (run seed, iteration, noise stream)."""
        if self.antithetic:
            seeds = member_seeds(self.seed, iteration, self.population_size // 2, self.stream)
            return [Member(s, sign) for s in seeds for sign in (1, -1)]
        return [Member(s, 1) for s in member_seeds(self.seed, iteration, self.population_size, self.stream)]

    def shape(self, fitness: Sequence[float]) -> np.ndarray:
        f = np.asarray(fitness, dtype=np.float64)
        if not np.all(np.isfinite(f)):
            raise ValueError(f"non-finite fitness: {f}")
        return self.shaping(f)

    def tell(self, members: Sequence[Member], fitness: Sequence[float]) -> Update:
        """Update from members and their fitness (higher is better). Returns an `Update` with one term per seed:
        antithetic pairs fold to c = z(+) - z(-), so each noise tensor is regenerated once."""
        if len(members) != len(fitness):
            raise ValueError(f"{len(members)} members but {len(fitness)} fitness values")
        z = self.shape(fitness)
        terms: dict[int, float] = {}
        for (seed, sign), zi in zip(members, z):
            terms[int(seed)] = terms.get(int(seed), 0.0) + float(sign) * float(zi)
        n = len(members)
        if self.optimizer_name == "sgd":
            scale, kind = self.alpha / n, "sgd"
        else:
            # the fitness-gradient estimate is (1 / (N sigma)) sum z eps; torch minimises, hence the minus
            scale, kind = -1.0 / (n * self.sigma), "gradient"
        return Update(seeds=tuple(terms), coefficients=tuple(terms.values()), scale=scale, kind=kind)

    def make_optimizer(self, masters: Sequence[torch.Tensor]) -> torch.optim.Optimizer | None:
        """The torch optimizer over the fp32 master tensors (None for the paper's SGD rule, which has no state)."""
        if self.optimizer_name == "sgd":
            return None
        return torch.optim.Adam(list(masters), lr=self.alpha, betas=self.adam_betas, eps=self.adam_eps)
