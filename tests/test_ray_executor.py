"""Ray executor on CPU with local workers (esft.es.ray_executor): bit-identity with the local executor, load
balancing, replica checksums, a worker killed mid-iteration, a worker that hangs, the loss of every worker, and a
worker's own exception reported in one line.

Real path end to end: a tiny random Llama saved as a Hugging Face folder with the SmolLM2 tokenizer, which the
driver and each worker load by themselves; BoolQ prompts through the chat template; esft.generation greedy
decoding. A random model never answers BoolQ, so the fitness rule here scores the completions' characters,
which differ from member to member: every iteration makes a real update.

Run: . .venv/bin/activate && pytest -q tests/test_ray_executor.py   (~160 s on 2 busy cores; one Ray instance)
"""

from __future__ import annotations

import logging
import re
import threading
import time

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

from es_tiny import one_thread  # noqa: F401  (autouse: tiny matmuls on one thread)
from conftest import make_tiny_model  # noqa: E402
from esft.api import es_trainer as ESTrainer  # noqa: E402  (builds the Ray executor through esft.es.distributed)
from esft.es import es_rundir as runlog  # noqa: E402
from esft.es.distributed.ray_executor import RayExecutor, ReplicaDivergence, WorkersLost  # noqa: E402
from esft.es.es_config import ESConfig, resume_config  # noqa: E402


class TextFitness:
    """Deterministic fitness from the completions' characters (a stand-in for a reward the tiny model earns)."""

    def __call__(self, result, batch):
        return np.array([np.mean([(sum(map(ord, t)) % 11) / 10 for t in row]) for row in result.texts])


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    # One Ray instance for the module: start-up costs ~10 s here. Logical CPUs only; workers use 1 thread each.
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=100 * 1024**2,
             logging_level=logging.WARNING, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    folder = tmp_path_factory.mktemp("tiny-llama")
    make_tiny_model().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def config(model_dir, out, **kw) -> ESConfig:
    base = dict(model=str(model_dir), task="boolq", max_passage_chars=60, population_size=4, batch_size=3,
                iterations=4, max_new_tokens=4, sigma=0.05, alpha=0.02, seed=3, output_dir=str(out),
                eval_every=4, eval_limit=3, checkpoint_every=1, generation_batch_size=2, dtype="float32",
                device="cpu", samples_per_iteration=1,
                executor_options={"threads_per_worker": 1, "checksum_every": 1})
    base.update(kw)
    return ESConfig(**base)


def trainer(cfg: ESConfig) -> ESTrainer:
    return ESTrainer(cfg, fitness_rule=TextFitness(), progress=False)


