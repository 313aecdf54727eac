"""DART-ES: difficulty-aware reweighting and targeted replay on top of plain ES (docs/es_variants.md).

A fitness rule that is also the trainer's batch sampler (`--fitness-rule dart`, alias `--fitness dart`).

Per train problem j it keeps
    EMA_j        pass rate over the population, p_j = mean_i A[i, j]; EMA_j = 0.7 EMA_j + 0.3 p_j (first value p_j)
    zero_pass_j  consecutive evaluations in which no member solved j
    in_buffer_j  the replay buffer: j is added when at least one member solved it, dropped when EMA_j >= 0.5
                 (learned) or when nobody solved it twice in a row (hopeless)
    replays_j    replays of j in the current epoch;  last_seen_j  the last iteration j was in a batch

A batch belongs to the epoch of the fresh stream where it starts (cursor // n): its replays are checked against,
and counted in, that epoch's counts, so no problem is replayed more than twice among one epoch's batches.

Batches: fresh problems come from a stream of seeded per-epoch permutations of the train split (the fresh
window); round(0.2 B) slots (halves rounded up, not Python's round-half-to-even) are reserved for replay
candidates (in the buffer, not in the fresh window, replayed < 2 times this epoch, last seen more than 1 iteration
ago, EMA < 0.5), drawn without replacement with priority exp(-3 EMA). Reserved slots that find no candidate go
to further fresh problems, so a batch always holds B distinct problems (min(B, n)).

Fitness: F_i = mean_j(A[i, j] w_j) + 0.1 mean_j(format[i, j]), w_j = 0.8 + exp(-3 EMA_j); the strategy's
fitness shaping ("zscore", the default) then z-scores it. The weights use the EMA *after* this iteration's
update, so a problem seen for the first time is weighted by its current pass rate (the "first value p_j").
A is the 0/1 correctness matrix (score >= 0.5, on scores in [0, 1]: another scale is refused),
format the well-formed matrix of the executor's result.

State and resume: the state is a function of the logged history. Each iteration logs what the rule needs to
replay it (per-problem solve counts, replay flags, the fresh cursor) in its seeds.jsonl line under
"fitness_rule"; checkpoints store the state itself. Resume = state from the checkpoint + replay of the logged
lines after it, so the resumed run draws exactly the batches of an uninterrupted one.

The trainer's periodic `evaluate()` still reports its train reward on the uniform `sample_batch` batch, so that
number stays comparable between plain ES and DART-ES runs.

`DartES` implements every hook of esft.es.fitness.FitnessRule: bind(num_examples, seed), sample_batch(seed,
iteration, n, batch_size), __call__(result, batch), log_record(), summary(), state_dict(), load_state_dict(state),
replay(seed_log_record).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from esft.es.fitness import FitnessRule, row_means

NEVER = -(10**9)  # last_seen of a problem never batched: any cooldown has passed


@dataclass(frozen=True)
class DartOptions:
    """DART-ES constants (defaults = the published rule); set through ESConfig.fitness_options."""

    ema_decay: float = 0.7
    """EMA_j = ema_decay * EMA_j + (1 - ema_decay) * p_j"""
    learned_threshold: float = 0.5
    """EMA at or above which a problem counts as learned: dropped from the buffer, never replayed"""
    hopeless_after: int = 2
    """drop from the buffer after this many consecutive evaluations with no solver"""
    replay_fraction: float = 0.2
    """round(replay_fraction * B) slots per batch are reserved for replays"""
    max_replays_per_epoch: int = 2
    """a problem is replayed at most this many times per epoch"""
    cooldown: int = 1
    """a replay candidate must have been out of the batches for more than this many iterations"""
    priority_temperature: float = 3.0
    """replay priority exp(-priority_temperature * EMA)"""
    weight_floor: float = 0.8
    """difficulty weight w = weight_floor + exp(-weight_temperature * EMA)"""
    weight_temperature: float = 3.0
    format_coef: float = 0.1
    """F_i += format_coef * mean_j format[i, j]"""

    def __post_init__(self) -> None:
        for name, (kind, ok, words) in _OPTION_RANGES.items():
            value = getattr(self, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or (kind is int and not isinstance(value, int)) or not ok(value):
                raise ValueError(f"DART-ES option {name} = {value!r} is not accepted; expected {words}")

    @classmethod
    def from_dict(cls, options: dict[str, Any] | None) -> "DartOptions":
        options = dict(options or {})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - names, key=str)  # by text: YAML keys may mix ints and text
        if unknown:
            raise ValueError(f"unknown DART-ES options {unknown}; known: {sorted(names)}")
        return cls(**{k: _number(v, _OPTION_RANGES[k][0]) if k in _OPTION_RANGES else v for k, v in options.items()})


def _number(value: Any, kind: type) -> Any:
    """Text read as a number of the option's type (YAML 1.1 reads `1e-3` as text, and a quoted number is text);
    other text unchanged, for the range check to refuse."""
    if not isinstance(value, str):
        return value
    try:
        return kind(value.strip())
    except ValueError:
        return value


def _finite(v: float) -> bool:
    # math, not numpy: np.isfinite raises TypeError for a Python int beyond 64 bits (YAML reads 1 followed by 30
    # zeros as one); such an int is finite if it converts to a float, and too large for one otherwise
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


#: what each DartOptions field accepts: (type, check, words for the error)
_OPTION_RANGES: dict[str, tuple[type, Any, str]] = {
    "ema_decay": (float, lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "learned_threshold": (float, lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "hopeless_after": (int, lambda v: v >= 1, "an integer >= 1"),
    "replay_fraction": (float, lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "max_replays_per_epoch": (int, lambda v: v >= 0, "an integer >= 0"),
    "cooldown": (int, lambda v: v >= 0, "an integer >= 0"),
    "priority_temperature": (float, lambda v: _finite(v) and v >= 0, "a finite number >= 0"),
    "weight_floor": (float, lambda v: _finite(v) and v >= 0, "a finite number >= 0"),
    "weight_temperature": (float, lambda v: _finite(v) and v >= 0, "a finite number >= 0"),
    "format_coef": (float, _finite, "a finite number"),
}


# ---- pure rules (arrays in, arrays out) ---------------------------------------------------------------------------

def pass_rates(correct: np.ndarray) -> np.ndarray:
    """p_j = mean_i A[i, j] of an [N, B] 0/1 matrix."""
    return np.asarray(correct, dtype=np.float64).mean(axis=0)


def ema_update(ema: np.ndarray, seen: np.ndarray, p: np.ndarray, decay: float) -> np.ndarray:
    """EMA of the batch's problems: decay * EMA + (1 - decay) * p, or p for a problem seen for the first time."""
    ema, seen, p = np.asarray(ema, np.float64), np.asarray(seen, bool), np.asarray(p, np.float64)
    return np.where(seen, decay * ema + (1.0 - decay) * p, p)


