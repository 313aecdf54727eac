"""Ray runs: what is refused before the model loads, and the driver's SIGTERM handler surviving ray.init.

Run: . .venv/bin/activate && pytest -q tests/test_ray_options.py   (~15 s on 2 cores: one Ray start)
"""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from esft.api import es_trainer
from esft.es.es_config import ESConfig


def _cpu_spec(**config):
    """What a CPU Ray run ships to its workers; building it loads no model."""
    from esft.es.distributed.hf_replica import ReplicaSpec

    return ReplicaSpec(config=ESConfig(executor="ray", device="cpu", **config), threads=1)


def test_unknown_executor_options_are_refused_before_the_model_loads(tmp_path, monkeypatch):
    import esft.models

    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the executor options were checked")

    monkeypatch.setattr(esft.models, "load_model", load_model)
    cfg = ESConfig(model="smollm2-135m", task="boolq", executor="ray", num_workers=1, device="cpu",
                   executor_options={"threads_per_worker": 1}, output_dir=str(tmp_path / "run"))
    cfg.executor_options["bogus"] = 1  # after the config's own check, which refuses it as well
    with pytest.raises(ValueError, match=r"unknown executor_options \['bogus'\]"):
        es_trainer(cfg, progress=False)


def test_ray_init_keeps_the_drivers_sigterm_handler(monkeypatch):
    """ray.init installs `sys.exit(15)` for SIGTERM; esft's CLI handler (SIGTERM = Ctrl-C: weights restored,
    resume command printed, exit 130) must stay in place once the executor has started Ray."""
    ray = pytest.importorskip("ray")
    from esft.es.distributed.ray_executor import RayExecutor

    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    executor = RayExecutor(_cpu_spec(), weights=None)
    try:
        executor._connect()
        assert ray.is_initialized() and executor._owns_ray
        assert signal.getsignal(signal.SIGTERM) is interrupt
    finally:
        executor.close()
        signal.signal(signal.SIGTERM, before)


def _closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _processes_naming(text: str) -> list[int]:
    """Pids of the live (not zombie) processes whose command line contains `text`."""
    import os

    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:  # ended meanwhile
            continue
        if text in cmdline and not zombie:
            pids.append(int(pid))
    return pids


def test_ctrl_c_during_ray_init_leaves_no_ray_process_behind(monkeypatch):
    """Ctrl-C while `ray.init` starts a local Ray (seconds): Ray 2.60 interrupted halfway left the processes it had
    started running on (its agents for about a minute) or crashed the driver at exit. The interrupt is held until
    ray.init returns, then Ray is shut down and KeyboardInterrupt raised."""
    import os
    import shutil
    import tempfile
    import threading
    import time

    ray = pytest.importorskip("ray")
    from esft.es.distributed.connection import connect_ray

    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    root = tempfile.mkdtemp(prefix="esft-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    monkeypatch.setenv("RAY_TMPDIR", root)  # every process of this Ray names its session folder under root

    def interrupt_once_ray_runs():
        for _ in range(600):
            if _processes_naming(root):
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Thread(target=interrupt_once_ray_runs, daemon=True)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            connect_ray(None)
            time.sleep(30)  # the interrupt must have come during ray.init or right after it
        timer.join()
        assert not ray.is_initialized()
        for _ in range(100):
            left = _processes_naming(root)
            if not left:
                break
            time.sleep(0.1)
        assert not left, f"Ray processes still running after the interrupt: {left}"
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for pid in _processes_naming(root):  # old code: the processes the interrupted ray.init left
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


def test_cluster_endpoint_parses_the_addresses_ray_accepts():
    from esft.es.distributed.connection import cluster_endpoint

    assert cluster_endpoint("10.0.0.5:6379") == ("10.0.0.5", 6379)
    assert cluster_endpoint("ray://head.example:10001") == ("head.example", 10001)
    assert cluster_endpoint("[::1]:6379") == ("::1", 6379)
    for resolved_by_ray in (None, "", "auto", "local", "head.example", "ray://head", "http://h:8265/x"):
        assert cluster_endpoint(resolved_by_ray) is None, resolved_by_ray


def test_unreachable_ray_address_fails_fast_and_before_the_model_loads(tmp_path, monkeypatch):
    """Ray 2.60 retries a HOST:PORT with nothing behind it without end; esft probes the port first, before the
    model loads and before Ray starts, and names the address."""
    import time

    ray = pytest.importorskip("ray")
    import esft.models

    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process")

    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the Ray address was tried")

    monkeypatch.setattr(esft.models, "load_model", load_model)
    address = f"127.0.0.1:{_closed_port()}"
    cfg = ESConfig(model="smollm2-135m", task="boolq", executor="ray", num_workers=1, device="cpu",
                   ray_address=address, output_dir=str(tmp_path / "run"))
    t0 = time.perf_counter()
    with pytest.raises(ConnectionError, match=rf"cannot reach a Ray cluster at '{address}' \(.*refused"):
        es_trainer(cfg, progress=False)
    assert time.perf_counter() - t0 < 5
    assert not ray.is_initialized()


def test_unreachable_ray_address_env_is_probed_too(monkeypatch):
    from esft.es.distributed.connection import check_reachable

    address = f"ray://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("RAY_ADDRESS", address)
    with pytest.raises(ConnectionError, match="cannot reach a Ray cluster at 'ray://127.0.0.1:"):
        check_reachable(None)
    check_reachable("auto")  # resolved by Ray itself (it fails fast when no cluster runs): not probed


def test_a_listening_ray_address_passes_the_probe():
    import socket

    from esft.es.distributed.connection import check_reachable

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}", timeout_s=5)


