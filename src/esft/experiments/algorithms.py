"""The trainers an experiment can use, behind one small interface (`Algorithm`), plus their measured accounting.

Each entry knows its config dataclass and presets (for validating option blocks), the config field that is its
training budget, whether a finished run can be extended (ES: `resume` with a larger `iterations` continues
bit-identically, so one run serves budgets 100 and 300), how to train, and how to read what a run actually
generated up to a budget (for Table 18). ES variants that keep ESConfig (DART-ES fitness, low-rank noise) need no
entry: a spec label with `algorithm: es` and their options is enough; a new trainer calls `register_algorithm`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from esft import paper
from esft.config import RunConfig

CHECKPOINTS = "checkpoints"


@dataclass(frozen=True)
class Algorithm:
    name: str
    config_cls: type[RunConfig]
    presets: dict[str, dict[str, Any]]
    budget_field: str
    """config field holding the training budget (ES `iterations`, GRPO `max_steps`)"""
    budget_short: str
    """how tables name the budget: ES (iter=100), GRPO (T=80)"""
    extendable: bool
    """True when resuming a finished run with a larger budget continues it exactly (snapshots at each budget)"""
    train: Callable[..., Any]
    """train(config, **kwargs) -> object with `final_checkpoint`; must honour config.resume"""
    accounting: Callable[[Path, int], dict[str, Any]]
    """accounting(run_dir, budget) -> measured counts of the first `budget` steps (see es_accounting)"""
    formula: Callable[[Any, int], dict[str, Any]]
    """formula(config, budget) -> the study's FLOP formula as {"coefficient": c, "text": ...}, FLOPs = c * P * L"""
    done_step: Callable[[Path], int | None]
    """step of the run's `checkpoints/final`, or None when the run has not finished"""
    check_model: Callable[[Any], None] | None = None
    """check_model(config): what the config asks of its model, checked from the model's skeleton before any weights
    load (ValueError); None: nothing to check"""
    model_options: tuple[str, ...] = ()
    """the config fields check_model reads, whose line a spec's refusal names"""
    checkpoints: Callable[[Path], list[tuple[int, Path]]] = lambda run_dir: []
    """checkpoints(run_dir) -> (step, folder) of the run's complete checkpoints, sorted by step, for the evaluation
    of a stage's intermediate checkpoints (spec: evaluation.checkpoints); a trainer that keeps none returns []"""


ALGORITHMS: dict[str, Algorithm] = {}


def register_algorithm(algorithm: Algorithm) -> None:
    ALGORITHMS[algorithm.name] = algorithm


def get_algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    from esft.rundir import read_jsonl

    return read_jsonl(path)


def run_info(run_dir: Path) -> dict[str, Any]:
    """The `_run` block the trainers write into config.yaml (num_params, precision, ...)."""
    import yaml

    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        return {}
    return (yaml.safe_load(path.read_text()) or {}).get("_run", {}) or {}


# ---- ES ---------------------------------------------------------------------------------------------------------

def _train_es(config: Any, **kwargs: Any) -> Any:
    from esft.api import train_es

    return train_es(config, **kwargs)


def es_accounting(run_dir: Path, budget: int) -> dict[str, Any]:
    """What the first `budget` ES iterations generated, from the run's own logs: generations = members x batch
    of every logged iteration (seeds.jsonl), tokens from the train records of metrics.jsonl."""
    seeds = [r for r in _read_jsonl(Path(run_dir) / "seeds.jsonl") if r.get("iteration", 0) < budget]
    train = [r for r in _read_jsonl(Path(run_dir) / "metrics.jsonl")
             if r.get("kind") == "train" and r.get("step", 0) <= budget]
    return {
        "steps": len(seeds),
        "generations": sum(len(r.get("members", ())) * len(r.get("batch", ())) for r in seeds),
        "prompt_tokens": sum(int(r.get("prompt_tokens", 0)) for r in train),
        "tokens_generated": sum(int(r.get("tokens_generated", 0)) for r in train),
        "train_forward_tokens": 0,  # ES never back-propagates
        "train_seconds": sum(float(r.get("time", {}).get("total", 0.0)) for r in train),
    }


def es_formula(config: Any, budget: int) -> dict[str, Any]:
    """Table 18: 2 * iters * N * batch * P * L (one forward pass per generated sequence, no backward)."""
    k = paper.ES_FLOPS_PER_TOKEN
    c = k * budget * config.population_size * config.batch_size
    return {"coefficient": c, "text": f"{k}({budget})({config.population_size})({config.batch_size})PL"}


def es_done_step(run_dir: Path) -> int | None:
    state = Path(run_dir) / CHECKPOINTS / "final" / "es_state.json"
    if not state.exists():
        return None
    return int(json.loads(state.read_text())["step"])


def es_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    from esft.es.es_rundir import list_checkpoints

    return list_checkpoints(run_dir)


def _check_es_selection(config: Any) -> None:
    from esft.es.build import check_selection  # as `esft train es` before its weights load

    check_selection(config)


def _es() -> Algorithm:
    from esft.es.es_config import PRESETS, ESConfig

    return Algorithm("es", ESConfig, PRESETS, "iterations", "iter", True, _train_es, es_accounting, es_formula,
                     es_done_step, _check_es_selection, ("include", "exclude"), es_checkpoints)


# ---- GRPO -------------------------------------------------------------------------------------------------------

def _train_grpo(config: Any, **kwargs: Any) -> Any:
    from esft.api import train_grpo  # as ES's stages: the run's curve.png is drawn at its end

    return train_grpo(config, **kwargs)


def grpo_accounting(run_dir: Path, budget: int) -> dict[str, Any]:
    """Running totals of the GRPO ledger (esft.grpo.ledger) at the last logged step <= budget: completions and
    tokens counted from the tensors TRL built, and positions run through forward+backward."""
    train = [r for r in _read_jsonl(Path(run_dir) / "metrics.jsonl")
             if r.get("kind") == "train" and r.get("step", 0) <= budget]
    totals = train[-1].get("totals", {}) if train else {}
    return {
        "steps": int(train[-1]["step"]) if train else 0,
        "generations": int(totals.get("completions", 0)),
        "prompt_tokens": int(totals.get("prompt_tokens", 0)),
        "tokens_generated": int(totals.get("tokens_generated", 0)),
        "train_forward_tokens": int(totals.get("forward_tokens", 0)),
        "train_seconds": sum(float(r.get("time", {}).get("total", 0.0)) for r in train),
    }


def grpo_formula(config: Any, budget: int) -> dict[str, Any]:
    """Table 18: 8 * T * prompts * K * P * L (2 for generation + 6 for forward and backward per token)."""
    k = paper.GRPO_FLOPS_PER_TOKEN
    c = k * budget * config.prompts_per_step * config.num_generations
    return {"coefficient": c, "text": f"{k}({budget})({config.prompts_per_step})({config.num_generations})PL"}


def grpo_done_step(run_dir: Path) -> int | None:
    state = Path(run_dir) / CHECKPOINTS / "final" / "trainer_state.json"
    if not state.exists():
        return None
    return int(json.loads(state.read_text())["global_step"])


def grpo_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    from esft.grpo.checkpoints import list_checkpoints

    return list_checkpoints(run_dir)


def _grpo() -> Algorithm:
    from esft.grpo.grpo_config import PRESETS, GRPOConfig

    return Algorithm("grpo", GRPOConfig, PRESETS, "max_steps", "T", False, _train_grpo, grpo_accounting, grpo_formula,
                     grpo_done_step, checkpoints=grpo_checkpoints)


register_algorithm(_es())
register_algorithm(_grpo())
