"""The Ray executor's parts (connection, factory, replica, worker faults, executor) at the edges the other Ray tests
leave out: a connection from a thread other than the main one, a replica given masters without optimizer state,
checksums of 8-byte parameters, message lengths at their limit. No Ray instance starts.

Run: . .venv/bin/activate && pytest -q tests/test_ray_mutmutdist.py   (~10 s)
"""

from __future__ import annotations

import copy
import signal
import threading
import time

import numpy as np
import pytest
import torch

from es_tiny import ToyTask, one_thread, tiny_llama  # noqa: F401  (one_thread: autouse)
from esft.es.distributed import connection
from esft.es.es_config import ESConfig
from esft.es.noise import Update
from test_ray_parts import FakeRay, fake_ray  # noqa: F401 (a stand-in `ray`, as test_ray_parts uses it)


# ---- connection ----------------------------------------------------------------------------------------------------


def test_connect_ray_from_another_thread_sets_no_signal_handler(fake_ray):
    """A script or notebook may start a run from a thread other than the main one, where Python refuses to set a
    signal handler (ValueError): there connect_ray neither holds Ctrl-C nor puts back esft's SIGTERM handler."""

    def esft_handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, esft_handler)
    outcome: list = []

    def connect():
        try:
            outcome.append(connection.connect_ray(None))
        except BaseException as exc:  # the assertion below shows it
            outcome.append(exc)

    thread = threading.Thread(target=connect)
    thread.start()
    thread.join(30)
    assert outcome == [True] and [c[0] for c in fake_ray.calls] == ["init", "init returned"]
    assert signal.getsignal(signal.SIGTERM) is esft_handler


def test_check_reachable_probes_port_65535_and_refuses_65536(monkeypatch):
    import socket

    from esft.es.distributed.connection import check_reachable

    probed = []

    class Open:
        def close(self):
            pass

    monkeypatch.setattr(socket, "create_connection", lambda endpoint, timeout: probed.append(endpoint) or Open())
    check_reachable("head:65535")
    assert probed == [("head", 65535)]
    with pytest.raises(ValueError, match=r"65536 is not a TCP port \(1-65535\)"):
        check_reachable("head:65536")
    assert probed == [("head", 65535)]


# ---- the Hugging Face replica ----------------------------------------------------------------------------------------


def _replica(optimizer: str):
    from esft.es.distributed.hf_replica import HFReplica, ReplicaSpec

    cfg = ESConfig(population_size=4, sigma=0.05, alpha=0.02, seed=3, include=["layers.0."], dtype="float32",
                   device="cpu", optimizer=optimizer)
    return HFReplica(ReplicaSpec(config=cfg, builder=lambda c: (tiny_llama(), None, ToyTask())))


def test_load_state_without_optimizer_state_takes_the_masters_and_keeps_the_replicas_moments():
    """The executor sends no optimizer state when its driver has no optimizer (`optimizer=None`): an Adam replica
    then takes the masters alone and keeps its own moments."""
    driver, worker = _replica("adam"), _replica("adam")
    driver.apply(Update(seeds=(5, 6), coefficients=(1.0, -0.5), scale=-1.0, kind="gradient"))
    worker.apply(Update(seeds=(7,), coefficients=(1.0,), scale=-1.0, kind="gradient"))
    moments = copy.deepcopy(worker.optimizer.state_dict())
    masters = {n: m.clone() for n, m in driver.weights.iter_masters()}
    assert worker.load_state(masters) == driver.checksum()
    kept = worker.optimizer.state_dict()
    assert kept["state"].keys() == moments["state"].keys() and all(
        torch.equal(kept["state"][k][name], moments["state"][k][name])
        for k in moments["state"] for name in ("exp_avg", "exp_avg_sq"))


def test_frozen_checksum_of_float64_parameters_sums_their_64_bit_patterns():
    from esft.es.distributed.hf_replica import frozen_checksum

    model = tiny_llama(dtype=torch.float64)
    norm = model.model.norm.weight  # ones: 0x3FF0000000000000 each in float64
    want = (0x3FF0000000000000 * norm.numel()) % 2**64  # int64 addition wraps around
    want = want - 2**64 if want >= 2**63 else want
    assert frozen_checksum(model, ["model.layers.0.mlp.up_proj.weight"])["model.norm.weight"] == want


