"""The Ray executor's parts that need no Ray cluster: address parsing and the connection (on a stand-in `ray`),
the factory's choice of replica and options, the Hugging Face replica driven in-process, and how a worker's
failures are told apart and timed.

Run: . .venv/bin/activate && pytest -q tests/test_ray_parts.py   (~10 s: no Ray instance starts)
"""

from __future__ import annotations

import copy
import os
import signal
import socket

import numpy as np
import pytest
import torch

from es_tiny import ToyTask, one_thread, stub_generate, tiny_llama  # noqa: F401  (one_thread: autouse)
from esft.es.distributed import connection
from esft.es.es_config import ESConfig
from esft.es.executor import LocalExecutor
from esft.es.noise import MasterWeights, Update
from esft.es.strategy import ES

# ---- connection ----------------------------------------------------------------------------------------------------


def test_cluster_endpoint_refuses_what_is_not_host_and_numeric_port():
    from esft.es.distributed.connection import cluster_endpoint

    assert cluster_endpoint(" ray://10.0.0.5:10001 ") == ("10.0.0.5", 10001)
    for not_a_tcp_endpoint in (":6379", "head:port", "http://h:8265", "ray://:10001"):
        assert cluster_endpoint(not_a_tcp_endpoint) is None, not_a_tcp_endpoint


@pytest.mark.parametrize("error, why", [(socket.gaierror(-2, "Name or service not known"), "host name not found"),
                                        (TimeoutError("timed out"), "no answer within 2.5 s"),
                                        (ConnectionRefusedError(111, "Connection refused"), "Connection refused")])
def test_check_reachable_says_why_the_probe_failed(monkeypatch, error, why):
    from esft.es.distributed.connection import check_reachable

    tried = []

    def create_connection(endpoint, timeout):
        tried.append((endpoint, timeout))
        raise error

    monkeypatch.setattr(socket, "create_connection", create_connection)
    monkeypatch.setenv("RAY_ADDRESS", "10.9.9.9:1")  # an explicit address wins over the environment
    with pytest.raises(ConnectionError, match=rf"^cannot reach a Ray cluster at 'head.example:6379' \({why}\): is "
                                              r"`ray start --head` running on head.example") as caught:
        check_reachable("head.example:6379", timeout_s=2.5)
    assert tried == [(("head.example", 6379), 2.5)] and caught.value.__cause__ is error


@pytest.mark.parametrize("address", ["127.0.0.1:99999", "ray://head:0"])
def test_check_reachable_refuses_a_port_out_of_range_without_probing_another(monkeypatch, address):
    """Port 99999 used to be probed as 34463 (99999 mod 65536) and reported as that port's answer."""
    from esft.es.distributed.connection import check_reachable

    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("probed a port it was not given"))
    with pytest.raises(ValueError, match=r"is not a TCP port \(1-65535\)"):
        check_reachable(address)


class FakeRay:
    """Stands in for `ray`: records its calls; `on_init` runs inside `init` (as if Ray were starting)."""

    def __init__(self, initialized=False, on_init=None):
        self.initialized, self.on_init, self.calls = initialized, on_init, []

    def is_initialized(self):
        return self.initialized

    def init(self, **kwargs):
        self.calls.append(("init", kwargs))
        if self.on_init is not None:
            self.on_init()
        self.initialized = True
        self.calls.append(("init returned", None))

    def shutdown(self):
        self.calls.append(("shutdown", None))
        self.initialized = False


