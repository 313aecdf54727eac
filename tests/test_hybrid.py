"""Hybrid schedules (esft.hybrid): a total budget split between the stages of grpo->es / es->grpo chains, in
completions or Table 18 FLOPs, producing spec entries the experiment runner accepts.

Run: . .venv/bin/activate && pytest -q tests/test_hybrid.py   (~2 s, no model)
"""

from __future__ import annotations

import pytest

from esft.experiments.hybrid import hybrid_block, hybrid_methods, single_budget, split_budget, step_cost

# sizes pinned here (8 x 16 members x prompts, 16 x 8 prompts x samples = 128 completions per step each) so the
# arithmetic below does not depend on how the cpu presets are tuned
CPU = {"es": {"preset": "cpu", "population_size": 8, "batch_size": 16},
       "grpo": {"preset": "cpu", "prompts_per_step": 16, "num_generations": 8}}


def test_split_budget():
    assert split_budget(4000, [100, 200], [0.5, 0.5]) == [20, 10]
    assert split_budget(4000, [100, 200], [1, 3]) == [10, 15]  # shares are normalised
    with pytest.raises(ValueError, match="at least 200 gives every stage one step"):  # never over the total
        split_budget(10, [100, 100], [0.5, 0.5])
    assert split_budget(200, [100, 100], [0.5, 0.5]) == [1, 1]
    assert split_budget(999, [100], [1]) == [9]  # never above the total
    for bad in [(0, [1], [1]), (10, [0], [1]), (10, [1, 1], [1]), (10, [1], [-1])]:
        with pytest.raises(ValueError):
            split_budget(*bad)


@pytest.mark.parametrize("total", [float("nan"), float("inf")])
def test_a_non_finite_total_is_refused_by_name(total):
    with pytest.raises(ValueError, match="total budget must be a finite number > 0"):
        split_budget(total, [100, 100], [0.5, 0.5])
    with pytest.raises(ValueError, match="total budget must be a finite number > 0"):
        hybrid_methods(total, 0.5, options=CPU)


def test_a_non_finite_share_or_cost_is_refused_by_name():
    for costs, shares in [([100, float("nan")], [0.5, 0.5]), ([100, 100], [0.5, float("nan")]),
                          ([100, 100], [float("inf"), 0.5])]:
        with pytest.raises(ValueError, match="costs and shares must be finite"):
            split_budget(4000, costs, shares)


def test_step_costs_match_presets_and_table18():
    from esft.es.es_config import preset as es_preset
    from esft.grpo.grpo_config import preset as grpo_preset

    es, grpo = es_preset("cpu"), grpo_preset("cpu")
    assert step_cost("es", es) == es.population_size * es.batch_size == 128
    completions = grpo.prompts_per_step * grpo.num_generations  # whatever the cpu preset currently uses
    assert step_cost("grpo", grpo) == completions
    assert step_cost("es", es, "flops") == 2 * 128 and step_cost("grpo", grpo, "flops") == 8 * completions
    with pytest.raises(ValueError):
        step_cost("es", es, "hours")


def test_hybrid_blocks_equal_budget():
    block, report = hybrid_block("grpo->es", 2560, 0.5, "completions", CPU)
    assert block == {"grpo": {**CPU["grpo"], "num_iterations": 1, "per_task": {}, "max_steps": 10},
                     "es": {**CPU["es"], "per_task": {}, "iterations": 10}}
    assert report["used"] == 2560 and single_budget("es", 2560, options=CPU["es"]) == 20
    # in FLOPs a GRPO step costs 4x an ES iteration of the same size (backward pass)
    block, report = hybrid_block("es->grpo", 2560 * 2, 0.5, "flops", CPU)
    assert block["es"]["iterations"] == 10 and block["grpo"]["max_steps"] == 2
    with pytest.raises(ValueError):
        hybrid_block("es->es", 100)
    with pytest.raises(ValueError):
        hybrid_block("grpo->es", 100, split=1.0)


