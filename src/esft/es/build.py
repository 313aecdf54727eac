"""From an `ESConfig` to the objects of an ES run: strategy, master weights, generation config, fitness rule,
batch sampler and the local executor.

The trainer, the replicas of a distributed run (esft.es.distributed, esft.es.distributed.vllm_backend) and replay
(esft.es.replay) all build through here, so a replica or a replay holds exactly what the trainer holds.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from esft.es.es_config import RAY_OPTION_VALUES, VLLM_OPTION_VALUES, ESConfig, check_executor_values
from esft.es.executor import LocalExecutor
from esft.es.fitness import FITNESS_RULES, ClassBalancedMean, FitnessRule, MeanReward, sample_batch
from esft.es.lanes import available_memory
from esft.es.noise import MasterWeights, select_parameters
from esft.es.strategy import ES

EXECUTORS = ("local", "ray")
WORKER_BACKENDS = ("hf", "vllm")
# keys of `executor_options` (esft.es.distributed.factory reads them; es_config says what each value accepts)
RAY_OPTIONS = set(RAY_OPTION_VALUES)
VLLM_OPTIONS = set(VLLM_OPTION_VALUES)


def make_strategy(config: ESConfig) -> ES:
    return ES(population_size=config.population_size, sigma=config.sigma, alpha=config.alpha, seed=config.seed,
              antithetic=config.antithetic, fitness_shaping=config.fitness_shaping, optimizer=config.optimizer,
              stream=config.noise_stream)


def rollout_precision(config: ESConfig, flags: Any = None, probe: Any = None) -> Any:
    """The run's rollout dtype (esft.generation.precision.resolve_rollout_dtype): bf16 rollouts exist on the local
    executor's member-by-member path only, so Ray and low-rank runs roll out in fp32 ("bfloat16" asked there is
    an error). Returns a `RolloutPrecision`."""
    from esft.generation.precision import RolloutPrecision, resolve_rollout_dtype  # lazy, as generation_config

    if config.executor != "local" or config.noise == "lowrank":
        if config.rollout_dtype == "bfloat16":
            raise ValueError("rollout_dtype 'bfloat16' runs on the local executor with member-by-member noise")
        where = "low-rank populations" if config.noise == "lowrank" else f"executor {config.executor!r}"
        return RolloutPrecision("float32", config.rollout_dtype, f"{where}: members roll out in the model's dtype")
    from esft.models import default_device

    # device None is what load_model picks (CUDA when present), not necessarily the CPU
    return resolve_rollout_dtype(config.rollout_dtype, device=config.device or default_device(),
                                 generation_options=config.generation_options, flags=flags, probe=probe)


def check_selection(config: ESConfig) -> None:
    """`include` / `exclude` that select no parameter of `config.model` are refused from the model's skeleton
    (esft.models.model_skeleton), before its weights load: the same ValueError the masters would raise later. A
    model whose config cannot be read here is left to `load_model`, which says why."""
    if not (config.include or config.exclude):
        return
    from esft.models import model_skeleton

    try:
        skeleton = model_skeleton(config.model)
    except (OSError, ValueError):
        return
    select_parameters(skeleton, config.include, config.exclude)


def check_lowrank_memory(config: ESConfig) -> None:
    """A low-rank run is refused from the model's skeleton, before its weights load, where its selection holds no
    matrix, where the batched population forward cannot perturb a selected matrix (esft.es.lowrank.matrix_owners:
    GPT-2's Conv1D), and where its population's factors (esft.es.lowrank.factor_bytes) need more memory than is
    available (esft.es.lanes.available_memory; the message names the largest rank that fits). The memory only on
    the CPU, where that is the memory the factors take; where the model's config or the memory cannot be read,
    nothing is refused here."""
    if config.noise != "lowrank":
        return
    from esft.es.lowrank import check_factor_memory, matrix_owners
    from esft.models import default_device, model_skeleton, parse_dtype

    try:
        skeleton = model_skeleton(config.model)
    except (OSError, ValueError, ImportError, KeyError):  # load_model will say what is wrong with the model
        return
    # the matrices LowRankWeights keeps, in the order PopulationPerturbation builds their factors
    matrices = {name: p for name, p in select_parameters(skeleton, config.include or None,
                                                         config.exclude or None).items() if p.dim() == 2}
    if not matrices:  # as LowRankWeights says once the weights have loaded
        raise ValueError("lowrank noise needs at least one selected 2-D weight matrix")
    matrix_owners(skeleton, matrices)
    device = torch.device(config.device or default_device())
    if device.type != "cpu":
        return
    check_factor_memory([tuple(p.shape) for p in matrices.values()], config.population_size, config.rank,
                        parse_dtype(config.dtype, device).itemsize, available_memory())


def make_weights(model: Any, config: ESConfig) -> MasterWeights:
    """The run's MasterWeights of `model`; where `model` holds weights rounded to bf16 / fp16 and `config.model` is
    a folder of fp32 tensors (an earlier stage's checkpoint), the masters start from those (esft.es.start_weights),
    for the trainer, its replicas and replay alike. An fp32 `model` loaded from an ES checkpoint of a bf16 / fp16
    run starts from that run's fp32 masters (`masters.safetensors`), not from its rounded model file."""
    from esft.es.start_weights import exact_start, fp32_start

    if all(p.dtype == torch.float32 for p in model.parameters()):
        fp32_start(model, config.model)
    weights = _new_weights(model, config)
    exact_start(weights, model, config.model)
    return weights


def _new_weights(model: Any, config: ESConfig) -> MasterWeights:
    if config.noise == "lowrank":  # matrices only, low-rank noise (esft.es.lowrank)
        from esft.es.lowrank import LowRankWeights

        return LowRankWeights(model, rank=config.rank, include=config.include or None,
                              exclude=config.exclude or None)
    # bf16 rollouts, parallel lanes and the packed path run on copies, never on the model
    # (esft.es.executor.LocalExecutor): its fp32 parameters can then be the masters themselves, not a second fp32
    # model beside them. On the packed path even one lane gains: the copy's projections are freed while packed
    # (esft.generation.releasing), so it holds one copy of them, not two (docs/performance.md, "Memory")
    share = config.executor == "local" and (config.rollout_dtype == "bfloat16" or int(config.parallel_members) > 1
                                             or bool(config.generation_options.get("packed_linear")))
    return MasterWeights(model, include=config.include or None, exclude=config.exclude or None, noise=config.noise,
                         share_storage=share)


def generation_config(config: ESConfig) -> Any:
    """The rollouts' GenerationConfig: greedy, from the ESConfig's own fields plus its checked generation_options."""
    from esft.generation import GenerationConfig

    return GenerationConfig(max_new_tokens=config.max_new_tokens, temperature=0.0, top_p=1.0,
                            batch_size=config.generation_batch_size, seed=0, **config.generation_options)


def make_fitness_rule(name: str, format_bonus: float = 0.0, options: dict | None = None,
                      task: Any = None) -> FitnessRule:
    """"mean" (the paper, options unused), "dart" (DART-ES, esft.es.dart; options = DartOptions fields) or
    "balanced" (class-balanced mean over the task's `balance_key` labels; needs `task`). A task object that is not
    an esft Task gets TaskAdapter's defaults for the labels it does not bring (esft.tasks.custom.as_task, as the
    trainer wraps it)."""
    if name in ("mean", "balanced") and options:
        raise ValueError(f"fitness rule {name!r} takes no fitness_options, got {sorted(options)}")
    if name == "mean":
        return MeanReward(format_bonus)
    if name == "balanced":
        from esft.tasks.custom import as_task
        from esft.tasks.labels import LABELLED_TASKS

        labelled = None if task is None else as_task(task)
        if labelled is None or labelled.label_set() is None:
            shown = None if labelled is None else labelled.shown_name()
            raise ValueError(f"fitness rule 'balanced' needs a task with labels ({LABELLED_TASKS}); {shown!r} has "
                             "none")
        return ClassBalancedMean(labelled.balance_key, labelled.label_set(), format_bonus)
    if name == "dart":
        from esft.es.dart import make_dart

        return make_dart(format_bonus, options)
    raise ValueError(f"unknown fitness rule {name!r}; available: {', '.join(FITNESS_RULES)}")


def fitness_rule(config: ESConfig, task: Any = None) -> FitnessRule:
    return make_fitness_rule(config.fitness_rule, config.format_bonus, config.fitness_options, task)


def check_layout(config: ESConfig) -> None:
    """Refuse an executor layout that cannot run (`executor`, `worker_backend`, noise, `parallel_members`); warn
    about a layout option that the chosen executor ignores."""
    if config.executor not in EXECUTORS:
        raise ValueError(f"unknown executor {config.executor!r}; choose one of {EXECUTORS}")
    if config.worker_backend not in WORKER_BACKENDS:
        raise ValueError(f"unknown worker_backend {config.worker_backend!r}; choose one of {WORKER_BACKENDS}")
    if config.noise == "lowrank" and config.executor != "local":
        # replicas would evaluate members one by one on materialised weights, not bit-identical to the batched pass
        raise ValueError("noise 'lowrank' evaluates the population in one batched pass: use --executor local")
    if int(config.parallel_members) < 1:
        raise ValueError(f"parallel_members must be >= 1, got {config.parallel_members}")
    if config.parallel_members > 1 and (config.executor != "local" or config.noise == "lowrank"):
        # a layout option (results do not depend on it) that presets set for the local executor: not an error
        where = "the Ray executor spreads members over workers (num_workers)" if config.executor != "local" \
            else "a low-rank population is one batched pass"
        warnings.warn(f"parallel_members={config.parallel_members} ignored: {where}", stacklevel=3)


def check_executor_options(config: ESConfig) -> None:
    """Refuse a Ray run's unknown `executor_options` keys and values its workers could not use: the trainer calls
    it before the model loads."""
    if config.executor == "local":
        return  # the local executor reads none of them (warn_unread_ray_options)
    check_executor_values(config.executor_options)  # again: a config's options may change after it is built


def check_ray_installed(config: ESConfig) -> None:
    """A run whose members esft's own Ray executor runs needs Ray: refused where it is not installed, before the model
    loads (else an ImportError traceback where the executor starts). Not asked of an injected executor."""
    import importlib.util

    if config.executor != "local" and importlib.util.find_spec("ray") is None:
        raise ValueError(f"executor {config.executor!r} runs its members on Ray workers, and Ray is not installed "
                         "here: pip install 'esft[ray]'")


def warn_unread_ray_options(config: ESConfig) -> None:
    """A local run reads none of the Ray options: those set are named in a warning, not refused (a Ray run resumed
    with --executor local keeps them in its config). The trainer calls it once, before the model loads."""
    if config.executor != "local":
        return
    unread = [f"{k}={v!r}" for k, v in (("num_workers", config.num_workers), ("ray_address", config.ray_address),
                                        ("executor_options", config.executor_options)) if v]
    if unread:
        warnings.warn(f"{', '.join(unread)} ignored: the local executor runs the members in this process "
                      "(--executor ray spreads them over Ray workers)", stacklevel=3)


def warn_unread_rank(config: ESConfig) -> None:
    """`rank` is read by low-rank noise only: a rank other than the default with another noise (`--rank 4` without
    `--noise lowrank`) is named in a warning, as a local run's Ray options are; so is a save_total_limit without
    numbered checkpoints to count. The trainer calls it once."""
    if config.noise != "lowrank" and config.rank != 1:
        warnings.warn(f"rank={config.rank} ignored: noise {config.noise!r} draws full-rank perturbations "
                      "(--noise lowrank uses the rank)", stacklevel=3)
    if config.save_total_limit and not config.checkpoint_every:  # only `final` is written, which it never counts
        warnings.warn(f"save_total_limit={config.save_total_limit} ignored: checkpoint_every 0 writes only the final "
                      "checkpoint (--checkpoint-every N writes the ones it keeps)", stacklevel=3)


def make_local_executor(config: ESConfig, *, model: Any, tokenizer: Any, weights: MasterWeights, task: Any,
                        strategy: ES, gen_config: Any, generate_fn: Any = None) -> LocalExecutor:
    """The in-process executor of `executor: local` (after `check_layout`): member after member, or the whole
    low-rank population in one batched pass. Perturbations are scaled by `strategy.sigma`."""
    if config.worker_backend != "hf":
        raise ValueError("worker_backend 'vllm' runs vLLM engines as Ray actors: use --executor ray")
    if config.noise == "lowrank":
        from esft.es.lowrank import LowRankExecutor

        return LowRankExecutor(model, tokenizer, weights, task, strategy, gen_config, generate_fn=generate_fn)
    from esft.kernels import load_amx_linear, load_decode_attention, load_param_passes

    # built here, on the main thread, if they are not yet: a Ctrl-C during a build then stops it at once, where a
    # lane thread's build would first run to its end
    load_param_passes()  # the perturbation's and update's passes (esft.es.param_writes)
    if gen_config is not None and gen_config.fused_attention:
        load_decode_attention()
    if config.rollout_dtype == "bfloat16":
        load_amx_linear()  # bf16 linears on AMX tiles where the CPU has them (esft.generation.packed)
    return LocalExecutor(model, tokenizer, weights, task, strategy, gen_config, generate_fn=generate_fn,
                         parallel_members=config.parallel_members,
                         rollout_dtype=torch.bfloat16 if config.rollout_dtype == "bfloat16" else None)


__all__ = ["EXECUTORS", "RAY_OPTIONS", "VLLM_OPTIONS", "WORKER_BACKENDS", "check_executor_options", "check_layout",
           "check_lowrank_memory", "check_ray_installed", "check_selection", "fitness_rule", "generation_config",
           "make_fitness_rule", "make_local_executor", "make_strategy", "make_weights", "rollout_precision",
           "sample_batch", "warn_unread_rank", "warn_unread_ray_options"]