def test_a_ray_run_connects_before_the_model_loads_and_the_executor_owns_the_connection(tmp_path, monkeypatch):
    """A local Ray start (no address) happens before the model loads; the run's executor then shuts it down."""
    ray = pytest.importorskip("ray")
    import esft.models

    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    seen = []

    def load_model(*args, **kwargs):
        seen.append(ray.is_initialized())
        raise RuntimeError("stop after the connection")

    monkeypatch.setattr(esft.models, "load_model", load_model)
    cfg = ESConfig(model="smollm2-135m", task="boolq", executor="ray", num_workers=1, device="cpu",
                   output_dir=str(tmp_path / "run"))
    with pytest.raises(RuntimeError, match="stop after the connection"):
        es_trainer(cfg, progress=False)
    assert seen == [True]  # connected when the model was about to load
    assert not ray.is_initialized()  # and the failed run let its connection go


def test_an_executor_that_owns_an_earlier_connection_shuts_it_down():
    ray = pytest.importorskip("ray")
    from esft.es.distributed.connection import connect_ray
    from esft.es.distributed.ray_executor import RayExecutor

    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process")
    assert connect_ray(None)
    borrowed = RayExecutor(_cpu_spec(), weights=None)  # a connection it did not make is not its own to end
    borrowed.close()
    assert ray.is_initialized()
    RayExecutor(_cpu_spec(), weights=None, owns_ray=True).close()
    assert not ray.is_initialized()


def test_actor_slots_count_what_each_node_holds():
    """An actor runs on one node: what is left on several nodes does not add up to a slot."""
    from esft.es.distributed.ray_executor import actor_slots

    nodes = [{"CPU": 4.0, "GPU": 2.0, "memory": 1e9}, {"CPU": 3.0}]
    assert actor_slots(nodes, 2, 0) == 2 + 1
    assert actor_slots(nodes, 1, 1) == 2  # GPU workers fit only where the GPUs are
    assert actor_slots(nodes, 1 / 3, 0) == 12 + 9
    assert actor_slots(nodes, 5, 0) == 0


class _CpuOnlyCluster:
    """The two calls `RayExecutor._resources` makes, answered for one node with 2 CPUs and no GPU."""

    @staticmethod
    def cluster_resources():
        return {"CPU": 2.0}

    @staticmethod
    def nodes():
        return [{"Alive": True, "Resources": {"CPU": 2.0}}]


@pytest.mark.parametrize("options, error", [
    # num_workers 0 counts one worker per CPU it asks for; asking for none used to mean 2**30 actors (a hang)
    ({"actor_options": {"num_cpus": 0}}, r"--num-workers 0 .* ask for none"),
    # one worker per GPU of a cluster without GPUs used to read "0 Ray workers requested ... lower --num-workers"
    ({"use_gpu": True}, r"\(executor_options use_gpu: true\) but the Ray cluster has no GPUs .*: run with "
                        r"--device cpu \(and without use_gpu: true\), or join a cluster with GPUs$"),
])
def test_a_worker_count_that_cannot_be_derived_is_refused_with_its_reason(monkeypatch, options, error):
    from esft.es.distributed import ray_executor

    monkeypatch.setattr(ray_executor, "import_ray", _CpuOnlyCluster)
    spec = _cpu_spec()
    executor = ray_executor.RayExecutor(spec, weights=None, num_workers=0, **options)
    with pytest.raises(ValueError, match=error):
        executor._resources()
    counted = ray_executor.RayExecutor(spec, weights=None, num_workers=3, actor_options={"num_cpus": 0})
    assert counted._resources()[0] == 3  # a count that is given needs none


