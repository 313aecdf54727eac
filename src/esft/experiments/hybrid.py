"""Hybrid schedules (`grpo->es`, `es->grpo`): one total training budget split between the stages of a chain.

The experiment runner (esft.experiments) already runs chains: a spec entry such as
`grpo->es: {grpo: {max_steps: 40}, es: {iterations: 50}}` trains GRPO, then ES from GRPO's final checkpoint.
What it does not decide is how many steps each stage gets when the *total* must match a single-algorithm run
(Ba et al.: the same budget, split in half). This module makes that decision, in one of two units:

* "completions": sequences generated for training. An ES iteration generates N x B (every member answers the
  batch); a GRPO step generates prompts_per_step x K / num_iterations (one generation round serves num_iterations
  optimizer steps). On the same hardware, generation dominates both.
* "flops": the study's Table 18 convention, in units of P x L (parameters x tokens per sequence): an ES
  iteration costs 2 N B (forward only), a GRPO step 8 x prompts x K (generation 2 + forward/backward 6), taken
  from the registered algorithms' own formulas so that the budget and the runner's Table 18 agree.

Stage i gets floor(total x share_i / cost_i) steps, so a chain never exceeds the total (a share too small for one
step of its stage is an error naming the smallest total that fits); the report says what each stage actually uses.
A GRPO stage gets whole generation rounds (a multiple of num_iterations steps): a run that stopped inside a round
would have generated the whole round's completions for part of its updates.

A chain's sub-block inherits the spec's base block of the same algorithm (esft.experiments.spec), so each stage's
block pins the fields its step cost is computed from (COST_FIELDS): a base `es: {population_size: 30}` cannot
silently change the size of the chain's ES iterations after the budget was split. For the same reason each stage's
block carries its own `per_task` (that of `options`, else none): the base block's is not inherited, as a per-task
size or step count there would override the pinned ones. A `per_task` override of those fields in `options` would
make the cost or the steps differ by task and is refused.

    methods = hybrid_methods(total=8000, split=0.5, options={"es": {"preset": "cpu"}, "grpo": {"preset": "cpu"}})
    spec["algorithms"].update(methods)       # {"grpo->es": {...}, "es->grpo": {...}} for esft.experiments
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Mapping, Sequence

UNITS = ("completions", "flops")
CHAIN = "->"
#: the config fields one step's cost depends on, in both units (GRPO's num_iterations: updates per generation round)
COST_FIELDS = {"es": ("population_size", "batch_size"),
               "grpo": ("prompts_per_step", "num_generations", "num_iterations")}


def _config(algorithm: str, options: Mapping[str, Any]) -> Any:
    """The trainer config an option block (with an optional `preset`) resolves to, as the runner would build it."""
    from esft.config import build_config
    from esft.experiments.algorithms import get_algorithm

    algo = get_algorithm(algorithm)
    opts = dict(options)
    preset = opts.pop("preset", None)
    opts.pop("display", None)
    for task, sub in dict(opts.pop("per_task", None) or {}).items():
        pinned = sorted(set(sub) & {*COST_FIELDS.get(algorithm, ()), algo.budget_field})
        if pinned:
            raise ValueError(f"{algorithm}.per_task.{task} sets {pinned}: a hybrid budget needs one step cost and "
                             "one step count for every task")
    return build_config(algo.config_cls, algo.presets, preset, None, opts)


def step_cost(algorithm: str, config: Any, unit: str = "completions") -> float:
    """Cost of one budget step (ES iteration / GRPO optimizer step) of `config` in `unit`."""
    if unit not in UNITS:
        raise ValueError(f"unknown budget unit {unit!r}; choose one of {UNITS}")
    if unit == "flops":
        from esft.experiments.algorithms import get_algorithm

        return float(get_algorithm(algorithm).formula(config, 1)["coefficient"])
    if algorithm == "es":  # N members x B prompts
        return float(config.population_size * config.batch_size)
    if algorithm == "grpo":  # prompts x K samples per generation round, a round every num_iterations steps
        return config.prompts_per_step * config.num_generations / config.num_iterations
    raise ValueError(f"no completion count known for algorithm {algorithm!r}")


def round_steps(algorithm: str, config: Any) -> int:
    """Steps of one generation round: GRPO's num_iterations (updates per generated batch), 1 for ES."""
    return int(config.num_iterations) if algorithm == "grpo" else 1


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)  # numpy's numbers too