def buffer_update(in_buffer: np.ndarray, zero_pass: np.ndarray, ema: np.ndarray, p: np.ndarray,
                  learned: float, hopeless_after: int) -> tuple[np.ndarray, np.ndarray]:
    """(in_buffer, zero_pass) of the batch's problems after an evaluation with pass rates p and updated EMA.

    zero_pass counts consecutive evaluations without a solver; a problem leaves the buffer when learned
    (EMA >= learned) or hopeless (zero_pass >= hopeless_after), and enters it when someone solved it (p > 0)
    and it is not learned."""
    p = np.asarray(p, np.float64)
    zero_pass = np.where(p > 0, 0, np.asarray(zero_pass) + 1)
    drop = (np.asarray(ema) >= learned) | (zero_pass >= hopeless_after)
    add = p > 0
    return (np.asarray(in_buffer, bool) | add) & ~drop, zero_pass


def difficulty_weights(ema: np.ndarray, floor: float = 0.8, temperature: float = 3.0) -> np.ndarray:
    """w_j = floor + exp(-temperature * EMA_j): 1.8 for a never-solved problem, ~0.85 for a mastered one."""
    return floor + np.exp(-temperature * np.asarray(ema, np.float64))


def dart_fitness(correct: np.ndarray, well_formed: np.ndarray, weights: np.ndarray, format_coef: float) -> np.ndarray:
    """F_i = mean_j(A[i, j] w_j) + format_coef * mean_j(format[i, j]) (before z-scoring)."""
    # order-independent row sums (esft.es.fitness.row_means): members that solved problems of the same weights and
    # the same number of well-formed answers tie bit for bit, whichever problems they were
    return row_means(correct, weights) + format_coef * row_means(well_formed)