def masters(t: ESTrainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in t.weights.iter_masters()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def fitness_log(run_dir) -> list[list[float]]:
    return [r["fitness"] for r in runlog.read_seed_log(run_dir)]


@pytest.fixture(scope="module")
def reference(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "run"
    t = trainer(config(model_dir, out, executor="local"))
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # module-scoped: set here, `one_thread` (per test) is not active yet
    try:
        t.train()
    finally:
        torch.set_num_threads(previous)
    fit = fitness_log(out)
    assert all(np.ptp(f) > 0 for f in fit), "the test needs a fitness signal in every iteration"
    return masters(t), fit, out


def test_ray_two_workers_bit_identical_to_local(model_dir, tmp_path, reference):
    ref_masters, ref_fitness, ref_dir = reference
    t = trainer(config(model_dir, tmp_path / "ray", executor="ray", num_workers=2))
    t._owns_executor = False  # keep the workers after train() for the checksum drill below
    ex: RayExecutor = t.executor
    try:
        t.train()
        assert same(masters(t), ref_masters)
        assert fitness_log(tmp_path / "ray") == ref_fitness
        ev = [m for m in runlog.read_jsonl(tmp_path / "ray" / "metrics.jsonl") if m["kind"] == "eval"]
        ref_ev = [m for m in runlog.read_jsonl(ref_dir / "metrics.jsonl") if m["kind"] == "eval"]
        assert [e["test_accuracy"] for e in ev] == [e["test_accuracy"] for e in ref_ev]
        # work queue: every member evaluated exactly once, by both workers
        assert [sum(h["members_per_worker"].values()) for h in ex.history] == [4, 4, 4, 4]
        assert sum(w.members_done for w in ex.workers) == 16 and all(w.members_done > 0 for w in ex.workers)
        checks = [e for e in ex.events if e["event"] == "checksum"]
        assert len(checks) == 1 + 4 and all(e["ok"] for e in checks)  # start-up + every update (checksum_every=1)
        assert not [e for e in ex.events if e["event"] == "sync"]  # same files -> same weights: nothing sent
        # a replica that drifts by one ulp in one tensor is named
        w1 = ex.workers[1]
        bad = masters(t)
        name = next(iter(bad))
        bad[name].view(-1)[0] = torch.nextafter(bad[name].view(-1)[0], torch.tensor(1.0))
        ray.get(w1.actor.load_state.remote(bad, None))
        with pytest.raises(ReplicaDivergence, match=rf"worker 1 .*1 tensors differ, first {name}"):
            ex.verify()
    finally:
        ex.close()


def test_worker_killed_mid_iteration_then_all_workers_lost(model_dir, tmp_path, reference):
    """One Ray run (worker start-up is the slow part here): worker 1 is SIGKILLed in iteration 1, which ends with
    the same fitness as the local run, iteration 2 runs on worker 0 alone, and when worker 0 dies in iteration 3
    the run stops with iterations 0-2 and their checkpoints intact; resumed locally it ends where the local run
    ended, bit for bit."""
    ref_masters, ref_fitness, _ = reference
    out = tmp_path / "fault"
    t = trainer(config(model_dir, out, executor="ray", num_workers=2))
    ex: RayExecutor = t.executor
    killed: dict[int, int] = {}

    def drill(executor, worker, index):
        it = len(executor.history)  # iterations whose members are done so far = index of the running one
        if it == 1 and 1 not in killed:  # first row of iteration 1 arrived: 3 members to go
            killed[1] = executor.worker_pids()[1]
            executor.kill_worker(1)
        if it == 3 and 0 not in killed:
            killed[0] = executor.worker_pids()[0]
            executor.kill_worker(0)

    ex.on_result = drill
    with pytest.raises(WorkersLost, match="all 2 Ray workers are lost .*--resume"):
        t.train()
    assert fitness_log(out) == ref_fitness[:3]  # iterations 1 and 2 completed with the local run's result
    assert ex.history[1]["requeued"] >= 1 and ex.history[2]["members_per_worker"] == {0: 4}
    records = [m for m in runlog.read_jsonl(out / "metrics.jsonl") if m["kind"] == "executor"]
    lost = [m for m in records if m["event"] == "worker_lost"]
    assert [m["worker"] for m in lost] == [1, 0] and [m["info"]["pid"] for m in lost] == [killed[1], killed[0]]
    assert lost[0]["workers_left"] == 1 and records[-1]["event"] == "all_workers_lost"
    assert [s for s, _ in runlog.list_checkpoints(out)] == [1, 2, 3]
    # the run goes on from its checkpoint on another layout and ends where the uninterrupted run ended
    t2 = ESTrainer(resume_config(out, {"executor": "local"}), fitness_rule=TextFitness(), progress=False)
    t2.train()
    assert same(masters(t2), ref_masters) and fitness_log(out) == ref_fitness


def test_workers_that_cannot_be_placed_are_refused_at_once(model_dir, tmp_path):
    """3 workers of 2 CPUs each on this 4-CPU Ray instance: Ray would keep the third pending and start() would
    wait start_timeout_s (30 min by default) for it; it fails at once instead, before any worker starts."""
    from esft.es.distributed.factory import make_ray_executor

    cfg = config(model_dir, tmp_path / "run", executor="ray", num_workers=3,
                 executor_options={"threads_per_worker": 2})
    ex = make_ray_executor(cfg, weights=None, start_timeout_s=30)
    t0 = time.perf_counter()
    try:
        with pytest.raises(ValueError, match=r"3 Ray workers requested .* nodes fit 2"):
            ex.start()
    finally:
        ex.close()
    assert time.perf_counter() - t0 < 10 and not ex.workers


def test_a_worker_whose_frozen_parameters_differ_is_named_at_start_up(model_dir, tmp_path):
    """With `exclude`, ES never perturbs, updates or checksums the norms, so a worker whose copy of the model
    differs there (another revision on its node) would evaluate another model unnoticed; start-up compares them."""
    from esft.es.distributed.factory import make_ray_executor
    from esft.es.noise import MasterWeights
    from esft.models import load_model

    cfg = config(model_dir, tmp_path / "run", executor="ray", num_workers=1, exclude=["norm"])
    model, _ = load_model(str(model_dir), dtype="float32", device="cpu")
    for changed in (False, True):
        if changed:
            with torch.no_grad():
                model.model.norm.weight[0] += 1.0
        ex = make_ray_executor(cfg, weights=MasterWeights(model, exclude=["norm"]), model=model)
        try:
            if changed:
                with pytest.raises(ReplicaDivergence, match=r"worker 0 .*1 tensors differ, first model\.norm\.weight"):
                    ex.start()
            else:
                ex.start()  # the same files on both sides: nothing differs
                assert ex._started
        finally:
            ex.close()


def test_bench_parallel_iteration_does_what_the_local_one_does(model_dir, tokenizer):
    """`esft bench --workers 2`: the members run on two Ray replicas, with the same completions, fitness and
    update (so the same weights afterwards) as the one-process iteration."""
    from esft import bench
    from esft.models import load_model

    prompts = [[{"role": "user", "content": f"Tell me about the number {i}."}] for i in range(3)]
    work = bench.Workload("small", prompts, max_new_tokens=5, min_new_tokens=5, generation_batch_size=2,
                          sigma=1e-2, alpha=1e-3)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        local_model, tok = load_model(str(model_dir), dtype="float32", device="cpu")
        ours = bench.esft_iteration(local_model, tok, work, population=4, noise="table", gen_overrides={})
        ray_model, _ = load_model(str(model_dir), dtype="float32", device="cpu")
        par = bench.esft_iteration_parallel(ray_model, work, population=4, noise="table", gen_overrides={},
                                            workers=2, threads_per_worker=1, model_name=str(model_dir))
    finally:
        torch.set_num_threads(previous)
    assert par["texts"] == ours["texts"] and par["generated_tokens"] == ours["generated_tokens"] == 4 * 3 * 5
    assert not par["zero_update"]
    for (name, a), b in zip(local_model.named_parameters(), ray_model.parameters()):
        assert torch.equal(a, b), name
    t = par["timings"]
    assert t["iteration"] >= t["update"] > 0 and t["generate"] > 0 and t["setup"] > 0
    assert t["iteration"] < t["setup"]  # worker start-up (model and kernel loading) is not in the iteration


def train_or_fail_after(t: ESTrainer, seconds: float) -> BaseException | None:
    """t.train() in a thread: the exception it ended with, or a test failure when it still runs after `seconds`
    (a hung run; its workers are then ended so that the thread returns). Under pytest a SIGALRM handler did not
    interrupt the driver's wait on Ray, hence the thread."""
    ended: list[BaseException | None] = []

    def run():
        try:
            t.train()
            ended.append(None)
        except BaseException as exc:
            ended.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        t.executor.close()
        thread.join(60)
        pytest.fail(f"the run still hung after {seconds:.0f} s")
    return ended[0]


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def assert_ends(pid: int, what: str) -> None:
    """The process `pid` is gone (or a zombie) within 10 s."""
    for _ in range(100):
        if not running(pid):
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} pid {pid} still runs")


def hanging_replica(hang_at: dict[int, tuple[str, int]]) -> type:
    """An HFReplica whose worker of rank r stays alive but never answers (sleeps) in its first member evaluation
    after `n` updates (hang_at[r] = ("evaluate", n)) or in the n-th update (("apply", n)). Defined here, inside a
    function, so that Ray ships the class itself to the workers."""
    from esft.es.distributed.hf_replica import HFReplica

    class Hanging(HFReplica):
        def __init__(self, spec, rank=0):
            super().__init__(spec, rank)
            self.updates = 0

        def evaluate(self, members, batch):
            if hang_at.get(self.rank) == ("evaluate", self.updates):
                time.sleep(3600)
            return super().evaluate(members, batch)

        def apply(self, update):
            self.updates += 1
            if hang_at.get(self.rank) == ("apply", self.updates):
                time.sleep(3600)
            return super().apply(update)

    return Hanging


def test_a_hung_worker_is_dropped_after_member_timeout_s(model_dir, tmp_path, reference):
    """Worker 1 hangs (alive, silent) in a member of iteration 1: after member_timeout_s it is dropped and ended,
    its member re-queued, and the iteration ends with the local run's fitness. Worker 0 then hangs in the update
    of step 3: the run stops with WorkersLost, iterations 0-2 and their checkpoints intact, and a resume on a new
    Ray worker (which loads the base model: the driver's step-3 masters are sent to it at start-up) ends bit for bit
    where the uninterrupted run ended."""
    ref_masters, ref_fitness, _ = reference
    out = tmp_path / "hung"
    options = {"threads_per_worker": 1, "checksum_every": 1, "member_timeout_s": 6}
    t = trainer(config(model_dir, out, executor="ray", num_workers=2, executor_options=options))
    ex: RayExecutor = t.executor
    ex.replica_cls = hanging_replica({1: ("evaluate", 1), 0: ("apply", 3)})
    pids: dict[int, int] = {}
    ex.on_result = lambda executor, worker, index: pids.update(executor.worker_pids())
    error = train_or_fail_after(t, 240)
    assert isinstance(error, WorkersLost) and re.match("all 2 Ray workers are lost .*--resume", str(error))
    assert fitness_log(out) == ref_fitness[:3]
    assert ex.history[1]["requeued"] == 1 and ex.history[2]["members_per_worker"] == {0: 4}
    lost = [m for m in runlog.read_jsonl(out / "metrics.jsonl") if m.get("event") == "worker_lost"]
    assert [(m["worker"], m["error"]) for m in lost] == [(1, "WorkerTimeout"), (0, "WorkerTimeout")]
    assert lost[0]["requeued"] and "member" in lost[0]["detail"] and "update to step 3" in lost[1]["detail"]
    assert all("within 6 s (executor_options member_timeout_s)" in m["detail"] for m in lost)
    assert [s for s, _ in runlog.list_checkpoints(out)] == [1, 2, 3]
    for pid in pids.values():  # a hung worker is ended, not left holding its CPU
        assert_ends(pid, "hung worker")
    start = len(runlog.read_jsonl(out / "metrics.jsonl"))
    t2 = ESTrainer(resume_config(out, {"num_workers": 1}), fitness_rule=TextFitness(), progress=False)
    t2.train()
    assert same(masters(t2), ref_masters) and fitness_log(out) == ref_fitness
    resumed = [m for m in runlog.read_jsonl(out / "metrics.jsonl")[start:] if m["kind"] == "executor"]
    # the new worker loaded the base model, behind the driver's step 3: sent the masters, checked, then step 4
    assert [m["event"] for m in resumed] == ["start", "sync", "checksum", "members", "checksum"]
    assert [(m.get("step"), m["ok"]) for m in resumed if m["event"] == "checksum"] == [(None, True), (4, True)]


def raising_replica(error: Exception) -> type:
    """An HFReplica whose task scorer raises `error` (a bug in a user's reward function)."""
    from esft.es.distributed.hf_replica import HFReplica

    class BrokenScorer:
        def __init__(self, task):
            self.task = task

        def __getattr__(self, name):
            return getattr(self.task, name)

        def score(self, text, example):
            raise error

    class Raising(HFReplica):
        def __init__(self, spec, rank=0):
            super().__init__(spec, rank)
            self.executor.task = BrokenScorer(self.executor.task)

    return Raising


def test_an_exception_in_a_worker_is_one_line_naming_worker_member_and_error(model_dir, tmp_path, monkeypatch,
                                                                                capsys):
    """A scorer that raises in a worker: the run stops with one line naming the worker, the member and the
    original exception, not Ray's RayTaskError with the worker's traceback; `esft --debug` shows that traceback."""
    import esft.api
    import esft.cli as cli
    from esft.es.distributed.worker_faults import WorkerError

    out = tmp_path / "run"
    t = trainer(config(model_dir, out, executor="ray", num_workers=1, eval_every=0))
    t.executor.replica_cls = raising_replica(KeyError("answer"))
    with pytest.raises(WorkerError) as caught:
        t.train()
    msg = str(caught.value)
    assert "\n" not in msg and "Traceback" not in msg
    assert re.match(r"worker 0 \(pid \d+ on .+, cpu\) raised KeyError: 'answer' in member 0 \(seed \d+, "
                    r"sign [+-]1\); the run stops .* `esft train es --resume .*run`", msg), msg
    assert isinstance(caught.value.__cause__, ray.exceptions.RayTaskError)
    assert "raise error" in str(caught.value.__cause__)  # the worker's traceback, for --debug
    assert fitness_log(out) == []  # nothing of the iteration is logged
    # what the CLI prints: one line, or with --debug the traceback of the worker's exception
    monkeypatch.setattr(esft.api, "train_es", lambda config: (_ for _ in ()).throw(caught.value))
    args = ["train", "es", "--model", str(model_dir), "--task", "boolq", "--output-dir", str(tmp_path / "cli")]
    capsys.readouterr()
    assert cli.main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"esft: error: {msg}"]
    with pytest.raises(WorkerError) as debug:
        cli.main(args + ["--debug"])
    assert debug.value.__cause__ is caught.value.__cause__