def split_budget(total: float, costs: Sequence[float], shares: Sequence[float]) -> list[int]:
    """Steps per stage: floor(total * share / cost). Shares are normalised to sum to 1. A stage with a share
    whose budget buys no step is an error: rounding it up to one step would exceed the total."""
    # a total read from text ("8000") or a flag (True) is not a budget, though Python would compare or count it
    if not _is_real(total):
        raise ValueError(f"total budget must be a finite number > 0, got {total!r} ({type(total).__name__})")
    # a NaN passes every comparison below and an infinity has no step count: both would end in a bare
    # float-to-int error far from the argument that caused it
    if not (math.isfinite(total) and total > 0):
        raise ValueError(f"total budget must be a finite number > 0, got {total}")
    if len(costs) != len(shares) or not costs:
        raise ValueError("one cost and one share per stage")
    if not all(math.isfinite(v) for v in (*costs, *shares)):
        raise ValueError(f"costs and shares must be finite numbers: {costs}, {shares}")
    if any(c <= 0 for c in costs) or any(s < 0 for s in shares) or sum(shares) <= 0:
        raise ValueError(f"costs must be > 0 and shares >= 0 with a positive sum: {costs}, {shares}")
    norm = float(sum(shares))
    # a tiny epsilon keeps exact multiples (e.g. 0.5 * 4000 / 100 = 20) from flooring to 19 through rounding
    steps = [math.floor(total * s / norm / c + 1e-9) for c, s in zip(costs, shares)]
    short = [i for i, (n, s) in enumerate(zip(steps, shares)) if n < 1 and s > 0]
    if short:
        need = max(costs[i] * norm / shares[i] for i in short)
        raise ValueError(f"a total of {total:g} buys no step of stage {short[0] + 1} (one step costs "
                         f"{costs[short[0]]:g}, its share is {shares[short[0]] / norm:.2f}): a total of at least "
                         f"{need:g} gives every stage one step")
    return steps


def _check_options(options: Mapping[str, Any]) -> None:
    """`options` maps algorithm names to option blocks. A name that is no algorithm (`gpro`) is refused, since its
    stage would otherwise train at the defaults (and the budget be split at their step cost) without a word; so is
    a budget field (`iterations`, `max_steps`), which the split's step count decides."""
    from esft.experiments.algorithms import ALGORITHMS, get_algorithm

    if not isinstance(options, Mapping):
        raise ValueError(f"options maps each algorithm to its option block, got {type(options).__name__}")
    for name, block in options.items():
        if name not in ALGORITHMS:
            raise ValueError(f"options: unknown algorithm {name!r} (known: {', '.join(ALGORITHMS)}); its block "
                             "would be left out and its stage would train with the defaults")
        if not isinstance(block, Mapping):
            raise ValueError(f"options.{name} must map config fields to values, got {type(block).__name__}")
        field = get_algorithm(name).budget_field
        if field in block:
            raise ValueError(f"options.{name} sets {field}: the hybrid budget decides each stage's step count; "
                             "leave it out")


def hybrid_block(order: str, total: float, split: float = 0.5, unit: str = "completions",
                 options: Mapping[str, Mapping[str, Any]] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(spec block, budget report) of a two-stage chain `order` ("grpo->es" or "es->grpo").

    `split` is the first stage's share of `total`; `options` maps algorithm -> option block (preset and config
    fields, as in a spec). The block has one sub-block per stage with its budget field filled in."""
    parts = [p.strip() for p in order.split(CHAIN)]
    if len(parts) != 2 or len(set(parts)) != 2:
        raise ValueError(f"a hybrid schedule chains two different algorithms, e.g. grpo->es; got {order!r}")
    if not (_is_real(split) and 0.0 < split < 1.0):
        raise ValueError(f"split must be in (0, 1), got {split!r}")
    from esft.experiments.algorithms import get_algorithm

    options = options or {}
    _check_options(options)
    configs = [_config(p, options.get(p, {})) for p in parts]
    costs = [step_cost(p, c, unit) for p, c in zip(parts, configs)]
    rounds = [round_steps(p, c) for p, c in zip(parts, configs)]
    steps = [n * k for n, k in zip(split_budget(total, [c * k for c, k in zip(costs, rounds)],
                                                [split, 1.0 - split]), rounds)]
    block: dict[str, Any] = {}
    stages = []
    for part, config, cost, n in zip(parts, configs, costs, steps):
        field = get_algorithm(part).budget_field
        pinned = {f: getattr(config, f) for f in COST_FIELDS.get(part, ())}
        # its own per_task, even empty: the base block's would override the pinned fields task by task
        own = dict(options.get(part, {}))
        block[part] = {**own, **pinned, "per_task": dict(own.get("per_task") or {}), field: n}
        stages.append({"algorithm": part, field: n, "cost_per_step": cost, "used": n * cost})
    report = {"order": order, "unit": unit, "total": total, "split": split, "stages": stages,
              "used": sum(s["used"] for s in stages)}
    return block, report


def hybrid_methods(total: float, split: float = 0.5, unit: str = "completions",
                   options: Mapping[str, Mapping[str, Any]] | None = None,
                   orders: Sequence[str] = ("grpo->es", "es->grpo")) -> dict[str, Any]:
    """Spec `algorithms` entries for the hybrid chains (default both orders) at one total budget."""
    return {order: hybrid_block(order, total, split, unit, options)[0] for order in orders}


def single_budget(algorithm: str, total: float, unit: str = "completions",
                  options: Mapping[str, Any] | None = None) -> int:
    """Steps of a single-algorithm run at the same total budget (the comparison point of the chains)."""
    config = _config(algorithm, options or {})
    k = round_steps(algorithm, config)
    return k * split_budget(total, [k * step_cost(algorithm, config, unit)], [1.0])[0]


__all__ = ["UNITS", "COST_FIELDS", "step_cost", "round_steps", "split_budget", "hybrid_block", "hybrid_methods",
           "single_budget"]