def replay_candidates(in_buffer: np.ndarray, ema: np.ndarray, replays: np.ndarray, last_seen: np.ndarray,
                      window: Sequence[int], iteration: int, opts: DartOptions) -> np.ndarray:
    """Problems eligible for a replay slot at `iteration` (sorted indices)."""
    ok = np.asarray(in_buffer, bool).copy()
    ok &= np.asarray(replays) < opts.max_replays_per_epoch
    ok &= iteration - np.asarray(last_seen) > opts.cooldown
    ok &= np.asarray(ema) < opts.learned_threshold
    ok[np.asarray(list(window), dtype=np.int64)] = False
    return np.flatnonzero(ok)


def draw_replays(candidates: np.ndarray, ema: np.ndarray, slots: int, rng: np.random.Generator,
                 temperature: float = 3.0) -> list[int]:
    """min(slots, |candidates|) candidates without replacement, with probability proportional to exp(-t EMA)."""
    candidates = np.asarray(candidates, dtype=np.int64)
    k = min(int(slots), candidates.size)
    if k <= 0:
        return []
    e = np.asarray(ema, np.float64)[candidates]
    # shifted by the smallest EMA: the same probabilities once normalised, but the largest priority is exactly 1,
    # so a large temperature (accepted by DartOptions) cannot underflow every priority to 0 (0/0 = NaN); those that
    # still underflow keep the smallest positive weight, as a draw of k needs k candidates of nonzero probability
    prio = np.maximum(np.exp(-temperature * (e - e.min())), np.finfo(np.float64).tiny)
    return [int(i) for i in rng.choice(candidates, size=k, replace=False, p=prio / prio.sum())]


