"""The checks experiment specs are parsed with (esft.experiments.spec): each value against what it must be, the
error naming the file and line (`SpecContext.error`), with close matches for a misspelt name."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

from esft.experiments.algorithms import Algorithm
from esft.experiments.yamlines import LineDict, LineList, SpecError, load_file, plain

#: fields the experiment sets itself (esft.experiments.plan), never an option block
RUNNER_FIELDS = ("model", "task", "seed", "output_dir", "resume", "noise_stream")
#: task options, which live at the spec's top level so that training and evaluation see the same prompts
TASK_OPTION_FIELDS = ("max_passage_chars", "task_options")


class SpecContext:
    """Formats `file:line: message` errors."""

    def __init__(self, path: str):
        self.path = path

    def error(self, line: int, message: str) -> SpecError:
        return SpecError(f"{self.path}:{line}: {message}" if line else f"{self.path}: {message}")


def did_you_mean(name: Any, choices: typing.Iterable[str]) -> str:
    from esft.names import close_names

    close = close_names(str(name), choices)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def unknown_option_hint(algo: Algorithm, name: str, names: typing.Iterable[str]) -> str:
    """What an unknown option of `algo` means, as for a config file (esft.config.coerce): its config's
    `unknown_option_hint` (the close matches by default; GRPOConfig also tells a TRL user where TRL's options go),
    or the other trainer's command where `name` is its option."""
    from esft.config import unknown_option_words

    return unknown_option_words(algo.config_cls, name, names)


def as_mapping(ctx: SpecContext, value: Any, where: str, line: int) -> LineDict:
    if value is None:
        out = LineDict()
        out.line = line
        return out
    if not isinstance(value, dict):
        raise ctx.error(line, f"{where} must be a mapping, got {value!r}")
    if not isinstance(value, LineDict):  # built from Python (tests, API): no lines
        out = LineDict(value)
        out.line = line
        return out
    return value


def check_keys(ctx: SpecContext, block: LineDict, allowed: typing.Iterable[str], where: str) -> None:
    allowed = list(allowed)
    for key in block:
        if key not in allowed:
            raise ctx.error(block.line_of(key), f"unknown key {key!r} in {where}{did_you_mean(key, allowed)}; "
                                                f"allowed: {', '.join(allowed)}")


def check_int(ctx: SpecContext, value: Any, line: int, where: str, minimum: int | None = None,
              optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ctx.error(line, f"{where} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ctx.error(line, f"{where} must be >= {minimum}, got {value}")
    return value


def check_bool(ctx: SpecContext, value: Any, line: int, where: str) -> bool:
    if not isinstance(value, bool):
        raise ctx.error(line, f"{where} must be true or false, got {value!r}")
    return value


def check_checkpoint_tasks(ctx: SpecContext, value: Any, line: int, trained: list[str],
                           evaluated: list[str]) -> list[str]:
    """`evaluation.checkpoints`: false (none, the default), true (`trained`, the tasks evaluation.tasks names) or a
    list among the `evaluated` tasks. Checked here, before any model loads: a typo would otherwise surface only
    after a stage has trained, as curves that are silently missing."""
    if isinstance(value, bool):
        return list(trained) if value else []
    if not isinstance(value, (list, str)):
        raise ctx.error(line, f"evaluation.checkpoints must be true, false or a list of evaluated tasks, got "
                              f"{value!r}")
    return check_task_list(ctx, value, line, "evaluation.checkpoints", evaluated, closed=True)


def check_eval_dtype(ctx: SpecContext, dtype: str, line: int) -> str:
    """The dtype every evaluation loads its model in, as `esft eval` accepts it: a name the loader does not know
    failed each stage's evaluation only after its training had run."""
    from esft.eval_config import EVAL_RULES

    rule = EVAL_RULES["dtype"]
    if not rule.ok(dtype):
        raise ctx.error(line, f"evaluation.dtype must be {rule.accepted}, got {dtype!r}")
    return dtype


def check_eval_device(ctx: SpecContext, device: str | None, line: int) -> str | None:
    """The device every evaluation loads its model on (None: the loader's default), as a torch device name: a name
    torch does not know failed each stage's evaluation only after its training had run. Whether this machine has
    that device is not asked here: a spec is read on other machines than the one it runs on (the shipped paper
    specs name cuda and parse on a laptop)."""
    if device is None:
        return None
    from esft.config import ConfigError
    from esft.validation import check_device_name

    try:
        check_device_name("evaluation.device", device)
    except ConfigError:
        raise ctx.error(line, f"evaluation.device must be a torch device (cpu, cuda, cuda:N or mps), got {device!r}") \
            from None
    return device


def check_text(ctx: SpecContext, block: LineDict, key: str, what: str) -> str | None:
    """A scalar top-level value (name, description, output_dir) as text, None when absent; a mapping or a list
    there is refused at its line (an output_dir of 5 used to fail only when the runner made the folder)."""
    value = block.get(key)
    if value is None:
        return None
    if isinstance(value, (dict, list, bool)) or value == "":
        raise ctx.error(block.line_of(key), f"{key} must be {what}, got {value!r}")
    return str(value)


def unused_task_options(task: Any, used: typing.Sequence[str]) -> str:
    """The refusal of a `task_options` entry for no task the spec trains or evaluates (`used`): its options would
    apply to nothing, silently, as those of `boolq` beside a task written `boolq:max_passage_chars=100` (an entry
    is keyed by the task as the spec writes it)."""
    from esft.tasks import TASK_NAMES

    if task not in TASK_NAMES:
        return f"task_options: unknown task {task!r}{did_you_mean(task, [*TASK_NAMES, *used])}"
    named = [t for t in used if str(t).split(":", 1)[0].strip() == task]
    hint = f"; the spec writes it {named[0]!r}, the name its options must be keyed by" if named else ""
    return (f"task_options: {task!r} is neither trained nor evaluated by this spec ({', '.join(used)}), so its "
            f"options would apply to nothing{hint}")


def check_task_list(ctx: SpecContext, value: Any, line: int, where: str, allowed: typing.Sequence[str],
                    closed: bool = False) -> list[str]:
    """The task names of a spec list, as the spec keys them: a registered or installed task's name lower-cased
    (its option values kept as written), a data file or module:Class without the blanks around it. An open list
    takes any task that builds: a name of `allowed` or one an installed package registers (entry point), either
    with `:key=value` options, or a task outside the registry; a `closed` list (evaluation.passk.tasks) only the
    names of `allowed`, which it picks from: a name outside it would be accepted and never used."""
    from esft.tasks import get_task, split_task_list
    from esft.tasks.custom import entry_point_names, external_kind

    if isinstance(value, str):
        try:  # "countdown:numbers=2,ops=+, boolq" is two tasks: the comma inside options does not split
            value = split_task_list(value)
        except ValueError as exc:
            raise ctx.error(line, f"{where}: {exc}") from None
    if not isinstance(value, list):
        raise ctx.error(line, f"{where} must be a list of task names, got {value!r}")
    known = list(allowed) if closed else list(dict.fromkeys([*allowed, *entry_point_names()]))
    out: list[str] = []
    for i, name in enumerate(value):
        item_line = value.line_of(i) if isinstance(value, LineList) else line
        text = str(name).strip()
        external = external_kind(text) is not None  # a data file or module:Class: built with its task_options
        # task names are case-insensitive, option values are not (a system prompt, a dataset path)
        base, sep, options = text.partition(":")
        key = text if external else base.strip().lower() + sep + options
        if key not in known and (closed or not (external or sep and key.partition(":")[0] in known)):
            what, listed = (f"task {name!r} in {where} is not evaluated by this spec", "evaluated") if closed \
                else (f"unknown task {name!r} in {where}", "known")
            raise ctx.error(item_line, f"{what}{did_you_mean(key, known)}; {listed}: {', '.join(known)}")
        if key not in known and not external and key.partition(":")[0] in allowed:
            try:  # a registered task with options (esft.tasks): checked by building it, before any compute
                get_task(key)
            except ValueError as exc:
                raise ctx.error(item_line, f"{where}: {exc}") from None
        if key in out:
            raise ctx.error(item_line, f"task {name!r} appears twice in {where}")
        out.append(key)
    return out


def check_options(ctx: SpecContext, block: LineDict, algo: Algorithm, where: str, skip: typing.Iterable[str] = (),
                  allow_budget_list: bool = False) -> dict[str, Any]:
    """Field overrides of an option block, each key checked against the config dataclass with its line."""
    from esft.config import ConfigError, check_value, coerce
    from esft.tracking import report_to_text

    names = {f.name for f in dataclasses.fields(algo.config_cls)}
    out: dict[str, Any] = {}
    for key, value in block.items():
        if key in skip:
            continue
        line = block.line_of(key)
        name = str(key).replace("-", "_")
        if name in RUNNER_FIELDS:
            raise ctx.error(line, f"{where}: {key!r} is set by the experiment (top-level model / tasks / seeds, "
                                  f"--output-dir, the stage's place in a chain), not per algorithm")
        if name in TASK_OPTION_FIELDS:
            raise ctx.error(line, f"{where}: {key!r} is a task option; put it under the top-level task_options "
                                  f"(e.g. task_options: {{boolq: {{max_passage_chars: 400}}}}) so training and "
                                  f"evaluation see the same prompts")
        if name not in names:
            raise ctx.error(line, f"unknown option {key!r} in {where} for {algo.name} "
                                  f"({algo.config_cls.__name__}){unknown_option_hint(algo, name, names)}")
        if name == algo.budget_field and isinstance(value, list):
            if not allow_budget_list:
                raise ctx.error(line, f"{where}: {key} must be one number here ({algo.name} "
                                      + ("cannot extend a finished run, so one run cannot serve several budgets; "
                                         "use one label per budget)" if not algo.extendable else
                                         "inside a chain or a per-task block)"))
            budgets = [check_int(ctx, b, value.line_of(i) if isinstance(value, LineList) else line,
                                 f"{where}.{key}", 1) for i, b in enumerate(value)]
            if not budgets or sorted(set(budgets)) != budgets:
                raise ctx.error(line, f"{where}.{key}: budgets must be a non-empty increasing list, got {value!r}")
            out[name] = list(budgets)
            continue
        try:
            converted = coerce(algo.config_cls, {name: report_to_text(plain(value)) if name == "report_to" else value},
                               where)[name]
            # a budget is >= 1, as in a budget list (the base stage is the model at 0), said before the trainer's
            # own ">= 0" would name a bound that is refused next
            if name == algo.budget_field and isinstance(converted, int) and converted < 1:
                raise ConfigError(name, converted, "an integer >= 1 (an experiment evaluates the base model in its "
                                                   "own stage: a stage of 0 would only repeat it)")
            check_value(algo.config_cls, name, converted)
        except ConfigError as exc:
            raise ctx.error(line, f"{where}.{key} = {exc.value!r} is not accepted; expected {exc.accepted}") \
                from None
        except (ValueError, TypeError) as exc:
            raise ctx.error(line, f"{where}.{key}: {exc}") from None
        out[name] = plain(converted)  # no line-keeping containers in trainer configs (they are saved as YAML)
    return out


def check_task_fit(config: Any, built: dict[Any, Any]) -> None:
    """A trainer config's cross-checks against the task it builds (labels for a class-balanced reward, a balanced
    held-out set that exists: `check_task_fit`), as `esft train` runs them before any model loads
    (esft.validation.check_names); without them such a stage failed only when it started, after the stages before
    it had run. `built` caches the tasks by name and options. ConfigError (a ValueError) otherwise."""
    from esft.validation import check_task

    for key, name, options in config.task_checks():
        cache = (key, name, repr(sorted(options.items())))
        if cache not in built:
            built[cache] = check_task(key, name, options)
        config.check_task_fit(built[cache], name)


def check_trained_tasks_evaluated(ctx: SpecContext, spec: Any, data: LineDict) -> None:
    """Every training task is evaluated (in evaluation.tasks or evaluation.holdout): Tables 1 and 5-8 set each
    stage's accuracy on it beside the base model's, and an `evaluation.tasks` that left one out ran every stage to
    tables of dashes whose notes named an evaluation of it (the spec's limit) that was never made."""
    missing = [t for t in spec.tasks if t not in spec.evaluation.all_tasks]
    if missing:
        block = data.get("evaluation") if isinstance(data.get("evaluation"), LineDict) else LineDict()
        line = block.line_of("tasks") if "tasks" in block else data.line_of("tasks")
        raise ctx.error(line, f"evaluation.tasks leaves out the training task(s) {', '.join(missing)}: the tables "
                              "compare every stage's accuracy on each training task with the base model's; list "
                              "each in evaluation.tasks (or evaluation.holdout)")


def check_evaluated_tasks(ctx: SpecContext, spec: Any, data: LineDict) -> None:
    """Every task the stages of `spec` (a parsed esft.experiments.spec.Spec) evaluate builds with its task_options
    and has a test split holding examples, and, evaluated balanced, a balanced subset of its limit, as `esft eval`
    checks before the model loads. The trainers' checks cover only the splits they read, so a missing holdout data
    file or a balanced limit beyond the rarest label failed in every stage's evaluation, after its training."""
    from esft.config import ConfigError
    from esft.validation import check_balanced_set, check_splits, check_task

    block = data.get("evaluation") if isinstance(data.get("evaluation"), LineDict) else LineDict()
    for task in spec.evaluation.all_tasks:  # named at the list it is evaluated for first, which names it
        line = block.line_of("holdout") if task not in spec.evaluation.tasks else \
            block.line_of("tasks") if "tasks" in block else data.line_of("tasks")
        try:
            built = check_task("task", task, spec.task_options.get(task, {}))
            check_splits("task", task, built, ("test",))
        except ConfigError as exc:
            raise ctx.error(line, f"evaluation of {task}: expected {exc.accepted}") from None
        except (ValueError, TypeError, OSError) as exc:
            raise ctx.error(line, f"evaluation of {task}: {exc}") from None
        settings = spec.evaluation.for_task(task)
        if settings.balanced:  # limit None: as many as the rarest label allows, which still needs every label
            try:
                check_balanced_set(built, settings.limit)
            except ConfigError as exc:
                per_task = as_mapping(ctx, block.get("per_task"), "evaluation.per_task", block.line_of("per_task"))
                limit_line = per_task.get(task).line_of("limit") if isinstance(per_task.get(task), LineDict) \
                    and "limit" in per_task[task] else block.line_of("limit")
                raise ctx.error(limit_line, f"evaluation of {task} (balanced): limit {settings.limit} is not "
                                            f"accepted; expected {exc.accepted}") from None


def spec_file(spec: Any) -> tuple[SpecContext, LineDict]:
    """The error context of a parsed spec and its loaded YAML, for the lines of the checks made after parsing (an
    empty mapping, no lines, for a spec built from Python)."""
    data = load_file(spec.path) if spec.path and Path(spec.path).is_file() else LineDict()
    return SpecContext(spec.path or "<spec>"), data


def _written_key(block: dict[Any, Any], key: str) -> Any:
    """`key` as `block` spells it (eval-limit for eval_limit, as check_options reads it), None when absent."""
    return next((k for k in block if str(k).replace("-", "_") == key), None)


def option_source(data: Any, method: Any, comp: Any, task: str | None, key: str) -> tuple[str, int]:
    """Where the spec `data` (its loaded YAML) sets option `key` of `comp`, a component of `method`, for `task`:
    (the dotted key, its line), looked up in the order the values win (esft.experiments.spec.Component.overrides):
    the per-task block, then the block itself, then, for a step of a chain, the base block of its algorithm.
    (the method's key, its line) where the spec sets none."""
    algos = data.get("algorithms") if isinstance(data, dict) else None
    algos = algos if isinstance(algos, dict) else {}
    block = algos.get(method.label)
    blocks = [(f"algorithms.{method.label}", block)]
    if method.is_chain:
        sub = block.get(comp.algorithm) if isinstance(block, dict) else None
        blocks = [(f"algorithms.{method.label}.{comp.algorithm}", sub),
                  (f"algorithms.{comp.algorithm}", algos.get(comp.algorithm))]
    blocks = [(where, b) for where, b in blocks if isinstance(b, dict)]
    per = next(((where, b["per_task"]) for where, b in blocks if "per_task" in b), None)  # a chain's sub-block's wins
    if task is not None and per is not None and isinstance(per[1], dict) and isinstance(per[1].get(task), dict):
        blocks.insert(0, (f"{per[0]}.per_task.{task}", per[1][task]))
    for where, b in blocks:
        written = _written_key(b, key)
        if written is not None:
            return f"{where}.{written}", b.line_of(written) if isinstance(b, LineDict) else 0
    return f"algorithms.{method.label}", method.line


def check_unread_eval(ctx: SpecContext, spec: Any, data: LineDict) -> None:
    """An evaluation option an algorithm block gives (eval_limit, eval_balanced, eval_max_new_tokens) to a run whose
    eval_every is 0 is refused at its line, as `esft train` refuses the flag (esft.validation.unread_eval_option):
    the run would ignore it without a word."""
    from esft.validation import unread_eval_option

    for method in spec.methods:
        for comp in method.components:
            for task in spec.tasks:
                given = comp.overrides(task)
                key = unread_eval_option(spec.config(comp, task, spec.seeds[0], output_dir="<check>"), given)
                if key is not None:
                    where, line = option_source(data, method, comp, task, key)
                    raise ctx.error(line, f"{where} = {given[key]!r} is not accepted; expected a run that "
                                          f"evaluates: eval_every is 0, so no held-out evaluation runs and {key} "
                                          f"would be ignored (set e.g. eval_every: 10, or drop {key})")


def check_carried_state(ctx: SpecContext, spec: Any, data: LineDict) -> None:
    """sequential.carry_optimizer_state beside a GRPO method whose runs save no optimizer state (TRL's
    save_only_model in trl_args) is refused at the line that sets it: every stage after the first would start with
    fresh AdamW moments, without a word, while the spec and the stage records say they were carried."""
    if not spec.carry_optimizer_state:
        return
    for method in spec.methods:
        first, last = method.components[0], method.components[-1]
        if first.algorithm != "grpo" or last.algorithm != "grpo":
            continue  # the runner carries the state only from a GRPO step into a GRPO step
        for task in spec.tasks[:-1]:  # the stages whose state the next stage takes
            trl_args = spec.config(last, task, spec.seeds[0], output_dir="<check>").trl_args or {}
            if trl_args.get("save_only_model"):
                where, line = option_source(data, method, last, task, "trl_args")
                raise ctx.error(line, f"{where} sets save_only_model, so its checkpoints hold no optimizer state "
                                      "for sequential.carry_optimizer_state to carry: every later stage would start "
                                      "with fresh AdamW moments; drop one of the two")


def check_spec_devices(spec: Any) -> None:
    """Every device `spec` (a parsed esft.experiments.spec.Spec) names, in its algorithm blocks (per task too) and
    evaluation.device, is one this machine's torch can use, as `esft train --device` is checked
    (esft.validation.check_device): a device it lacks failed each stage only after the base model's evaluation.
    Not part of parse_spec nor of a dry run: a spec is read on other machines than the one it runs on (the shipped
    paper specs name cuda and parse on a laptop); `esft experiment run` checks it before any stage runs."""
    from esft.config import ConfigError
    from esft.validation import check_device

    ctx, data = spec_file(spec)
    block = data.get("evaluation") if isinstance(data.get("evaluation"), LineDict) else LineDict()
    named = [("evaluation.device", block.line_of("device"), spec.evaluation.device)]
    for method in spec.methods:
        for comp in method.components:
            for task in spec.tasks:
                device = spec.config(comp, task, spec.seeds[0], output_dir="<check>").device  # a preset's too
                named.append((*option_source(data, method, comp, task, "device"), device))
    for where, line, device in named:
        try:
            check_device(where, device)
        except ConfigError as exc:
            raise ctx.error(line, f"{where} = {device!r} is not accepted; expected {exc.accepted}") from None


def check_spec_model(spec: Any) -> None:
    """The spec's model is an embedded model, a model folder or a hub id (esft.validation), as `esft experiment
    run` loads it, the evaluation's completions fit its context, and each algorithm's own checks of the model
    (Algorithm.check_model: ES's include / exclude select a parameter) pass from its skeleton, without its weights;
    not part of parse_spec, since a runner given its own model loader may name anything."""
    from esft.validation import check_context, check_model

    for key, check in (("model", lambda: check_model("model", spec.model)),
                       ("evaluation", lambda: check_context(spec.model, {
                           f"evaluation.max_new_tokens ({t})": spec.evaluation.for_task(t).max_new_tokens
                           for t in spec.evaluation.all_tasks}))):
        try:
            check()
        except ValueError as exc:
            ctx, data = spec_file(spec)
            block = data.get(key)  # the evaluation's own max_new_tokens line, where it sets one
            line = (block.line_of("max_new_tokens") if isinstance(block, LineDict) and "max_new_tokens" in block
                    else data.line_of(key) if key in data else 0)
            raise ctx.error(line, str(exc)) from None
    _check_algorithm_models(spec)


def _check_algorithm_models(spec: Any) -> None:
    """Algorithm.check_model of every component on every task (the model of a later stage is a checkpoint of the
    spec's model: the same parameter names), refused at the line of the option it names (ES: include, exclude)."""
    for method in spec.methods:
        for comp in method.components:
            check = comp.spec.check_model
            for task in spec.tasks if check is not None else ():
                try:
                    check(spec.config(comp, task, spec.seeds[0], output_dir="<check>"))
                except ValueError as exc:
                    ctx, data = spec_file(spec)
                    given = comp.overrides(task)
                    key = next((k for k in comp.spec.model_options if given.get(k)), None)
                    where, line = option_source(data, method, comp, task, key) if key else \
                        (f"algorithms.{method.label}", method.line)
                    raise ctx.error(line, f"{where}: {exc}") from None
