"""Experiment specs: parse a YAML file into a validated `Spec`, failing before any compute with the line named.

    name: cpu-mini-sequential
    kind: sequential                 # or single-task
    model: smollm2-135m
    tasks: [countdown, math, chemistry, boolq]   # the order is the training order for `sequential`
    seeds: [42, 52, 62]
    algorithms:                      # label -> option block (ESConfig / GRPOConfig fields, validated)
      es: {preset: cpu, iterations: [100, 300], per_task: {math: {max_new_tokens: 64}}}
      grpo: {preset: cpu, max_steps: 80}
      dart-es: {algorithm: es, fitness_rule: dart}     # a variant: any label, `algorithm` names the trainer
      grpo->es: {grpo: {max_steps: 40}, es: {iterations: 50}}   # a chain: the stage runs grpo, then es
    task_options: {boolq: {max_passage_chars: 400}}  # task constructor options, for training and evaluation
    evaluation: {limit: 50, max_new_tokens: 64, holdout: [mmlu, ifeval], per_task: {ifeval: {limit: 20}}}
    # evaluation.checkpoints: true (or [countdown, mmlu]) evaluates every intermediate checkpoint too
    sequential: {carry_optimizer_state: false}
    tables: {ifeval_metric: prompt_strict}

Fields the experiment itself sets (model, task, seed, output_dir, resume, and ES's noise_stream, one per ES run of
a chain: esft.experiments.plan) may not appear in option blocks; neither may task options (`max_passage_chars`,
`task_options`), which live at the top level so that training and evaluation see the same prompts.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from esft.experiments.algorithms import ALGORITHMS, Algorithm, get_algorithm
from esft.experiments.spec_checks import (
    SpecContext, as_mapping, check_bool, check_carried_state, check_checkpoint_tasks, check_eval_device,
    check_eval_dtype, check_evaluated_tasks, check_int, check_keys, check_options, check_spec_model, check_task_fit,
    check_task_list, check_text, check_trained_tasks_evaluated, check_unread_eval, did_you_mean, unused_task_options,
)
from esft.experiments.yamlines import LineDict, LineList, SpecError, load_file

KINDS = ("single-task", "sequential")
TOP_KEYS = ("name", "description", "kind", "model", "tasks", "seeds", "algorithms", "task_options", "evaluation",
            "sequential", "tables", "output_dir")
BLOCK_KEYS = ("algorithm", "preset", "display", "per_task")
EVAL_KEYS = ("tasks", "holdout", "limit", "max_new_tokens", "batch_size", "dtype", "device", "per_task",
             "after_single_task", "passk", "balanced", "generation_options", "checkpoints")
PASSK_KEYS = ("samples", "temperature", "top_p", "k", "tasks", "seed")
EVAL_TASK_KEYS = ("limit", "max_new_tokens", "batch_size", "balanced")
AFTER_SINGLE_TASK = ("all", "trained", "trained+holdout")
IFEVAL_METRICS = ("accuracy", "prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose")
CHAIN = "->"


@dataclass
class Component:
    """One trainer run inside a stage: an algorithm with its preset and option overrides."""

    algorithm: str
    preset: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    per_task: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def spec(self) -> Algorithm:
        return get_algorithm(self.algorithm)

    def overrides(self, task: str) -> dict[str, Any]:
        return {**self.options, **self.per_task.get(task, {})}


@dataclass
class Method:
    """An entry of `algorithms`: a label, its display name and its components (several for a chain such as
    `grpo->es`: the hook for hybrid schedules). `budgets` are the training budgets of a single-component method
    whose trainer can extend a finished run (ES iterations): one run is snapshotted at each budget."""

    label: str
    display: str
    components: list[Component]
    budgets: list[int] = field(default_factory=list)
    line: int = 0

    @property
    def is_chain(self) -> bool:
        return len(self.components) > 1


@dataclass
class TaskEval:
    limit: int | None
    max_new_tokens: int
    batch_size: int
    balanced: bool = False


@dataclass
class PassKSpec:
    """Sampled evaluation beside the greedy one (`evaluation.passk`): n completions per question at a temperature,
    reported as pass@k, mean@n and maj@k with bootstrap CIs (esft.evaluation.evaluate_task_sampled)."""

    samples: int
    k: list[int]
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    tasks: list[str] = field(default_factory=list)
    """tasks to sample on (default: the spec's training tasks)"""

    def settings(self) -> dict[str, Any]:
        return {"samples": self.samples, "k": list(self.k), "temperature": self.temperature, "top_p": self.top_p,
                "seed": self.seed}


@dataclass
class EvalSpec:
    tasks: list[str]
    holdout: list[str]
    limit: int | None = None
    max_new_tokens: int = 1024
    batch_size: int = 32
    dtype: str = "auto"
    device: str | None = None
    per_task: dict[str, dict[str, Any]] = field(default_factory=dict)
    passk: PassKSpec | None = None
    balanced: bool = False
    """evaluate tasks that have a label set on a label-balanced subset of `limit` held-out examples
    (esft.evaluation.load_examples; a Countdown variant balances over the target's operator); per_task overrides"""
    generation_options: dict[str, Any] = field(default_factory=dict)
    """how the engine runs every evaluation: {} = the exact path (greedy outputs equal `model.generate`'s), "fast" in
    the YAML = esft.config.FAST_CPU_GENERATION (~5x faster on CPU, logits equal to ~1e-6), or a mapping of
    esft.generation.ENGINE_OPTIONS. Part of each evaluation's recorded settings."""
    after_single_task: str = "all"
    """after a single-task stage evaluate "all" (every spec task and the holdouts), "trained" (its own task) or
    "trained+holdout" (its own task and the holdouts)"""
    checkpoints: list[str] = field(default_factory=list)
    """tasks each intermediate checkpoint of a stage is evaluated on (esft.experiments.checkpoint_eval); YAML true =
    `tasks`, false (the default) = none, or a list of evaluated tasks"""

    def for_task(self, task: str) -> TaskEval:
        o = self.per_task.get(task, {})
        return TaskEval(limit=o.get("limit", self.limit), max_new_tokens=o.get("max_new_tokens", self.max_new_tokens),
                        batch_size=o.get("batch_size", self.batch_size), balanced=o.get("balanced", self.balanced))

    @property
    def all_tasks(self) -> list[str]:
        return list(dict.fromkeys([*self.tasks, *self.holdout]))


@dataclass
class Spec:
    name: str
    kind: str
    model: str
    tasks: list[str]
    seeds: list[int]
    methods: list[Method]
    evaluation: EvalSpec
    task_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    carry_optimizer_state: bool = False
    """sequential GRPO stages start with the previous stage's AdamW moments (fresh LR schedule) when True"""
    ifeval_metric: str = "prompt_strict"
    output_dir: str | None = None
    description: str = ""
    path: str | None = None

    def method(self, label: str) -> Method:
        return next(m for m in self.methods if m.label == label)

    def config(self, component: Component, task: str, seed: int, budget: int | None = None, **runner: Any) -> Any:
        """The trainer config of `component` on `task` for `seed` (budget and runner fields on top)."""
        from esft.config import build_config

        algo = component.spec
        names = {f.name for f in dataclasses.fields(algo.config_cls)}
        # task options come from the spec's top level (a preset's BoolQ passage cut must not reach other tasks)
        task_fields = {"max_passage_chars": None, "task_options": dict(self.task_options.get(task, {}))}
        values = {**component.overrides(task), "task": task, "seed": seed, "model": self.model,
                  **{k: v for k, v in task_fields.items() if k in names}, **runner}
        if budget is not None:
            values[algo.budget_field] = budget
        return build_config(algo.config_cls, algo.presets, component.preset, None, values, overrides_source="spec")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if not self.evaluation.checkpoints:  # plan.json's spec as written before the option existed
            del out["evaluation"]["checkpoints"]
        return out


# ---- parsing ------------------------------------------------------------------------------------------------------

def _component(ctx: SpecContext, block: LineDict, algo_name: str, where: str, tasks: list[str],
               allow_budget_list: bool) -> Component:
    algo = get_algorithm(algo_name)
    preset = block.get("preset")
    if preset is not None and preset not in algo.presets:
        raise ctx.error(block.line_of("preset"), f"{where}: unknown preset {preset!r} for {algo_name}"
                                                 f"{did_you_mean(preset, algo.presets)}; "
                                                 f"available: {', '.join(algo.presets)}")
    options = check_options(ctx, block, algo, where, skip=BLOCK_KEYS, allow_budget_list=allow_budget_list)
    per_task: dict[str, dict[str, Any]] = {}
    raw = as_mapping(ctx, block.get("per_task"), f"{where}.per_task", block.line_of("per_task"))
    for task, sub in raw.items():
        line = raw.line_of(task)
        if task not in tasks:
            raise ctx.error(line, f"{where}.per_task: {task!r} is not one of the spec's tasks ({', '.join(tasks)})")
        sub = as_mapping(ctx, sub, f"{where}.per_task.{task}", line)
        per_task[task] = check_options(ctx, sub, algo, f"{where}.per_task.{task}")
        budgets = options.get(algo.budget_field)
        if isinstance(budgets, list) and algo.budget_field in per_task[task]:
            key = next(k for k in sub if str(k).replace("-", "_") == algo.budget_field)  # as written: iterations
            raise ctx.error(sub.line_of(key), f"{where}.per_task.{task}: a per-task {algo.budget_field} cannot be "
                                              f"combined with the budget list {budgets}")
    return Component(algorithm=algo_name, preset=preset, options=options, per_task=per_task)


def _default_display(label: str) -> str:
    return CHAIN.join(part.upper() for part in label.split(CHAIN))


def _methods(ctx: SpecContext, raw: Any, line: int, tasks: list[str]) -> list[Method]:
    if isinstance(raw, list):  # `algorithms: [es, grpo]`: defaults for each
        items = LineDict()
        items.line = line
        for i, name in enumerate(raw):
            items[str(name)] = None
            items.key_lines[str(name)] = raw.line_of(i) if isinstance(raw, LineList) else line
        raw = items
    raw = as_mapping(ctx, raw, "algorithms", line)
    if not raw:
        raise ctx.error(line, "algorithms: at least one algorithm is needed (es, grpo, ...)")
    methods = []
    for label, block in raw.items():
        label = str(label)
        bline = raw.line_of(label)
        block = as_mapping(ctx, block, f"algorithms.{label}", bline)
        name = block.get("algorithm", label)
        where = f"algorithms.{label}"
        if not isinstance(name, str):
            raise ctx.error(block.line_of("algorithm"), f"{where}.algorithm must be a name, got {name!r}")
        parts = [p.strip() for p in name.split(CHAIN)]
        for part in parts:
            if part not in ALGORITHMS:
                at = block.line_of("algorithm") if "algorithm" in block else bline
                raise ctx.error(at, f"unknown algorithm {part!r} in {where}{did_you_mean(part, ALGORITHMS)}; "
                                    f"known: {', '.join(ALGORITHMS)} (or a chain such as grpo->es)")
        display = block.get("display") or _default_display(label)
        if len(parts) == 1:
            comp = _component(ctx, block, parts[0], where, tasks, allow_budget_list=get_algorithm(parts[0]).extendable)
            budgets = comp.options.pop(comp.spec.budget_field, None)
            if not isinstance(budgets, list):
                if budgets is not None:
                    comp.options[comp.spec.budget_field] = budgets
                budgets = None
            methods.append(Method(label, str(display), [comp], budgets or [], bline))
            continue
        # a chain: each component starts from the base block of the same name (if any), then its sub-block
        check_keys(ctx, block, ("algorithm", "display", *dict.fromkeys(parts)), where)
        comps = []
        for part in parts:
            base = raw.get(part) if part in raw and CHAIN not in part else None
            base = as_mapping(ctx, base, f"algorithms.{part}", raw.line_of(part))
            sub = as_mapping(ctx, block.get(part), f"{where}.{part}", block.line_of(part))
            merged = LineDict({**base, **sub})
            merged.line = sub.line or base.line
            merged.key_lines = {**base.key_lines, **sub.key_lines}
            comps.append(_component(ctx, merged, part, f"{where}.{part}", tasks, allow_budget_list=False))
        methods.append(Method(label, str(display), comps, [], bline))
    return methods


def _evaluation(ctx: SpecContext, raw: Any, line: int, tasks: list[str], known: typing.Sequence[str]) -> EvalSpec:
    from esft.tasks import HOLDOUT_TASKS

    block = as_mapping(ctx, raw, "evaluation", line)
    check_keys(ctx, block, EVAL_KEYS, "evaluation")
    ev = EvalSpec(tasks=list(tasks), holdout=list(HOLDOUT_TASKS))
    if "tasks" in block:
        ev.tasks = check_task_list(ctx, block["tasks"], block.line_of("tasks"), "evaluation.tasks", known)
    if "holdout" in block:
        ev.holdout = check_task_list(ctx, block["holdout"] or [], block.line_of("holdout"), "evaluation.holdout",
                                     known)
    if "limit" in block:
        ev.limit = check_int(ctx, block["limit"], block.line_of("limit"), "evaluation.limit", 1, optional=True)
    if "max_new_tokens" in block:
        ev.max_new_tokens = check_int(ctx, block["max_new_tokens"], block.line_of("max_new_tokens"),
                                      "evaluation.max_new_tokens", 1)
    if "batch_size" in block:
        ev.batch_size = check_int(ctx, block["batch_size"], block.line_of("batch_size"), "evaluation.batch_size", 1)
    for key in ("dtype", "device"):
        if key in block and block[key] is not None and not isinstance(block[key], str):
            raise ctx.error(block.line_of(key), f"evaluation.{key} must be a string, got {block[key]!r}")
    ev.dtype = check_eval_dtype(ctx, block.get("dtype", ev.dtype) or "auto", block.line_of("dtype"))
    ev.device = check_eval_device(ctx, block.get("device", ev.device), block.line_of("device"))
    if "after_single_task" in block:
        value = block["after_single_task"]
        if value not in AFTER_SINGLE_TASK:
            raise ctx.error(block.line_of("after_single_task"), f"evaluation.after_single_task must be one of "
                                                                f"{', '.join(AFTER_SINGLE_TASK)}, got {value!r}")
        ev.after_single_task = value
    if "balanced" in block:
        ev.balanced = check_bool(ctx, block["balanced"], block.line_of("balanced"), "evaluation.balanced")
    if "generation_options" in block:
        from esft.generation import engine_options

        try:
            ev.generation_options = engine_options(block["generation_options"])
        except ValueError as exc:
            raise ctx.error(block.line_of("generation_options"), f"evaluation.{exc}") from None
    if "checkpoints" in block:
        ev.checkpoints = check_checkpoint_tasks(ctx, block["checkpoints"], block.line_of("checkpoints"), ev.tasks,
                                                ev.all_tasks)
    if block.get("passk") is not None:
        ev.passk = _passk(ctx, block["passk"], block.line_of("passk"), tasks, ev.all_tasks)
    per = as_mapping(ctx, block.get("per_task"), "evaluation.per_task", block.line_of("per_task"))
    for task, sub in per.items():
        tline = per.line_of(task)
        if task not in ev.all_tasks:
            raise ctx.error(tline, f"evaluation.per_task: {task!r} is not evaluated by this spec "
                                   f"({', '.join(ev.all_tasks)})")
        sub = as_mapping(ctx, sub, f"evaluation.per_task.{task}", tline)
        check_keys(ctx, sub, EVAL_TASK_KEYS, f"evaluation.per_task.{task}")
        ev.per_task[task] = {k: check_bool(ctx, v, sub.line_of(k), f"evaluation.per_task.{task}.{k}")
                             if k == "balanced" else
                             check_int(ctx, v, sub.line_of(k), f"evaluation.per_task.{task}.{k}", 1,
                                       optional=(k == "limit")) for k, v in sub.items()}
    return ev


def _passk(ctx: SpecContext, raw: Any, line: int, tasks: list[str], evaluated: list[str]) -> PassKSpec:
    block = as_mapping(ctx, raw, "evaluation.passk", line)
    check_keys(ctx, block, PASSK_KEYS, "evaluation.passk")
    if "samples" not in block:
        raise ctx.error(line, "evaluation.passk needs samples (completions per question, e.g. 8)")
    samples = check_int(ctx, block["samples"], block.line_of("samples"), "evaluation.passk.samples", 2)
    ks = block.get("k", [1, samples])
    ks = ks if isinstance(ks, list) else [ks]
    if not ks:  # no k would leave mean@n alone, silently: pass@k and maj@k are what passk is asked for
        raise ctx.error(block.line_of("k"), f"evaluation.passk.k must name at least one k between 1 and samples "
                                            f"({samples}), got []")
    for k in ks:
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= samples:
            raise ctx.error(block.line_of("k") if "k" in block else line,
                            f"evaluation.passk.k must be integers between 1 and samples ({samples}), got {k!r}")
    numbers = {}
    for key, default, low, high in (("temperature", 1.0, 1e-6, 10.0), ("top_p", 1.0, 1e-6, 1.0)):
        value = block.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ctx.error(block.line_of(key), f"evaluation.passk.{key} must be a number in (0, {high}], "
                                                f"got {value!r} (sampling needs temperature > 0)")
        numbers[key] = float(value)
    seed = check_int(ctx, block.get("seed", 0), block.line_of("seed") if "seed" in block else line,
                     "evaluation.passk.seed", 0)
    chosen = list(tasks)
    if "tasks" in block:
        chosen = check_task_list(ctx, block["tasks"], block.line_of("tasks"), "evaluation.passk.tasks", evaluated,
                                 closed=True)
    return PassKSpec(samples=samples, k=sorted(set(ks)), seed=seed, tasks=chosen, **numbers)


def _task_options(ctx: SpecContext, raw: Any, line: int, used: typing.Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per-task constructor options of the tasks the spec trains or evaluates (`used`), checked by building each
    task (cheap: data loads lazily)."""
    from esft.tasks import get_task

    block = as_mapping(ctx, raw, "task_options", line)
    out = {}
    for task, opts in block.items():
        tline = block.line_of(task)
        if task not in used:
            raise ctx.error(tline, unused_task_options(task, used))
        opts = dict(as_mapping(ctx, opts, f"task_options.{task}", tline))
        try:
            get_task(task, **opts)
        except (TypeError, ValueError, FileNotFoundError) as exc:
            raise ctx.error(tline, f"task_options.{task}: {exc}") from None
        out[task] = opts
    return out


def parse_spec(data: Any, path: str = "<spec>", name: str | None = None) -> Spec:
    """Validate a loaded YAML document (LineDict) into a Spec; every error names its line."""
    from esft.tasks import TASK_NAMES

    ctx = SpecContext(path)
    if not isinstance(data, dict):
        raise ctx.error(1, "an experiment spec is a mapping of keys (kind, model, tasks, seeds, algorithms, ...)")
    data = as_mapping(ctx, data, "spec", 1)
    check_keys(ctx, data, TOP_KEYS, "the spec")
    for key in ("kind", "tasks", "algorithms"):
        if key not in data:
            raise ctx.error(data.line or 1, f"missing required key {key!r}")
    kind = data["kind"]
    if kind not in KINDS:
        raise ctx.error(data.line_of("kind"), f"unknown kind {kind!r}{did_you_mean(kind, KINDS)}; "
                                              f"one of: {', '.join(KINDS)}")
    tasks = check_task_list(ctx, data["tasks"], data.line_of("tasks"), "tasks", TASK_NAMES)
    if not tasks:
        raise ctx.error(data.line_of("tasks"), "tasks: at least one task is needed")
    seeds_raw = data.get("seeds", [42])
    if isinstance(seeds_raw, int) and not isinstance(seeds_raw, bool):
        seeds_raw = [seeds_raw]
    if not isinstance(seeds_raw, list) or not seeds_raw:
        raise ctx.error(data.line_of("seeds"), f"seeds must be a non-empty list of integers, got {seeds_raw!r}")
    seeds = [check_int(ctx, s, seeds_raw.line_of(i) if isinstance(seeds_raw, LineList) else data.line_of("seeds"),
                       "seeds[]", 0) for i, s in enumerate(seeds_raw)]
    if len(set(seeds)) != len(seeds):
        raise ctx.error(data.line_of("seeds"), f"seeds repeat: {seeds}")
    model = data.get("model", "smollm2-135m")
    if not isinstance(model, str) or not model:
        raise ctx.error(data.line_of("model"), f"model must be a name or a path, got {model!r}")
    methods = _methods(ctx, data["algorithms"], data.line_of("algorithms"), tasks)
    evaluation = _evaluation(ctx, data.get("evaluation"), data.line_of("evaluation"), tasks, TASK_NAMES)
    # the evaluated tasks may be data files, module:Class or installed tasks too; evaluation builds each with its
    # task_options
    used = list(dict.fromkeys([*tasks, *evaluation.all_tasks]))
    task_options = _task_options(ctx, data.get("task_options"), data.line_of("task_options"), used)

    seq = as_mapping(ctx, data.get("sequential"), "sequential", data.line_of("sequential"))
    check_keys(ctx, seq, ("carry_optimizer_state",), "sequential")
    carry = seq.get("carry_optimizer_state", False)
    if not isinstance(carry, bool):
        raise ctx.error(seq.line_of("carry_optimizer_state"), "sequential.carry_optimizer_state must be true/false")
    if seq and kind != "sequential":
        raise ctx.error(data.line_of("sequential"), "the `sequential` block only applies to kind: sequential")
    ev_raw = as_mapping(ctx, data.get("evaluation"), "evaluation", data.line_of("evaluation"))
    if "after_single_task" in ev_raw and kind != "single-task":  # sequential stages evaluate every task
        raise ctx.error(ev_raw.line_of("after_single_task"), "evaluation.after_single_task only applies to kind: "
                                                              "single-task (a sequential stage evaluates every task)")
    tables = as_mapping(ctx, data.get("tables"), "tables", data.line_of("tables"))
    check_keys(ctx, tables, ("ifeval_metric",), "tables")
    metric = tables.get("ifeval_metric", "prompt_strict")
    if metric not in IFEVAL_METRICS:
        raise ctx.error(tables.line_of("ifeval_metric"), f"tables.ifeval_metric must be one of "
                                                          f"{', '.join(IFEVAL_METRICS)}, got {metric!r}")
    spec = Spec(name=check_text(ctx, data, "name", "a name") or name or "experiment", kind=kind, model=model,
                tasks=tasks, seeds=seeds, methods=methods, evaluation=evaluation, task_options=task_options,
                carry_optimizer_state=carry, ifeval_metric=metric,
                output_dir=check_text(ctx, data, "output_dir", "a folder path"),
                description=check_text(ctx, data, "description", "a text") or "", path=path)
    _check_configs(ctx, spec)
    check_unread_eval(ctx, spec, data)
    check_trained_tasks_evaluated(ctx, spec, data)
    check_evaluated_tasks(ctx, spec, data)
    check_carried_state(ctx, spec, data)
    return spec


def _check_configs(ctx: SpecContext, spec: Spec) -> None:
    """Build every trainer config the experiment will use (each method x task x budget), so a value the config
    itself rejects (e.g. GRPO batch shapes that do not divide) fails here, at the method's line."""
    from esft.tracking import check_backends
    from esft.validation import check_context

    built: dict[Any, Any] = {}
    for method in spec.methods:
        line = method.line
        for comp in method.components:
            for task in spec.tasks:
                for budget in method.budgets or [None]:
                    try:
                        config = spec.config(comp, task, spec.seeds[0], budget, output_dir="<check>")
                        check_task_fit(config, built)
                        check_context(spec.model, config.generation_limits())  # a KV cache past any memory
                        check_backends(config.report_to)  # a tracker not installed, before the base model's eval
                        if len(method.budgets) > 1 and config.save_total_limit:
                            # the budgets share one run, snapshotted at each budget as a numbered checkpoint
                            raise ValueError("save_total_limit would delete the checkpoints this method keeps at "
                                             "each of its budgets; leave it at 0 with a list of budgets")
                    except (ValueError, TypeError, FileNotFoundError) as exc:  # a data file task that is not there
                        raise ctx.error(line, f"algorithms.{method.label} ({comp.algorithm}) on {task}: {exc}") \
                            from None


def load_spec(path_or_name: str | Path) -> Spec:
    """A spec from a YAML file, or a shipped spec by name (`cpu-mini-sequential`, see `shipped_specs()`)."""
    path = resolve_spec_path(path_or_name)
    return parse_spec(load_file(path), str(path), name=path.stem)


def shipped_specs() -> dict[str, Path]:
    """Specs bundled with esft (src/esft/experiments/specs), by name."""
    folder = Path(__file__).parent / "specs"
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def resolve_spec_path(path_or_name: str | Path) -> Path:
    path = Path(path_or_name)
    if path.is_dir():  # e.g. an experiment's output folder, which keeps its spec as spec.yaml
        hint = f": its spec is {path / 'spec.yaml'}" if (path / "spec.yaml").is_file() else ""
        raise IsADirectoryError(f"{path} is a folder, not a spec file (YAML){hint}")
    if path.exists():
        return path
    shipped = shipped_specs()
    key = str(path_or_name)[:-5] if str(path_or_name).endswith(".yaml") else str(path_or_name)
    if key in shipped:
        return shipped[key]
    from esft.names import did_you_mean

    raise FileNotFoundError(f"no spec file {path_or_name!r}, and no shipped spec of that name"
                            f"{did_you_mean(key, shipped)}; shipped: {', '.join(shipped)}")