# ---- worker faults ---------------------------------------------------------------------------------------------------


def test_original_exception_keeps_500_characters_and_shortens_a_longer_one_to_500():
    pytest.importorskip("ray")
    from esft.es.distributed.worker_faults import original_exception

    def died(message: str) -> RuntimeError:  # an exception Ray passes on as its traceback's text only
        return RuntimeError(f"Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: {message}")

    whole = "ValueError: " + "a" * 488
    assert len(whole) == 500 and original_exception(died("a" * 488)) == whole
    longer = original_exception(died("a" * 489))
    assert longer == whole[:497] + "..." and len(longer) == 500


def test_a_chained_exception_in_the_traceback_text_is_read_as_the_last_one_raised():
    pytest.importorskip("ray")
    from esft.es.distributed.worker_faults import original_exception

    chained = RuntimeError(
        "Traceback (most recent call last):\n  File \"task.py\", line 3, in score\nKeyError: 'answer'\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n  File \"replica.py\", line 9, in __init__\n"
        "ValueError: the task cannot score this dataset\n")
    assert original_exception(chained) == "ValueError: the task cannot score this dataset"


def test_a_member_timeout_below_one_second_is_kept():
    from esft.es.distributed.worker_faults import Deadlines

    fixed = Deadlines(member_timeout_s=0.5, first_s=1800, batch_size=4)
    fixed.observe(100.0, 4)
    assert fixed.member_s() == 0.5 and fixed.for_prompts(8) == 1.0
    assert fixed.source() == "executor_options member_timeout_s"


def test_members_faster_than_a_second_set_the_deadline_too():
    from esft.es.distributed.worker_faults import Deadlines

    auto = Deadlines(first_s=1800, batch_size=4, factor=10, floor_s=1)
    auto.observe(0.5, 4)
    assert auto.member_s() == 5.0 and auto.source().startswith("10 x the slowest member so far (0.5 s)")


# ---- executor ------------------------------------------------------------------------------------------------------


def test_an_executor_built_with_defaults_derives_its_member_deadline_from_the_run():
    from esft.es.distributed.hf_replica import ReplicaSpec
    from esft.es.distributed.ray_executor import RayExecutor

    executor = RayExecutor(ReplicaSpec(config=ESConfig(executor="ray", device="cpu", batch_size=4)), weights=None,
                           start_timeout_s=120)
    assert executor.deadlines.member_s() == 120 and executor.deadlines.source().startswith("start_timeout_s")
    executor.deadlines.observe(70.0, 4)
    assert executor.deadlines.member_s() == 700  # 10 x the slowest member, above the 600 s floor


class _Cluster:
    """The two calls `RayExecutor._resources` makes, answered for nodes with the given resources."""

    def __init__(self, *nodes):
        self.resources = list(nodes)

    def cluster_resources(self):
        return {key: sum(n.get(key, 0.0) for n in self.resources) for key in ("CPU", "GPU")}

    def nodes(self):
        return [{"Alive": True, "Resources": n} for n in self.resources]


def _placed(monkeypatch, cluster, device="cpu", threads=1, **kwargs):
    """(workers, actor options) that `RayExecutor._resources` asks `cluster` for."""
    from esft.es.distributed import ray_executor
    from esft.es.distributed.hf_replica import ReplicaSpec

    monkeypatch.setattr(ray_executor, "import_ray", lambda: cluster)
    spec = ReplicaSpec(config=ESConfig(executor="ray", device=device), threads=threads)
    return ray_executor.RayExecutor(spec, weights=None, **kwargs)._resources()