def test_a_worker_that_cannot_load_its_model_is_named_in_one_line(tmp_path, model_dir):
    """The replica's model is missing on the worker's node: start-up stops with one line naming the worker and
    the loader's error, not Ray's ActorDiedError with the constructor's traceback; the workers are ended."""
    from esft.es.distributed.factory import make_ray_executor
    from esft.es.distributed.worker_faults import WorkerError

    cfg = config(model_dir, tmp_path / "run", executor="ray", num_workers=1)
    cfg.model = str(tmp_path / "missing-model")
    ex = make_ray_executor(cfg, weights=None)
    try:
        with pytest.raises(WorkerError, match=r"^worker 0 \(not started\) raised esft.models.ModelNotFoundError: "
                                              r"model folder .*missing-model does not exist in its start-up") as caught:
            ex.start()
        assert "\n" not in str(caught.value) and not ex.alive
    finally:
        ex.close()


def test_a_worker_killed_for_memory_is_lost_not_a_code_error():
    """Ray's memory monitor kills a worker with OutOfMemoryError: that worker is lost (its member re-queued), unlike
    an exception our own code raised in it, which stops the run."""
    import ray

    from esft.es.distributed.worker_faults import is_worker_death

    assert is_worker_death(ray.exceptions.OutOfMemoryError("node low on memory"))
    assert is_worker_death(ray.exceptions.ActorDiedError())
    assert not is_worker_death(KeyError("answer"))