@pytest.fixture()
def fake_ray(monkeypatch):
    """Install a FakeRay; SIGINT and SIGTERM handlers are put back afterwards."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    ray = FakeRay()
    monkeypatch.setattr(connection, "import_ray", lambda: ray)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    yield ray
    for s, handler in handlers.items():
        signal.signal(s, handler)


def test_connect_ray_connects_once_and_leaves_an_existing_connection_alone(fake_ray):
    sigint = signal.getsignal(signal.SIGINT)
    assert connection.connect_ray("") is True
    assert [c[0] for c in fake_ray.calls] == ["init", "init returned"]
    assert fake_ray.calls[0][1]["address"] is None  # "" = let Ray resolve it, as None
    assert signal.getsignal(signal.SIGINT) is sigint  # the handler that held Ctrl-C during init is gone
    assert connection.connect_ray("auto") is False and len(fake_ray.calls) == 2  # already connected: not again
    connection.disconnect_ray()
    assert not fake_ray.initialized
    connection.disconnect_ray()  # not connected: nothing to shut down
    assert [c[0] for c in fake_ray.calls] == ["init", "init returned", "shutdown"]


def test_connect_ray_probes_the_address_before_ray_is_asked(fake_ray, monkeypatch):
    tried = []

    def create_connection(endpoint, timeout):
        tried.append(timeout)
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(socket, "create_connection", create_connection)
    with pytest.raises(ConnectionError, match=r"cannot reach a Ray cluster at '10.0.0.5:6379' \(Connection refused"):
        connection.connect_ray("10.0.0.5:6379")
    assert fake_ray.calls == [] and not fake_ray.initialized
    assert 0 < tried[0] <= 30  # fails fast where Ray would retry without end


def test_connect_ray_names_esfts_flag_when_ray_cannot_connect(fake_ray):
    def refuse():
        raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to by "
                              "setting `--address`")

    fake_ray.on_init = refuse
    with pytest.raises(ConnectionError, match=r"`--address` \(esft's flag is --ray-address\)$"):
        connection.connect_ray("auto")


def test_an_address_ray_cannot_parse_is_one_line_naming_esfts_flag(fake_ray):
    """Ray 2.60 refuses an HTTP address (the dashboard's) with a ValueError of three lines."""
    def refuse():
        raise ValueError("Invalid Ray address: 'http://h:8265'. It looks like you set RAY_ADDRESS to an HTTP address"
                         ". To fix this, either:\n  1. Unset RAY_ADDRESS if you are running from a Ray node, or\n  2. "
                         "Set RAY_ADDRESS to the GCS address instead (e.g. <head_node_ip>:6379).")

    fake_ray.on_init = refuse
    with pytest.raises(ValueError) as caught:
        connection.connect_ray("http://h:8265")
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith("Invalid Ray address: 'http://h:8265'. It looks like")
    assert str(caught.value).endswith("<head_node_ip>:6379). (esft's flag is --ray-address)")


def test_an_address_from_ray_address_is_named_as_such(fake_ray, monkeypatch):
    """No --ray-address given: Ray read $RAY_ADDRESS, and the error named esft's flag as if the user had typed it."""
    def refuse():
        raise ValueError("Invalid Ray address: 'http://h:8265'.")

    fake_ray.on_init = refuse
    monkeypatch.setenv("RAY_ADDRESS", "http://h:8265")
    with pytest.raises(ValueError) as caught:
        connection.connect_ray(None)
    assert str(caught.value).endswith("(the address is $RAY_ADDRESS's; esft's flag is --ray-address)")


NO_PORT = r"names no port: Ray Client addresses are ray://HOST:PORT .*10001"


@pytest.mark.parametrize("address, refusal", [
    # ray://HOST used to wait 30 s for gRPC's default port 443, then read only `ray client connection timeout`
    *((a, NO_PORT) for a in ("ray://head", "ray://[::1]", " ray://head ")),
    # ray://HOST:PORT/ was refused as naming no port, which it does
    *((a, r"has a path: Ray Client addresses are ray://HOST:PORT, with nothing after")
      for a in ("ray://head:10001/", "ray://head:10001/x")),
    # `--ray-address localhost:` reached Ray, whose error named neither the flag nor the HOST:PORT form
    *((a, r"names no port number: a cluster's address is HOST:PORT .*--ray-address") for a in ("localhost:",
                                                                                            " head:63x9 ")),
])
def test_an_address_without_a_usable_port_is_refused_without_waiting(monkeypatch, fake_ray, address, refusal):
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("probed a port it was not given"))
    with pytest.raises(ValueError, match=refusal):
        connection.connect_ray(address)
    assert fake_ray.calls == []


@pytest.mark.parametrize("address", ["auto", "local", "http://h:8265"])
def test_addresses_ray_resolves_itself_pass_the_port_check(address):
    connection.check_reachable(address)