def test_workers_are_one_per_gpu_or_one_per_threads_cores(monkeypatch):
    gpus = _Cluster({"CPU": 8.0, "GPU": 2.0}, {"CPU": 8.0, "GPU": 1.0})
    assert _placed(monkeypatch, gpus, device="cuda") == (3, {"num_gpus": 1, "num_cpus": 1})
    assert _placed(monkeypatch, gpus, device="cuda", num_workers=3)[0] == 3  # every GPU
    with pytest.raises(ValueError, match=r"4 GPU workers requested but the Ray cluster has 3 GPUs"):
        _placed(monkeypatch, gpus, device="cuda", num_workers=4)
    one = _Cluster({"CPU": 4.0, "GPU": 1.0})
    assert _placed(monkeypatch, one, device="cuda") == (1, {"num_gpus": 1, "num_cpus": 1})
    # an Apple GPU is no Ray GPU: one clear line, not one model copy per core on the one device
    with pytest.raises(ValueError, match=r"GPU workers requested \(--device mps\) but the Ray cluster has no GPUs"):
        _placed(monkeypatch, _Cluster({"CPU": 8.0}), device="mps")
    assert _placed(monkeypatch, one, use_gpu=True, num_workers=1)[0] == 1  # one GPU is a GPU
    # a CPU driver on a GPU cluster: CPU workers, `threads` cores each, one per node's share
    assert _placed(monkeypatch, gpus, device="cpu", threads=3) == (4, {"num_gpus": 0, "num_cpus": 3})
    # workers of 2 GPUs each: only a node with 2 GPUs holds one, whatever the cluster's total
    uneven = _Cluster({"CPU": 8.0, "GPU": 3.0}, {"CPU": 8.0, "GPU": 1.0})
    two = {"actor_options": {"num_gpus": 2}}
    assert _placed(monkeypatch, uneven, device="cuda", **two) == (1, {"num_gpus": 2, "num_cpus": 1})
    with pytest.raises(ValueError, match=r"0 Ray workers requested with .* the cluster's nodes fit 0"):
        _placed(monkeypatch, _Cluster({"CPU": 8.0, "GPU": 1.0}, {"CPU": 8.0, "GPU": 1.0}), device="cuda", **two)
    cpus = _Cluster({"CPU": 5.0}, {"CPU": 2.0})
    assert _placed(monkeypatch, cpus) == (7, {"num_gpus": 0, "num_cpus": 1})
    assert _placed(monkeypatch, cpus, threads=0) == (7, {"num_gpus": 0, "num_cpus": 1})  # torch's default: 1 core
    # device None (CUDA where there is one) on a cluster without GPUs: CPU workers
    assert _placed(monkeypatch, cpus, device=None) == (7, {"num_gpus": 0, "num_cpus": 1})
    assert _placed(monkeypatch, gpus, device=None) == (3, {"num_gpus": 1, "num_cpus": 1})  # and GPUs where there are
    assert _placed(monkeypatch, gpus, device="cpu:0", threads=3)[1] == {"num_gpus": 0, "num_cpus": 3}
    with pytest.raises(ValueError, match=r"\(--device cuda\) but the Ray cluster has no GPUs"):
        _placed(monkeypatch, cpus, device="cuda")  # not CPU workers that then fail to load on CUDA
    assert _placed(monkeypatch, cpus, threads=2) == (3, {"num_gpus": 0, "num_cpus": 2})
    with pytest.raises(ValueError, match=r"1 Ray workers requested with .* the cluster's nodes fit 0"):
        _placed(monkeypatch, cpus, threads=6)  # no node holds 6 cores: one is still asked for, and refused
    with pytest.raises(ValueError, match=r"8 Ray workers requested .* fit 7"):
        _placed(monkeypatch, cpus, num_workers=8)


# ---- factory -------------------------------------------------------------------------------------------------------


def test_machine_cores_without_an_affinity_mask_is_the_cpu_count(monkeypatch):
    """macOS and Windows have no os.sched_getaffinity: the machine's CPU count, 1 where the OS gives none."""
    import os

    from esft.es.distributed.factory import machine_cores

    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert machine_cores() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert machine_cores() == 1


