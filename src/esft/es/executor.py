"""The population-evaluation seam of the ES loop: who evaluates the members (executor).

Executor: `evaluate_members(members, batch) -> PopulationResult` (a reward matrix [N, B] plus counters); the
trainer turns it into one fitness per member with a fitness rule (esft.es.fitness). `LocalExecutor` perturbs the
model in place, generates greedily, scores and restores, member after member. A distributed executor (Ray,
esft.es.distributed) only needs to return the same matrix: replicas share the member seeds, so no weights cross
the network (Salimans et al. 2017). The perturbation scale is the strategy's `sigma` (esft.es.strategy.ES owns
it), read when a member is perturbed.
"""

from __future__ import annotations

import contextlib
import numbers
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from queue import Empty, SimpleQueue
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from esft.es.lanes import (available_memory, lane_bytes, lanes_that_fit, map_large_blocks,  # noqa: F401 (re-exported)
                           openmp_backend, return_freed_heap, rollout_replica)
from esft.es.noise import MasterWeights, Update
from esft.es.param_writes import release
from esft.es.population import PopulationResult
from esft.es.strategy import ES, Member

GenerateFn = Callable[..., list]  # generate(model, tokenizer, prompts, cfg) -> list[Generation]


class Executor:
    """Evaluates populations for the trainer. Subclasses implement `evaluate_members` and `evaluate_center`; the
    other hooks default to nothing to do."""

    def evaluate_members(self, members: Sequence[Member], batch: Sequence[dict]) -> PopulationResult:
        raise NotImplementedError

    def evaluate_center(self, batch: Sequence[dict]) -> PopulationResult:
        """The unperturbed model on a batch (train-batch reward, held-out accuracy)."""
        raise NotImplementedError

    def on_update(self, update: Update, step: int) -> None:
        """Called with every update before the driver applies it to its own weights (`step` = updates applied
        after it). An executor on the driver's weights has nothing to do; remote replicas apply the same update."""
        return None

    def close(self) -> None:
        """Release what the executor started (threads, model copies, workers)."""
        return None


