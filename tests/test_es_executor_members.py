"""What `LocalExecutor` (esft.es.executor) owes each member beyond agreeing with itself across lanes: its own
perturbation (seed and sign) scored on its own examples, exact counters, the model restored when generation fails,
scoring on the calling thread, a stop that reaches every lane, timings summed over lanes, and a lane budget from
the memory a lane copy needs in its rollout dtype. tests/test_es_executor.py compares lanes with one lane; these
compare with a reference computed by hand, which catches what both paths would get wrong alike.

Run: . .venv/bin/activate && pytest -q tests/test_es_executor_members.py   (~10 s)
"""

from __future__ import annotations

import threading
import time
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from es_tiny import ToyTask, bit_equal, state, stub_generate, tiny_llama
from esft.es import executor as executor_module
from esft.es.executor import LocalExecutor
from esft.es.lanes import lane_bytes
from esft.es.noise import MasterWeights
from esft.es.strategy import ES
from esft.tasks.base import Task

SIGMA = 0.05


def counted_generate(model, tokenizer, prompts, cfg):
    """stub_generate with counters that differ from prompt to prompt (lengths, prompt tokens, eos or not)."""
    gens = stub_generate(model, tokenizer, prompts, cfg)
    return [SimpleNamespace(text=g.text, completion_ids=[0] * (1 + p[0] % 4), prompt_tokens=len(p) + p[1] % 3,
                            finished=bool(p[2] % 2)) for g, p in zip(gens, prompts)]


def population(size, seed):
    return ES(population_size=size, sigma=SIGMA, alpha=0.01, seed=seed).ask(0)


def executor(model, generate_fn, lanes, task=None, **kw):
    weights = kw.pop("weights", None) or MasterWeights(model, noise="table")
    return LocalExecutor(model, None, weights, task or ToyTask(), SIGMA, None, generate_fn=generate_fn,
                         parallel_members=lanes, **kw)


@pytest.mark.parametrize("lanes", [1, 2])
def test_each_member_is_its_own_perturbation_scored_on_its_own_examples(lanes, two_threads):
    task = ToyTask()
    batch = task.load("train")[:8]
    members = ES(population_size=6, sigma=SIGMA, alpha=0.01, seed=3, antithetic=True).ask(0)
    assert [sign for _, sign in members] == [1, -1] * 3  # antithetic pairs
    texts = []
    for seed, sign in members:  # the reference: a fresh model perturbed by hand
        model = tiny_llama()
        MasterWeights(model, noise="table").perturb(seed, sign, SIGMA)
        texts.append([g.text for g in stub_generate(model, None, [ex["ids"] for ex in batch], None)])
    assert texts[0] != texts[1]  # a pair's two signs answer differently: a lost sign shows
    scores = np.array([[task.score(t, ex) for t, ex in zip(row, batch)] for row in texts])
    assert len({tuple(r) for r in scores.tolist()}) > 1 and 0 < scores.mean() < 1

    model = tiny_llama()
    centre = state(model)
    got = executor(model, counted_generate, lanes).evaluate_members(members, batch)
    assert got.texts == texts
    np.testing.assert_array_equal(got.scores, scores)
    np.testing.assert_array_equal(got.well_formed, [[t.startswith("\\boxed{") for t in row] for row in texts])
    ids = [ex["ids"] for ex in batch]
    n = len(members)
    assert got.tokens_generated == n * sum(1 + p[0] % 4 for p in ids)
    assert got.prompt_tokens == n * sum(len(p) + p[1] % 3 for p in ids)
    assert got.finished == n * sum(p[2] % 2 for p in ids) and 0 < got.finished < n * len(ids)
    assert bit_equal(state(model), centre)


class NoFormatTask(Task):
    """A task that declares it checks no format, though an inherited `is_well_formed` would say yes."""

    name = "no-format"
    checks_format = False

    def prompt(self, example):
        return example["ids"]

    def score(self, completion, example):
        return 1.0

    def is_well_formed(self, completion, example):
        return True


def test_a_task_without_a_format_has_no_well_formed_answers():
    batch = ToyTask().load("train")[:3]
    got = executor(tiny_llama(), stub_generate, 1, task=NoFormatTask()).evaluate_members([(1, 1)], batch)
    assert got.scores.tolist() == [[1.0] * 3] and not got.well_formed.any()