def test_a_node_without_cpus_holds_no_cpu_worker(monkeypatch):
    """A head started with `ray start --head --num-cpus 0` runs no worker: the share comes from the other nodes."""
    from types import SimpleNamespace

    import esft.es.distributed.factory as factory

    nodes = [{"Alive": True, "Resources": {"CPU": 0.0, "GPU": 1.0}}, {"Alive": True, "Resources": {"CPU": 8.0}},
             {"Alive": True, "Resources": {"CPU": 8.0}}]
    monkeypatch.setattr(connection, "import_ray", lambda: SimpleNamespace(is_initialized=lambda: True,
                                                                           nodes=lambda: nodes))
    assert factory.cluster_cores() == [8, 8]
    assert factory.cpu_threads_share(factory.cluster_cores(), 2) == 8


def test_cpu_workers_run_one_thread_each_unless_told(monkeypatch, tmp_path):
    """threads_per_worker unset on CPUs: one torch thread per worker (the share of the cores is for 0 only)."""
    import esft.es.distributed.factory as factory
    import esft.es.distributed.ray_executor as ray_executor
    from esft.es.noise import MasterWeights

    monkeypatch.setattr(ray_executor, "RayExecutor", lambda spec, weights, optimizer, **kwargs: spec)
    monkeypatch.setattr(factory, "machine_cores", lambda: 12)
    monkeypatch.setattr(factory, "cluster_cores", lambda: [12])
    weights = MasterWeights(tiny_llama())
    for device in ("cpu", None):
        cfg = ESConfig(executor="ray", num_workers=3, device=device, output_dir=str(tmp_path))
        assert factory.make_ray_executor(cfg, weights=weights, frozen=None).threads == 1


# ---- the executor on a stand-in cluster: start-up sync, member queue, timings ----------------------------------------


class _Calls(_Cluster):
    """A cluster whose calls return at once: `remote` calls of the stand-in actors return a thunk, which `get` runs
    (raising what the actor raised); `put` records what the driver sends."""

    def __init__(self, *nodes):
        super().__init__(*nodes)
        self.sent, self.killed, self.timeouts, self.options = [], [], [], []
        self.make = lambda rank: _Actor({"w": 1})

    def put(self, value):
        self.sent.append(value)
        return value

    def wait(self, refs, num_returns=1, timeout=None):
        """Calls take a moment: none is ready to a wait of no time."""
        self.timeouts.append(timeout)
        if timeout is not None and timeout <= 0:
            return [], list(refs)
        ready = [r for r in refs if not getattr(r, "hung", False)][:num_returns]
        if not ready:  # a hung call: Ray waits out the timeout
            time.sleep(timeout)
        return ready, [r for r in refs if r not in ready]

    def get(self, ref):
        return ref()

    def kill(self, actor):
        self.killed.append(actor)

    def remote(self, **options):
        """`ray.remote(**options)(replica_cls)`: an actor class whose actors are `make(rank)`."""
        self.options.append(options)
        return lambda replica_cls: type("ActorClass", (), {"remote": staticmethod(lambda spec, rank: self.make(rank))})


class _Actor:
    """A worker's replica: `checksum` and `load_state` as HFReplica's; `evaluate` scores a member by its seed, or
    raises `dies` (once) as a dead actor does."""

    def __init__(self, checksum, dies=None, dies_in="evaluate", hangs=False):
        self.sums, self.dies, self.dies_in, self.loaded, self.evaluated = checksum, dies, dies_in, [], []
        self.hangs = hangs
        for name in ("info", "checksum", "load_state", "evaluate", "evaluate_center", "apply"):
            setattr(self, name, type("Method", (), {"remote": staticmethod(self._thunk(name))}))

    def _thunk(self, name):
        def call(*args):
            def run():
                if self.dies is not None and name.startswith(self.dies_in):
                    dies, self.dies = self.dies, None
                    raise dies
                return getattr(self, "_" + name)(*args)
            run.hung = self.hangs and name == "evaluate"
            return run
        return call

    def _info(self):
        return {"pid": 1, "host": "h", "device_type": "cpu"}

    def _checksum(self):
        return self.sums

    def _apply(self, update):
        self.loaded.append(update)
        return 0.0

    def _load_state(self, masters, optimizer_state):
        self.loaded.append((masters, optimizer_state))
        self.sums = {"w": 1}
        return self.sums

    def _evaluate(self, members, batch):
        from esft.es.executor import PopulationResult

        self.evaluated.append(members[0][0])
        return PopulationResult(scores=np.full((1, len(batch)), float(members[0][0])),
                                well_formed=np.ones((1, len(batch)), dtype=bool), texts=[["t"] * len(batch)],
                                tokens_generated=3, finished=1)

    def _evaluate_center(self, batch):
        return self._evaluate([(-1, 1)], batch)