@pytest.mark.parametrize("num_workers, options, error", [
    (3, {}, r"^3 Ray workers requested .* nodes fit 2"),
    (1, {"use_gpu": True}, r"\(executor_options use_gpu: true\) but the Ray cluster has no GPUs"),
])
def test_workers_the_cluster_cannot_hold_are_refused_before_the_model_loads(tmp_path, monkeypatch, num_workers,
                                                                             options, error):
    """The refusal `RayExecutor.start` makes comes right after the connection, not once the driver's model (minutes
    for a large one) has loaded; a connection made for the run is let go."""
    import esft.models
    from esft.es.distributed import connection, ray_executor

    class Cluster(_CpuOnlyCluster):
        @staticmethod
        def is_initialized():
            return True

    calls = []
    monkeypatch.setattr(ray_executor, "import_ray", Cluster)
    monkeypatch.setattr(connection, "import_ray", Cluster)
    monkeypatch.setattr(connection, "connect_ray", lambda address: calls.append("connect") or True)
    monkeypatch.setattr(connection, "disconnect_ray", lambda: calls.append("disconnect"))
    monkeypatch.setattr(esft.models, "load_model", lambda *a, **k: pytest.fail("the model loaded first"))
    cfg = ESConfig(model="smollm2-135m", task="boolq", executor="ray", num_workers=num_workers, device="cpu",
                   output_dir=str(tmp_path / "run"), executor_options=options)
    with pytest.raises(ValueError, match=error):
        es_trainer(cfg, progress=False)
    assert calls == ["connect", "disconnect"]
    assert not (tmp_path / "run").exists()


def test_member_deadlines_count_prompts_in_the_runs_batches():
    """An evaluation call on n prompts gets n / batch_size members' time: the unit is the config's batch."""
    from esft.es.distributed.ray_executor import RayExecutor

    executor = RayExecutor(_cpu_spec(batch_size=4), weights=None, member_timeout_s=10)
    assert executor.deadlines.for_prompts(4) == 10
    assert executor.deadlines.for_prompts(12) == 30


class _StartingCluster(_CpuOnlyCluster):
    """Places actors at once; the workers whose rank is in `dying` die while they load (`info` raises)."""

    def __init__(self, dying):
        import ray

        self.exceptions, self.dying, self.killed = ray.exceptions, dying, []

    def remote(self, **options):
        cluster = self

        class Actor:
            def __init__(self, rank):
                self.rank = rank
                self.info = SimpleNamespace(remote=self.started)

            @classmethod
            def remote(cls, spec, rank):
                return cls(rank)

            def started(self):
                if self.rank in cluster.dying:
                    return lambda: (_ for _ in ()).throw(cluster.exceptions.ActorDiedError())
                return lambda: {"rank": self.rank, "pid": 100 + self.rank, "host": "h", "device_type": "cpu"}

        return lambda replica_cls: Actor

    def wait(self, refs, num_returns=1, timeout=None):
        return refs, []

    def get(self, ref):
        return ref()

    def kill(self, actor):
        self.killed.append(actor.rank)


@pytest.mark.parametrize("dying", [{1}, {0, 1}])
def test_a_worker_killed_while_it_loads_is_dropped_not_a_code_error(monkeypatch, dying):
    """Killed (or OOM-killed) during start-up: the run starts on the others, as after a death mid-run; it used to
    stop as "worker 1 (not started) raised The actor never ran ... the run cannot start"."""
    import torch

    from esft.es.distributed import ray_executor

    cluster = _StartingCluster(dying)
    monkeypatch.setattr(ray_executor, "import_ray", lambda: cluster)
    monkeypatch.setattr(ray_executor.RayExecutor, "_connect", lambda self: None)
    monkeypatch.setattr(ray_executor.RayExecutor, "_sync_at_start", lambda self: None)
    spec = _cpu_spec()
    executor = ray_executor.RayExecutor(spec, SimpleNamespace(params={"w": torch.zeros(1)}), num_workers=2)
    if dying == {0, 1}:
        with pytest.raises(ray_executor.WorkersLost) as lost:
            executor.start()
        # nothing ran: the cause and "again", not the mid-run "after ? updates ... resume"
        assert str(lost.value).startswith("all 2 Ray workers died while they loaded the model and task (the last: ")
        assert "run the command again" in str(lost.value) and "?" not in str(lost.value)
        assert "--resume" not in str(lost.value)
        assert not executor.alive
        return
    executor.start()
    assert [w.rank for w in executor.alive] == [0] and cluster.killed == [1]
    assert [e["event"] for e in executor.events] == ["worker_lost", "start"]
    assert executor.events[1]["workers"] == [executor.workers[0].info]


