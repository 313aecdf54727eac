"""Population-parallel ES on Ray: one model replica per worker, only seeds and scalars on the wire.

    driver (ESTrainer + its own replica)            Ray workers (HFReplica or VLLMReplica), one per GPU / core
    members = ES.ask(t) ──(seed, sign)──────────▶  perturb -> generate -> score -> restore
    PopulationResult rows ◀──(scores, texts)────   (a work queue: an idle worker pulls the next member)
    update = ES.tell(...) ──(seeds, coefficients)─▶ every replica applies the same update (fp32, fixed order)
    every k updates: checksum of the fp32 masters ◀ compared with the driver's; a mismatch names the worker

The driver keeps its replica because it writes checkpoints and is the reference for the checksums; it never
sends weights in steady state. Weights cross the network only at start-up, when a worker's masters differ from
the driver's (a resumed run), as one object-store broadcast.

Same result, any layout: a worker evaluates one member with `LocalExecutor.evaluate_members([member], batch)`,
the same code and the same batch (same generation batch size, so the same padding) as the local executor, and
rows are put back in member order, so fitness, updates and final weights are bit-identical to a local run on
the same hardware and thread count (tested on CPU). Noise is drawn on each replica's device: the driver's
replica must be on the workers' device type (checked at start-up).

Faults: a worker that dies (process killed, node lost) or hangs (no answer within its deadline: `Deadlines`,
executor_options `member_timeout_s`) is dropped and ended; its in-flight member goes back to the queue and the
others finish the iteration with the same result. Each event is a `{"kind": "executor", ...}` line in
metrics.jsonl and a logging warning. With no worker left, `WorkersLost` stops the run before the iteration is
logged, so the run directory stays consistent (resume with `--resume`, on any layout). A Python exception raised
in a worker by the code it ran (a task's scorer) stops the run the same way, as a one-line `WorkerError` naming
the worker, the member and the exception (esft.es.distributed.worker_faults).
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from esft.es.distributed.connection import UNBOUNDED_SLOTS, actor_slots, connect_ray, import_ray, workers_use_gpu
from esft.es.distributed.hf_replica import (HFReplica, ReplicaSpec, checksum_diff, checksum_digest,
                                            masters_checksum)
from esft.es.distributed.worker_faults import Deadlines, WorkerTimeout, is_worker_death, worker_error
from esft.es.executor import Executor, PopulationResult
from esft.es.noise import MasterWeights, Update
from esft.es.population import merge_rows
from esft.es.strategy import Member
from esft.rundir import append_jsonl, say

log = logging.getLogger("esft.es.ray")


class WorkersLost(RuntimeError):
    """Every Ray worker of the run is gone; the run stops with its last logged iteration and checkpoint intact."""


class ReplicaDivergence(RuntimeError):
    """A replica's fp32 masters no longer match the driver's."""


class _Dropped(Exception):
    """The worker of a call is lost (dead or hung) and has been dropped; the caller re-queues its work."""


def place_workers(num_workers: int, device: str | None, use_gpu: bool | None, threads: int,
                  actor_options: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """(workers, `ray.remote` options of each) for the connected cluster, or a ValueError saying why they cannot
    all be placed at once. `esft.es.distributed.factory.connect` asks before the model loads, `start` again."""
    ray = import_ray()
    cluster = ray.cluster_resources()
    gpus = int(cluster.get("GPU", 0))
    on_gpu = workers_use_gpu(device, use_gpu, gpus)
    # one engine / replica per GPU; on CPUs, one replica per `threads` cores
    opts = {"num_gpus": 1, "num_cpus": 1} if on_gpu else {"num_gpus": 0, "num_cpus": threads}
    opts.update(actor_options)
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive", True)]
    fit = actor_slots(nodes, float(opts.get("num_cpus") or 0), float(opts.get("num_gpus") or 0))
    if on_gpu and gpus < 1:
        asked = "executor_options use_gpu: true" if use_gpu else f"--device {device}"
        raise ValueError(f"GPU workers requested ({asked}) but the Ray cluster has no GPUs ({cluster}): run "
                         "with --device cpu (and without use_gpu: true), or join a cluster with GPUs")
    if not num_workers and fit >= UNBOUNDED_SLOTS:
        # an actor that asks for no CPU and no GPU fits any number of times: "one per CPU" has no count
        raise ValueError(f"--num-workers 0 counts workers by the CPUs or GPUs each asks for, but they ask for "
                         f"none ({opts}): set --num-workers, or a num_cpus_per_worker above 0")
    n = num_workers or (min(gpus, fit) if on_gpu else max(1, fit))
    if on_gpu and n > gpus:
        raise ValueError(f"{n} GPU workers requested but the Ray cluster has {gpus} GPUs ({cluster})")
    if n > fit or n < 1:
        # Ray would keep the extra actors pending, and start() would wait start_timeout_s for them
        raise ValueError(f"{n} Ray workers requested with {opts} each, but the cluster's nodes fit {fit} "
                         f"({cluster}): lower --num-workers, threads_per_worker or num_cpus_per_worker")
    return n, opts


@dataclass
class Worker:
    rank: int
    actor: Any
    info: dict[str, Any] = field(default_factory=dict)
    alive: bool = True
    members_done: int = 0
    pending: list = field(default_factory=list)
    """refs of fire-and-forget calls (updates) not yet confirmed"""

    @property
    def label(self) -> str:
        i = self.info
        where = f"pid {i['pid']} on {i['host']}" if "pid" in i else "not started"
        dev = f", {i['device']}" if "device" in i else ""
        return f"worker {self.rank} ({where}{dev})"


class RayExecutor(Executor):
    """`Executor` whose members run on Ray workers, one model replica each (see the module docstring).

    spec: how workers build their replica. weights / optimizer: the driver's replica (reference for checksums
    and the source of a start-up sync). num_workers: replicas (0 = one per GPU, else one per CPU / threads).
    address: Ray cluster (None = $RAY_ADDRESS, a Ray running here, or a new one; Ray's own resolution, never forced).
    checksum_every: compare replicas every k updates (0 = never; start-up is always checked).
    event_log: metrics.jsonl of the run, for `{"kind": "executor"}` records. replica_cls: the worker class
    (HFReplica; the vLLM backend passes VLLMReplica). actor_options: extra `ray.remote` options.
    frozen: the driver's `frozen_checksum` of the parameters ES never perturbs, compared with each worker's at
    start-up (replicas with a `frozen_checksum` method; None = not compared).
    member_timeout_s: seconds a worker may take for one member before it is treated as hung and lost (0 = derived
    from the run: `worker_faults.Deadlines`; calls on more prompts than a member get proportionally more).
    on_result: test/monitoring hook `on_result(executor, worker, member_index)` after each member's row arrives.
    owns_ray: `close` shuts Ray down although it was connected before `start` (by `connect_ray`, for this run);
    a connection this executor makes itself is always its own.
    """

    def __init__(self, spec: ReplicaSpec, weights: MasterWeights, optimizer: Any = None, *, num_workers: int = 0,
                 address: str | None = None, checksum_every: int = 10, event_log: str | Path | None = None,
                 replica_cls: type = HFReplica, actor_options: dict[str, Any] | None = None,
                 use_gpu: bool | None = None, start_timeout_s: float = 1800.0, member_timeout_s: float = 0.0,
                 on_result: Callable[["RayExecutor", Worker, int], None] | None = None, owns_ray: bool = False,
                 frozen: dict[str, int] | None = None):
        self.spec = spec
        self.weights = weights
        self.optimizer = optimizer
        self.num_workers = int(num_workers)
        self.address = address
        self.checksum_every = int(checksum_every)
        self.event_log = Path(event_log) if event_log else None
        self.replica_cls = replica_cls
        self.actor_options = dict(actor_options or {})
        self.use_gpu = use_gpu
        self.start_timeout_s = float(start_timeout_s)
        self.deadlines = Deadlines(float(member_timeout_s), first_s=self.start_timeout_s,
                                   batch_size=int(spec.config.batch_size))
        self.on_result = on_result
        self.frozen = frozen
        self.workers: list[Worker] = []
        self.step: int | None = None  # updates applied, as told by the trainer (None until the first one)
        self.events: list[dict[str, Any]] = []
        self.history: list[dict[str, Any]] = []
        self._check_due = False
        self._started = False
        self._owns_ray = bool(owns_ray)

    # ---- events ------------------------------------------------------------------------------------------------
    def _event(self, event: str, level: int = logging.INFO, message: str | None = None, **fields: Any) -> None:
        rec: dict[str, Any] = {"kind": "executor", "event": event}
        if self.step is not None:
            rec["step"] = self.step
        rec.update(fields)
        rec["time"] = time.time()
        self.events.append(rec)
        if message:
            log.log(level, message)
        if self.event_log is not None and self.event_log.parent.exists():
            append_jsonl(self.event_log, rec)

    # ---- start-up ----------------------------------------------------------------------------------------------
    def _connect(self) -> None:
        if connect_ray(self.address):
            self._owns_ray = True

    def _resources(self) -> tuple[int, dict[str, Any]]:
        return place_workers(self.num_workers, self.spec.config.device, self.use_gpu, int(self.spec.threads or 1),
                             self.actor_options)

    def start(self) -> None:
        """Connect, place the workers, wait for their models, check their masters against the driver's."""
        if self._started:
            return
        t0 = time.perf_counter()
        self._connect()
        ray = import_ray()
        n, opts = self._resources()
        # No automatic restarts: a restarted actor would come back with the base weights; the executor drops it
        # and re-queues its work instead (a replacement would need a weight sync).
        actor_cls = ray.remote(max_restarts=0, max_task_retries=0, **opts)(self.replica_cls)
        self.workers = [Worker(rank=r, actor=actor_cls.remote(self.spec, r)) for r in range(n)]
        refs = [w.actor.info.remote() for w in self.workers]
        ready, not_ready = ray.wait(refs, num_returns=len(refs), timeout=self.start_timeout_s)
        if not_ready:
            self.close()
            raise WorkersLost(f"{len(not_ready)} of {n} Ray workers did not start within {self.start_timeout_s:.0f} s "
                              f"(requested {opts} each; cluster has {ray.cluster_resources()})")
        died = "unknown"
        for w, ref in zip(self.workers, refs):
            try:
                w.info = ray.get(ref)
            except Exception as exc:  # model not found on its node, ...: a configuration error, named in one line
                if is_worker_death(exc):  # killed while it loaded: the others can evaluate the population
                    self._lose(w, exc)
                    died = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
                    continue
                self.close()
                raise worker_error(w.label, "its start-up (loading the model, tokenizer and task)", exc,
                                   "the run cannot start") from exc
        if not self.alive:  # nothing ran: what killed them, not the mid-run "resume on fewer workers"
            msg = (f"all {n} Ray workers died while they loaded the model and task (the last: {died}); no member was "
                   "evaluated: run the command again once every node can load them (memory, model files)")
            self._event("all_workers_lost", detail=msg)
            self.close()
            raise WorkersLost(msg)
        self._started = True
        drv = next(iter(self.weights.params.values())).device.type
        kinds = {w.info["device_type"] for w in self.alive}
        if kinds != {drv}:
            self.close()
            raise ValueError(f"the driver's replica is on {drv} but workers are on {sorted(kinds)}: noise streams "
                             "differ between device types, so replicas would diverge; set --device to the "
                             "workers' device type (e.g. --device cuda on a GPU driver)")
        labels, n, seconds = "; ".join(w.label for w in self.alive), len(self.alive), time.perf_counter() - t0
        self._event("start", message=f"ray executor: {n} workers: {labels}", workers=[w.info for w in self.alive],
                    actor_options=dict(opts), seconds=seconds)  # placement + model loading (in the first iteration)
        # the log record above is below what an unconfigured logger shows: the user sees that this wait has ended
        say(f"esft: {n} Ray worker{'' if n == 1 else 's'} started in {seconds:.1f} s")
        self._sync_at_start()

    def _sync_at_start(self) -> None:
        """Workers loaded the base model; after a resume the driver is further on: send its masters once."""
        ray = import_ray()
        self._check_frozen()
        ref_sum = masters_checksum(self.weights)
        sums = self._gather([(w, w.actor.checksum.remote()) for w in self.alive], "a checksum", self.start_timeout_s)
        stale = [w for w, s in sums if s != ref_sum]
        if stale:
            masters = ray.put({n: t.detach().cpu() for n, t in self.weights.iter_masters()})
            opt = ray.put(self.optimizer.state_dict()) if self.optimizer is not None else None
            after = self._gather([(w, w.actor.load_state.remote(masters, opt)) for w in stale],
                                 "loading the driver's weights", self.start_timeout_s)
            bad = [w.label for w, s in after if s != ref_sum]
            if bad:
                raise ReplicaDivergence(f"could not bring {', '.join(bad)} to the driver's weights")
            self._event("sync", message=f"ray executor: sent the driver's masters to {len(stale)} worker(s)",
                        workers=[w.rank for w in stale], digest=checksum_digest(ref_sum))
        self._event("checksum", digest=checksum_digest(ref_sum), workers=len(self.alive), ok=True)

    def _check_frozen(self) -> None:
        """Parameters outside the ES selection are never sent: a worker whose copy differs (another revision of
        the model on its node, or base files changed since the run's checkpoint) cannot be repaired, only named."""
        if not self.frozen:
            return
        sums = self._gather([(w, w.actor.frozen_checksum.remote()) for w in self.alive], "a checksum",
                            self.start_timeout_s)
        bad = [(w, checksum_diff(self.frozen, s)) for w, s in sums if s != self.frozen]
        if bad:
            parts = [f"{w.label}: {len(names)} tensors differ, first {names[0]}" for w, names in bad]
            msg = ("workers hold other values than the driver in parameters ES does not perturb (include / exclude), "
                   "so they evaluate another model: " + "; ".join(parts) + ". Give every node the same model files")
            # recorded, not logged: the raised error is the one line the user reads (exit 3)
            self._event("frozen", ok=False, drifted=[w.rank for w, _ in bad], detail=msg)
            raise ReplicaDivergence(msg)

    # ---- bookkeeping ---------------------------------------------------------------------------------------------
    @property
    def alive(self) -> list[Worker]:
        return [w for w in self.workers if w.alive]

    def _lose(self, worker: Worker, exc: BaseException, requeued: Sequence[int] = ()) -> None:
        worker.alive = False
        # an actor reported unavailable (or hung) may still run and hold its CPUs or GPU: it is never used again,
        # so end it
        try:
            import_ray().kill(worker.actor)
        except Exception:  # already gone
            pass
        left = len(self.alive)
        why = f"{type(exc).__name__}: {exc}" if isinstance(exc, WorkerTimeout) else type(exc).__name__
        self._event("worker_lost", logging.WARNING,
                    f"ray executor: lost {worker.label}: {why}; re-queued members {list(requeued)}; "
                    f"{left} worker(s) left", worker=worker.rank, info=worker.info, error=type(exc).__name__,
                    requeued=list(requeued), workers_left=left,
                    **({"detail": str(exc)} if isinstance(exc, WorkerTimeout) else {}))

    def _stop_hint(self) -> str:
        run_dir = str(self.event_log.parent) if self.event_log is not None else "RUN_DIR"
        return ("the run stops with every logged iteration and checkpoint intact: fix the cause and continue with "
                f"`esft train es --resume {run_dir}`")

    def _get(self, worker: Worker, ref: Any, what: str, deadline: float, limit: str,
             requeued: Sequence[int] = ()) -> Any:
        """The result of one call to `worker`, waited for until `deadline` (time.perf_counter; `limit` says how
        long that is, for the message). A dead or hung worker is dropped (`_Dropped`); an exception raised by the
        code it ran stops the run as a one-line `WorkerError`."""
        ray = import_ray()
        ready, _ = ray.wait([ref], timeout=max(0.0, deadline - time.perf_counter()))
        if not ready:
            hung = WorkerTimeout(f"no answer to {what} within {limit}")
            if worker.alive:
                self._lose(worker, hung, requeued)
            raise _Dropped(what) from hung
        try:
            return ray.get(ref)
        except Exception as exc:
            if not is_worker_death(exc):
                raise worker_error(worker.label, what, exc, self._stop_hint()) from exc
            if worker.alive:
                self._lose(worker, exc, requeued)
            raise _Dropped(what) from exc

    def _gather(self, calls: list[tuple[Worker, Any]], what: str,
                timeout_s: float | None = None) -> list[tuple[Worker, Any]]:
        """The results of calls that run at once on different workers (at most `timeout_s` in all, default one
        member's deadline); a dead or hung worker is dropped (logged) instead of failing the run."""
        if timeout_s is None:
            timeout_s, source = self.deadlines.member_s(), self.deadlines.source()
        else:
            source = "start_timeout_s"
        deadline, limit = time.perf_counter() + timeout_s, f"{timeout_s:.0f} s ({source})"
        out = []
        for w, ref in calls:
            try:
                out.append((w, self._get(w, ref, what, deadline, limit)))
            except _Dropped:
                pass
        return out

    def settle(self) -> None:
        """Confirm the updates sent to every worker (they normally finished long ago), then a due checksum."""
        for w in self.alive:
            pending, w.pending = w.pending, []
            self._gather([(w, ref) for ref in pending], f"the update to step {self.step}")
        if self._check_due:
            self._check_due = False
            self.verify()
        if not self.alive:
            raise self._all_lost()

    def _all_lost(self) -> WorkersLost:
        # the trainer names the step with its first update of this session: none yet, none to count
        when = "before this session's first update" if self.step is None else f"after {self.step} updates"
        run_dir = str(self.event_log.parent) if self.event_log is not None else "RUN_DIR"
        # the local executor generates with esft's own loop: a vLLM run must say so to resume there
        vllm = self.spec.config.worker_backend == "vllm"
        local = "--executor local --worker-backend hf" if vllm else "--executor local"
        msg = (f"all {len(self.workers)} Ray workers are lost ({when}); the run stops here. The run "
               "directory holds every logged iteration (seeds.jsonl) and its checkpoints, untouched; continue with "
               f"`esft train es --resume {run_dir}` (on any number of workers, or {local})")
        self._event("all_workers_lost", detail=msg)  # not logged: the raised error is the one line the user reads
        return WorkersLost(msg)

    # ---- the Executor interface -------------------------------------------------------------------------------------
    def evaluate_members(self, members: Sequence[Member], batch: Sequence[dict]) -> PopulationResult:
        self.start()
        self.settle()
        ray = import_ray()
        t0 = time.perf_counter()
        batch_ref = ray.put(list(batch))  # one copy in the object store, read by every worker
        queue: deque[int] = deque(range(len(members)))
        rows: list[PopulationResult | None] = [None] * len(members)
        inflight: dict[Any, tuple[Worker, int, float, float]] = {}  # ref -> (worker, member, sent, deadline)
        idle: deque[Worker] = deque(self.alive)
        per_worker: dict[int, int] = {}
        requeued = 0
        self.deadlines.batch_size = len(batch)
        while queue or inflight:
            # Work queue: each idle worker pulls the next member, so a faster worker simply takes more of them.
            while queue and idle:
                w = idle.popleft()
                if w.alive:
                    i = queue.popleft()
                    sent = time.perf_counter()
                    deadline = sent + self.deadlines.for_prompts(len(batch))
                    inflight[w.actor.evaluate.remote([members[i]], batch_ref)] = (w, i, sent, deadline)
            if not inflight:
                raise self._all_lost()
            first = min(d for *_, d in inflight.values())
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=max(0.0, first - time.perf_counter()))
            # nothing returned before the earliest deadline: the calls past theirs are collected as hung
            for ref in ready or [r for r, (*_, d) in inflight.items() if d <= time.perf_counter()]:
                w, i, sent, deadline = inflight.pop(ref)
                limit = f"{deadline - sent:.0f} s ({self.deadlines.source()})"
                try:
                    rows[i] = self._get(w, ref, f"member {i} (seed {members[i][0]}, sign {members[i][1]:+d})",
                                        deadline, limit, requeued=[i])
                except _Dropped:
                    queue.appendleft(i)
                    requeued += 1
                    continue
                self.deadlines.observe(time.perf_counter() - sent, len(batch))
                w.members_done += 1
                per_worker[w.rank] = per_worker.get(w.rank, 0) + 1
                idle.append(w)
                if self.on_result is not None:
                    self.on_result(self, w, i)
        result = merge_rows(rows)  # type: ignore[arg-type]
        wall = time.perf_counter() - t0
        result.timings["evaluate"] = wall  # the workers' own "evaluate" times overlap: the sum is not a wall time
        stats = {"members": len(members), "wall_s": wall, "members_per_worker": per_worker,
                 "requeued": requeued, "workers_alive": len(self.alive),
                 "tokens_per_s": result.tokens_generated / max(wall, 1e-9)}
        self.history.append(stats)
        self._event("members", **stats)
        return result

    def evaluate_center(self, batch: Sequence[dict]) -> PopulationResult:
        """The unperturbed model on one worker: generation sorts and chunks the whole batch, so splitting it
        across workers would change batch composition (and greedy outputs in the last bits)."""
        self.start()
        self.settle()
        while True:
            alive = self.alive
            if not alive:
                raise self._all_lost()
            w = min(alive, key=lambda x: x.rank)
            t0, limit_s = time.perf_counter(), self.deadlines.for_prompts(len(batch))
            try:
                out = self._get(w, w.actor.evaluate_center.remote(list(batch)),
                                f"the unperturbed model on {len(batch)} prompts", t0 + limit_s,
                                f"{limit_s:.0f} s ({self.deadlines.source()})")
            except _Dropped:
                continue
            self.deadlines.observe(time.perf_counter() - t0, len(batch))
            return out

    # ---- updates and checks ------------------------------------------------------------------------------------------
    def on_update(self, update: Update, step: int) -> None:
        """Called by the trainer with every update (before the driver applies it to its own replica): each
        worker applies the same (seeds, coefficients). Fire-and-forget: Ray runs an actor's calls in submission
        order, so the next member evaluation on a worker starts from the updated weights."""
        self.step = int(step)
        if not self._started:
            return  # workers not placed yet (no member evaluated); they will sync at start-up
        for w in self.alive:
            w.pending.append(w.actor.apply.remote(update))
        if self.checksum_every and self.step % self.checksum_every == 0:
            self._check_due = True  # compared at the next call, once the driver has applied the update too

    def verify(self) -> None:
        """Compare every worker's master checksum with the driver's; raise `ReplicaDivergence` naming the
        worker(s) that drifted (or the driver, when all workers agree among themselves but not with it)."""
        self.start()
        for w in self.alive:  # updates sent but not yet confirmed must be applied before comparing
            pending, w.pending = w.pending, []
            self._gather([(w, ref) for ref in pending], f"the update to step {self.step}")
        reference = masters_checksum(self.weights)
        sums = self._gather([(w, w.actor.checksum.remote()) for w in self.alive], "a checksum")
        bad = [(w, checksum_diff(reference, s)) for w, s in sums if s != reference]
        if not bad:
            self._event("checksum", digest=checksum_digest(reference), workers=len(sums), ok=True)
            return
        digests = {checksum_digest(s) for _, s in sums}
        if len(bad) == len(sums) and len(digests) == 1 and len(sums) > 1:
            msg = (f"replica divergence after {self.step} updates: all {len(sums)} workers agree with each other "
                   f"but not with the driver's replica ({len(bad[0][1])} tensors differ, first {bad[0][1][0]})")
        else:
            parts = [f"{w.label}: {len(names)} tensors differ, first {names[0]}" for w, names in bad]
            msg = f"replica divergence after {self.step} updates: " + "; ".join(parts)
        msg += " (the driver's replica is the reference; see docs/distributed.md)"
        self._event("checksum", ok=False, digest=checksum_digest(reference), drifted=[w.rank for w, _ in bad],
                    tensors={w.rank: names[:5] for w, names in bad}, detail=msg)  # not logged: raised, as above
        raise ReplicaDivergence(msg)

    def close(self) -> None:
        ray = import_ray()
        for w in self.workers:
            if w.alive:
                try:
                    ray.kill(w.actor)
                except Exception:  # already gone
                    pass
            w.alive = False
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
            self._owns_ray = False
        self._started = False

    # ---- convenience for tests and monitoring ------------------------------------------------------------------------
    def worker_pids(self) -> dict[int, int]:
        return {w.rank: int(w.info["pid"]) for w in self.workers if "pid" in w.info}

    def kill_worker(self, rank: int) -> None:
        """SIGKILL a local worker process (fault drills; the executor notices on its next call to it)."""
        import signal

        os.kill(self.worker_pids()[rank], signal.SIGKILL)