def test_ctrl_c_during_ray_init_is_held_then_shuts_ray_down(fake_ray):
    fake_ray.on_init = lambda: os.kill(os.getpid(), signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        connection.connect_ray(None)
    assert [c[0] for c in fake_ray.calls] == ["init", "init returned", "shutdown"]  # init ran to its end first
    assert not fake_ray.initialized


def test_a_second_ctrl_c_during_ray_init_interrupts_it_at_once(fake_ray):
    def twice():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)

    fake_ray.on_init = twice
    with pytest.raises(KeyboardInterrupt):
        connection.connect_ray(None)
    assert [c[0] for c in fake_ray.calls] == ["init"]  # init did not return


def test_esfts_sigterm_handler_is_held_during_init_and_kept_after_it(fake_ray):
    seen = []

    def esft_handler(signum, frame):
        seen.append(signum)

    def ray_handler(signum, frame):  # what ray.init installs: sys.exit(15)
        raise SystemExit(15)

    def init():
        os.kill(os.getpid(), signal.SIGTERM)
        signal.signal(signal.SIGTERM, ray_handler)

    signal.signal(signal.SIGTERM, esft_handler)
    fake_ray.on_init = init
    with pytest.raises(KeyboardInterrupt):
        connection.connect_ray(None)
    assert signal.getsignal(signal.SIGTERM) is esft_handler and seen == []  # held, not handled twice
    assert fake_ray.calls[-1][0] == "shutdown"


def test_a_sigterm_after_ray_installs_its_handler_stops_the_run_as_ctrl_c_does(fake_ray):
    """Ray 2.60's ray.init installs `sys.exit(SIGTERM)` first thing, so that is the handler a SIGTERM during
    start-up meets: esft turns its exit into the interrupt (exit 130, resume hint), Ray shut down."""

    def esft_handler(signum, frame):
        raise KeyboardInterrupt

    def ray_handler(signum, frame):
        raise SystemExit(signum)

    def init():
        signal.signal(signal.SIGTERM, ray_handler)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, esft_handler)
    fake_ray.on_init = init
    with pytest.raises(KeyboardInterrupt):
        connection.connect_ray(None)
    assert [c[0] for c in fake_ray.calls] == ["init", "shutdown"]
    assert signal.getsignal(signal.SIGTERM) is esft_handler


def test_other_exits_during_ray_init_are_not_taken_for_a_sigterm(fake_ray):
    signal.signal(signal.SIGTERM, lambda signum, frame: None)

    def init():
        raise SystemExit(3)

    fake_ray.on_init = init
    with pytest.raises(SystemExit) as info:
        connection.connect_ray(None)
    assert info.value.code == 3


def test_without_esfts_handler_a_sigterm_during_ray_init_ends_the_process_as_ray_says(fake_ray):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def init():
        signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(SystemExit(signum)))
        os.kill(os.getpid(), signal.SIGTERM)

    fake_ray.on_init = init
    with pytest.raises(SystemExit) as info:
        connection.connect_ray(None)
    assert info.value.code == signal.SIGTERM


def test_without_a_python_sigterm_handler_rays_own_stays(fake_ray):
    def ray_handler(signum, frame):
        raise SystemExit(15)

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    fake_ray.on_init = lambda: signal.signal(signal.SIGTERM, ray_handler)
    assert connection.connect_ray(None) is True
    assert signal.getsignal(signal.SIGTERM) is ray_handler  # its exit shuts down the Ray this driver started


# ---- factory -------------------------------------------------------------------------------------------------------


class Recorded:
    def __init__(self, spec, weights, optimizer=None, **kwargs):
        self.spec, self.weights, self.optimizer, self.kwargs = spec, weights, optimizer, kwargs


@pytest.fixture()
def recorded_executor(monkeypatch):
    import esft.es.distributed.ray_executor as ray_executor

    monkeypatch.setattr(ray_executor, "RayExecutor", Recorded)


