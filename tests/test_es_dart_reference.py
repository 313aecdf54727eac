"""DART-ES (esft.es.dart) against an independent re-implementation of its published rule, written here clause by
clause: EMA, zero-pass counter, replay buffer, round(0.2 B) replay slots (halves up), candidates, priority draw,
weights and fitness, and per-epoch replay counts. The two random streams (the seeded per-epoch permutations and
the seeded priority draw) are esft's definitions and are shared; everything built on them is re-derived.

Run: . .venv/bin/activate && pytest -q tests/test_es_dart_reference.py   (~2 s, CPU)
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from esft.es.dart import DartES, epoch_permutation


class ReferenceDart:
    """The rule, problem by problem. A batch belongs to the epoch of the fresh stream where it starts."""

    def __init__(self, n, seed, fraction=0.2, decay=0.7, learned=0.5, hopeless=2, max_replays=2, cooldown=1,
                 priority_t=3.0, floor=0.8, weight_t=3.0, format_coef=0.1):
        self.n, self.seed, self.fraction = n, seed, fraction
        self.decay, self.learned, self.hopeless, self.max_replays = decay, learned, hopeless, max_replays
        self.cooldown, self.priority_t, self.floor, self.weight_t = cooldown, priority_t, floor, weight_t
        self.format_coef = format_coef
        self.ema, self.seen = np.zeros(n), np.zeros(n, bool)
        self.zero, self.buf = np.zeros(n, int), np.zeros(n, bool)
        self.replays, self.last = np.zeros(n, int), np.full(n, -10**9)
        self.pos = self.start = self.epoch = 0

    def fresh(self, count, taken):
        out = []
        while len(out) < count:
            e, o = divmod(self.pos, self.n)
            j = int(epoch_permutation(self.seed, e, self.n)[o])
            self.pos += 1
            if j not in taken and j not in out:
                out.append(j)
        return out

    def propose(self, it, batch_size):
        self.start = self.pos
        size = min(batch_size, self.n)
        slots = math.floor(self.fraction * size + 0.5)
        fresh = self.fresh(size - slots, set())
        counts = self.replays if self.start // self.n == self.epoch else np.zeros(self.n, int)
        cands = [j for j in range(self.n) if self.buf[j] and j not in fresh and counts[j] < self.max_replays
                 and it - self.last[j] > self.cooldown and self.ema[j] < self.learned]
        picks = []
        if cands and slots:
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, it, 0xDA28]))
            prio = np.exp(-self.priority_t * (self.ema[cands] - self.ema[cands].min()))
            picks = [int(x) for x in rng.choice(np.array(cands, dtype=np.int64), size=min(slots, len(cands)),
                                                replace=False, p=prio / prio.sum())]
        fresh += self.fresh(size - len(fresh) - len(picks), set(fresh) | set(picks))
        return fresh + picks, [False] * len(fresh) + [True] * len(picks)

    def score(self, it, idx, flags, correct, fmt):
        if self.start // self.n != self.epoch:
            self.epoch, self.replays[:] = self.start // self.n, 0
        for k, j in enumerate(idx):
            p = correct[:, k].mean()
            self.ema[j] = self.decay * self.ema[j] + (1 - self.decay) * p if self.seen[j] else p
            self.seen[j] = True
            self.zero[j] = 0 if p > 0 else self.zero[j] + 1
            self.buf[j] = (self.buf[j] or p > 0) and not (self.ema[j] >= self.learned or self.zero[j] >= self.hopeless)
            self.replays[j] += flags[k]
            self.last[j] = it
        w = self.floor + np.exp(-self.weight_t * self.ema[idx])
        return (correct * w).mean(axis=1) + self.format_coef * fmt.mean(axis=1)


def result(correct, fmt):
    return SimpleNamespace(scores=correct.astype(float), well_formed=fmt)


#: DartOptions field -> ReferenceDart argument
REFERENCE_ARGS = {"replay_fraction": "fraction", "ema_decay": "decay", "learned_threshold": "learned",
                  "hopeless_after": "hopeless", "max_replays_per_epoch": "max_replays", "cooldown": "cooldown",
                  "priority_temperature": "priority_t", "weight_floor": "floor", "weight_temperature": "weight_t",
                  "format_coef": "format_coef"}


@pytest.mark.parametrize("n,batch,pop", [(12, 5, 4), (10, 10, 3), (7, 12, 2), (30, 8, 5), (9, 4, 3), (30, 10, 8)])
def test_dart_follows_the_reference_rule_through_epochs_and_resume(n, batch, pop):
    follow_reference(n, batch, pop, {})


@pytest.mark.parametrize("options", [
    dict(replay_fraction=0.4, ema_decay=0.5, learned_threshold=0.6, hopeless_after=3, max_replays_per_epoch=1,
         cooldown=2, priority_temperature=1.5, weight_floor=0.5, weight_temperature=2.0, format_coef=0.3),
    dict(replay_fraction=0.3, ema_decay=0.9, learned_threshold=0.4, hopeless_after=1, max_replays_per_epoch=3,
         cooldown=0, priority_temperature=6.0, weight_floor=1.2, weight_temperature=0.5, format_coef=-0.2),
])
def test_dart_options_follow_the_reference_rule(options):
    """Every DartOptions constant takes effect where the rule uses it (the test above runs the defaults only)."""
    for n, batch, pop in [(12, 5, 4), (30, 10, 8), (9, 4, 3), (7, 12, 2)]:
        follow_reference(n, batch, pop, options)


def follow_reference(n, batch, pop, options):
    """DartES and ReferenceDart, same options, 45 iterations on random answers, with a JSON resume at 20."""
    for seed in range(3):
        rule, ref = DartES(options), ReferenceDart(n, seed, **{REFERENCE_ARGS[k]: v for k, v in options.items()})
        rule.bind(n, seed)
        rng = np.random.default_rng(seed)
        solve = rng.uniform(0.05, 0.6, n)  # per-problem difficulty, so the buffer fills and drains
        for it in range(45):
            if it == 20:  # resume from a JSON checkpoint of the state
                state = json.loads(json.dumps(rule.state_dict()))
                rule = DartES(options)
                rule.load_state_dict(state)
            idx = rule.sample_batch(seed, it, n, batch)
            want_idx, flags = ref.propose(it, batch)
            assert idx == want_idx, (seed, it)
            correct = rng.random((pop, len(idx))) < solve[idx]
            fmt = rng.random((pop, len(idx))) < 0.7
            f = rule(result(correct, fmt), [{}] * len(idx))
            assert rule.log_record()["replay"] == [int(x) for x in flags]
            np.testing.assert_allclose(f, ref.score(it, idx, flags, correct, fmt), rtol=1e-12)
            state = rule.state_dict()
            assert state["ema"] == pytest.approx(ref.ema.tolist(), rel=1e-12)
            assert state["replays"] == ref.replays.tolist() and state["in_buffer"] == ref.buf.astype(int).tolist()
            assert state["zero_pass"] == ref.zero.tolist()


def test_no_problem_is_replayed_more_than_twice_in_an_epoch():
    """A batch drawn from the start of a new epoch: its replays count in that epoch, and the counts of the epoch
    before do not bar them. Before, such a batch was checked and counted against the old epoch, whose counts were
    then wiped, so a problem could be replayed 3 times among one epoch's batches."""
    n = 10
    rule = DartES()
    rule.bind(n, seed=1)
    state = rule.state_dict()
    # epoch 0 fully consumed (cursor at its end), every problem buffered, unlearned, replayed twice in epoch 0
    state.update(cursor=n, epoch=0, in_buffer=[1] * n, seen=[1] * n, ema=[0.2] * n, replays=[2] * n,
                 last_seen=[0] * n)
    rule.load_state_dict(state)
    idx = rule.sample_batch(1, 5, n, 5)
    rule(result(np.zeros((3, 5), bool), np.ones((3, 5), bool)), [{}] * 5)
    flags = rule.log_record()["replay"]
    assert sum(flags) == 1  # round(0.2 * 5) = 1 replay slot, filled: epoch 1 has no replays yet
    replayed = idx[flags.index(1)]
    assert rule.state_dict()["replays"][replayed] == 1 and rule.state_dict()["epoch"] == 1