class LocalExecutor(Executor):
    """Evaluates members on the local model: perturb -> generate -> score, member after member, then restore.

    `generate_fn(model, tokenizer, prompts, gen_config)` defaults to `esft.generation.generate` (greedy, from
    `gen_config`); tests pass a stub. Each perturbation rewrites every perturbed parameter from the masters, so
    members run back to back and the model is restored once, at the end, also when generation raises: a caught
    Ctrl-C leaves the model at the centre.

    `strategy` is the ES strategy whose `sigma` scales every perturbation (read at each one: the strategy owns
    sigma); a number in its place is a fixed sigma (benchmarks, tests).

    `parallel_members` > 1 evaluates that many members at once, each on its own thread ("lane") with an equal share
    of torch's intra-op threads; the centre's evaluations split their generation batches across the lanes. Lane 0 is
    the calling thread on `model`; every other lane holds a deep copy of the model (one more model in memory per
    lane), made at its first use (or by `start`), whose parameters `weights.bind` perturbs from the same masters.
    With `rollout_dtype` (bf16 rollouts, esft.generation.precision), or with masters that share the model's storage
    (`MasterWeights(share_storage=True)`, what `esft.es.build` makes for bf16 rollouts and for parallel lanes),
    every lane, lane 0 and the centre's evaluations included, runs on a copy (`rollout_replica`; bf16: half a model
    each) holding (master + sigma * eps) in its dtype, and `model` stays at the masters.

    Memory: a copy's projections are rewritten in full at every perturbation, so while the lean engine holds their
    packed copies the plain ones are freed (`esft.generation.releasing`; re-allocated by the next perturb or
    restore): a lane holds one copy of its projections, not two (docs/performance.md, "Memory").

    Why lanes: a batch-32 decode step is a string of small matmuls and memory-bound attention reads, and two threads
    splitting each op meet at a barrier after every one; two members side by side, one core each, keep both cores busy,
    and one lane's memory-bound phases overlap the other's compute (docs/performance.md, "Two members at once, one core
    each"). torch releases the GIL inside its kernels and esft's compiled kernels do too. Lanes only perturb and
    generate; completions are scored on the calling thread afterwards, in member order, so tasks need not be
    thread-safe. Each member's completions, scores and counters are the same as with one lane (tested), provided the
    matmul kernels give the same bits at either thread count (oneDNN's and MKL's do here: tests/test_es_executor.py).
    Lanes need torch's OpenMP backend (per-thread thread counts) and a CPU model; elsewhere the executor warns and uses
    one lane. If one lane fails or Ctrl-C reaches the calling thread, the other lanes stop at their next decode step
    (`esft.generation.cancel_on`). Per-member timings are summed over members (so over lanes: their sum can exceed the
    wall time); `timings["evaluate"]` is the wall time of the call.
    """

    def __init__(self, model: Any, tokenizer: Any, weights: MasterWeights, task: Any, strategy: ES | float,
                 gen_config: Any, generate_fn: GenerateFn | None = None, parallel_members: int = 1,
                 rollout_dtype: torch.dtype | None = None):
        if int(parallel_members) < 1:
            raise ValueError(f"parallel_members must be >= 1, got {parallel_members}")
        self.parallel_members = int(parallel_members)
        # rollouts in another dtype (bf16, esft.generation.precision): every lane, lane 0 included, generates on
        # a copy whose parameters are round(master + sigma * eps); `model` is never perturbed
        self.rollout_dtype = None if rollout_dtype in (None, torch.float32) else rollout_dtype
        # masters in the model's own storage cannot be perturbed there: then every lane is a copy as well
        self._replicas = self.rollout_dtype is not None or weights.shared
        self._lanes: list[tuple[Any, MasterWeights]] = []  # (model copy, weights bound to it), lane order
        self._synced_versions: dict[str, int] = {}  # unselected parameters' versions when last copied to lanes
        self._kv: dict[int, Any] = {}  # per lane model, its KV cache buffers while a population runs (`_reusing_kv`)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0
        self._pending: list[Future] = []
        self._warned = False
        self._memory_lanes: int | None = None  # lanes whose copies fit in memory, decided once (`lanes_for`)
        self.model = model
        self.tokenizer = tokenizer
        self.weights = weights
        self.task = task
        self.strategy = strategy
        self.gen_config = gen_config
        self._encode = None
        # esft's engine writes a released lane parameter when it reads it (`_releasing`); an injected generate
        # function may read them directly, so lane copies then keep theirs
        self._engine_fills = generate_fn is None
        if generate_fn is None:
            # lazy: keeps the ES core importable (and testable) without the generation stack
            from esft.generation import encode_prompts, generate as generate_fn

            # the chat template is applied once per batch, not once per member
            self._encode = lambda prompts: encode_prompts(tokenizer, prompts)
        self.generate_fn = generate_fn

    @property
    def sigma(self) -> float:
        source = self.strategy
        return float(source) if isinstance(source, numbers.Real) else float(source.sigma)

    def _prompts(self, batch: Sequence[dict]) -> tuple[list, dict]:
        prompts = [self.task.prompt(ex) for ex in batch]
        extra = {"prompt_ids": self._encode(prompts)} if self._encode is not None else {}
        return prompts, extra

    def _generate(self, model: Any, prompts: tuple[list, dict], timings: dict[str, float],
                  weights: MasterWeights | None = None) -> list:
        t0 = time.perf_counter()
        filled = [0.0]
        with self._releasing(weights, filled), self._reusing_kv(model):
            gens = self.generate_fn(model, self.tokenizer, prompts[0], self.gen_config, **prompts[1])
        # the deferred perturbation written during generation is perturbation work: timed as such
        timings["generate"] += time.perf_counter() - t0 - filled[0]
        timings["perturb"] += filled[0]
        return gens

    def _reusing_kv(self, model: Any) -> Any:
        """With esft's engine, each lane's members generate into the same KV cache buffers
        (`esft.generation.KVBuffers`: their batch, and so their caches' shapes, are the same), which the lane keeps
        until the population or the centre's evaluation is done (`_free_kv`)."""
        if not self._engine_fills:
            return contextlib.nullcontext()
        from esft.generation import KVBuffers, reusing_kv  # lazy, as generate_fn in __init__

        return reusing_kv(self._kv.setdefault(id(model), KVBuffers()))

    def _free_kv(self) -> None:
        for buffers in self._kv.values():
            buffers.clear()
        self._kv.clear()

    def _releasing(self, weights: MasterWeights | None, filled: list[float]) -> Any:
        """A lane copy's perturbed parameters may be freed once packed (perturb and restore rewrite them all);
        the model's own never are. Freed ones are written again only when the engine reads them (`weights.fill`,
        layer by layer on the stacked path), so a lane never holds all its plain projections beside their packed
        copies; `filled[0]` accumulates the seconds those writes took."""
        if weights is None or weights is self.weights:
            return contextlib.nullcontext()
        from esft.generation import releasing  # lazy, as generate_fn in __init__

        def fill(tensors: Iterable[torch.Tensor] | None) -> None:
            t0 = time.perf_counter()
            weights.fill(tensors)
            filled[0] += time.perf_counter() - t0

        def rows(tensor: torch.Tensor, index: Any, buffer: torch.Tensor | None) -> torch.Tensor:  # freed vocabulary
            t0 = time.perf_counter()
            out = weights.rows(tensor, index, buffer)
            filled[0] += time.perf_counter() - t0
            return out

        def tiles(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:  # a freed layer, packed by the owner
            t0 = time.perf_counter()
            out = weights.tiles(tensors)
            filled[0] += time.perf_counter() - t0
            return out

        return releasing(weights.params.values(), fill=fill, rows=rows if weights.mode == "table" else None,
                         tiles=tiles)

    def _score(self, gens: list, batch: Sequence[dict], result: PopulationResult, row: int) -> None:
        if len(gens) != len(batch):  # zipped, a short list would leave the row's last examples unscored (0)
            raise ValueError(f"generate returned {len(gens)} completions for {len(batch)} prompts; it must return "
                             "one per prompt, in the prompts' order")
        t0 = time.perf_counter()
        for j, (gen, example) in enumerate(zip(gens, batch)):
            result.record(row, j, gen, self.task, example)
        result.timings["score"] += time.perf_counter() - t0

    def _run(self, prompts: tuple[list, dict], batch: Sequence[dict], result: PopulationResult, row: int,
             model: Any = None, weights: MasterWeights | None = None) -> None:
        gens = self._generate(self.model if model is None else model, prompts, result.timings, weights)
        self._score(gens, batch, result, row)

    def _empty(self, rows: int, cols: int) -> PopulationResult:
        return PopulationResult(scores=np.zeros((rows, cols)), well_formed=np.zeros((rows, cols), dtype=bool),
                                texts=[[] for _ in range(rows)],
                                timings={"perturb": 0.0, "generate": 0.0, "score": 0.0, "restore": 0.0})

    def _perturbed_members(self, weights: MasterWeights, rows: Iterable[int], members: Sequence[Member],
                           timings: dict[str, float], restore: bool = True) -> Iterator[int]:
        """Perturb `weights` for each row in turn and yield the row while the model holds that member. No restore in
        between (`perturb(replace=True)` is bit-identical to restore-then-perturb); one at the end, also when the
        caller raises or stops early, unless `restore` is False (a lane's private copy, always perturbed before
        use)."""
        try:
            for row in rows:
                seed, sign = members[row]
                t0 = time.perf_counter()
                weights.perturb(seed, sign, self.sigma, replace=True)
                timings["perturb"] += time.perf_counter() - t0
                yield row
        finally:
            if restore and weights.perturbed is not None:
                t0 = time.perf_counter()
                weights.restore()
                timings["restore"] += time.perf_counter() - t0

    def evaluate_members(self, members: Sequence[Member], batch: Sequence[dict]) -> PopulationResult:
        start = time.perf_counter()
        self._drain()
        prompts = self._prompts(batch)
        result = self._empty(len(members), len(batch))
        lanes = self.lanes_for(len(members))
        if lanes <= 1:
            self._ensure_lanes(1)
            model, weights = self._lane(0)
            rows = self._perturbed_members(weights, range(len(members)), members, result.timings,
                                           restore=weights is self.weights)
            try:
                for row in rows:
                    self._run(prompts, batch, result, row, model, weights)
            finally:
                rows.close()  # restores now, not when the generator is garbage-collected
        else:
            self._evaluate_in_lanes(lanes, members, prompts, batch, result)
        self._free_kv()
        result.timings["evaluate"] = time.perf_counter() - start
        return result

    def evaluate_center(self, batch: Sequence[dict]) -> PopulationResult:
        """The unperturbed model on a batch (train-batch reward, held-out accuracy). With lanes, each lane generates
        whole generation batches of the one-lane call (`esft.generation.generation_batches`, dealt in turn), so the
        completions are the same."""
        start = time.perf_counter()
        self._drain()
        prompts = self._prompts(batch)
        result = self._empty(1, len(batch))
        if batch:
            batches = self._center_batches(prompts)
            lanes = self.lanes_for(len(batches))
            if lanes > 1:
                gens = self._center_in_lanes(lanes, prompts, batches, result.timings)
            else:
                self._ensure_lanes(1)
                model, weights = self._lane(0)
                self._at_centre(weights, result.timings)
                gens = self._generate(model, prompts, result.timings, weights)
            self._score(gens, batch, result, 0)
            self._free_kv()
        result.timings["evaluate"] = time.perf_counter() - start
        return result

    def _at_centre(self, weights: MasterWeights, timings: dict[str, float]) -> None:
        """A lane copy is set to the masters (rounded once for bf16); the model itself already holds them."""
        if weights is not self.weights:
            t0 = time.perf_counter()
            weights.restore()
            timings["restore"] += time.perf_counter() - t0

    def _center_batches(self, prompts: tuple[list, dict]) -> list[list[int]]:
        """The generation batches of a one-lane call (one batch when the prompts' token ids are not known here,
        e.g. under an injected generate function: nothing to split then)."""
        ids = prompts[1].get("prompt_ids")
        if ids is None:
            return [list(range(len(prompts[0])))]
        from esft.generation import generation_batches  # lazy, as generate_fn in __init__

        return generation_batches(ids, self.gen_config.batch_size)

    def _center_in_lanes(self, lanes: int, prompts: tuple[list, dict], batches: list[list[int]],
                         timings: dict[str, float]) -> list:
        texts, ids = prompts[0], prompts[1]["prompt_ids"]
        # batches sorted longest first and dealt in turn: a lane's share is whole batches in the one-lane order,
        # which one `generate` call batches exactly as before; the lanes' loads differ by at most one batch
        shares = [[i for b in batches[k::lanes] for i in b] for k in range(lanes)]
        gens: list = [None] * len(texts)

        def run(k: int, model: Any, weights: MasterWeights, lane_timings: dict[str, float], stop: threading.Event):
            self._at_centre(weights, lane_timings)
            mine = shares[k]
            out = self._generate(model, ([texts[i] for i in mine], {"prompt_ids": [ids[i] for i in mine]}),
                                 lane_timings, weights)
            for i, gen in zip(mine, out):
                gens[i] = gen

        self._in_lanes(lanes, run, timings)
        return gens

    # -- parallel lanes
    def lanes_for(self, jobs: int) -> int:
        """Lanes a call with this many jobs (members, or a centre evaluation's generation batches) uses:
        parallel_members, capped by the jobs and torch's threads, or 1 (with a warning, once) without torch's OpenMP
        backend or on a non-CPU model."""
        lanes = min(self.parallel_members, jobs, torch.get_num_threads())
        if lanes <= 1:
            return 1
        reason = None
        param = next(self.model.parameters(), None) if self.model is not None else None
        if not openmp_backend():
            reason = "torch's parallel backend is not OpenMP, so thread counts are not per thread"
        elif param is None or param.device.type != "cpu":
            reason = "the model is not a CPU torch model"
        if reason is None:
            return min(lanes, self._lanes_in_memory())
        if not self._warned:
            warnings.warn(f"parallel_members={self.parallel_members} ignored: {reason}; one member at a time",
                          stacklevel=3)
            self._warned = True
        return 1

    def _lanes_in_memory(self) -> int:
        """parallel_members, lowered to the lanes whose model copies fit in the memory available before the first
        copy is made (with a warning): a large model on a small machine runs one member at a time instead of
        being killed for memory. Decided once; members' results do not depend on the lanes."""
        if self._memory_lanes is None:
            per_lane = lane_bytes(self.model, self.rollout_dtype)
            available = available_memory()
            fit = lanes_that_fit(self.parallel_members, int(self._replicas), per_lane, available)
            if fit < self.parallel_members:
                warnings.warn(f"parallel_members={self.parallel_members} lowered to {fit}: a lane's model copy "
                              f"needs ~{per_lane / 2**30:.1f} GiB and {available / 2**30:.1f} GiB of memory are "
                              "available (the results are the same with any number of lanes)", stacklevel=4)
            self._memory_lanes = fit
        return self._memory_lanes

    def start(self) -> None:
        """Make the lanes' model copies and threads now rather than at the first `evaluate_members` (a benchmark
        keeps this set-up out of its timed iteration). Nothing to do with one lane."""
        lanes = self.lanes_for(self.parallel_members)
        if lanes > 1 or self._replicas:
            self._ensure_lanes(lanes)

    def _drain(self) -> list[BaseException]:
        """Wait for the lanes still running (a failed or interrupted call's: cancelled, an esft-engine generation
        stops at its next decode step, an HF `model.generate` batch at its end); return their exceptions. A future
        leaves the list only once done, so a second Ctrl-C here leaves nothing unaccounted for."""
        errors = []
        while self._pending:
            exc = self._pending[0].exception()
            self._pending.pop(0)
            if exc is not None:
                errors.append(exc)
        return errors

    def _lane(self, k: int) -> tuple[Any, MasterWeights]:
        """Lane k's model and weights: lane 0 is `model` itself unless every lane is a copy (`_replicas`)."""
        if not self._replicas:
            return (self.model, self.weights) if k == 0 else self._lanes[k - 1]
        return self._lanes[k]

    def _ensure_lanes(self, lanes: int) -> None:
        copies = lanes if self._replicas else lanes - 1
        # the copies' plain matrices, released below, may stay resident in the heap (`return_freed_heap`)
        trim = len(self._lanes) < copies and self._engine_fills
        while len(self._lanes) < copies:
            map_large_blocks()
            replica = rollout_replica(self.model, self.rollout_dtype or (torch.float32 if self._replicas else None))
            bound = self.weights.bind(replica, cast=self.rollout_dtype is not None)
            if self._engine_fills:
                # the copy's perturbed matrices start without storage, as the engine leaves them once packed: it
                # writes each one when it reads it (`weights.fill`, layer by layer on the packed path), so the copy
                # never holds a whole plain model, not even for its first member (whose ~400 MiB of plain
                # projections, freed once packed, glibc would keep). Vectors (norm gains, biases) are read as they
                # are, so they keep theirs.
                release(p for p in bound.params.values() if p.dim() >= 2)
            self._lanes.append((replica, bound))
            self._synced_versions = {}
        if trim:
            return_freed_heap()
        # Parameters outside the ES selection are never perturbed: keep the copies' equal to the model's, which a
        # resumed or reloaded model may have changed since the copy (checked by version counter: no data pass).
        if self._lanes:  # one lane on the model itself (or an engine's weights) has no copies to keep in sync
            chosen = {id(p) for p in self.weights.params.values()}
            with torch.no_grad():
                for name, param in self.model.named_parameters():
                    if id(param) in chosen or self._synced_versions.get(name) == param._version:
                        continue
                    for replica, _ in self._lanes:
                        replica.get_parameter(name).copy_(param)
                    self._synced_versions[name] = param._version
        if lanes > 1 and (self._pool is None or self._pool_size < lanes - 1):
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self._pool = ThreadPoolExecutor(max_workers=lanes - 1, thread_name_prefix="esft-lane")
            self._pool_size = lanes - 1

    def _evaluate_in_lanes(self, lanes: int, members: Sequence[Member], prompts: tuple[list, dict],
                           batch: Sequence[dict], result: PopulationResult) -> None:
        queue: "SimpleQueue[int]" = SimpleQueue()
        for i in range(len(members)):
            queue.put(i)
        generations: dict[int, list] = {}  # row -> completions; each row is written by one lane only

        def run(k: int, model: Any, weights: MasterWeights, lane_timings: dict[str, float], stop: threading.Event):
            def handed_out() -> Iterator[int]:  # members go one at a time to whichever lane is free
                while not stop.is_set():
                    try:
                        yield queue.get_nowait()
                    except Empty:
                        return

            rows = self._perturbed_members(weights, handed_out(), members, lane_timings,
                                           restore=weights is self.weights)
            try:
                for row in rows:
                    generations[row] = self._generate(model, prompts, lane_timings, weights)
            finally:
                rows.close()

        self._in_lanes(lanes, run, result.timings)
        for row in range(len(members)):
            self._score(generations[row], batch, result, row)

    def _in_lanes(self, lanes: int, run: Callable[..., None], timings: dict[str, float]) -> None:
        """run(k, model, weights, lane_timings, stop) on lanes 0..lanes-1 at once, lane 0 on the calling thread, each
        with its share of torch's threads; its timings are added to `timings`. If one lane fails or Ctrl-C reaches
        the calling thread, `stop` is set and the other lanes stop at their next decode step."""
        from esft.generation import GenerationCancelled, cancel_on  # lazy, as generate_fn above

        total = torch.get_num_threads()
        share = [total // lanes + (1 if k < total % lanes else 0) for k in range(lanes)]
        self._ensure_lanes(lanes)
        stop = threading.Event()
        lane_timings = [{"perturb": 0.0, "generate": 0.0, "restore": 0.0} for _ in range(lanes)]

        def lane(k: int, weights: MasterWeights, model: Any) -> None:
            try:
                torch.get_num_threads()  # a new thread's first ATen call sets its team size from the global default
                torch.set_num_threads(share[k])  # then this thread's own share
                with torch.no_grad(), cancel_on(stop):  # grad mode and cancellation are per thread
                    run(k, model, weights, lane_timings[k], stop)
            except BaseException:
                stop.set()  # the other lanes stop at their next decode step
                raise

        error: BaseException | None = None
        try:
            for k in range(1, lanes):
                model, weights = self._lane(k)
                self._pending.append(self._pool.submit(lane, k, weights, model))
            model, weights = self._lane(0)
            lane(0, weights, model)  # the calling thread (on the real model unless bf16): Ctrl-C lands here
        except BaseException as exc:
            stop.set()
            error = exc
        finally:
            try:
                errors = self._drain()
            finally:
                torch.set_num_threads(total)  # after every lane thread has set its own (the default is global)
        if error is not None or errors:
            # the cause, not the cancellations it triggered in the other lanes
            causes = [e for e in ([error] if error is not None else []) + errors
                      if not isinstance(e, GenerationCancelled)]
            raise (causes[0] if causes else error or errors[0])
        for each in lane_timings:
            for key, value in each.items():
                timings[key] += value

    def close(self) -> None:
        """Stop the lane threads and drop the model copies (the executor can still be used: lanes come back)."""
        self._drain()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._lanes = []
        self._synced_versions = {}
        self._free_kv()