def test_make_ray_executor_passes_the_configs_options_on(recorded_executor, tmp_path):
    from esft.es.distributed.factory import make_ray_executor
    from esft.es.distributed.hf_replica import HFReplica, frozen_checksum

    model = tiny_llama()
    weights = MasterWeights(model, include=["layers.0."])
    options = {"threads_per_worker": 3, "num_cpus_per_worker": 2, "checksum_every": 4, "use_gpu": False,
               "start_timeout_s": 60, "member_timeout_s": 7, "max_model_len": 512}
    cfg = ESConfig(executor="ray", num_workers=2, ray_address="10.0.0.5:6379", device="cpu",
                   output_dir=str(tmp_path), executor_options=options)
    ex = make_ray_executor(cfg, weights=weights, optimizer="adam-state", generate_fn=stub_generate, model=model)
    assert ex.weights is weights and ex.optimizer == "adam-state"
    assert ex.spec.config is cfg and ex.spec.threads == 3 and ex.spec.generate_fn is stub_generate
    assert ex.spec.options == {"max_model_len": 512}  # the engine's options only
    frozen = ex.kwargs.pop("frozen")
    assert frozen == frozen_checksum(model, weights.names) and frozen and not set(frozen) & set(weights.names)
    assert ex.kwargs == dict(num_workers=2, address="10.0.0.5:6379", checksum_every=4,
                             event_log=tmp_path / "metrics.jsonl", replica_cls=HFReplica,
                             actor_options={"num_cpus": 2}, use_gpu=False, start_timeout_s=60.0,
                             member_timeout_s=7.0)


def test_make_ray_executor_defaults(recorded_executor, tmp_path):
    from esft.es.distributed.factory import make_ray_executor

    weights = MasterWeights(tiny_llama())
    on_cpu = make_ray_executor(ESConfig(executor="ray", output_dir=str(tmp_path)), weights=weights,
                               frozen={"x": 1})
    assert on_cpu.spec.threads == 1  # device None is the CPU: one torch thread per worker
    assert on_cpu.spec.options == {} and on_cpu.optimizer is None
    kw = on_cpu.kwargs
    assert kw["frozen"] == {"x": 1}  # an override wins
    assert (kw["checksum_every"], kw["start_timeout_s"], kw["member_timeout_s"]) == (10, 1800.0, 0.0)
    assert kw["actor_options"] == {} and kw["use_gpu"] is None and kw["address"] is None
    on_gpu = make_ray_executor(ESConfig(executor="ray", device="cuda", output_dir=str(tmp_path)), weights=weights)
    assert on_gpu.spec.threads == 0 and on_gpu.kwargs["frozen"] is None  # no model given: nothing to compare


def test_device_none_is_read_alike_for_the_workers_threads_and_their_resources(recorded_executor, tmp_path,
                                                                             monkeypatch):
    """device None is the loader's default, CUDA where there is one: on a cluster with GPUs the workers are GPU
    workers both for the threads the factory gives them (torch's default, 0) and for the resources `_resources`
    asks for; on one without, CPU workers of one thread. `use_gpu` overrides the device either way."""
    from esft.es.distributed import factory
    from esft.es.distributed.connection import workers_use_gpu

    assert workers_use_gpu(None, None, 2) and not workers_use_gpu(None, None, 0)
    assert workers_use_gpu("cuda:1", None, 0) and not workers_use_gpu("cpu:0", None, 4)
    assert workers_use_gpu("cpu", True, 0) and not workers_use_gpu("cuda", False, 4)
    weights = MasterWeights(tiny_llama())
    for gpus, threads in ((2, 0), (0, 1)):
        monkeypatch.setattr(factory, "cluster_gpus", lambda gpus=gpus: gpus)
        ex = factory.make_ray_executor(ESConfig(executor="ray", output_dir=str(tmp_path)), weights=weights,
                                       frozen={})
        assert ex.spec.threads == threads
    monkeypatch.setattr(factory, "cluster_gpus", lambda: 2)
    forced = factory.make_ray_executor(ESConfig(executor="ray", output_dir=str(tmp_path),
                                                executor_options={"use_gpu": False}), weights=weights, frozen={})
    assert forced.spec.threads == 1


class _FakeRay:
    def __init__(self, connected: bool, gpus: float):
        self.connected, self.gpus = connected, gpus

    def is_initialized(self):
        return self.connected

    def cluster_resources(self):
        return {"CPU": 8.0, "GPU": self.gpus} if self.connected else {}


