"""What an experiment's compute table reads of a finished stage (esft.experiments.algorithms): generations, tokens and
seconds of the first `budget` steps from the run's own logs, the Table 18 formula, the step it ended at.
Run: `pytest tests/test_algorithms_mutmutcli.py -q`."""

from __future__ import annotations

import json
from types import SimpleNamespace

from esft import paper
from esft.experiments.algorithms import (
    es_accounting, es_done_step, es_formula, grpo_accounting, grpo_done_step, grpo_formula)


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_es_accounting_counts_the_first_budget_iterations_of_the_logs(tmp_path):
    # iterations 0, 1, 2 logged; a budget of 2 reads 0 and 1 (seeds) and the train records of steps 1 and 2
    _jsonl(tmp_path / "seeds.jsonl", [{"iteration": 0, "members": [1, 2, 3, 4], "batch": [0, 1]},
                                      {"iteration": 1, "members": [5, 6, 7, 8], "batch": [2, 3, 4]},
                                      {"iteration": 2, "members": [9, 10, 11, 12], "batch": [5]}])
    _jsonl(tmp_path / "metrics.jsonl", [
        {"kind": "train", "step": 1, "prompt_tokens": 100, "tokens_generated": 30, "time": {"total": 1.5}},
        {"kind": "eval", "step": 1, "prompt_tokens": 999, "tokens_generated": 999, "time": {"total": 99.0}},
        {"kind": "train", "step": 2, "prompt_tokens": 200, "tokens_generated": 50, "time": {"total": 2.0}},
        {"kind": "train", "step": 3, "prompt_tokens": 400, "tokens_generated": 70, "time": {"total": 4.0}}])
    assert es_accounting(tmp_path, 2) == {"steps": 2, "generations": 4 * 2 + 4 * 3, "prompt_tokens": 300,
                                          "tokens_generated": 80, "train_forward_tokens": 0, "train_seconds": 3.5}


def test_grpo_accounting_reads_the_ledger_totals_at_the_last_step_within_the_budget(tmp_path):
    totals = {"completions": 16, "prompt_tokens": 320, "tokens_generated": 90, "forward_tokens": 410}
    _jsonl(tmp_path / "metrics.jsonl", [
        {"kind": "train", "step": 1, "totals": {k: v // 2 for k, v in totals.items()}, "time": {"total": 1.0}},
        {"kind": "eval", "step": 2, "totals": {"completions": 999}, "time": {"total": 50.0}},
        {"kind": "train", "step": 2, "totals": totals, "time": {"total": 1.25}},
        {"kind": "train", "step": 3, "totals": {k: 10 * v for k, v in totals.items()}, "time": {"total": 8.0}}])
    assert grpo_accounting(tmp_path, 2) == {"steps": 2, "generations": 16, "prompt_tokens": 320,
                                            "tokens_generated": 90, "train_forward_tokens": 410,
                                            "train_seconds": 2.25}
    assert grpo_accounting(tmp_path / "none", 2) == {"steps": 0, "generations": 0, "prompt_tokens": 0,
                                                     "tokens_generated": 0, "train_forward_tokens": 0,
                                                     "train_seconds": 0}


def test_the_table18_formulas_multiply_steps_and_group_sizes():
    es = es_formula(SimpleNamespace(population_size=30, batch_size=8), 5)
    assert es["coefficient"] == paper.ES_FLOPS_PER_TOKEN * 5 * 30 * 8
    assert es["text"] == f"{paper.ES_FLOPS_PER_TOKEN}(5)(30)(8)PL"
    grpo = grpo_formula(SimpleNamespace(prompts_per_step=4, num_generations=6), 7)
    assert grpo["coefficient"] == paper.GRPO_FLOPS_PER_TOKEN * 7 * 4 * 6
    assert grpo["text"] == f"{paper.GRPO_FLOPS_PER_TOKEN}(7)(4)(6)PL"


def test_the_done_step_is_the_final_checkpoints_and_none_before_it(tmp_path):
    assert es_done_step(tmp_path) is None and grpo_done_step(tmp_path) is None
    final = tmp_path / "checkpoints" / "final"
    final.mkdir(parents=True)
    (final / "es_state.json").write_text(json.dumps({"step": 12}))
    (final / "trainer_state.json").write_text(json.dumps({"global_step": 7}))
    assert es_done_step(tmp_path) == 12 and grpo_done_step(tmp_path) == 7


def test_run_info_is_the_run_block_of_config_yaml(tmp_path):
    from esft.experiments.algorithms import run_info

    assert run_info(tmp_path) == {}
    (tmp_path / "config.yaml").write_text("task: boolq\n_run:\n  num_params: 1234\n  precision: fp32\n")
    assert run_info(tmp_path) == {"num_params": 1234, "precision": "fp32"}
    (tmp_path / "config.yaml").write_text("task: boolq\n")
    assert run_info(tmp_path) == {}