@pytest.mark.parametrize("fraction,batch,slots", [(0.25, 2, 1), (0.25, 10, 3), (0.25, 6, 2), (0.25, 14, 4),
                                                  (0.1, 5, 1), (0.1, 25, 3), (0.2, 7, 1), (0.2, 8, 2), (0.5, 1, 1)])
def test_replay_slots_round_halves_up(fraction, batch, slots):
    rule = DartES({"replay_fraction": fraction})
    rule.bind(100, seed=0)
    assert rule.replay_slots(batch) == slots


def test_empty_buffer_and_too_few_candidates_fill_with_fresh_problems():
    n = 20
    rule = DartES({"replay_fraction": 0.5})
    rule.bind(n, seed=4)
    idx = rule.sample_batch(4, 0, n, 8)  # empty buffer: 8 fresh problems
    correct = np.zeros((4, 8), bool)
    correct[0, 0] = True  # one problem solved by one member of four (EMA 0.25): the only buffer entry
    rule(result(correct, correct), [{}] * 8)
    assert len(set(idx)) == 8 and not any(rule.log_record()["replay"])
    solved = idx[0]
    idx = rule.sample_batch(4, 2, n, 8)  # 4 slots, 1 candidate (cooldown passed at iteration 2)
    rule(result(np.zeros((4, 8), bool), correct), [{}] * 8)
    assert len(set(idx)) == 8 and rule.log_record()["replay"] == [0] * 7 + [1] and idx[-1] == solved
