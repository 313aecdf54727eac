"""DART-ES (esft.es.dart): each rule on hand-made answer matrices, the batch sampler, state save/replay, and the
trainer integration (--fitness dart) with exact resume on the tiny model.

Run: . .venv/bin/activate && pytest -q tests/test_es_dart.py   (~5 s, CPU)
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from es_tiny import one_thread  # noqa: F401  (autouse fixture)
from es_tiny import ToyTask, stub_generate, tiny_llama
from esft.api import train_es
from esft.es import es_rundir as runlog
from esft.es.build import make_fitness_rule
from esft.es.dart import (DartES, DartOptions, buffer_update, dart_fitness, difficulty_weights, draw_replays,
                          ema_update, epoch_permutation, make_dart, pass_rates, replay_candidates, take_fresh)
from esft.es.es_config import ESConfig

OPTS = DartOptions()


def test_pass_rates_and_ema():
    a = np.array([[1, 0, 0, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 0, 1]])
    p = pass_rates(a)
    assert p.tolist() == [1.0, 0.5, 0.0, 0.5]
    seen = np.array([False, True, True, False])
    ema = ema_update(np.array([0.0, 0.2, 0.4, 0.9]), seen, p, 0.7)
    # first value p_j; afterwards 0.7 EMA + 0.3 p
    assert ema.tolist() == pytest.approx([1.0, 0.7 * 0.2 + 0.3 * 0.5, 0.7 * 0.4, 0.5])


def test_buffer_add_drop_rules():
    # problems: solved-but-hard (add), learned (drop), second zero in a row (drop), first zero (kept), unseen zero
    in_buf = np.array([False, True, True, True, False])
    zero = np.array([0, 0, 1, 0, 0])
    p = np.array([0.25, 0.75, 0.0, 0.0, 0.0])
    ema = np.array([0.25, 0.55, 0.1, 0.2, 0.0])
    new_buf, new_zero = buffer_update(in_buf, zero, ema, p, learned=0.5, hopeless_after=2)
    assert new_buf.tolist() == [True, False, False, True, False]
    assert new_zero.tolist() == [0, 0, 2, 1, 1]
    # a solve resets the zero-pass counter, so "twice in a row" means consecutive evaluations
    buf, z = buffer_update(np.array([True]), np.array([1]), np.array([0.1]), np.array([0.25]), 0.5, 2)
    assert buf.tolist() == [True] and z.tolist() == [0]


def test_weights_and_fitness_on_hand_made_matrix():
    ema = np.array([0.0, 0.5, 1.0])
    w = difficulty_weights(ema)
    assert w.tolist() == pytest.approx([1.8, 0.8 + np.exp(-1.5), 0.8 + np.exp(-3.0)])
    a = np.array([[1, 0, 1], [0, 1, 1], [0, 0, 0]])
    fmt = np.array([[1, 1, 1], [1, 0, 1], [0, 0, 0]], dtype=bool)
    f = dart_fitness(a, fmt, w, 0.1)
    expected = [(w[0] + w[2]) / 3 + 0.1, (w[1] + w[2]) / 3 + 0.1 * 2 / 3, 0.0]
    assert f.tolist() == pytest.approx(expected)
    # solving the hard problem is worth more than solving the easy one
    assert f[0] > f[1]


def test_replay_candidate_conditions():
    n = 8
    in_buf = np.array([1, 1, 1, 1, 1, 1, 0, 1], dtype=bool)
    ema = np.array([0.1, 0.1, 0.1, 0.1, 0.6, 0.1, 0.1, 0.1])
    replays = np.array([0, 2, 1, 0, 0, 0, 0, 0])
    last = np.array([3, 3, 3, 9, 3, 3, 3, 3])
    window = [5]
    cands = replay_candidates(in_buf, ema, replays, last, window, iteration=10, opts=OPTS)
    # 1: replayed twice this epoch; 3: seen 1 iteration ago (cooldown); 4: learned; 5: in the fresh window;
    # 6: not in the buffer
    assert cands.tolist() == [0, 2, 7]
    assert n == len(in_buf)


def test_draw_replays_priority_and_no_replacement():
    cands = np.array([0, 1, 2])
    ema = np.array([0.0, 0.45, 0.45])
    picks = draw_replays(cands, ema, 5, np.random.default_rng(0))
    assert sorted(picks) == [0, 1, 2]  # min(slots, candidates), distinct
    counts = np.zeros(3)
    rng = np.random.default_rng(1)
    for _ in range(3000):
        counts[draw_replays(cands, ema, 1, rng)[0]] += 1
    prio = np.exp(-3 * ema)
    np.testing.assert_allclose(counts / counts.sum(), prio / prio.sum(), atol=0.03)
    assert draw_replays(np.array([], dtype=int), ema, 2, rng) == []


def test_epoch_permutations_are_the_original_draws():
    """Literal orders of SeedSequence([run seed, epoch, 0xDA27]): a resumed DART-ES run continues the fresh stream
    from its checkpointed cursor, so the orders must be those the interrupted run drew."""
    assert epoch_permutation(42, 0, 10).tolist() == [2, 1, 0, 8, 4, 5, 3, 9, 6, 7]
    assert epoch_permutation(5, 1, 8).tolist() == [4, 7, 3, 6, 0, 2, 1, 5]


def test_fresh_stream_covers_each_epoch():
    n, seen, cursor = 10, [], 0
    for _ in range(5):
        got, cursor = take_fresh(7, n, cursor, 4)
        assert len(set(got)) == 4
        seen += got
    assert sorted(seen[:10]) == list(range(10))  # the first epoch is a permutation
    got, _ = take_fresh(7, n, 0, 4, exclude=[0, 1, 2, 3, 4, 5])
    assert set(got) == {6, 7, 8, 9}


def fake_result(correct, fmt=None):
    correct = np.asarray(correct, dtype=float)
    fmt = np.ones_like(correct, dtype=bool) if fmt is None else np.asarray(fmt, dtype=bool)
    return SimpleNamespace(scores=correct, well_formed=fmt)


def test_dart_state_machine_and_replay_of_logged_history():
    n, bsz, N = 12, 5, 4
    rule = DartES()
    rule.bind(n, seed=3)
    assert rule.replay_slots(bsz) == 1
    rng = np.random.default_rng(0)
    logs = []
    replayed = 0
    for it in range(12):
        idx = rule.sample_batch(3, it, n, bsz)
        assert len(idx) == bsz == len(set(idx))
        assert rule.sample_batch(3, it, n, bsz) == idx  # proposing is pure
        # hand-made answers: problem j solved by member i with probability j / n
        a = (rng.random((N, bsz)) < np.array(idx) / n).astype(float)
        before = rule.state_dict()
        f = rule(fake_result(a), [{}] * bsz)
        assert f.shape == (N,)
        ema = np.array(rule.state_dict()["ema"])[idx]
        w = 0.8 + np.exp(-3 * ema)
        np.testing.assert_allclose(f, (a * w).mean(axis=1) + 0.1)
        log = rule.log_record()
        replayed += sum(log["replay"])
        for j, flag in zip(idx, log["replay"]):
            if flag:  # a replayed problem was a candidate at proposal time
                assert before["in_buffer"][j] and before["ema"][j] < 0.5 and before["replays"][j] < 2
                assert it - before["last_seen"][j] > 1
        logs.append({"iteration": it, "batch": idx, "members": [[0, 1]] * N, "fitness_rule": log})
    assert replayed > 0
    final = rule.state_dict()
    # replaying the logged history from a fresh state reproduces the state exactly
    again = DartES()
    again.bind(n, seed=3)
    for rec in logs:
        again.replay(json.loads(json.dumps(rec)))
    assert again.state_dict() == final
    assert again.log_record() == logs[-1]["fitness_rule"]  # the last replayed line, as after scoring it
    # and from a mid-run snapshot (a checkpoint) plus the remaining lines
    mid = DartES()
    mid.bind(n, seed=3)
    for rec in logs[:5]:
        mid.replay(rec)
    restored = DartES()
    restored.load_state_dict(json.loads(json.dumps(mid.state_dict())))
    for rec in logs[5:]:
        restored.replay(rec)
    assert restored.state_dict() == final
    with pytest.raises(RuntimeError):  # only batches it proposed
        DartES().__call__(fake_result(np.zeros((2, 2))), [{}, {}])


def test_options_and_factory():
    rule = make_fitness_rule("dart", 0.0, {"replay_fraction": 0.5, "format_coef": 0.0})
    assert isinstance(rule, DartES) and rule.opts.replay_fraction == 0.5
    assert isinstance(make_fitness_rule("dart", 0.1), DartES)  # equal to DART's own coefficient: fine
    with pytest.raises(ValueError, match="format_coef"):
        make_dart(0.3)
    assert make_dart().opts == DartOptions()  # no format bonus given: the published rule
    with pytest.raises(ValueError, match="unknown DART-ES options"):
        make_dart(0.0, {"nope": 1})
    with pytest.raises(ValueError):
        make_fitness_rule("mean", 0.0, {"replay_fraction": 0.5})
    assert ESConfig(fitness_rule="dart", fitness_options="{replay_fraction: 0.3}").fitness_options == \
        {"replay_fraction": 0.3}


@pytest.mark.parametrize("options, words", [
    ({"replay_fraction": 2}, "[0, 1]"), ({"replay_fraction": -0.1}, "[0, 1]"), ({"ema_decay": 5}, "[0, 1)"),
    ({"ema_decay": 1}, "[0, 1)"), ({"learned_threshold": 0}, "(0, 1]"), ({"hopeless_after": 0}, ">= 1"),
    ({"cooldown": 1.5}, "an integer"), ({"max_replays_per_epoch": -1}, ">= 0"),
    ({"format_coef": float("nan")}, "finite"), ({"priority_temperature": "hot"}, ">= 0"),
    ({"weight_floor": True}, ">= 0"),
])
def test_dart_options_out_of_range_are_refused(options, words):
    """An out-of-range DART-ES constant (replay_fraction 2 reserves more replay slots than the batch has; an EMA
    decay of 5 diverges) used to run silently; the config refuses it when built, before any model loads."""
    from esft.config import ConfigError

    name = next(iter(options))
    with pytest.raises(ValueError, match=name) as info:
        DartOptions.from_dict(options)
    assert words in str(info.value)
    with pytest.raises(ConfigError, match="fitness_options"):
        ESConfig(fitness_rule="dart", fitness_options=options)
    assert DartOptions.from_dict({"replay_fraction": 1, "ema_decay": 0, "cooldown": 0}).replay_fraction == 1


# ---- trainer integration -------------------------------------------------------------------------------------------

def cfg(tmp_path, name="run", **kw) -> ESConfig:
    base = dict(model="tiny", task="toy", population_size=6, sigma=0.05, alpha=0.02, batch_size=10,
                iterations=6, max_new_tokens=2, seed=5, output_dir=str(tmp_path / name), eval_every=3,
                eval_limit=6, checkpoint_every=2, format_bonus=0.1, fitness_rule="dart")
    base.update(kw)
    return ESConfig(**base)


def run(config, **kw):
    return train_es(config, model=tiny_llama(), tokenizer=None, task=ToyTask(), generate_fn=stub_generate,
                    progress=False, **kw)


def test_trainer_dart_runs_logs_and_resumes_exactly(tmp_path):
    full = run(cfg(tmp_path, "full"))
    lines = runlog.read_jsonl(full.output_dir / "seeds.jsonl")
    assert all("fitness_rule" in r and len(r["fitness_rule"]["solved"]) == 10 for r in lines)
    assert any(any(r["fitness_rule"]["replay"]) for r in lines)  # replays happen
    ck = json.loads((full.output_dir / "checkpoints" / "iter_000002" / runlog.STATE_FILE).read_text())
    assert ck["fitness_rule_state"]["n"] == 24
    metrics = [m for m in runlog.read_jsonl(full.output_dir / "metrics.jsonl") if m["kind"] == "train"]
    assert "buffer_size" in metrics[-1]["fitness_rule"]

    # stop after 3 iterations, drop the final checkpoint: resume = iter_000002 + replay of seed-log line 2
    part = cfg(tmp_path, "part", iterations=3)
    run(part)
    import shutil

    shutil.rmtree(part.output_dir + "/checkpoints/final")
    resumed = run(part.replace(iterations=6, resume=True))
    a = runlog.read_jsonl(full.output_dir / "seeds.jsonl")
    b = runlog.read_jsonl(resumed.output_dir / "seeds.jsonl")
    assert a == b  # same batches (DART sampler state), fitness and updates
    from safetensors.torch import load_file

    sa = load_file(str(full.output_dir / "checkpoints" / "final" / "model.safetensors"))
    sb = load_file(str(resumed.output_dir / "checkpoints" / "final" / "model.safetensors"))
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_cli_fitness_alias():
    from esft.cli import build_parser

    args = build_parser().parse_args(["train", "es", "--fitness", "dart", "--fitness-options", "{cooldown: 2}"])
    assert args.fitness_rule == "dart" and args.fitness_options == "{cooldown: 2}"


def test_draw_replays_large_temperature_does_not_underflow():
    """exp(-t EMA) underflows to 0 for every candidate at t = 2000 (0/0 probabilities before); the draw must
    still follow the priority, which at that temperature is all on the lowest EMA."""
    cands, ema = np.array([0, 1, 2]), np.array([0.4, 0.45, 0.42])
    rng = np.random.default_rng(0)
    assert all(draw_replays(cands, ema, 1, rng, 2000.0) == [0] for _ in range(50))
    assert sorted(draw_replays(cands, ema, 3, rng, 2000.0)) == [0, 1, 2]
    rule = DartES({"priority_temperature": 2000.0})  # the option range accepts it
    assert rule.opts.priority_temperature == 2000.0


def test_draw_replays_fills_every_slot_when_most_priorities_underflow():
    """At t = 2000 an EMA gap of 0.49 gives exp(-980) = 0: numpy refused a draw of 2 ("Fewer non-zero entries in p
    than size") although two candidates exist; the lowest EMA is still drawn first."""
    cands, ema = np.array([0, 1, 2]), np.array([0.0, 0.49, 0.45])
    rng = np.random.default_rng(0)
    for _ in range(20):
        picks = draw_replays(cands, ema, 2, rng, 2000.0)
        assert len(picks) == 2 and 0 in picks
    assert sorted(draw_replays(cands, ema, 3, rng, 2000.0)) == [0, 1, 2]


def test_replay_candidates_learned_boundary_and_draw_default_temperature():
    """A buffered problem at exactly the learned threshold is no candidate (EMA < 0.5, as the buffer drops it at
    EMA >= 0.5); draw_replays hands numpy the priorities exp(-3 EMA) normalised (3: the default temperature)."""
    in_buf, ema = np.ones(3, bool), np.array([0.5, 0.4999, 0.2])
    cands = replay_candidates(in_buf, ema, np.zeros(3), np.full(3, -10), [], iteration=0, opts=OPTS)
    assert cands.tolist() == [1, 2]

    class Spy:
        def choice(self, a, size, replace, p):
            self.args = (a.tolist(), size, replace, p)
            return a[:size]

    spy = Spy()
    assert draw_replays([2, 0], ema, 1, spy) == [2]  # a list of candidates is fine
    prio = np.exp(-3 * ema[[2, 0]])
    assert spy.args[:3] == ([2, 0], 1, False)
    np.testing.assert_allclose(spy.args[3], prio / prio.sum(), rtol=1e-12)


def test_pure_rules_accept_lists():
    assert ema_update([0.5, 0.0], [True, False], [1.0, 0.25], 0.7).tolist() == pytest.approx([0.65, 0.25])
    buf, zero = buffer_update([True, False], [1, 0], [0.1, 0.2], [0.0, 0.5], 0.5, 2)
    assert buf.tolist() == [False, True] and zero.tolist() == [2, 0]


def test_take_fresh_asked_for_more_than_remain_returns_what_remains():
    """count is capped at the problems not excluded: a larger count would otherwise loop for ever."""
    import signal

    def hung(*_):
        raise TimeoutError("take_fresh did not return")

    old = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, 5.0)
    try:
        got, _ = take_fresh(7, 10, 0, 8, exclude=[0, 1, 2, 3, 4, 5, 42])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert sorted(got) == [6, 7, 8, 9]