def _starting_executor(monkeypatch, dying, **kwargs):
    """A RayExecutor of 2 workers on `_StartingCluster(dying)`, its masters checked by nobody."""
    import torch

    from esft.es.distributed import ray_executor

    monkeypatch.setattr(ray_executor, "import_ray", lambda: _StartingCluster(dying))
    monkeypatch.setattr(ray_executor.RayExecutor, "_connect", lambda self: None)
    monkeypatch.setattr(ray_executor.RayExecutor, "_sync_at_start", lambda self: None)
    spec = _cpu_spec()
    return ray_executor.RayExecutor(spec, SimpleNamespace(params={"w": torch.zeros(1)}), num_workers=2, **kwargs)


@pytest.mark.parametrize("dying, started", [(set(), "2 Ray workers"), ({1}, "1 Ray worker")])
def test_the_workers_start_is_one_line_the_user_sees(monkeypatch, capsys, dying, started):
    """Placing the workers and loading their models takes seconds to minutes, after "esft: connecting to Ray"; its
    end is printed as esft's other progress lines are (its log record is INFO, which no one shows by default)."""
    import re

    _starting_executor(monkeypatch, dying).start()
    lines = [line for line in capsys.readouterr().err.splitlines() if "started" in line]
    assert len(lines) == 1 and re.fullmatch(rf"esft: {started} started in \d+\.\d s", lines[0]), lines


def test_all_workers_lost_is_printed_once_with_exit_3(tmp_path, monkeypatch, capsys, caplog):
    """The error the command line prints is the whole message: the executor used to log it as well (an ERROR
    record, which Python prints on stderr when logging is not configured), so the user read it twice."""
    import esft.api
    from esft.cli import main

    out = tmp_path / "run"
    monkeypatch.setattr(esft.api, "train_es", lambda config: _starting_executor(
        monkeypatch, {0, 1}, event_log=out / "metrics.jsonl").start())
    code = main(["train", "es", "--model", "smollm2-135m", "--task", "boolq", "--executor", "ray",
                 "--num-workers", "2", "--device", "cpu", "--output-dir", str(out)])
    assert code == 3
    lost = [line for line in capsys.readouterr().err.splitlines() if "workers died" in line]
    assert len(lost) == 1 and lost[0].startswith("esft: error: all 2 Ray workers died while they loaded")
    assert not [r for r in caplog.records if "workers died" in r.getMessage()]


def test_vllm_workers_with_adam_are_refused_when_the_config_is_built():
    from esft.config import ConfigError

    with pytest.raises(ConfigError, match=r"optimizer = 'adam' .*'sgd' with worker_backend 'vllm'"):
        ESConfig(executor="ray", worker_backend="vllm", optimizer="adam")
    ESConfig(executor="ray", worker_backend="hf", optimizer="adam")  # PyTorch replicas carry Adam's state


