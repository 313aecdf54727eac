"""Seams of the ES loop: who evaluates the population (executor) and how rewards become fitness (fitness rule).

Executor: `evaluate_members(members, batch) -> PopulationResult` (a reward matrix [N, B] plus counters); the
trainer turns it into one fitness per member with a `FitnessRule`. `LocalExecutor` perturbs the model in place,
generates greedily, scores and restores, member after member. A distributed executor (Ray) only needs to return
the same matrix: replicas share the member seeds, so no weights cross the network (REFERENCE.md section 5).

FitnessRule: `(result, batch) -> fitness [N]`, higher is better (esft maximises). `MeanReward` is the paper's
rule (mean 0/1 reward over the batch), optionally plus a format bonus; `esft.es.dart.DartES` (DART-ES) is a
stateful rule that also draws the batches (see the hooks listed in esft.es.dart).
"""

from __future__ import annotations

import copy
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from queue import Empty, SimpleQueue
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence

import numpy as np
import torch

from esft.es.noise import MasterWeights
from esft.es.strategy import Member

GenerateFn = Callable[..., list]  # generate(model, tokenizer, prompts, cfg) -> list[Generation]


@dataclass
class PopulationResult:
    """Outcome of evaluating R rows (members, or the one unperturbed model) on a batch of B examples."""

    scores: np.ndarray
    """[R, B] task scores (0/1 under the paper's protocol)"""
    well_formed: np.ndarray
    """[R, B] bool: answer in the required format (for the format bonus and the box rate)"""
    texts: list[list[str]]
    """[R][B] completions"""
    tokens_generated: int = 0
    prompt_tokens: int = 0
    finished: int = 0
    """completions that ended with eos (the rest hit max_new_tokens)"""
    timings: dict[str, float] = field(default_factory=dict)
    """seconds: perturb, generate, score, restore"""


class Executor(Protocol):
    def evaluate_members(self, members: Sequence[Member], batch: Sequence[dict]) -> PopulationResult: ...

    def evaluate_center(self, batch: Sequence[dict]) -> PopulationResult: ...


class FitnessRule(Protocol):
    def __call__(self, result: PopulationResult, batch: Sequence[dict]) -> np.ndarray: ...


@dataclass
class MeanReward:
    """Fitness = mean over the batch of (score + format_bonus * well_formed). format_bonus 0 = the paper."""

    format_bonus: float = 0.0

    def rewards(self, result: PopulationResult) -> np.ndarray:
        r = np.asarray(result.scores, dtype=np.float64)
        if self.format_bonus:
            r = r + self.format_bonus * np.asarray(result.well_formed, dtype=np.float64)
        return r

    def __call__(self, result: PopulationResult, batch: Sequence[dict]) -> np.ndarray:
        return self.rewards(result).mean(axis=1)


FITNESS_RULES = ("mean", "dart")


def make_fitness_rule(name: str, format_bonus: float = 0.0, options: dict | None = None) -> FitnessRule:
    """"mean" (the paper, options unused) or "dart" (DART-ES, esft.es.dart; options = DartOptions fields)."""
    if name == "mean":
        if options:
            raise ValueError(f"fitness rule 'mean' takes no fitness_options, got {sorted(options)}")
        return MeanReward(format_bonus)
    if name == "dart":
        from esft.es.dart import make_dart

        return make_dart(format_bonus, options)
    raise ValueError(f"unknown fitness rule {name!r}; available: {', '.join(FITNESS_RULES)}")