def test_cluster_gpus_reads_the_connected_cluster_else_this_machine(monkeypatch):
    """The connected cluster's GPUs; before a connection this machine's CUDA GPUs, which the local Ray instance
    the executor would start has (a caller of the factory that skipped `connect` got 0: CPU-worker threads for
    what `_resources` then placed as GPU workers)."""
    import torch

    from esft.es.distributed import connection, factory

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(connection, "import_ray", lambda: _FakeRay(True, 2.0))
    assert factory.cluster_gpus() == 2
    monkeypatch.setattr(connection, "import_ray", lambda: _FakeRay(False, 2.0))
    assert factory.cluster_gpus() == 3


def test_cpu_threads_share_splits_the_cores_between_the_workers():
    from esft.es.distributed.factory import cpu_threads_share

    assert cpu_threads_share([16], 4) == 4 and cpu_threads_share([16], 5) == 3
    assert cpu_threads_share([2], 8) == 1  # more workers than cores: one thread each, never 0 (torch's default)
    assert cpu_threads_share([16], 0) == 1  # num_workers 0: one worker per CPU
    assert cpu_threads_share([16], 4, num_cpus_per_worker=6) == 6  # the CPUs Ray gives each worker
    assert cpu_threads_share([16], 4, num_cpus_per_worker=0.5) == 1
    # a worker runs on one node: 32 CPUs over 2 workers is 16 each, more than an 8-core node holds
    assert cpu_threads_share([8] * 4, 2) == 8 and cpu_threads_share([8] * 4, 8) == 4
    # 24 CPUs over 4 workers is 6 each, but three 8-core nodes hold only three such workers: 4 each places all
    assert cpu_threads_share([8] * 3, 4) == 4 and cpu_threads_share([8, 8], 3) == 4
    for nodes, workers in (([8] * 3, 4), ([8, 8], 3), ([16, 4], 3), ([6, 6, 6], 5), ([1], 3)):
        share = cpu_threads_share(nodes, workers)
        assert sum(c // share for c in nodes) >= workers or share == 1, (nodes, workers, share)


def test_the_share_reads_the_connected_clusters_nodes(monkeypatch):
    """A 32-core driver joined to two 8-core nodes: the share is read from the nodes, not the driver's cores."""
    from types import SimpleNamespace

    import esft.es.distributed.connection as connection
    import esft.es.distributed.factory as factory

    nodes = [{"Alive": True, "Resources": {"CPU": 8.0}}, {"Alive": True, "Resources": {"CPU": 8.0}},
             {"Alive": False, "Resources": {"CPU": 64.0}}]
    cluster = SimpleNamespace(is_initialized=lambda: True, nodes=lambda: nodes)
    monkeypatch.setattr(connection, "import_ray", lambda: cluster)
    monkeypatch.setattr(factory, "machine_cores", lambda: 32)
    assert factory.cluster_cores() == [8, 8]
    cluster.is_initialized = lambda: False  # no cluster joined yet: this machine's cores
    assert factory.cluster_cores() == [32]


def test_threads_per_worker_0_gives_cpu_workers_their_share_of_the_cores(recorded_executor, monkeypatch, tmp_path):
    """0 on CPUs used to leave torch's default (every core) in each worker: n workers then ran n x cores threads."""
    import esft.es.distributed.factory as factory

    monkeypatch.setattr(factory, "machine_cores", lambda: 12)
    weights = MasterWeights(tiny_llama())

    def threads(**fields):
        cfg = ESConfig(executor="ray", output_dir=str(tmp_path), **fields)
        return factory.make_ray_executor(cfg, weights=weights, frozen=None).spec.threads

    assert threads(num_workers=3, device="cpu", executor_options={"threads_per_worker": 0}) == 4
    assert threads(num_workers=3, executor_options={"threads_per_worker": 0, "num_cpus_per_worker": 2}) == 2
    assert threads(num_workers=3, device="cpu", executor_options={"threads_per_worker": 5}) == 5  # as given
    assert threads(num_workers=3, device="cuda", executor_options={"threads_per_worker": 0}) == 0  # torch's own
    monkeypatch.setattr(factory, "cluster_cores", lambda: [8] * 4)  # a cluster of 8-core nodes
    assert threads(num_workers=2, device="cpu", executor_options={"threads_per_worker": 0}) == 8


def test_make_ray_executor_for_vllm_workers(recorded_executor, monkeypatch, tmp_path):
    import esft.es.distributed.vllm_backend.availability as availability
    from esft.es.distributed.factory import make_ray_executor
    from esft.es.distributed.vllm_backend import VLLMReplica

    monkeypatch.setattr(availability, "vllm_unavailable_reason", lambda: None)  # as if vLLM could run here
    weights = MasterWeights(tiny_llama(), include=["layers.0.mlp"])
    cfg = ESConfig(executor="ray", worker_backend="vllm", output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="a custom generate_fn cannot be used"):
        make_ray_executor(cfg, weights=weights, generate_fn=stub_generate)
    ex = make_ray_executor(cfg, weights=weights)
    assert ex.kwargs["replica_cls"] is VLLMReplica and "frozen" not in ex.kwargs  # engines hold no frozen copy
    assert ex.spec.options["layout"] == {"selected": weights.names,
                                         "shapes": {n: list(p.shape) for n, p in weights.params.items()}}
    cfg.optimizer = "adam"  # past the config's own check: the factory refuses it too
    with pytest.raises(ValueError, match="supports optimizer 'sgd' only"):
        make_ray_executor(cfg, weights=weights)


def test_make_executor_hands_the_drivers_strategy_to_a_local_executor():
    from esft.es.distributed.factory import make_executor

    model = tiny_llama()
    strategy = ES(population_size=4, sigma=0.123, alpha=0.01)
    ex = make_executor(ESConfig(sigma=0.5), model=model, tokenizer=None, weights=MasterWeights(model),
                       task=ToyTask(), gen_config=None, generate_fn=stub_generate, strategy=strategy)
    assert ex.sigma == 0.123
    strategy.sigma = 0.2  # a sigma schedule on the driver reaches the executor
    assert ex.sigma == 0.2
    assert make_executor(ESConfig(sigma=0.5), model=model, tokenizer=None, weights=MasterWeights(model),
                         task=ToyTask(), gen_config=None, generate_fn=stub_generate).sigma == 0.5


def test_connect_leaves_a_local_run_off_ray(monkeypatch):
    from esft.es.distributed.factory import connect

    monkeypatch.setattr(connection, "connect_ray", lambda address: pytest.fail("a local run joined Ray"))
    assert connect(ESConfig(executor="local")) is False


def test_connect_joins_the_configs_address(monkeypatch, capsys):
    from esft.es.distributed.factory import connect

    monkeypatch.setattr(connection, "connect_ray", lambda address: address)
    monkeypatch.setenv("RAY_ADDRESS", "10.1.1.1:6379")
    assert connect(ESConfig(executor="ray", ray_address="10.0.0.5:6379")) == "10.0.0.5:6379"
    assert "connecting to Ray: 10.0.0.5:6379" in capsys.readouterr().err
    assert connect(ESConfig(executor="ray")) is None  # Ray resolves $RAY_ADDRESS itself
    assert "connecting to Ray: 10.1.1.1:6379" in capsys.readouterr().err


# ---- the Hugging Face replica, in-process ---------------------------------------------------------------------------


def replica_config(**kw) -> ESConfig:
    base = dict(population_size=4, sigma=0.05, alpha=0.02, seed=3, include=["layers.0."], dtype="float32",
                device="cpu")
    base.update(kw)
    return ESConfig(**base)


def test_hf_replica_evaluates_and_updates_bit_identically_to_the_local_executor():
    from esft.es.distributed.hf_replica import HFReplica, ReplicaSpec, masters_checksum

    cfg = replica_config()
    built = []

    def builder(config):
        built.append(config)
        return tiny_llama().train(), None, ToyTask()  # as loaded: in training mode, with autograd

    replica = HFReplica(ReplicaSpec(config=cfg, builder=builder, generate_fn=stub_generate), rank=2)
    assert built == [cfg] and not replica.model.training
    assert not any(p.requires_grad for p in replica.model.parameters())
    info = replica.info()
    assert (info["rank"], info["backend"], info["device_type"], info["pid"]) == (2, "hf", "cpu", os.getpid())
    assert info["num_params"] == replica.weights.num_params

    model = tiny_llama()
    weights = MasterWeights(model, include=["layers.0."])
    strategy = ES(population_size=4, sigma=0.05, alpha=0.02, seed=3)
    local = LocalExecutor(model, None, weights, ToyTask(), strategy, None, generate_fn=stub_generate)
    assert replica.checksum() == masters_checksum(weights)
    batch = ToyTask().load("train", limit=6)
    members = strategy.ask(0)
    got, want = replica.evaluate(members, batch), local.evaluate_members(members, batch)
    assert got.texts == want.texts and np.array_equal(got.scores, want.scores)
    assert len({tuple(row) for row in got.texts}) > 1  # members differ: the perturbation is applied
    centre = replica.evaluate_center(batch)
    assert centre.texts == local.evaluate_center(batch).texts
    update = strategy.tell(members, got.scores.mean(axis=1) + np.arange(4))
    assert replica.apply(update) == weights.apply(update) > 0
    assert replica.checksum() == masters_checksum(weights)


def test_hf_replica_sets_its_thread_count():
    from esft.es.distributed.hf_replica import HFReplica, ReplicaSpec

    cfg = replica_config()
    replica = HFReplica(ReplicaSpec(config=cfg, builder=lambda c: (tiny_llama(), None, ToyTask()), threads=2))
    assert replica.info()["threads"] == torch.get_num_threads() == 2  # one_thread restores the count after


def test_hf_replica_load_state_takes_masters_and_adam_state():
    from esft.es.distributed.hf_replica import HFReplica, ReplicaSpec, masters_checksum

    cfg = replica_config(optimizer="adam")
    driver = HFReplica(ReplicaSpec(config=cfg, builder=lambda c: (tiny_llama(), None, ToyTask())))
    worker = HFReplica(ReplicaSpec(config=cfg, builder=lambda c: (tiny_llama(), None, ToyTask())))
    update = Update(seeds=(5, 6), coefficients=(1.0, -0.5), scale=-1.0, kind="gradient")
    driver.apply(update)
    assert worker.checksum() != driver.checksum()
    masters = {n: m.clone() for n, m in driver.weights.iter_masters()}
    state = copy.deepcopy(driver.optimizer.state_dict())  # as Ray ships it: no tensor shared with the driver
    assert worker.load_state(masters, state) == driver.checksum()
    assert worker.frozen_checksum() == driver.frozen_checksum()
    driver.apply(update)  # Adam's moments came along: the next step agrees too
    worker.apply(update)
    assert worker.checksum() == driver.checksum() == masters_checksum(driver.weights)


def test_masters_checksum_sees_one_bit():
    from esft.es.distributed.hf_replica import masters_checksum

    weights = MasterWeights(tiny_llama(), include=["layers.0.mlp.up_proj"])
    (name, master), = weights.iter_masters()
    before = masters_checksum(weights)
    master.view(torch.int32)[0, 0] ^= 1  # the lowest mantissa bit
    after = masters_checksum(weights)
    assert after[name] - before[name] in (1, -1)


def test_frozen_checksum_covers_the_unselected_parameters_of_any_width():
    from esft.es.distributed.hf_replica import frozen_checksum

    model = tiny_llama(dtype=torch.bfloat16)
    selected = ["model.layers.0.mlp.up_proj.weight"]
    sums = frozen_checksum(model, selected)
    assert set(sums) == {n for n, _ in model.named_parameters()} - set(selected)
    norm = "model.norm.weight"  # ones in bf16: 0x3F80 each
    assert sums[norm] == 0x3F80 * model.model.norm.weight.numel()
    fp32 = tiny_llama()
    assert frozen_checksum(fp32, selected)[norm] == 0x3F800000 * fp32.model.norm.weight.numel()  # 1.0 in fp32


def test_checksum_digest_and_diff():
    from esft.es.distributed.hf_replica import checksum_diff, checksum_digest

    assert checksum_digest({"a": 1, "b": 2}) == checksum_digest({"b": 2, "a": 1}) != checksum_digest({"a": 1, "b": 3})
    assert len(checksum_digest({"a": 1})) == 16
    assert checksum_diff({"a": 1, "b": 2}, {"a": 1, "b": 2}) == []
    assert checksum_diff({"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 5, "d": 4}) == ["b", "c", "d"]


# ---- worker faults -------------------------------------------------------------------------------------------------


def test_original_exception_is_the_workers_type_and_message():
    ray = pytest.importorskip("ray")
    from esft.es.distributed.worker_faults import WorkerError, original_exception, worker_error

    raised = ray.exceptions.RayTaskError("evaluate", "Traceback ...\nKeyError: 'answer'", KeyError("answer"))
    assert original_exception(raised) == "KeyError: 'answer'"
    bare = ray.exceptions.RayTaskError("evaluate", "Traceback ...", StopIteration())
    assert original_exception(bare) == "StopIteration"
    text_only = RuntimeError("\x1b[36mTraceback (most recent call last):\x1b[0m\n  File x\n"
                             "\x1b[31mOSError: no model at /m\x1b[0m\n\n")
    assert original_exception(text_only) == "OSError: no model at /m"
    assert original_exception(RuntimeError("")) == "RuntimeError"
    err = worker_error("worker 1 (pid 7)", "member 3", raised, "the run stops")
    assert isinstance(err, WorkerError) and str(err) == ("worker 1 (pid 7) raised KeyError: 'answer' in member 3; "
                                                         "the run stops (the worker's traceback: esft --debug)")


def test_an_exception_of_several_lines_is_read_whole_from_the_traceback_text():
    """A replica's constructor that raised an exception Ray cannot pickle (vLLM's pydantic ValidationError for a
    model it does not implement) reaches the driver as text only (Ray 2.60's ActorDiedError, as below): the
    message goes on, indented, below its "Type: message" line, and its last line is no exception."""
    pytest.importorskip("ray")
    from esft.es.distributed.worker_faults import original_exception

    died = RuntimeError(
        "The actor died because of an error raised in its creation task, \x1b[36mray::VLLMReplica.__init__()\x1b[39m "
        "(pid=6783, ip=192.0.2.2, actor_id=0f75, repr=<VLLMReplica object at 0x7f>)\n           ^^^^^^^^^^^^\n"
        '  File "/x/vllm_replica.py", line 9, in __init__\n    raise Bad()\n'
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
        "  Value error, Model architectures ['GPTNeoForCausalLM'] are not supported for now.\n"
        "    For further information visit https://errors.pydantic.dev/2.14/v/value_error")
    assert original_exception(died) == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig Value error, Model "
        "architectures ['GPTNeoForCausalLM'] are not supported for now. For further information visit "
        "https://errors.pydantic.dev/2.14/v/value_error")


def test_a_ray_error_as_cause_is_read_from_the_traceback_text():
    ray = pytest.importorskip("ray")
    from esft.es.distributed.worker_faults import original_exception

    inner = ray.exceptions.RaySystemError("system")
    raised = ray.exceptions.RayTaskError("evaluate", "Traceback ...\nValueError: from the text", inner)
    assert original_exception(raised).endswith("ValueError: from the text")


def test_every_kind_of_lost_worker_is_a_death_and_a_task_error_is_not():
    ray = pytest.importorskip("ray")
    from esft.es.distributed.worker_faults import is_worker_death

    for name in ("RayActorError", "ActorDiedError", "ActorUnavailableError", "NodeDiedError", "WorkerCrashedError",
                 "OwnerDiedError", "OutOfMemoryError"):
        cls = getattr(ray.exceptions, name)
        assert is_worker_death(cls.__new__(cls)), name
    assert not is_worker_death(ray.exceptions.RayTaskError("evaluate", "Traceback ...", KeyError("answer")))
    # a replica constructor that raised (its model missing on the node) is reported as ActorDiedError too
    init_failed = ray.exceptions.ActorDiedError(ray.exceptions.RayTaskError("__init__", "Traceback ...", OSError()))
    assert init_failed.actor_init_failed and not is_worker_death(init_failed)


def test_deadlines_without_a_batch_size_and_after_a_faster_member():
    from esft.es.distributed.worker_faults import Deadlines

    plain = Deadlines(first_s=100)
    assert plain.for_prompts(50) == 100 and plain.source().startswith("start_timeout_s")
    auto = Deadlines(batch_size=4, floor_s=1, factor=2)
    auto.observe(30.0, 4)
    auto.observe(40.0, 2)  # a call on fewer prompts than a batch counts as one member
    auto.observe(5.0, 4)  # a faster member does not shorten the deadline
    assert auto.member_s() == 80 and auto.for_prompts(2) == 80 and auto.for_prompts(12) == 240
    assert auto.source() == "2 x the slowest member so far (40.0 s), at least 1 s; set executor_options " \
                            "member_timeout_s"