def _executor(monkeypatch, *actors, optimizer=None):
    from esft.es.distributed import ray_executor
    from esft.es.distributed.hf_replica import ReplicaSpec

    cluster = _Calls({"CPU": 2.0})
    monkeypatch.setattr(ray_executor, "import_ray", lambda: cluster)
    monkeypatch.setattr(ray_executor, "masters_checksum", lambda weights: {"w": 1})
    spec = ReplicaSpec(config=ESConfig(executor="ray", device="cpu", batch_size=2))
    weights = type("Weights", (), {"iter_masters": lambda self: iter([("w", torch.ones(2))]),
                                   "params": {"w": torch.ones(2)}})()
    executor = ray_executor.RayExecutor(spec, weights, optimizer)
    executor.workers = [ray_executor.Worker(rank=r, actor=a, info=a._info()) for r, a in enumerate(actors)]
    executor._started = True
    return executor, cluster


def test_workers_behind_the_driver_get_its_masters_and_optimizer_state_at_start(monkeypatch):
    """A resumed run: workers load the base model, the driver is further on; only the workers whose checksum
    differs get the driver's masters, and its optimizer state when it has one."""
    adam = type("Adam", (), {"state_dict": lambda self: {"state": "moments"}})()
    for optimizer, state in ((adam, {"state": "moments"}), (None, None)):
        current, behind = _Actor({"w": 1}), _Actor({"w": 0})
        executor, cluster = _executor(monkeypatch, current, behind, optimizer=optimizer)
        executor._sync_at_start()
        assert current.loaded == [] and len(behind.loaded) == 1 and behind.loaded[0][1] == state
        assert torch.equal(behind.loaded[0][0]["w"], torch.ones(2))
        assert [e["event"] for e in executor.events] == ["sync", "checksum"] and executor.events[0]["workers"] == [1]


def test_members_go_to_idle_workers_and_a_dead_workers_member_is_requeued(monkeypatch, caplog):
    ray = pytest.importorskip("ray")
    steady, dying = _Actor({"w": 1}), _Actor({"w": 1}, dies=ray.exceptions.ActorDiedError())
    executor, cluster = _executor(monkeypatch, steady, dying)
    members = [(10, 1), (11, -1), (12, 1), (13, -1)]
    result = executor.evaluate_members(members, [{"q": 0}, {"q": 1}])
    assert result.scores[:, 0].tolist() == [10, 11, 12, 13]  # member order, whoever evaluated them
    assert sorted(steady.evaluated) == [10, 11, 12, 13] and cluster.killed == [dying]
    stats = executor.history[-1]
    assert (stats["requeued"], stats["members_per_worker"], stats["workers_alive"]) == (1, {0: 4}, 1)
    assert [w.members_done for w in executor.workers] == [4, 0]
    assert result.tokens_generated == 12 and result.finished == 4
    # the deadline learned from these calls is their duration (they returned at once), not a clock reading
    assert 0 <= executor.deadlines.slowest_s < 5 and executor.deadlines.member_s() == 600
    # every wait ends by the deadline of the calls it waits for (1800 s: start_timeout_s until a member returns)
    assert cluster.timeouts and all(0 < t <= 1800 for t in cluster.timeouts)
    # the loss is the one warning logged; the other events are recorded only
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "esft.es.ray"]
    assert len(logged) == 1 and logged[0][0] == "WARNING", logged
    assert logged[0][1].startswith("ray executor: lost worker 1 (pid 1 on h): ActorDiedError; re-queued members [1]")