class LocalExecutor:
    """Evaluates members on the local model: perturb -> generate -> score -> restore, member after member.

    `generate_fn(model, tokenizer, prompts, gen_config)` defaults to `esft.generation.generate` (greedy, from
    `gen_config`); tests pass a stub. The weights are restored even if generation raises, so a caught Ctrl-C
    leaves the model at the centre.

    `parallel_members` > 1 evaluates that many members at once, each on its own thread ("lane") with
    `torch threads // parallel_members` intra-op threads. Lane 0 is the calling thread on `model`; every other
    lane holds a deep copy of the model (one more model in memory per lane), made at its first use, whose
    parameters `weights.bind` perturbs from the same masters. Why: a batch-32 decode step is a string of small
    matmuls and memory-bound attention reads, and two threads splitting each of them wait on each other at every
    op; two members stepped side by side, one core each, keep both cores busy, and one lane's memory-bound
    phases overlap the other's compute (docs/performance.md, "Session 5"). torch releases the GIL inside its
    kernels and esft's compiled kernels do too. Each member's completions, scores and counters are the same as
    with one lane, wherever it ran (tested), so results do not depend on this setting as long as the matmul
    kernels give the same bits at either thread count (oneDNN's and MKL's do here: tests/test_es_executor.py).
    Timings are summed over members, so with lanes their sum exceeds the wall time.
    """

    def __init__(self, model: Any, tokenizer: Any, weights: MasterWeights, task: Any, sigma: float,
                 gen_config: Any, generate_fn: GenerateFn | None = None, parallel_members: int = 1):
        if int(parallel_members) < 1:
            raise ValueError(f"parallel_members must be >= 1, got {parallel_members}")
        self.parallel_members = int(parallel_members)
        self._lanes: list[tuple[Any, MasterWeights]] = []  # extra lanes: (model copy, weights bound to it)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_threads = 0
        self._pending: list[Future] = []
        self.model = model
        self.tokenizer = tokenizer
        self.weights = weights
        self.task = task
        self.sigma = float(sigma)
        self.gen_config = gen_config
        self._encode = None
        if generate_fn is None:
            # lazy: keeps the ES core importable (and testable) without the generation stack
            from esft.generation import encode_prompts, generate as generate_fn

            # the chat template is applied once per batch, not once per member
            self._encode = lambda prompts: encode_prompts(tokenizer, prompts)
        self.generate_fn = generate_fn

    def _prompts(self, batch: Sequence[dict]) -> tuple[list, dict]:
        prompts = [self.task.prompt(ex) for ex in batch]
        extra = {"prompt_ids": self._encode(prompts)} if self._encode is not None else {}
        return prompts, extra

    def _run(self, prompts: tuple[list, dict], batch: Sequence[dict], result: PopulationResult, row: int,
             model: Any = None) -> None:
        t0 = time.perf_counter()
        model = self.model if model is None else model
        gens = self.generate_fn(model, self.tokenizer, prompts[0], self.gen_config, **prompts[1])
        t1 = time.perf_counter()
        for j, (gen, example) in enumerate(zip(gens, batch)):
            text = gen.text
            result.texts[row].append(text)
            result.scores[row, j] = float(self.task.score(text, example))
            result.well_formed[row, j] = bool(self.task.is_well_formed(text, example))
            result.tokens_generated += len(getattr(gen, "completion_ids", ()) or ())
            result.prompt_tokens += int(getattr(gen, "prompt_tokens", 0) or 0)
            result.finished += int(bool(getattr(gen, "finished", False)))
        t2 = time.perf_counter()
        result.timings["generate"] += t1 - t0
        result.timings["score"] += t2 - t1

    def _empty(self, rows: int, cols: int) -> PopulationResult:
        return PopulationResult(scores=np.zeros((rows, cols)), well_formed=np.zeros((rows, cols), dtype=bool),
                                texts=[[] for _ in range(rows)],
                                timings={"perturb": 0.0, "generate": 0.0, "score": 0.0, "restore": 0.0})

    def _members(self, weights: MasterWeights, model: Any, prompts: tuple[list, dict], batch: Sequence[dict],
                 result: PopulationResult, rows: Iterable[int], members: Sequence[Member],
                 restore: bool = True) -> None:
        """Perturb -> generate -> score for each row of `rows`, back to back on one model: each perturbation
        rewrites every perturbed parameter from the masters, so no restore is needed between members (the result is
        bit-identical to restoring in between). The model is restored once at the end, also when generation
        raises, unless `restore` is False (a lane's private copy, which is perturbed again before any use)."""
        try:
            for row in rows:
                seed, sign = members[row]
                t0 = time.perf_counter()
                weights.perturb(seed, sign, self.sigma, replace=True)
                result.timings["perturb"] += time.perf_counter() - t0
                self._run(prompts, batch, result, row, model)
        finally:
            if restore and weights.perturbed is not None:
                t0 = time.perf_counter()
                weights.restore()
                result.timings["restore"] += time.perf_counter() - t0

    def evaluate_members(self, members: Sequence[Member], batch: Sequence[dict]) -> PopulationResult:
        prompts = self._prompts(batch)
        result = self._empty(len(members), len(batch))
        lanes = min(self.parallel_members, len(members))
        if lanes <= 1:
            self._members(self.weights, self.model, prompts, batch, result, range(len(members)), members)
            return result
        return self._evaluate_in_lanes(lanes, members, prompts, batch, result)

    # -- parallel lanes
    def start(self) -> None:
        """Make the lanes' model copies and threads now rather than at the first `evaluate_members` (a benchmark
        keeps this set-up out of its timed iteration). Nothing to do with one lane."""
        if self.parallel_members > 1:
            self._ensure_lanes(self.parallel_members, max(1, torch.get_num_threads() // self.parallel_members))

    def _ensure_lanes(self, lanes: int, threads: int) -> None:
        for fut in self._pending:  # an interrupted call may have left lanes finishing their member
            fut.exception()
        self._pending = []
        while len(self._lanes) < lanes - 1:
            replica = copy.deepcopy(self.model)
            self._lanes.append((replica, self.weights.bind(replica)))
        for replica, _ in self._lanes:
            # parameters outside the ES selection are never perturbed: keep them equal to the model's (a resumed
            # or reloaded model may have changed them since the copy was made)
            chosen = {id(p) for p in self.weights.params.values()}
            theirs = dict(replica.named_parameters())
            with torch.no_grad():
                for name, param in self.model.named_parameters():
                    if id(param) not in chosen and not torch.equal(theirs[name], param):
                        theirs[name].copy_(param)
        if self._pool is None or self._pool_threads != threads:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self._pool_threads = threads
            self._pool = ThreadPoolExecutor(max_workers=self.parallel_members - 1, thread_name_prefix="esft-lane",
                                            initializer=torch.set_num_threads, initargs=(threads,))

    def _evaluate_in_lanes(self, lanes: int, members: Sequence[Member], prompts: tuple[list, dict],
                           batch: Sequence[dict], result: PopulationResult) -> PopulationResult:
        total = torch.get_num_threads()
        threads = max(1, total // lanes)
        self._ensure_lanes(lanes, threads)
        queue: "SimpleQueue[int]" = SimpleQueue()
        for i in range(len(members)):
            queue.put(i)
        stop = threading.Event()
        # each lane counts into its own result (`+=` on shared counters is not atomic across threads); rows are
        # disjoint, so they are merged by copying each lane's rows
        parts = [self._empty(len(members), len(batch)) for _ in range(lanes)]
        done: list[list[int]] = [[] for _ in range(lanes)]

        def lane(k: int, weights: MasterWeights, model: Any) -> None:
            def rows() -> Iterator[int]:  # members handed out one at a time, to whichever lane is free
                while not stop.is_set():
                    try:
                        i = queue.get_nowait()
                    except Empty:
                        return
                    done[k].append(i)
                    yield i

            with torch.no_grad():  # grad mode is thread-local
                self._members(weights, model, prompts, batch, parts[k], rows(), members, restore=k == 0)

        def guarded(k: int, weights: MasterWeights, model: Any) -> None:
            try:
                lane(k, weights, model)
            except BaseException:
                stop.set()
                raise

        self._pending = [self._pool.submit(guarded, k + 1, w, m) for k, (m, w) in enumerate(self._lanes[:lanes - 1])]
        torch.set_num_threads(threads)  # this thread is lane 0 (on the real model): a Ctrl-C reaches it at once
        try:
            guarded(0, self.weights, self.model)
        except BaseException:
            stop.set()  # the other lanes finish their current member on their own copies and stop
            raise
        finally:
            torch.set_num_threads(total)
        for fut in self._pending:
            fut.result()
        self._pending = []
        for part, rows in zip(parts, done):
            for i in rows:
                result.scores[i] = part.scores[i]
                result.well_formed[i] = part.well_formed[i]
                result.texts[i] = part.texts[i]
            result.tokens_generated += part.tokens_generated
            result.prompt_tokens += part.prompt_tokens
            result.finished += part.finished
            for key, value in part.timings.items():
                result.timings[key] += value
        return result

    def close(self) -> None:
        """Stop the lane threads and drop the model copies (the executor can still be used: lanes come back)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._lanes = []
        self._pending = []

    def evaluate_center(self, batch: Sequence[dict]) -> PopulationResult:
        """The unperturbed model on a batch (train-batch reward, held-out accuracy)."""
        prompts = self._prompts(batch)
        result = self._empty(1, len(batch))
        if batch:
            self._run(prompts, batch, result, 0)
        return result