def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """Order of the fresh problems in an epoch: a pure function of (run seed, epoch)."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(epoch), 0xDA27])).permutation(n)


def take_fresh(seed: int, n: int, cursor: int, count: int, exclude: Sequence[int] = ()) -> tuple[list[int], int]:
    """Next `count` distinct problems of the fresh stream from position `cursor`, skipping `exclude` (and repeats
    across an epoch boundary); returns them and the new cursor. Skipped positions are consumed."""
    taken: list[int] = []
    skip = set(int(i) for i in exclude)
    count = min(int(count), n - len(skip & set(range(n))))
    perms: dict[int, np.ndarray] = {}
    while len(taken) < count:
        epoch, offset = divmod(cursor, n)
        if epoch not in perms:
            perms[epoch] = epoch_permutation(seed, epoch, n)
        j = int(perms[epoch][offset])
        cursor += 1
        if j in skip:
            continue
        skip.add(j)
        taken.append(j)
    return taken, cursor


# ---- the stateful rule -----------------------------------------------------------------------------------------------

@dataclass
class Proposal:
    iteration: int
    indices: list[int]
    replay: list[bool]
    cursor: int
    """fresh-stream position after this batch"""


class DartES(FitnessRule):
    """DART-ES fitness rule + batch sampler (see the module docstring). esft maximises fitness. Every hook of
    `FitnessRule` is used: bind, sample_batch, log_record, summary, state_dict / load_state_dict, replay."""

    stateful = True

    def __init__(self, options: DartOptions | dict[str, Any] | None = None):
        self.opts = options if isinstance(options, DartOptions) else DartOptions.from_dict(options)
        self.seed: int | None = None
        self.n = 0
        self._pending: Proposal | None = None
        self._last_log: dict[str, Any] | None = None

    # -- state
    def bind(self, num_examples: int, seed: int) -> None:
        """Size the per-problem state for the train split and remember the run seed (fresh state)."""
        self.seed, self.n = int(seed), int(num_examples)
        self.ema = np.zeros(self.n)
        self.seen = np.zeros(self.n, dtype=bool)
        self.zero_pass = np.zeros(self.n, dtype=np.int64)
        self.in_buffer = np.zeros(self.n, dtype=bool)
        self.replays = np.zeros(self.n, dtype=np.int64)
        self.last_seen = np.full(self.n, NEVER, dtype=np.int64)
        self.cursor = 0
        self.epoch = 0
        self._pending = None

    def _check_bound(self) -> None:
        if self.seed is None:
            raise RuntimeError("DartES.bind(num_examples, seed) must be called before use")

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state (floats as Python floats: json writes repr, which round-trips float64 exactly)."""
        self._check_bound()
        return {"n": self.n, "seed": self.seed, "cursor": self.cursor, "epoch": self.epoch,
                "ema": self.ema.tolist(), "seen": self.seen.astype(int).tolist(),
                "zero_pass": self.zero_pass.tolist(), "in_buffer": self.in_buffer.astype(int).tolist(),
                "replays": self.replays.tolist(), "last_seen": self.last_seen.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.bind(int(state["n"]), int(state["seed"]))
        self.cursor, self.epoch = int(state["cursor"]), int(state["epoch"])
        self.ema = np.asarray(state["ema"], dtype=np.float64)
        self.seen = np.asarray(state["seen"], dtype=bool)
        self.zero_pass = np.asarray(state["zero_pass"], dtype=np.int64)
        self.in_buffer = np.asarray(state["in_buffer"], dtype=bool)
        self.replays = np.asarray(state["replays"], dtype=np.int64)
        self.last_seen = np.asarray(state["last_seen"], dtype=np.int64)

    # -- batches
    def replay_slots(self, batch_size: int) -> int:
        # floor(x + 0.5), the rule's round: Python's round() sends halves to even (round(2.5) == 2)
        return int(math.floor(self.opts.replay_fraction * min(batch_size, self.n) + 0.5))

    def propose(self, iteration: int, batch_size: int) -> Proposal:
        """The batch of `iteration` from the current state (pure: the state is not changed)."""
        self._check_bound()
        size = min(int(batch_size), self.n)
        slots = self.replay_slots(size)
        fresh, cursor = take_fresh(self.seed, self.n, self.cursor, size - slots)
        # counts of the batch's epoch (module docstring): none yet when the fresh stream has moved on to a new one
        replays = self.replays if self.cursor // self.n == self.epoch else np.zeros_like(self.replays)
        cands = replay_candidates(self.in_buffer, self.ema, replays, self.last_seen, fresh, iteration, self.opts)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, int(iteration), 0xDA28]))
        picks = draw_replays(cands, self.ema, slots, rng, self.opts.priority_temperature)
        # reserved slots without a candidate are filled from the fresh stream
        more, cursor = take_fresh(self.seed, self.n, cursor, size - len(fresh) - len(picks), exclude=fresh + picks)
        fresh += more
        return Proposal(int(iteration), fresh + picks, [False] * len(fresh) + [True] * len(picks), cursor)

    def sample_batch(self, seed: int, iteration: int, n: int, batch_size: int) -> list[int]:
        """The trainer's batch seam (same signature as esft.es.fitness.sample_batch)."""
        self._check_bound()
        if int(n) != self.n or int(seed) != self.seed:
            raise ValueError(f"DartES bound to n={self.n}, seed={self.seed}; asked for n={n}, seed={seed}")
        if self._pending is None or self._pending.iteration != iteration:
            self._pending = self.propose(iteration, batch_size)
        return list(self._pending.indices)

    # -- the update of the per-problem state
    def _advance(self, proposal: Proposal, solved: np.ndarray, population: int) -> np.ndarray:
        """Apply one evaluated batch to the state; returns the batch's difficulty weights."""
        idx = np.asarray(proposal.indices, dtype=np.int64)
        p = np.asarray(solved, dtype=np.float64) / float(population)
        ema = ema_update(self.ema[idx], self.seen[idx], p, self.opts.ema_decay)
        self.ema[idx] = ema
        self.seen[idx] = True
        self.in_buffer[idx], self.zero_pass[idx] = buffer_update(
            self.in_buffer[idx], self.zero_pass[idx], ema, p, self.opts.learned_threshold, self.opts.hopeless_after)
        epoch = self.cursor // self.n  # the batch's epoch: where the fresh stream stood when it was drawn
        if epoch != self.epoch:  # a new epoch: replay counts start again, before this batch's replays count
            self.epoch = epoch
            self.replays[:] = 0
        flags = np.asarray(proposal.replay, dtype=bool)
        self.replays[idx[flags]] += 1
        self.last_seen[idx] = proposal.iteration
        self.cursor = int(proposal.cursor)
        self._pending = None
        return difficulty_weights(ema, self.opts.weight_floor, self.opts.weight_temperature)

    def __call__(self, result: Any, batch: Sequence[dict]) -> np.ndarray:
        """Fitness of the members on the proposed batch; advances the per-problem state."""
        proposal = self._pending
        if proposal is None or len(proposal.indices) != len(batch):
            raise RuntimeError("DartES scores only batches it proposed (its sample_batch hook)")
        scores = np.asarray(result.scores, dtype=np.float64)
        outside = scores[(scores < 0.0) | (scores > 1.0)]
        if outside.size:  # >= 0.5 means "solved" only on a [0, 1] scale (right/wrong, partial credit)
            raise ValueError(f"DART-ES counts a score >= 0.5 as solved, but the task scored {outside.flat[0]:g}: a "
                             "reward on another scale has no 'solved' (use the default fitness rule, --fitness "
                             "mean, with such a task)")
        correct = scores >= 0.5
        solved = correct.sum(axis=0).astype(np.int64)
        weights = self._advance(proposal, solved, correct.shape[0])
        self._last_log = {"solved": solved.tolist(), "replay": [int(r) for r in proposal.replay],
                          "cursor": proposal.cursor, "buffer_size": int(self.in_buffer.sum()),
                          "weights_mean": float(weights.mean())}
        return dart_fitness(correct, result.well_formed, weights, self.opts.format_coef)

    def log_record(self) -> dict[str, Any]:
        """What the last scored iteration needs for an exact replay (stored in its seeds.jsonl line)."""
        if self._last_log is None:
            raise RuntimeError("no iteration scored yet")
        return dict(self._last_log)

    def replay(self, record: dict[str, Any]) -> None:
        """Advance the state by one logged iteration (a seeds.jsonl line with a "fitness_rule" entry)."""
        self._check_bound()
        entry = record.get("fitness_rule")
        if entry is None:
            raise ValueError(f"seed-log line of iteration {record.get('iteration')} has no DART-ES record")
        proposal = Proposal(int(record["iteration"]), [int(i) for i in record["batch"]],
                            [bool(r) for r in entry["replay"]], int(entry["cursor"]))
        self._advance(proposal, np.asarray(entry["solved"], dtype=np.int64), len(record["members"]))
        self._last_log = dict(entry)

    def summary(self) -> dict[str, Any]:
        """Diagnostics: buffer size, mean EMA of seen problems, replayed problems this epoch."""
        self._check_bound()
        return {"buffer_size": int(self.in_buffer.sum()), "seen": int(self.seen.sum()),
                "mean_ema_seen": float(self.ema[self.seen].mean()) if self.seen.any() else None,
                "epoch": self.epoch, "replayed_this_epoch": int((self.replays > 0).sum())}


def make_dart(format_bonus: float = 0.0, options: dict[str, Any] | None = None) -> DartES:
    """DART-ES from ESConfig fields: `fitness_options` (DartOptions names) and `format_bonus`, which must be 0 or
    equal DART's own format coefficient (it is the `mean` rule's knob; silently ignoring it would be a trap)."""
    opts = DartOptions.from_dict(options)
    if format_bonus and format_bonus != opts.format_coef:
        raise ValueError(f"format_bonus={format_bonus} with fitness rule 'dart': DART-ES has its own format "
                         f"coefficient ({opts.format_coef}); set fitness_options {{format_coef: {format_bonus}}} "
                         "and leave format_bonus at 0")
    return DartES(opts)


__all__ = ["DartOptions", "DartES", "Proposal", "make_dart", "pass_rates", "ema_update", "buffer_update",
           "difficulty_weights", "dart_fitness", "replay_candidates", "draw_replays", "epoch_permutation",
           "take_fresh"]