def test_the_unperturbed_model_runs_on_one_worker_and_times_its_call(monkeypatch):
    executor, cluster = _executor(monkeypatch, _Actor({"w": 1}), _Actor({"w": 1}))
    centre = executor.evaluate_center([{"q": 0}, {"q": 1}, {"q": 2}, {"q": 3}])
    assert centre.scores.tolist() == [[-1, -1, -1, -1]]
    assert sorted(len(w.actor.evaluated) for w in executor.workers) == [0, 1]
    assert 0 <= executor.deadlines.slowest_s < 5  # half of one call on 2 batches' worth of prompts


def test_the_start_up_time_reported_is_the_time_the_start_took(monkeypatch, capsys):
    from esft.es.distributed import ray_executor

    monkeypatch.setattr(ray_executor.RayExecutor, "_connect", lambda self: None)
    executor, cluster = _executor(monkeypatch)
    executor._started, executor.num_workers = False, 2
    executor.start()
    start = next(e for e in executor.events if e["event"] == "start")
    assert len(start["workers"]) == 2 and 0 <= start["seconds"] < 5
    # no automatic restarts: a restarted actor would come back with the base model's weights
    assert cluster.options == [{"max_restarts": 0, "max_task_retries": 0, "num_gpus": 0, "num_cpus": 1}]
    assert f"esft: 2 Ray workers started in {start['seconds']:.1f} s" in capsys.readouterr().err


def test_a_divergence_names_the_driver_when_every_worker_agrees_and_else_the_workers(monkeypatch):
    from esft.es.distributed.ray_executor import ReplicaDivergence

    executor, _ = _executor(monkeypatch, _Actor({"w": 0, "b": 2}), _Actor({"w": 0, "b": 2}))
    executor.step = 5
    agree = (r"^replica divergence after 5 updates: all 2 workers agree with each other but not with the driver's "
             r"replica \(2 tensors differ, first w\)")
    with pytest.raises(ReplicaDivergence, match=agree):
        executor.verify()
    for workers in ([_Actor({"w": 0})], [_Actor({"w": 1}), _Actor({"w": 0})], [_Actor({"w": 0}), _Actor({"w": 2})]):
        executor, _ = _executor(monkeypatch, *workers)
        executor.step = 5
        with pytest.raises(ReplicaDivergence) as diverged:
            executor.verify()
        drifted = [w.rank for w in executor.workers if w.actor.sums != {"w": 1}]
        parts = "; ".join(f"worker {r} (pid 1 on h): 1 tensors differ, first w" for r in drifted)
        assert str(diverged.value) == (f"replica divergence after 5 updates: {parts} (the driver's replica is the "
                                       "reference; see docs/distributed.md)")


def test_workers_that_all_die_while_they_load_are_reported_with_the_last_error(monkeypatch):
    ray = pytest.importorskip("ray")
    from esft.es.distributed import ray_executor

    monkeypatch.setattr(ray_executor.RayExecutor, "_connect", lambda self: None)
    executor, cluster = _executor(monkeypatch)
    executor._started, executor.num_workers = False, 2
    died = ray.exceptions.ActorDiedError()
    cluster.make = lambda rank: _Actor({"w": 1}, dies=died, dies_in="info")
    with pytest.raises(ray_executor.WorkersLost) as lost:
        executor.start()
    first_line = str(died).splitlines()[0]
    assert first_line and f"(the last: ActorDiedError: {first_line[:200]});" in str(lost.value)