def test_member_deadlines_follow_the_slowest_member_unless_set():
    from esft.es.distributed.worker_faults import Deadlines

    auto = Deadlines(first_s=1800, batch_size=16)
    assert auto.for_prompts(16) == 1800 and auto.for_prompts(64) == 4 * 1800  # nothing timed yet
    auto.observe(30.0, 16)
    auto.observe(200.0, 160)  # a test-set evaluation: 10 members' worth, 20 s each
    assert auto.member_s() == 600  # the floor: 10 x 30 s is less
    auto.observe(90.0, 16)
    assert auto.for_prompts(16) == 900 and auto.for_prompts(8) == 900 and auto.for_prompts(32) == 1800
    assert "90.0 s" in auto.source()
    fixed = Deadlines(member_timeout_s=5, batch_size=4)
    fixed.observe(100.0, 4)
    assert fixed.for_prompts(4) == 5 and fixed.for_prompts(12) == 15
    assert fixed.source() == "executor_options member_timeout_s"


def test_an_error_in_the_first_evaluation_ends_the_workers(model_dir, tmp_path):
    """The step-0 evaluation is where the workers start: a scorer raising there stops the run with one line, and
    train() ends the workers it started (a script or notebook goes on with its CPUs or GPUs free)."""
    from esft.es.distributed.worker_faults import WorkerError

    t = trainer(config(model_dir, tmp_path / "run", executor="ray", num_workers=1))
    ex: RayExecutor = t.executor
    ex.replica_cls = raising_replica(ValueError("no answer field"))
    with pytest.raises(WorkerError, match=r"^worker 0 .* raised ValueError: no answer field in the unperturbed "
                                          r"model on \d+ prompts; the run stops"):
        t.train()
    pid = ex.worker_pids()[0]
    assert not ex.alive
    assert_ends(pid, "worker (after train() stopped)")