def test_the_model_is_restored_when_one_lane_generation_fails():
    model = tiny_llama()
    centre = state(model)
    calls = []

    def failing(m, tokenizer, prompts, cfg):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("generation failed")
        return stub_generate(m, tokenizer, prompts, cfg)

    ex = executor(model, failing, 1)
    with pytest.raises(RuntimeError, match="generation failed") as info:
        ex.evaluate_members([(1, 1), (2, -1), (3, 1)], ToyTask().load("train")[:2])
    # while the traceback (and with it the call's frame) is still alive: restored at once, not when collected
    assert info.value is not None and ex.weights.perturbed is None and bit_equal(state(model), centre)


class ThreadTask(ToyTask):
    """Records the thread, completion and example of every score call."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def score(self, completion, example):
        self.calls.append((threading.current_thread().name, completion, tuple(example["ids"])))
        return super().score(completion, example)


def slow_generate(delay):
    def generate(m, tokenizer, prompts, cfg):
        time.sleep(delay)
        return stub_generate(m, tokenizer, prompts, cfg)
    return generate


def test_lanes_score_on_the_calling_thread_in_member_order(two_threads):
    task = ThreadTask()
    batch = task.load("train")[:3]
    ex = executor(tiny_llama(), slow_generate(0.02), 2, task=task)
    got = ex.evaluate_members(population(6, 3), batch)
    ex.close()
    assert {thread for thread, *_ in task.calls} == {threading.current_thread().name}
    assert [ids for *_, ids in task.calls] == [tuple(ex["ids"]) for ex in batch] * 6
    assert [text for _, text, _ in task.calls] == [text for row in got.texts for text in row]  # member by member


def test_a_failing_lane_stops_the_others_between_members(two_threads):
    """Lane 0 fails on its first member while lane 1 is in a generation that does not check for cancellation (an HF
    `model.generate`): lane 1 takes no further member."""
    model = tiny_llama()
    calls, barrier = [], threading.Barrier(2, timeout=30)

    def generate(m, tokenizer, prompts, cfg):
        calls.append(m is model)
        if len(calls) <= 2:
            barrier.wait()  # both lanes hold a member
        if m is model:
            raise RuntimeError("lane 0 failed")
        time.sleep(0.1)
        return stub_generate(m, tokenizer, prompts, cfg)

    ex = executor(model, generate, 2)
    with pytest.raises(RuntimeError, match="lane 0 failed"):
        ex.evaluate_members(population(10, 1), ToyTask().load("train")[:2])
    assert calls.count(False) == 1
    ex.close()


def test_a_ctrl_c_while_lanes_start_stops_the_lanes_already_started(monkeypatch, two_threads):
    torch.set_num_threads(3)
    model = tiny_llama()
    calls = []

    def generate(m, tokenizer, prompts, cfg):
        calls.append(1)
        time.sleep(0.05)
        return stub_generate(m, tokenizer, prompts, cfg)

    ex = executor(model, generate, 3)
    ex.start()
    submit = ex._pool.submit

    def interrupted(*args):
        if len(ex._pending) == 1:  # lane 1 runs; Ctrl-C lands while lane 2 is handed its work
            assert started.wait(30)
            raise KeyboardInterrupt
        return submit(*args)

    started = threading.Event()
    monkeypatch.setattr(ex._pool, "submit", interrupted)
    real = ex.generate_fn
    ex.generate_fn = lambda *a: (started.set(), real(*a))[1]
    with pytest.raises(KeyboardInterrupt):
        ex.evaluate_members(population(12, 1), ToyTask().load("train")[:2])
    assert len(calls) <= 2 and ex.weights.perturbed is None
    monkeypatch.undo()
    ex.close()


def test_lane_timings_are_summed_over_lanes(two_threads):
    delay, n = 0.25, 4
    barrier = threading.Barrier(2, timeout=30)
    count = []

    def generate(m, tokenizer, prompts, cfg):
        count.append(1)
        if len(count) <= 2:
            barrier.wait()  # each lane gets a member: no lane runs all four
        time.sleep(delay)
        return stub_generate(m, tokenizer, prompts, cfg)

    ex = executor(tiny_llama(), generate, 2)
    got = ex.evaluate_members(population(n, 1), ToyTask().load("train")[:2])
    ex.close()
    assert got.timings["generate"] >= n * delay  # both lanes' generations, not the longest lane's
    assert got.timings["perturb"] > 0 and got.timings["restore"] > 0 and got.timings["score"] > 0


@pytest.mark.parametrize("shared", [False, True])
def test_one_lanes_timings_are_disjoint_parts_of_the_calls_wall_time(shared):
    """One lane: perturb, generate, score and restore are measured one after another inside the call, so each is
    >= 0 and their sum is within `evaluate`; the model's own weights are restored after the members, a copy (shared
    masters) is set to the masters for the centre."""
    model = tiny_llama()
    ex = executor(model, stub_generate, 1, weights=MasterWeights(model, noise="table", share_storage=shared))
    batch = ToyTask().load("train")[:2]
    walls, results = [], []
    for call in (lambda: ex.evaluate_members([(1, 1), (2, -1)], batch), lambda: ex.evaluate_center(batch)):
        t0 = time.perf_counter()
        results.append(call())
        walls.append(time.perf_counter() - t0)
    members, centre = results
    for got, wall in zip(results, walls):
        parts = [got.timings[k] for k in ("perturb", "generate", "score", "restore")]
        assert min(parts) >= 0 and sum(parts) <= got.timings["evaluate"] <= wall, got.timings
        assert got.timings["generate"] > 0 and got.timings["score"] > 0
    assert members.timings["perturb"] > 0 and (members.timings["restore"] > 0) == (not shared)  # a copy: no restore
    assert centre.timings["perturb"] == 0 and (centre.timings["restore"] > 0) == shared


def test_lane_timings_stay_within_the_lanes_wall_time(two_threads):
    """Two lanes: each lane's parts lie within the call, so each key's sum over lanes is at most 2x `evaluate`."""
    model = tiny_llama()
    ex = executor(model, stub_generate, 2, weights=MasterWeights(model, noise="table", share_storage=True))
    got = ex.evaluate_members(population(4, 1), ToyTask().load("train")[:2])
    ex.close()
    assert ex.lanes_for(4) == 2
    for key in ("perturb", "generate", "restore"):
        assert 0 <= got.timings[key] <= 2 * got.timings["evaluate"], got.timings


def test_bf16_rollouts_run_on_a_bf16_copy_and_the_model_stays_fp32():
    model = tiny_llama()
    ex = executor(model, stub_generate, 1, rollout_dtype=torch.bfloat16)
    ex.start()  # bf16 rollouts: even one lane is a copy
    (lane, _), = ex._lanes
    assert {p.dtype for p in lane.parameters() if p.is_floating_point()} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    ex.close()


def test_a_lanes_deferred_perturbation_is_timed_as_perturbation():
    """On a lane copy the engine asks for the perturbed projections while it generates (`fill_released`): those
    seconds count as perturbation, not generation."""
    from esft.generation.packed import fill_released

    delay, n = 0.25, 2

    def generate(m, tokenizer, prompts, cfg):
        fill_released()  # what the engine does before it reads the plain weights
        return stub_generate(m, tokenizer, prompts, cfg)

    model = tiny_llama()
    ex = executor(model, generate, 1, weights=MasterWeights(model, noise="table", share_storage=True))
    ex.start()
    (_, lane_weights), = ex._lanes
    fill = lane_weights.fill

    def slow_fill(tensors):
        time.sleep(delay)
        fill(tensors)

    ex.evaluate_members([(1, 1)], ToyTask().load("train")[:2])  # warm: the first forward pass is slower
    lane_weights.fill = slow_fill
    got = ex.evaluate_members([(1, 1), (2, -1)], ToyTask().load("train")[:2])
    assert got.timings["perturb"] >= n * delay
    # disjoint intervals of the call: fill seconds counted once, whatever else the machine is doing
    assert got.timings["perturb"] + got.timings["generate"] <= got.timings["evaluate"], got.timings
    assert min(got.timings.values()) >= 0, got.timings  # fill seconds moved from generation, never more


def test_the_centre_is_evaluated_at_the_masters_after_members_on_a_copy():
    """With every lane a copy (shared masters), the copy ends a population at its last member: the centre's
    evaluation sets it back first."""
    batch = ToyTask().load("train")[:8]
    members = population(4, 2)
    fresh = tiny_llama()
    expected = executor(fresh, stub_generate, 1,
                        weights=MasterWeights(fresh, noise="table", share_storage=True)).evaluate_center(batch)
    model = tiny_llama()
    ex = executor(model, stub_generate, 1, weights=MasterWeights(model, noise="table", share_storage=True))
    last = ex.evaluate_members(members, batch)
    assert last.texts[-1] != expected.texts[0]  # the last member answers otherwise than the centre
    assert ex.evaluate_center(batch).texts == expected.texts


def test_lanes_never_outnumber_the_jobs_or_torchs_threads(two_threads):
    ex = executor(tiny_llama(), stub_generate, 2)
    assert ex.lanes_for(4) == 2 and ex.lanes_for(1) == 1
    torch.set_num_threads(1)
    assert ex.lanes_for(4) == 1


def test_each_lane_gets_its_share_of_the_threads(two_threads):
    torch.set_num_threads(3)
    seen, barrier = [], threading.Barrier(2, timeout=30)

    def generate(m, tokenizer, prompts, cfg):
        seen.append(torch.get_num_threads())
        barrier.wait()  # both lanes at once: each reports its own share
        return stub_generate(m, tokenizer, prompts, cfg)

    ex = executor(tiny_llama(), generate, 2)
    ex.evaluate_members([(1, 1), (1, -1)], ToyTask().load("train")[:2])
    ex.close()
    assert sorted(seen) == [1, 2] and torch.get_num_threads() == 3


def test_a_later_call_with_more_lanes_gets_threads_for_all_of_them(two_threads):
    """The first call needs two lanes, the next three: the third lane runs beside the other two (a pool of one
    worker would run it after lane 1, and the lanes waiting for each other below would never meet)."""
    torch.set_num_threads(3)
    barrier = threading.Barrier(3, timeout=10)
    sync = []

    def generate(m, tokenizer, prompts, cfg):
        if sync:
            barrier.wait()
        return stub_generate(m, tokenizer, prompts, cfg)

    ex = executor(tiny_llama(), generate, 3)
    batch = ToyTask().load("train")[:2]
    ex.evaluate_members([(1, 1), (1, -1)], batch)
    sync.append(True)
    ex.evaluate_members([(1, 1), (1, -1), (2, 1)], batch)
    ex.close()


def test_without_openmp_lanes_warn_once_and_run_one_at_a_time(monkeypatch, two_threads):
    monkeypatch.setattr(executor_module, "openmp_backend", lambda: False)
    ex = executor(tiny_llama(), stub_generate, 2)
    with pytest.warns(UserWarning, match="parallel_members=2 ignored: torch's parallel backend is not OpenMP"):
        assert ex.lanes_for(4) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ex.lanes_for(4) == 1  # once
        assert executor(tiny_llama(), stub_generate, 1).lanes_for(4) == 1  # one lane asked: nothing ignored
    model = tiny_llama().to("meta")
    monkeypatch.setattr(executor_module, "openmp_backend", lambda: True)
    with pytest.warns(UserWarning, match="the model is not a CPU torch model"):
        assert executor(model, stub_generate, 2, weights=SimpleNamespace(shared=False)).lanes_for(4) == 1


@pytest.mark.parametrize("rollout_dtype, shared, copies, fits", [
    (None, False, 1, 2),  # lane 0 on the model: one copy for two lanes
    (None, True, 1.5, 1),  # every lane a copy: two copies needed, one and a half available
    (None, True, 2, 2),
    (torch.bfloat16, False, 2, 2),  # bf16 rollouts: every lane a bf16 copy, half an fp32 one
    (torch.bfloat16, False, 1.5, 1),
])
def test_the_lane_budget_counts_every_copy_in_its_rollout_dtype(monkeypatch, two_threads, rollout_dtype, shared,
                                                                 copies, fits):
    model = tiny_llama()
    per_lane = lane_bytes(model, rollout_dtype)
    monkeypatch.setattr(executor_module, "available_memory", lambda: int(copies * per_lane))
    ex = executor(model, stub_generate, 2, weights=MasterWeights(model, noise="table", share_storage=shared),
                  rollout_dtype=rollout_dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ex.lanes_for(4) == fits
    assert sum("lowered to 1" in str(w.message) for w in caught) == (fits < 2)


def test_the_lane_budget_is_decided_before_the_copies_take_memory(monkeypatch, two_threads):
    """The first call's copies take the memory a later reading would see as gone: the lanes stay as decided."""
    model = tiny_llama()
    readings = iter([10 * lane_bytes(model), 0, 0])
    monkeypatch.setattr(executor_module, "available_memory", lambda: next(readings))
    ex = executor(model, stub_generate, 2)
    batch = ToyTask().load("train")[:2]
    for _ in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ex.evaluate_members([(1, 1), (1, -1)], batch)
        assert ex.lanes_for(2) == 2
    ex.close()
