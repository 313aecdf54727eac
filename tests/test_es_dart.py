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
                          ema_update, make_dart, pass_rates, replay_candidates, take_fresh)
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