def test_runner_accepts_the_chains():
    from esft.experiments.spec import parse_spec

    algorithms = {"es": {"preset": "cpu", "iterations": 20}, "grpo": {"preset": "cpu", "max_steps": 20},
                  **hybrid_methods(2560, 0.5, options=CPU)}
    spec = parse_spec({"kind": "single-task", "tasks": ["boolq"], "algorithms": algorithms})
    chain = spec.method("grpo->es")
    assert chain.is_chain and [c.algorithm for c in chain.components] == ["grpo", "es"]
    configs = [spec.config(c, "boolq", 42, output_dir="x") for c in chain.components]
    assert configs[0].max_steps == 10 and configs[1].iterations == 10
    assert [c.algorithm for c in spec.method("es->grpo").components] == ["es", "grpo"]


def test_chain_stages_cost_what_the_budget_assumed_whatever_the_base_blocks():
    """A chain's sub-block inherits the spec's base block of its algorithm: sizes set there must not change the
    cost of the stages the budget was split for (before: a base `es: {population_size: 30}` made the chain's ES
    stage generate ~7x the completions of its share)."""
    from esft.experiments.algorithms import get_algorithm
    from esft.experiments.spec import parse_spec

    options = {"es": {"preset": "cpu"}, "grpo": {"preset": "cpu"}}
    total = 4096
    base = {"es": {"preset": "cpu", "population_size": 30, "batch_size": 32},
            "grpo": {"preset": "cpu", "prompts_per_step": 4, "num_generations": 16}}
    for unit in ("completions", "flops"):
        spec = parse_spec({"kind": "single-task", "tasks": ["boolq"],
                           "algorithms": {**base, **hybrid_methods(total, 0.5, unit, options)}})
        for order in ("grpo->es", "es->grpo"):
            _, report = hybrid_block(order, total, 0.5, unit, options)
            used = []
            for comp in spec.method(order).components:
                config = spec.config(comp, "boolq", 42, output_dir="x")
                steps = getattr(config, get_algorithm(comp.algorithm).budget_field)
                used.append(steps * step_cost(comp.algorithm, config, unit))
            assert used == [s["used"] for s in report["stages"]] and sum(used) <= total, (unit, order)


def test_per_task_sizes_are_refused_other_per_task_options_pass_through():
    per_task = {"es": {"preset": "cpu", "per_task": {"boolq": {"max_new_tokens": 8}}}, "grpo": {"preset": "cpu"}}
    block, _ = hybrid_block("grpo->es", 4096, 0.5, options=per_task)
    assert block["es"]["per_task"] == {"boolq": {"max_new_tokens": 8}}
    with pytest.raises(ValueError, match="one step cost and one step count for every task"):
        hybrid_block("grpo->es", 4096, 0.5, options={"es": {"per_task": {"boolq": {"batch_size": 4}}}})
    # a per-task step count would override the split as well (before: ES took 100 iterations on boolq)
    with pytest.raises(ValueError, match=r"es.per_task.boolq sets \['iterations'\]"):
        hybrid_block("grpo->es", 4096, 0.5, options={"es": {"per_task": {"boolq": {"iterations": 100}}}})


def test_the_base_blocks_per_task_sizes_do_not_reach_the_chain():
    """The chain's sub-block inherited the base block's `per_task`, whose sizes override the pinned ones task by
    task: a base `es: {per_task: {boolq: {population_size: 30}}}` made the chain's ES stage cost 7680 completions
    of its 2048 share on boolq."""
    from esft.experiments.algorithms import get_algorithm
    from esft.experiments.spec import parse_spec

    options = {"es": {"preset": "cpu"}, "grpo": {"preset": "cpu"}}
    base = {"es": {"preset": "cpu", "per_task": {"boolq": {"population_size": 30, "iterations": 3}}},
            "grpo": {"preset": "cpu", "per_task": {"boolq": {"num_generations": 16, "max_steps": 3}}}}
    spec = parse_spec({"kind": "single-task", "tasks": ["boolq"],
                       "algorithms": {**base, **hybrid_methods(4096, 0.5, "completions", options)}})
    for order in ("grpo->es", "es->grpo"):
        _, report = hybrid_block(order, 4096, 0.5, "completions", options)
        used = []
        for comp in spec.method(order).components:
            config = spec.config(comp, "boolq", 42, output_dir="x")
            used.append(getattr(config, get_algorithm(comp.algorithm).budget_field)
                        * step_cost(comp.algorithm, config))
        assert used == [s["used"] for s in report["stages"]], order
    assert spec.config(spec.method("es").components[0], "boolq", 42, output_dir="x").population_size == 30