def test_merge_rows_stacks_rows_in_order_and_sums_their_counts_and_timings():
    from esft.es.population import PopulationResult, merge_rows

    def row(score, timings):
        return PopulationResult(scores=np.array([[score, score]]), well_formed=np.array([[True, score > 0]]),
                                texts=[[f"{score}a", f"{score}b"]], tokens_generated=5, prompt_tokens=7, finished=1,
                                timings=timings, cell_finished=np.array([[score > 0, True]]),
                                cell_completion_tokens=np.array([[2, 3]]) + int(score),
                                cell_prompt_tokens=np.array([[4, 3]]) + int(score))

    merged = merge_rows([row(0.0, {"generate": 1.5, "score": 0.25}), row(1.0, {"generate": 2.0})])
    assert merged.scores.tolist() == [[0.0, 0.0], [1.0, 1.0]] and merged.well_formed.tolist() == [[True, False],
                                                                                                 [True, True]]
    assert merged.texts == [["0.0a", "0.0b"], ["1.0a", "1.0b"]]
    assert (merged.tokens_generated, merged.prompt_tokens, merged.finished) == (10, 14, 2)
    assert merged.timings == {"generate": 3.5, "score": 0.25}
    # each completion's own fields (esft.sample_rows), in member order
    assert merged.cell_finished.tolist() == [[False, True], [True, True]]
    assert merged.cell_completion_tokens.tolist() == [[2, 3], [3, 4]]
    assert merged.cell_prompt_tokens.tolist() == [[4, 3], [5, 4]]


def test_a_result_without_per_completion_fields_leaves_them_out_of_its_rows():
    """A custom executor that gives counters only: its sample rows leave out what it does not know, rather than
    read `finished: false, completion_tokens: 0`; a recorded completion fills them."""
    from esft.es.population import PopulationResult, merge_rows
    from esft.generation import Generation

    bare = PopulationResult(scores=np.array([[1.0]]), well_formed=np.array([[True]]), texts=[["x"]])
    assert bare.cell(0, 0, prompt=True) == {"score": 1.0, "completion": "x"}
    assert merge_rows([bare, bare]).cell_finished is None

    class Task:
        def score(self, text, example):
            return 0.5

    recorded = PopulationResult(scores=np.zeros((1, 1)), well_formed=np.zeros((1, 1), dtype=bool), texts=[[]])
    recorded.record(0, 0, Generation(text="y", completion_ids=[5, 6], prompt_tokens=4, finished=True), Task(), {})
    assert recorded.cell(0, 0, prompt=True) == {"score": 0.5, "completion": "y", "finished": True,
                                                "completion_tokens": 2, "prompt_tokens": 4}
    assert recorded.cell(0, 0) == {"score": 0.5, "completion": "y", "finished": True, "completion_tokens": 2}
    assert merge_rows([recorded, bare]).cell_completion_tokens is None


def test_every_kth_update_is_followed_by_a_checksum_at_the_next_call(monkeypatch):
    from esft.es.noise import Update

    executor, _ = _executor(monkeypatch, _Actor({"w": 1}), _Actor({"w": 1}))
    executor.checksum_every = 2
    update = Update(seeds=(5,), coefficients=(1.0,), scale=-1.0, kind="gradient")
    checked = []
    for step in range(1, 6):
        executor.on_update(update, step)
        executor.settle()
        checked += [e["step"] for e in executor.events if e["event"] == "checksum" and e["step"] not in checked]
    assert checked == [2, 4]
    assert all(len(w.actor.loaded) == 5 and not w.pending for w in executor.workers)  # every update, confirmed


def test_a_worker_that_hangs_past_its_deadline_is_dropped_and_its_member_requeued(monkeypatch):
    steady, hung = _Actor({"w": 1}), _Actor({"w": 1}, hangs=True)
    executor, cluster = _executor(monkeypatch, steady, hung)
    executor.deadlines.member_timeout_s = 0.2
    result = executor.evaluate_members([(10, 1), (11, -1), (12, 1)], [{"q": 0}, {"q": 1}])
    assert result.scores[:, 0].tolist() == [10, 11, 12] and sorted(steady.evaluated) == [10, 11, 12]
    assert cluster.killed == [hung] and [w.alive for w in executor.workers] == [True, False]
    lost = next(e for e in executor.events if e["event"] == "worker_lost")
    assert (lost["worker"], lost["requeued"], lost["error"]) == (1, [1], "WorkerTimeout")
    assert lost["detail"] == ("no answer to member 1 (seed 11, sign -1) within 0 s (executor_options "
                              "member_timeout_s)")
    assert executor.history[-1]["requeued"] == 1 and executor.history[-1]["workers_alive"] == 1
