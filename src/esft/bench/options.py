"""What `esft bench` runs (esft.bench): `BenchConfig`, whose fields are the command's flags (through esft.config),
the rules its values must meet before the model loads, and the `--set KEY=VALUE` generation overrides."""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Sequence

from esft.bench.workloads import WORKLOADS
from esft.config import FAST_CPU_GENERATION, ConfigHooks, check_fields
from esft.config_rules import at_least, one_of

__all__ = ["BENCH_RULES", "BenchConfig", "FAST_GENERATION", "FAST_NOISE", "check_given", "parse_overrides"]

#: esft's fast configuration, measured by default: esft.config.FAST_CPU_GENERATION (shared-prefix and
#: length-bucketed prefill, oneDNN packed linears, the compiled attention kernel) and noise from the shared table.
#: `--exact` measures the bit-exact defaults instead (per-tensor noise, plain prefill, torch ops: outputs
#: bit-identical to model.generate's arithmetic).
FAST_GENERATION: dict[str, Any] = dict(FAST_CPU_GENERATION)
FAST_NOISE = "table"


@dataclass
class BenchConfig(ConfigHooks):
    """What `esft bench` runs (one flag per field, via esft.config; `--set KEY=VALUE` adds generation overrides)."""

    model: str = "smollm2-135m"
    """model name or folder"""
    workloads: list[str] = field(default_factory=lambda: list(WORKLOADS))
    """comma-separated: decode-heavy,cpu-preset"""
    repeats: int = 1
    """esft and naive iterations per workload; the fastest of each is reported (every one's time in
    `esft_iterations_s` and `naive_iterations_s`)"""
    threads: int | None = None
    """torch intra-op threads (None = torch's default)"""
    population: int = 4
    """N members (the acceptance numbers use 4)"""
    exact: bool = False
    """measure the bit-exact defaults (per-tensor noise, no shared-prefix prefill, one member at a time) instead of
    esft's fast configuration"""
    noise: str | None = None
    """esft noise mode for the esft iteration (`MasterWeights` noise modes, "per-tensor" being the ES default, or
    "lowrank": EGGROLL populations, all members in one batched generation, esft.es.lowrank); None = table, or
    per-tensor with --exact"""
    rank: int = 1
    """rank r of the "lowrank" noise (another rank than 1 with another noise is refused)"""
    naive: bool = True
    """also time the naive iteration (needed for speedup_vs_naive)"""
    generation: dict[str, Any] | None = None
    """overrides of `GenerationConfig` fields for the esft engine (None = FAST_GENERATION, or none with --exact;
    lever experiments)"""
    parallel_members: int | None = None
    """members the local executor evaluates at once, one thread each (`ESConfig.parallel_members`); the lanes'
    model copies are made and warmed (one member per lane, one token: `esft.bench.iterations.warm_up`) before
    the timed iteration, as a training run's later iterations find them; None = each workload's own (two lanes
    for decode-heavy, the `cpu` preset's one for cpu-preset), or 1 with --exact"""
    workers: int = 1
    """members evaluated in parallel, each by its own model replica in a Ray worker process with
    `threads // workers` torch threads (esft's `--executor ray`); 1 = the local executor in this process"""
    seed: int = 0
    """seed of the ES population (its member noise)"""
    check_outputs: bool = False
    """also generate each workload's batch once with esft's engine (these generation options) and once with
    `model.generate`, on the unperturbed model, and report how many greedy completions are identical"""
    rollout_dtype: str | None = None
    """members' rollout precision (`ESConfig.rollout_dtype`): auto (bf16 on CPUs with native bf16, confirmed by a
    probe), float32 or bfloat16; None = auto, or float32 with --exact"""
    compare_fp32: bool = True
    """when the rollouts run in bf16, also time the same iteration with fp32 rollouts (`speedup_vs_fp32`)"""
    inference: bool = True
    """also time pure batched generation of the same prompts (population times, same lanes and dtype) for
    `inference_ratio`"""
    vllm: bool = True
    """with --inference, also time vLLM's pure generation of the same prompts where vLLM is installed (its CPU
    build in its own environment, scripts/vllm_venv.sh), in a spawned process after esft's measurements"""
    memory_rounds: int = 0
    """after the workloads, also measure peak memory: this many alternated rounds of the `cpu` preset's one ES
    iteration and an evaluation of its batch, each an `esft` process of its own (esft.bench.memory); the
    report's `memory` gives each round's peak RSS and ES over the evaluation"""

    def __post_init__(self) -> None:
        # unset options take esft's fast configuration, or the bit-exact defaults with `exact`
        if self.noise is None:
            self.noise = "per-tensor" if self.exact else FAST_NOISE
        if self.generation is None:
            self.generation = {} if self.exact else dict(FAST_GENERATION)
        if self.parallel_members is None and self.exact:
            self.parallel_members = 1
        if self.rollout_dtype is None:
            self.rollout_dtype = "float32" if self.exact else "auto"

    def check(self) -> None:
        """Fail before the model loads on a workload name, lane count, noise mode or rank that cannot run."""
        if not self.workloads:  # the model would load and the matmul be timed for an empty table
            raise ValueError(f"--workloads: none given; choose from {', '.join(WORKLOADS)}")
        for k, w in enumerate(self.workloads):
            if w not in WORKLOADS:
                raise ValueError(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
            if w in self.workloads[:k]:  # the report holds one entry per name: the second run would replace it
                raise ValueError(f"--workloads: {w!r} is given twice")
        if self.population < 2:  # as ESConfig: one member's shaped fitness is 0, and the Ray path builds an ESConfig
            raise ValueError(f"--population must be >= 2 (an ES iteration standardises its members' fitness), "
                             f"got {self.population}")
        check_fields(self, BENCH_RULES)  # ConfigError: build_config names the flag
        from esft.es.noise_seeds import NOISE_MODES

        if self.noise not in (*NOISE_MODES, "lowrank"):
            raise ValueError(f"--noise: unknown noise mode {self.noise!r}; choose one of {(*NOISE_MODES, 'lowrank')}")
        if self.rank != 1 and self.noise != "lowrank":  # the full-rank noise would be timed under the rank asked for
            raise ValueError(f"--rank {self.rank}: only --noise lowrank reads it (noise {self.noise!r} draws "
                             "full-rank perturbations)")
        if self.noise == "lowrank" and self.workers > 1:
            raise ValueError("--workers: a low-rank population is one batched generation in one process")
        if self.workers > 1 and importlib.util.find_spec("ray") is None:  # else an ImportError once the model loaded
            raise ValueError("--workers: the workers are Ray processes, and Ray is not installed: "
                             "pip install 'esft[ray]'")
        if self.rollout_dtype == "bfloat16" and (self.noise == "lowrank" or self.workers > 1):
            # as ESConfig refuses it: the bench would time fp32 rollouts under the bf16 label asked for
            raise ValueError("--rollout-dtype bfloat16: bf16 rollouts run on local member lanes only, not with "
                             "--noise lowrank or --workers; use --rollout-dtype float32 or auto")


#: what BenchConfig's fields accept beyond their type; a bad value would otherwise fail after the model loads and
#: the matmul is timed (rollout_dtype), with a bare Python error (repeats 0, threads < 1), or run a mislabelled
#: layout (workers 0 is neither the local executor nor Ray workers)
BENCH_RULES = {"repeats": at_least(1), "threads": at_least(1), "parallel_members": at_least(1), "workers": at_least(1),
               "rank": at_least(1), "seed": at_least(0), "rollout_dtype": one_of("auto", "float32", "bfloat16"),
               "memory_rounds": at_least(0)}


def check_given(config: BenchConfig, given: dict[str, Any]) -> None:
    """Refuse a flag the user typed (`given`: field -> value) that `config` would ignore without a word, before the
    model loads. A false value (`--no-vllm`, `--parallel-members 1`) asks for nothing more and passes."""
    from esft.bench.inference import vllm_available

    if given.get("vllm") and not config.inference:
        raise ValueError("--vllm: vLLM is timed in the pure-generation comparison, which --no-inference turns off; "
                         "drop one of the two")
    if config.noise == "lowrank" or config.workers > 1:
        layout = "--noise lowrank" if config.noise == "lowrank" else f"--workers {config.workers}"
        pure = "the pure-generation comparison runs on local member lanes only"
        why = {"inference": pure, "vllm": pure, "parallel_members": "member lanes are the local executor's",
               "compare_fp32": "its rollouts are fp32: bf16 rollouts run on local member lanes only"}
        for key, reason in why.items():
            if given.get(key) and not (key == "parallel_members" and given[key] == 1):
                raise ValueError(f"--{key.replace('_', '-')}: not with {layout}: {reason}")
    if given.get("compare_fp32") and config.rollout_dtype == "float32":
        source = "--rollout-dtype float32" if "rollout_dtype" in given else "--exact"
        raise ValueError(f"--compare-fp32: the rollouts are fp32 already ({source}), so there is nothing to compare")
    if given.get("vllm") and not vllm_available():
        raise ValueError("--vllm: vLLM is not installed in this Python environment (its CPU build lives in its own: "
                         "run esft bench from the environment scripts/vllm_venv.sh makes), or drop --vllm")


#: GenerationConfig fields that define what the workload generates, not how the esft engine runs: an override
#: would reach the esft iteration and its pure generation only
WORKLOAD_FIELDS = ("max_new_tokens", "min_new_tokens", "temperature", "top_p", "seed")


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """`key=value` pairs for GenerationConfig (values parsed as YAML scalars: true, 64, 0.5, hf), each value
    checked as GenerationConfig checks it, so that a bad one is refused before the model loads."""
    import yaml

    from esft.generation import GenerationConfig

    names = {f.name for f in dataclasses.fields(GenerationConfig)} - set(WORKLOAD_FIELDS)
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if sep and key in WORKLOAD_FIELDS:
            raise ValueError(f"--set {key}: the workload's, not an engine option: the naive iteration, vLLM and the "
                             f"output check would still use the workload's own, so the comparisons would not hold")
        if not sep or key not in names:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE with KEY a GenerationConfig engine field "
                             f"({', '.join(sorted(names))})")
        try:
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or "not valid YAML"  # one line, not YAML's marked excerpt
            raise ValueError(f"--set {key}: {value!r} is not a YAML value ({problem})") from None
    try:
        GenerationConfig(**out)
    except ValueError as exc:
        raise ValueError(f"--set: {exc}") from None
    return out