def test_correct_means_score_at_least_one_half():
    """A is score >= 0.5 (module docstring): a partial score counts as solved from 0.5 up."""
    rule = DartES()
    rule.bind(4, seed=0)
    idx = rule.sample_batch(0, 0, 4, 4)
    scores = np.array([[0.5, 0.49, 0.6, 0.0], [0.0, 0.0, 0.0, 0.0]])
    f = rule(fake_result(scores, np.zeros((2, 4), bool)), [{}] * 4)
    assert rule.log_record()["solved"] == [1, 0, 1, 0]
    w = 0.8 + np.exp(-3 * 0.5)  # the two solved problems: p = 1/2, first value
    np.testing.assert_allclose(f, [2 * w / 4, 0.0])
    assert [rule.state_dict()["ema"][j] for j in idx] == [0.5, 0.0, 0.5, 0.0]


@pytest.mark.parametrize("bad", [2.0, -0.5])
def test_a_score_outside_0_1_stops_dart_with_what_to_use(bad):
    """A custom reward on another scale has no 'solved': >= 0.5 would have counted a reward of 2 as solved."""
    rule = DartES()
    rule.bind(4, seed=0)
    rule.sample_batch(0, 0, 4, 4)
    scores = np.array([[0.5, 0.0, bad, 0.0], [0.0, 0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match=rf"task scored {bad:g}: .*use the default fitness rule"):
        rule(fake_result(scores, np.zeros((2, 4), bool)), [{}] * 4)


def test_sample_batch_refuses_another_split_or_seed_and_redraws_for_another_iteration():
    n = 10
    rule = DartES()
    line = {"iteration": 0, "batch": [0], "members": [[0]],
            "fitness_rule": {"solved": [0], "replay": [0], "cursor": 1}}
    for unbound in (rule.state_dict, rule.summary, lambda: rule.sample_batch(2, 0, n, 5),
                    lambda: rule.propose(0, 5), lambda: rule.replay(line)):
        with pytest.raises(RuntimeError, match="bind"):
            unbound()
    rule.bind(n, seed=2)
    with pytest.raises(RuntimeError, match="no iteration scored"):
        rule.log_record()
    with pytest.raises(ValueError, match="no DART-ES record"):
        rule.replay({"iteration": 0, "batch": [0], "members": [[0]]})
    with pytest.raises(ValueError, match="bound to"):
        rule.sample_batch(2, 0, n + 1, 5)
    with pytest.raises(ValueError, match="bound to"):
        rule.sample_batch(3, 0, n, 5)
    first = rule.sample_batch(2, 0, n, 5)
    assert rule.sample_batch(2, 4, n, 5) == first  # empty buffer: fresh problems only, whatever the iteration
    # one candidate, outside the first five fresh problems, batched last at 0: no replay at 0, replayed at 4
    j = next(k for k in range(n) if k not in first)
    state = rule.state_dict()
    state.update(in_buffer=[int(k == j) for k in range(n)], seen=[1] * n, ema=[0.2] * n, last_seen=[0] * n)
    rule.load_state_dict(state)  # a new state: the batch proposed before it is void
    assert rule.sample_batch(2, 4, n, 5) == first[:4] + [j]
    assert rule.sample_batch(2, 0, n, 5) == first  # not scored in between: drawn again for iteration 0
    assert rule.sample_batch(2, 4, n, 5) == first[:4] + [j]
    rule(fake_result(np.ones((2, 5))), [{}] * 5)
    with pytest.raises(RuntimeError, match="only batches it proposed"):  # a batch is scored once
        rule(fake_result(np.ones((2, 5))), [{}] * 5)


def test_replay_counts_of_the_current_epoch_bar_a_third_replay_mid_epoch():
    """In the middle of an epoch (cursor 5 of 10), problems already replayed twice in it are no candidates."""
    n = 10
    rule = DartES()
    rule.bind(n, seed=1)
    state = rule.state_dict()
    state.update(cursor=5, epoch=0, in_buffer=[1] * n, seen=[1] * n, ema=[0.2] * n, replays=[2] * n,
                 last_seen=[0] * n)
    rule.load_state_dict(state)
    assert rule.propose(5, 5).replay == [False] * 5
    fresh, _ = take_fresh(1, n, 5, 4)
    once = next(j for j in range(n) if j not in fresh)  # replayed once: the one candidate
    state["replays"][once] = 1
    rule.load_state_dict(state)
    prop = rule.propose(5, 5)
    assert prop.indices == fresh + [once] and prop.replay == [False] * 4 + [True]


def test_summary_and_log_record_report_the_state():
    n = 12
    rule = DartES()
    rule.bind(n, seed=0)
    assert rule.summary() == {"buffer_size": 0, "seen": 0, "mean_ema_seen": None, "epoch": 0,
                              "replayed_this_epoch": 0}
    assert rule.state_dict()["epoch"] == 0 and rule.state_dict()["cursor"] == 0
    assert rule.replay_slots(100) == 2  # round(0.2 min(B, n))
    idx = rule.sample_batch(0, 0, n, 4)
    correct = np.array([[1, 0, 0, 1], [1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]], float)
    rule(fake_result(correct), [{}] * 4)
    # p = [3/4, 1/4, 0, 1/4]: the first is learned (EMA 0.75), two are buffered
    log = rule.log_record()
    assert log["solved"] == [3, 1, 0, 1] and log["buffer_size"] == 2 and log["cursor"] == 4
    assert log["weights_mean"] == pytest.approx(np.mean(0.8 + np.exp(-3 * np.array([0.75, 0.25, 0.0, 0.25]))))
    assert rule.summary() == {"buffer_size": 2, "seen": 4, "mean_ema_seen": pytest.approx(0.3125), "epoch": 0,
                              "replayed_this_epoch": 0}
    assert sorted(np.flatnonzero(rule.state_dict()["in_buffer"]).tolist()) == sorted([idx[1], idx[3]])
    # iteration 1: the buffered two are cooling down, so 4 fresh problems, none solved; the buffer is the run's
    nxt = rule.sample_batch(0, 1, n, 4)
    assert not set(nxt) & set(idx)
    rule(fake_result(np.zeros((4, 4))), [{}] * 4)
    assert rule.log_record()["buffer_size"] == 2 and rule.summary()["seen"] == 8
    state = rule.state_dict()
    state["replays"] = [2, 1] + [0] * (n - 2)
    rule.load_state_dict(state)
    assert rule.summary()["replayed_this_epoch"] == 2  # problems replayed, not replays


INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize("name, accepted, refused", [
    ("ema_decay", [0, 0.999], [-1e-9, 1, NAN]),
    ("learned_threshold", [1e-9, 1], [0, -0.5, 1.0001]),
    ("hopeless_after", [1, 7], [0, -1, 1.0, True]),
    ("replay_fraction", [0, 0.5, 1], [-1e-9, 1.0001]),
    ("max_replays_per_epoch", [0, 3], [-1, 0.5]),
    ("cooldown", [0, 4], [-1, 2.0]),
    ("priority_temperature", [0, 2000.0], [-1e-9, INF, NAN]),
    ("weight_floor", [0, 5], [-0.1, INF]),
    ("weight_temperature", [0, 7.5], [-0.1, INF]),
    ("format_coef", [-1.0, 0, 2], [INF, -INF, NAN, "x", None]),
])
def test_dart_option_ranges_at_their_bounds(name, accepted, refused):
    """Each documented range, both sides of each bound (the range words in the error message)."""
    for value in accepted:
        assert getattr(DartOptions(**{name: value}), name) == value
    for value in refused:
        with pytest.raises(ValueError, match=name):
            DartOptions(**{name: value})
    with pytest.raises(ValueError, match="'lots'"):  # text that is no number is refused as given
        DartOptions.from_dict({name: "lots"})


def test_integer_options_beyond_64_bits_are_checked_as_numbers():
    """The finite checks of a large integer option (YAML reads `1` followed by 30 zeros as an int): one a float can
    hold is a finite number and accepted; one beyond float range is refused with the option's range words, as
    ValueError, not numpy's TypeError about ufunc casting."""
    assert DartOptions(priority_temperature=10**30).priority_temperature == 10**30
    assert DartOptions.from_dict({"format_coef": -(10**30)}).format_coef == -(10**30)
    for name in ("priority_temperature", "weight_floor", "weight_temperature", "format_coef"):
        with pytest.raises(ValueError, match=f"{name} = 1000.* is not accepted; expected a finite number"):
            DartOptions(**{name: 10**400})


def test_unknown_option_names_of_mixed_types_are_listed():
    """A YAML mapping may mix int and text keys ({1: 2, nope: 3}); they are refused as unknown options by name, not
    by a TypeError from sorting them."""
    from esft.config import ConfigError

    with pytest.raises(ValueError, match=r"unknown DART-ES options \[1, 'nope'\]"):
        DartOptions.from_dict({1: 2, "nope": 3})
    with pytest.raises(ConfigError, match="unknown DART-ES options"):
        ESConfig(fitness_rule="dart", fitness_options="{1: 2, nope: 3}")


def test_resume_refuses_a_dart_checkpoint_without_the_rule_state(tmp_path):
    """A DART-ES checkpoint past step 0 that lacks the rule's state cannot be resumed exactly: refused, not run
    on with a fresh rule."""
    import shutil

    part = cfg(tmp_path, "part", iterations=3, eval_every=0)
    run(part)
    shutil.rmtree(part.output_dir + "/checkpoints/final")
    state_file = tmp_path / "part" / "checkpoints" / "iter_000002" / runlog.STATE_FILE
    state = json.loads(state_file.read_text())
    del state["fitness_rule_state"]
    state_file.write_text(json.dumps(state))
    with pytest.raises(ValueError, match="holds no state"):
        run(part.replace(iterations=4, resume=True))
    assert len(runlog.read_jsonl(tmp_path / "part" / "seeds.jsonl")) == 3