def test_a_zero_share_gives_its_stage_no_steps_and_no_error():
    """Only a stage with a positive share must buy a step: a zero share is a stage left out on purpose."""
    assert split_budget(4000, [100, 200], [1, 0]) == [40, 0]
    assert split_budget(4000, [100, 200], [0, 1]) == [0, 20]


@pytest.mark.parametrize("split", [0.0, 1.0, 1.5, -0.5])
def test_a_split_outside_the_open_interval_is_refused_by_name(split):
    # a total large enough for one step of either stage alone, so only the split itself can be refused
    with pytest.raises(ValueError, match=r"split must be in \(0, 1\)"):
        hybrid_block("grpo->es", 10 ** 6, split=split, options=CPU)


def test_the_split_is_the_first_stage_share_in_either_order():
    # 128 completions a step for both algorithms (CPU): a quarter of 2560 buys 5 steps, three quarters 15
    for order, first, second in [("grpo->es", "grpo", "es"), ("es->grpo", "es", "grpo")]:
        block, report = hybrid_block(order, 2560, 0.25, "completions", CPU)
        field = {"es": "iterations", "grpo": "max_steps"}
        assert block[first][field[first]] == 5 and block[second][field[second]] == 15, order
        assert [s["algorithm"] for s in report["stages"]] == [first, second]
        assert [s["used"] for s in report["stages"]] == [640, 1920] and report["used"] == 2560


def test_bad_totals_and_shares_are_refused_by_name():
    with pytest.raises(ValueError, match="total budget must be a finite number > 0, got 0"):
        split_budget(0, [1], [1])
    # a negative share beside a larger positive one still sums to > 0: it must not give a negative step count
    with pytest.raises(ValueError, match="shares >= 0 with a positive sum"):
        split_budget(10, [1, 1], [-0.5, 1])
    with pytest.raises(ValueError, match="shares >= 0 with a positive sum"):
        split_budget(10, [1, 1], [0, 0])
    # both stages short: the smallest total named must buy a step of the dearer one as well
    with pytest.raises(ValueError, match="at least 600 gives every stage one step"):
        split_budget(10, [100, 300], [0.5, 0.5])


def test_a_chain_of_one_algorithm_twice_is_refused_by_name():
    for order in ("es->es", "grpo->grpo", "grpo->es->grpo", "es"):
        with pytest.raises(ValueError, match="chains two different algorithms"):
            hybrid_block(order, 10 ** 6, options=CPU)


def test_an_exact_multiple_reached_through_float_rounding_is_not_floored_one_short():
    # 1.0 - 0.8 is 0.19999999999999996: 100 x that / 10 must still buy 2 steps, as the docstring's floor promises
    assert split_budget(100, [10, 10], [0.8, 1.0 - 0.8]) == [8, 2]
    assert hybrid_block("grpo->es", 100 * 64, 0.8, "completions", CPU)[1]["used"] <= 100 * 64


def test_a_short_second_stage_is_named_with_its_own_cost():
    with pytest.raises(ValueError, match=r"buys no step of stage 2 \(one step costs 300, its share is 0.50\)"):
        split_budget(400, [100, 300], [0.5, 0.5])


def test_a_display_name_in_an_option_block_is_not_a_config_field():
    options = {"es": {**CPU["es"], "display": "ES (cpu)"}, "grpo": CPU["grpo"]}
    block, _ = hybrid_block("es->grpo", 2560, 0.5, "completions", options)
    assert block["es"]["display"] == "ES (cpu)" and block["es"]["iterations"] == 10