def test_a_ray_run_where_ray_is_not_installed_is_one_line_before_the_model_loads(tmp_path, monkeypatch, capsys):
    """`esft train es --executor ray` without Ray ended in an ImportError traceback (exit 1)."""
    import sys

    import esft.models
    from esft.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails, as where it is not installed
    monkeypatch.setattr(esft.models, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    assert main(["train", "es", "--task", "boolq", "--executor", "ray", "--num-workers", "2", "--iterations", "1",
                 "--output-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err == ("esft: error: executor 'ray' runs its members on Ray workers, and Ray is not installed here: "
                   "pip install 'esft[ray]'\n")
    assert not (tmp_path / "run").exists()


def test_missing_vllm_is_reported_before_ray_starts_and_the_model_loads(tmp_path, monkeypatch):
    import esft.es.distributed.connection
    import esft.es.distributed.vllm_backend.availability as availability
    import esft.models

    def never(*args, **kwargs):
        raise AssertionError("Ray or the model started although vLLM cannot run here")

    monkeypatch.setattr(availability, "vllm_unavailable_reason", lambda: "vLLM is not installed (test)")
    monkeypatch.setattr(esft.models, "load_model", never)
    monkeypatch.setattr(esft.es.distributed.connection, "connect_ray", never)
    cfg = ESConfig(model="smollm2-135m", task="boolq", executor="ray", worker_backend="vllm", num_workers=1,
                   device="cpu", output_dir=str(tmp_path / "run"))
    with pytest.raises(RuntimeError, match=r"worker_backend 'vllm' is not available here: vLLM is not installed"):
        es_trainer(cfg, progress=False)


@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_all_workers_lost_names_a_local_resume_that_the_run_accepts(tmp_path, backend):
    """The WorkersLost message offers `--resume DIR ... --executor local`; those flags must resume this run (a vLLM
    run's worker_backend cannot stay 'vllm' on the local executor)."""
    import re

    from esft.es.distributed.hf_replica import ReplicaSpec
    from esft.es.distributed.ray_executor import RayExecutor
    from esft.es.es_config import resume_config, save_yaml

    cfg = ESConfig(executor="ray", worker_backend=backend, output_dir=str(tmp_path))
    save_yaml(cfg, tmp_path / "config.yaml")
    lost = RayExecutor(ReplicaSpec(config=cfg), weights=None, event_log=tmp_path / "metrics.jsonl")._all_lost()
    flags = re.search(rf"--resume {re.escape(str(tmp_path))}` \(on any number of workers, or ([^)]*)\)",
                      str(lost)).group(1).split()
    overrides = {flag.removeprefix("--").replace("-", "_"): value for flag, value in zip(flags[::2], flags[1::2])}
    resumed = resume_config(tmp_path, overrides)
    assert resumed.executor == "local" and resumed.worker_backend == "hf" and resumed.resume


def test_a_dropped_worker_is_ended_not_left_holding_its_resources(monkeypatch):
    """A worker dropped on ActorUnavailableError may still be running; the executor never calls it again, so it
    kills it rather than leave its process (and CPUs or GPU) until the driver exits."""
    ray = pytest.importorskip("ray")
    from esft.es.distributed.ray_executor import RayExecutor, Worker

    killed = []
    monkeypatch.setattr(ray, "kill", lambda actor, **kw: killed.append(actor))
    executor = RayExecutor(_cpu_spec(), weights=None)
    lost, kept = Worker(rank=0, actor="actor-0"), Worker(rank=1, actor="actor-1")
    executor.workers = [lost, kept]
    executor._lose(lost, RuntimeError("unavailable"))
    assert killed == ["actor-0"] and not lost.alive and kept.alive
    executor.close()
    assert sorted(killed) == ["actor-0", "actor-1"]


def test_all_workers_lost_mid_run_names_the_resume_and_is_not_logged_as_well(tmp_path, monkeypatch, caplog):
    """Mid-run, every member's worker gone: the error (exit 3 at the command line) names the resume; the executor
    records it in metrics.jsonl but does not log it too (the user would read it twice)."""
    out = tmp_path / "run"
    out.mkdir()
    executor = _starting_executor(monkeypatch, set(), event_log=out / "metrics.jsonl")
    executor.start()
    executor.step = 4
    lost = executor._all_lost()
    assert str(lost).startswith("all 2 Ray workers are lost (after 4 updates)")
    assert f"`esft train es --resume {out}`" in str(lost)
    assert executor.events[-1]["event"] == "all_workers_lost" and executor.events[-1]["detail"] == str(lost)
    assert not [r for r in caplog.records if "workers are lost" in r.getMessage()]
    executor.step = None  # lost before the trainer's first update of this session: no "after ? updates"
    assert str(executor._all_lost()).startswith("all 2 Ray workers are lost (before this session's first update)")


@pytest.mark.parametrize("check", ["frozen", "checksum"])
def test_replica_divergence_is_recorded_and_not_logged_as_well(tmp_path, monkeypatch, caplog, check):
    """A worker whose model differs from the driver's (its frozen parameters at start-up, or its masters at a
    periodic check) stops the run with ReplicaDivergence, which the command line prints (exit 3); the executor
    records it in metrics.jsonl with that message but does not log it too (the user read it twice)."""
    import json
    import logging

    from esft.es.distributed import ray_executor

    out = tmp_path / "run"
    out.mkdir()
    executor = _starting_executor(monkeypatch, set(), event_log=out / "metrics.jsonl", frozen={"f": 0})
    executor.start()
    executor.step = 7
    monkeypatch.setattr(ray_executor, "masters_checksum", lambda weights: {"w": 0})
    for w in executor.workers:  # worker 1 differs from the driver, worker 0 agrees
        w.actor.frozen_checksum = w.actor.checksum = SimpleNamespace(remote=lambda key=check, r=w.rank: (
            lambda: {"f" if key == "frozen" else "w": r}))
    with pytest.raises(ray_executor.ReplicaDivergence) as diverged:
        executor._check_frozen() if check == "frozen" else executor.verify()
    assert "worker 1" in str(diverged.value)
    event = executor.events[-1]
    assert event["event"] == check and event["ok"] is False and event["drifted"] == [1]
    assert event["detail"] == str(diverged.value)
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["detail"] == str(diverged.value)
    assert not [r for r in caplog.records if str(diverged.value)[:40] in r.getMessage()]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
