"""esft.grpo.ledger on hand-made ledgers: the accounting part of a GRPO train record (reward summary with ES's
keys, accuracy from scores, format rate, finished rate) and the running totals carried across steps."""

from __future__ import annotations

import math

from esft.grpo.ledger import COUNTERS, StepLedger, add_totals


def test_record_summarises_rewards_scores_and_format():
    led = StepLedger(completions=4, finished=3, rewards=[1.1, 0.0, 0.1, 1.0], scores=[1.0, 0.0, 0.0, 1.0],
                     well_formed=[True, False, True, True])
    rec = led.record()
    assert list(rec)[:len(COUNTERS)] == list(COUNTERS)
    assert rec["completions"] == 4 and rec["finished"] == 3 and rec["tokens_generated"] == 0
    # population std, as ES summarises its fitness: mean 0.55, squared deviations 0.3025 * 2 + 0.2025 * 2
    assert rec["reward"]["mean"] == math.fsum([1.1, 0.0, 0.1, 1.0]) / 4
    assert math.isclose(rec["reward"]["std"], math.sqrt((2 * 0.55 ** 2 + 2 * 0.45 ** 2) / 4), rel_tol=1e-12)
    assert (rec["reward"]["min"], rec["reward"]["max"]) == (0.0, 1.1)
    # accuracy is the task score, not the reward (which holds the format bonus)
    assert rec["accuracy"] == 0.5 and rec["format_rate"] == 0.75 and rec["finished_rate"] == 0.75


def test_record_of_one_reward_and_of_a_task_without_format_check():
    rec = StepLedger(completions=1, rewards=[0.25], scores=[0.0]).record()
    assert rec["reward"] == {"mean": 0.25, "std": 0.0, "min": 0.25, "max": 0.25}
    assert rec["accuracy"] == 0.0 and "format_rate" not in rec and rec["finished_rate"] == 0.0


def test_an_empty_ledger_has_counts_and_no_reward():
    rec = StepLedger().record()
    assert rec == {**{k: 0 for k in COUNTERS}, "finished_rate": 0.0}


def test_times_of_one_phase_add_up():
    led = StepLedger()
    led.add_time("generate", 1.5)
    led.add_time("score", 0.5)
    led.add_time("generate", 0.25)
    assert led.time == {"generate": 1.75, "score": 0.5}


def test_totals_add_every_counter_and_leave_the_input_alone():
    before = {"completions": 8, "prompts": 2}
    led = StepLedger(prompts=1, completions=4, prompt_tokens=30, tokens_generated=10, finished=2,
                     trained_completions=4, trained_tokens=10, forward_tokens=64, signal_completions=2)
    totals = add_totals(before, led)
    assert totals == {"prompts": 3, "completions": 12, "prompt_tokens": 30, "tokens_generated": 10, "finished": 2,
                      "trained_completions": 4, "trained_tokens": 10, "forward_tokens": 64,
                      "signal_completions": 2}
    assert before == {"completions": 8, "prompts": 2}
    assert add_totals(totals, led)["completions"] == 16  # a second step adds again