def test_an_option_block_under_a_misspelt_algorithm_is_refused_not_left_out():
    """`options={"gpro": {...}}` was passed over: the GRPO stage took GRPOConfig's defaults (63 prompts x 8
    samples) and the budget was split at their cost, without a word."""
    with pytest.raises(ValueError, match=r"options: unknown algorithm 'gpro' \(known: es, grpo\)"):
        hybrid_block("grpo->es", 10 ** 6, options={"es": CPU["es"], "gpro": CPU["grpo"]})
    with pytest.raises(ValueError, match=r"options: unknown algorithm 'gpro'"):
        hybrid_methods(10 ** 6, options={"es": CPU["es"], "gpro": CPU["grpo"]})
    with pytest.raises(ValueError, match=r"options.es must map config fields to values, got list"):
        hybrid_block("grpo->es", 10 ** 6, options={"es": ["preset"]})
    with pytest.raises(ValueError, match=r"options maps each algorithm to its option block, got list"):
        hybrid_block("grpo->es", 10 ** 6, options=[("es", {})])


@pytest.mark.parametrize("algorithm,field", [("es", "iterations"), ("grpo", "max_steps")])
def test_a_step_count_in_an_option_block_is_refused_not_replaced(algorithm, field):
    """The split decides each stage's steps: a step count in `options` was replaced by it without a word, as a
    per-task one is refused."""
    options = {**CPU, algorithm: {**CPU[algorithm], field: 99}}
    with pytest.raises(ValueError, match=rf"options.{algorithm} sets {field}: the hybrid budget decides"):
        hybrid_block("grpo->es", 2560, 0.5, "completions", options)


def test_a_total_or_split_that_is_not_a_number_is_refused_by_name():
    """A total or split read from text failed in a bare comparison (TypeError) and a flag counted as 1."""
    import numpy as np

    for total in ("2560", True, None):
        with pytest.raises(ValueError, match=r"total budget must be a finite number > 0, got"):
            hybrid_block("grpo->es", total, 0.5, options=CPU)
    with pytest.raises(ValueError, match=r"split must be in \(0, 1\), got '0.5'"):
        hybrid_block("grpo->es", 2560, "0.5", options=CPU)
    # numpy's numbers are numbers
    assert hybrid_block("grpo->es", np.int64(2560), np.float64(0.5), options=CPU)[1]["used"] == 2560


def test_a_grpo_stage_of_several_updates_per_generation_round_costs_its_rounds_completions():
    """With num_iterations = mu, one generation round of prompts x K completions serves mu optimizer steps (TRL's
    repeat_count): a step costs prompts x K / mu, and the stage ends on a whole round (one cut short would have
    generated the whole round). Before, a step was costed prompts x K and the GRPO stage got 1/mu of its share."""
    from esft.grpo.grpo_config import preset as grpo_preset

    assert step_cost("grpo", grpo_preset("cpu", prompts_per_step=16, num_generations=8, num_iterations=2)) == 64
    options = {**CPU, "grpo": {**CPU["grpo"], "num_iterations": 2}}
    block, report = hybrid_block("grpo->es", 2560, 0.5, "completions", options)
    assert block["grpo"]["max_steps"] == 20 and block["grpo"]["num_iterations"] == 2  # 10 rounds of 128
    assert report["stages"][0]["used"] == 1280 and report["used"] == 2560
    options = {**CPU, "grpo": {**CPU["grpo"], "num_iterations": 3}}
    block, report = hybrid_block("grpo->es", 2560, 0.5, "completions", options)
    assert block["grpo"]["max_steps"] == 30 and report["stages"][0]["used"] == 1280  # 10 whole rounds, not 31 steps
    assert single_budget("grpo", 2560, options=options["grpo"]) == 60


def test_a_base_blocks_updates_per_round_do_not_reach_the_chain():
    from esft.experiments.spec import parse_spec

    spec = parse_spec({"kind": "single-task", "tasks": ["boolq"],
                       "algorithms": {"grpo": {"preset": "cpu", "num_iterations": 4},
                                      **hybrid_methods(2560, 0.5, options=CPU)}})
    grpo = next(c for c in spec.method("grpo->es").components if c.algorithm == "grpo")
    config = spec.config(grpo, "boolq", 42, output_dir="x")
    assert config.num_iterations == 1 and config.max_steps * step_cost("grpo", config) == 1280
    with pytest.raises(ValueError, match="num_iterations"):
        hybrid_block("grpo->es", 2560, 0.5, options={"grpo": {"per_task": {"boolq": {"num_iterations": 2}}}})
