"""The names half of esft's one validation layer: the task (with its options) and the model a config names exist,
checked without loading either. esft.config checks types and ranges whenever a config is built; this module adds
what needs the task registry and the model registry, so `esft train ...`, `esft eval` and experiment specs refuse a
misspelt task, a bad task option or a missing model folder before any model loads.

    build_config(ESConfig, PRESETS, preset, file, flags, check=check_names)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from esft.config import ConfigError, RunConfig, passage_cut

if TYPE_CHECKING:
    from esft.tasks.base import Task


def check_task(key: str, name: Any, options: dict[str, Any] | None = None) -> Any:
    """`name` builds a task with `options` (cheap: task data loads lazily), returned; else ConfigError under
    `key`."""
    from esft.tasks import TASK_NAMES, get_task
    from esft.tasks.custom import external_kind

    try:
        return get_task(str(name), **(options or {}))
    except (ValueError, TypeError, OSError) as exc:
        from esft.tasks.base import UnknownTaskOption
        from esft.tasks.verifiers import RewardError

        if isinstance(exc, RewardError) and "reward" in (options or {}):  # the reward's fault, not the data's
            text = str(exc).removeprefix(f"reward {options['reward']!r}: ")
            raise ConfigError("reward", options["reward"], f"a valid reward ({text})") from None
        if external_kind(str(name)):  # a data file, dataset or module: what is wrong with it
            # a missing file an option names (test_file) is the options' fault, not the task name's
            named = [v for k, v in (options or {}).items()
                     if "file" in k and isinstance(v, str) and v and v in str(exc)]
            # and so is an option the task does not take
            if (isinstance(exc, OSError) and named) or isinstance(exc, UnknownTaskOption):
                raise ConfigError("task_options", options, f"options of task {name!r} ({exc})") from None
            raise ConfigError(key, name, f"a task esft can build from it: {exc}") from None
        if isinstance(exc, OSError):  # the registry's own data: not the user's input
            raise
        if str(exc).startswith("unknown task"):  # the message lists the tasks: not a second time here
            from esft.names import close_names

            close = close_names(str(name).split(":")[0], TASK_NAMES, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(key, name, f"a known task name ({exc}){hint}") from None
        raise ConfigError(key, name, f"a task with valid options ({exc})") from None


def task_labels(task: Task) -> tuple[Any, ...] | None:
    """The task's label set (None for an unlabelled task). Every caller checks a task `check_task` built, which
    get_task wraps in esft.tasks.custom.TaskAdapter when the user's object is not an esft Task."""
    return task.label_set()


def require_labels(key: str, value: Any, accepted: str, task: Task) -> None:
    """`key = value` needs a labelled task (esft.tasks.labels.LABELLED_TASKS)."""
    from esft.tasks.labels import LABELLED_TASKS

    if task_labels(task) is None:
        raise ConfigError(key, value, f"{accepted} for this task: it needs a task with labels ({LABELLED_TASKS})")


def check_balanced_set(task: Task, limit: int | None, split: str = "test", key: str = "eval_limit") -> None:
    """A label-balanced set of `limit` examples of `split` exists (within what the rarest label allows; None = as
    many as it allows): every label occurs. Nothing to check without labels or with limit 0 (no evaluation)."""
    labels = task_labels(task)
    if labels is None or limit == 0:
        return
    from esft.tasks.labels import balanced_indices

    try:
        balanced_indices([task.balance_key(r) for r in task.load(split)], limit, label_set=labels)
    except ValueError as exc:
        where = "held-out set" if split == "test" else f"set of split {split!r}"
        raise ConfigError(key, limit, f"a balanced {where} that exists ({exc})") from None


def check_splits(key: str, value: Any, task: Task, splits: tuple[str, ...]) -> dict[str, int]:
    """`task` has the splits the run reads and each holds examples: a task class of the user's without a test
    split, holdout-only ifeval trained on, or a data file too small to leave a held-out row fails here, not once
    the model has loaded (or with an evaluation of n = 0). Loading a built-in task's split takes under 0.25 s.
    Returns each split's number of examples, for checks that need it without loading the split again."""
    have = tuple(task.splits)
    name = task.shown_name() or value
    missing = [s for s in splits if s not in have]
    if missing:
        raise ConfigError(key, value, f"a task with the split(s) {', '.join(missing)} (task {name!r} has "
                          f"{', '.join(have) or 'none'})")
    sizes: dict[str, int] = {}
    for split in splits:
        try:
            n = sizes[split] = len(task.load(split))
        except Exception as exc:  # the user's _load: named, before any model loads
            raise ConfigError(key, value, f"a task whose {split} split loads (task {name!r}: {type(exc).__name__}: "
                              f"{exc})") from None
        if not n:
            hint = task.why_empty(split)  # a data task names its options
            raise ConfigError(key, value, f"a task with {split} examples (task {name!r}: its {split} split is "
                              f"empty{'; ' + hint if hint else ''})")
        check_first_example(key, value, task, split)
    return sizes


def check_first_example(key: str, value: Any, task: Task, split: str) -> None:
    """The task prompts the first example of `split` as chat messages and scores an empty completion as a finite
    number: a `prompt` or `score` of the user's that raises (a missing field, a typo) fails here, not at the
    first population once the model has loaded. An empty completion is what every scorer must take without
    raising (Task.score: "never raises on a completion, whatever its text")."""
    import math
    import warnings
    from numbers import Real

    name = task.shown_name() or value
    example = task.load(split, limit=1)[0]
    for method, call in (("prompt", lambda: task.prompt(example)), ("score", lambda: task.score("", example))):
        try:
            with warnings.catch_warnings():  # what it says of this probe (a reward's None) the run says of its own
                warnings.simplefilter("ignore")
                out = call()
        except Exception as exc:  # the user's code: named with the example it failed on
            raise ConfigError(key, value, f"a task that can {method} its first {split} example (task {name!r}: "
                              f"{method} raised {type(exc).__name__}: {exc})") from None
        if method == "prompt" and not _is_messages(out):
            raise ConfigError(key, value, f"a task whose prompt(example) returns chat messages, a list of "
                              f"{{'role': ..., 'content': ...}} (task {name!r} returned {_brief(out)})")
        if method == "prompt" and (odd := [m["role"] for m in out if m["role"] not in CHAT_ROLES]):
            # a chat template renders any role it is given: a typo ("User") would reach the model as text
            raise ConfigError(key, value, f"a task whose prompt(example) returns chat messages with the roles "
                              f"{', '.join(CHAT_ROLES)} (task {name!r} gave the role {odd[0]!r})")
    if not isinstance(out, Real) or not math.isfinite(out):
        raise ConfigError(key, value, f"a task whose score(completion, example) returns a finite number (task "
                          f"{name!r} scored an empty completion {_brief(out)})")
    check_record_methods(key, value, task, split, example)


def check_record_methods(key: str, value: Any, task: Task, split: str, example: dict[str, Any]) -> None:
    """The methods every evaluation calls besides prompt and score take the first example of `split` (with an
    empty completion): `is_well_formed` (where the task checks a format) and `details` for each completion's record,
    `gold_key` for the constant-answer baseline beside the accuracy. A user's method that raises, details that are
    not a dict of fields, or a gold key a baseline cannot count fail here, not once the model has loaded and the
    held-out set has been generated."""
    import warnings
    from collections.abc import Hashable, Mapping

    from esft.tasks.base import checks_format

    name = task.shown_name() or value
    calls = [("details", lambda: task.details("", example)), ("gold_key", lambda: task.gold_key(example))]
    if checks_format(task):
        calls.insert(0, ("is_well_formed", lambda: task.is_well_formed("", example)))
    for method, call in calls:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = call()
            if method == "gold_key" and isinstance(out, Hashable):
                hash(out)  # a tuple holding a list is Hashable but cannot be hashed
        except Exception as exc:  # the user's code: named with the example it failed on
            given = "" if method == "gold_key" else " and an empty completion (a model may write one)"
            raise ConfigError(key, value, f"a task whose {method} takes its first {split} example{given} (task "
                              f"{name!r}: {method} raised {type(exc).__name__}: {exc})") from None
        if method == "details" and not isinstance(out, Mapping):
            raise ConfigError(key, value, f"a task whose details(completion, example) returns a dict of fields "
                              f"(task {name!r} returned {_brief(out)})")
        if method == "gold_key" and not isinstance(out, Hashable):
            raise ConfigError(key, value, f"a task whose gold_key(example) returns a hashable value or None, as the "
                              f"constant-answer baseline counts them (task {name!r} returned {_brief(out)})")


#: The roles of a chat that chat templates know (TRL's conversational format uses the first three).
CHAT_ROLES = ("system", "user", "assistant", "tool")


def _is_messages(out: Any) -> bool:
    return (isinstance(out, list) and bool(out) and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                        and isinstance(m.get("content"), str) for m in out))


def _brief(obj: Any) -> str:
    text = repr(obj)
    return f"{type(obj).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def check_model(key: str, name: Any) -> None:
    """`name` is an embedded model, a Hugging Face model folder, or a hub id `org/name` (tried only at load)."""
    from esft.models import is_hub_id, known_model_names

    text = str(name)
    if text.lower() in known_model_names():
        return
    path = Path(text).expanduser()
    accepted = (f"an embedded model ({', '.join(known_model_names())}), a Hugging Face model folder "
                "(with config.json) or a hub id org/name")
    if path.exists():
        if not (path / "config.json").exists():
            run = (path / "checkpoints").is_dir() and (path / "config.yaml").exists()
            final = path / "checkpoints" / "final"
            hint = (f"; {path} is a run directory: its model is a checkpoint folder, e.g. {final}" if run
                    else f"; {path} has no config.json")
            raise ConfigError(key, name, accepted + hint)
        flaw = model_folder_flaw(path)
        if flaw:
            raise ConfigError(key, name, f"a Hugging Face model folder with config.json and weights; {flaw}")
        return
    if not is_hub_id(text):
        raise ConfigError(key, name, accepted)


#: the weights files `from_pretrained` reads from a model folder (one file, or the index of a sharded set)
WEIGHTS_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


def model_folder_flaw(path: Path) -> str | None:
    """Why the model folder `path` (holding config.json) cannot load, in a refusal's words: a config.json that is
    no JSON object, or no weights file (`WEIGHTS_FILES`); None when neither. Checked here, before any model loads,
    so that such a folder is refused as bad input, not met by transformers' load error once loading began."""
    import json

    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"{path / 'config.json'} does not read as JSON ({exc}): restore it"
    if not isinstance(config, dict):
        return f"{path / 'config.json'} holds a {type(config).__name__}, not a JSON object: restore it"
    if not any((path / name).is_file() for name in WEIGHTS_FILES):
        return (f"{path} has no weights file ({', '.join(WEIGHTS_FILES)}): a copy that stopped early, or a "
                "folder of config files only")
    return None


def check_results_dir(path: str | Path, what: str = "--output-dir") -> None:
    """Refuse, before any model loads, an evaluation's output folder that is a run folder, lies inside one (a
    checkpoint folder) or holds a model: its summary.json and per-task files would mix with the run's or the
    model's own files (and travel with an export or an upload of them)."""
    from esft.rundir import enclosing_run_dir, is_run_dir

    folder = Path(path)
    run = folder if is_run_dir(folder) else enclosing_run_dir(folder)
    if run is not None:
        where = "is a run folder" if run == folder else f"is inside the run folder {run}"
        raise ValueError(f"{what} {path} {where}: evaluation results there would mix with the run's files; "
                         "choose a folder outside it, e.g. evals/NAME")
    if (folder / "config.json").is_file() and any((folder / name).is_file() for name in WEIGHTS_FILES):
        raise ValueError(f"{what} {path} is a model folder: evaluation results there would travel with the model; "
                         "choose a folder outside it, e.g. evals/NAME")


#: what check_device_name and check_device accept
_DEVICE_ACCEPTED = "a torch device: cpu, cuda, cuda:N or mps (or leave it unset for the default)"


def check_device_name(key: str, value: Any) -> Any:
    """The torch.device `value` names, when torch knows the name and its type is cpu, cuda or mps; else ConfigError
    under `key`. Whether this machine has that device is not asked (check_device does): an experiment spec is read
    on other machines than the one it runs on."""
    import torch

    try:
        device = torch.device(str(value))
    except (RuntimeError, ValueError):
        raise ConfigError(key, value, _DEVICE_ACCEPTED) from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(key, value, _DEVICE_ACCEPTED)
    return device


def check_device(key: str, value: Any) -> None:
    """`value` is a torch device this machine's torch can use (None: the loader's default), so that a run asking
    for a GPU on a CPU-only build fails here, not with a traceback once the model has loaded."""
    if value is None:
        return
    import torch

    device = check_device_name(key, value)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(key, value, f"{_DEVICE_ACCEPTED}; this torch ({torch.__version__}) sees no CUDA device, "
                              "so use cpu here")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(key, value, f"{_DEVICE_ACCEPTED}; this machine has {torch.cuda.device_count()} CUDA "
                              "device(s)")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(key, value, f"{_DEVICE_ACCEPTED}; MPS is not available here")


#: the options of the periodic held-out evaluation, which a run with eval_every = 0 never reads
EVAL_OPTIONS = ("eval_limit", "eval_balanced", "eval_max_new_tokens")


def check_passage_cut(config: Checked, given: dict[str, Any]) -> None:
    """A --max-passage-chars typed (in `given`: the flags typed) for a run or evaluation where no task is BoolQ,
    the only one it cuts, is refused (a preset's cut is not typed: `--preset cpu --task countdown` passes)."""
    tasks = [name for _, name, _ in config.task_checks()]
    typed = given.get("max_passage_chars")
    if typed is None:
        return
    boolq = [str(t) for t in tasks if str(t).partition(":")[0].strip().lower() == "boolq"]
    if not boolq:
        raise ConfigError("max_passage_chars", typed, f"a BoolQ task among {', '.join(map(str, tasks))}: it cuts "
                          "BoolQ passages only (drop --max-passage-chars)", "command line (--max-passage-chars)")
    # a cut in task_options, or in every BoolQ task's name, wins over the flag (esft.config.passage_cut)
    if "max_passage_chars" in config.task_options:
        setters = "task_options sets"
    elif not any(passage_cut(t, typed) for t in boolq):
        setters = f"{', '.join(boolq)} {'sets' if len(boolq) == 1 else 'set'}"
    else:
        return
    raise ConfigError("max_passage_chars", typed, f"a BoolQ task without a cut of its own ({setters} "
                      "max_passage_chars, which wins): drop --max-passage-chars or the other cut",
                      "command line (--max-passage-chars)")


def check_eval_options(config: RunConfig, given: dict[str, Any]) -> None:
    """A training run with eval_every = 0 evaluates nothing: an evaluation option the user gave (`given`: the
    flags typed) would be ignored without a word, so it is refused before any model loads. A zero or false value
    (`--eval-limit 0`) asks for no evaluation either and passes. So is a passage cut no task reads
    (`check_passage_cut`)."""
    check_passage_cut(config, given)
    key = unread_eval_option(config, given)
    if key is not None:
        flag = "--" + key.replace("_", "-")
        raise ConfigError(key, given[key], "a run that evaluates: eval_every is 0, so no held-out evaluation "
                          f"runs and {flag} would be ignored (add e.g. --eval-every 10, or drop {flag})",
                          f"command line ({flag})")


def unread_eval_option(config: RunConfig, given: dict[str, Any]) -> str | None:
    """The first of EVAL_OPTIONS set in `given` (the values a user gave: flags, an experiment spec's block) that
    `config` never reads, its eval_every being 0; None when there is none. A zero or false value asks for no
    evaluation either and passes. One rule for `esft train` (check_eval_options) and experiment specs."""
    if config.eval_every != 0:
        return None
    return next((key for key in EVAL_OPTIONS if given.get(key)), None)


class Checked(Protocol):
    """What a config declares for these checks (ESConfig, GRPOConfig, EvalConfig)."""

    model: str
    device: str | None
    task_options: dict[str, Any]

    def task_checks(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(config key, task name, constructor options) of every task the config builds."""

    def check_task_fit(self, task: Any, name: str | None = None) -> None:
        """Cross-checks of the config against a built task (labels for balanced rules, ...); ConfigError. `name`:
        the task as `task_checks` names it (what the user typed), for the messages."""

    def generation_limits(self) -> dict[str, int]:
        """{config key: the most tokens a completion may generate}."""


def check_with_task_flags(config: Checked, args: Any, tasks: list[str]) -> None:
    """`check_names` on `config` as it will run, with the data-task flags in `args` (--prompt-field, --reward ...)
    applied (esft.tasks.custom.apply_task_flags), so a data file's task is checked with its fields before any model
    loads. A bad reward is named where it was given: at --reward, else at task_options; a refused task_options is
    shown as the user gave it, without the flags' values (which are never its fault)."""
    from esft.tasks.custom import apply_task_flags

    try:
        flagged = apply_task_flags(config, args, tasks)
    except ValueError:  # flags no task reads: unless a name is no task at all (`sums` for sums.jsonl), said first
        for key, name, _ in config.task_checks():
            check_task(key, name)  # the name only: building a task loads none of its data
        raise
    try:
        check_names(flagged)
    except ConfigError as exc:
        if exc.key not in ("reward", "task_options") or exc.where:
            raise
        if exc.key == "reward" and getattr(args, "reward", None) is not None:
            raise exc.located("command line (--reward)") from None
        raise ConfigError("task_options", config.task_options, exc.accepted) from None


def check_saved_names(config: Checked, run_dir: str | Path) -> None:
    """`check_names` on a config read back from `<run_dir>/config.yaml` to resume it: an error names the line of
    that file it is about (a data file or reward module that cannot be found from here, a model folder gone)."""
    try:
        check_names(config)
    except ConfigError as exc:
        path = Path(run_dir) / "config.yaml"
        line = saved_key_lines(path).get(exc.key)
        raise exc.located(f"{path}:{line}" if line else str(path)) from None


def saved_key_lines(path: Path) -> dict[str, int]:
    """{key: line} of a saved config's top-level keys, and of the keys under its task_options that are no top-level
    key (a data task's `reward`, `prompt_field`); {} for a file that does not parse."""
    import yaml

    try:
        node = yaml.compose(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    items = node.value if isinstance(node, yaml.MappingNode) else []
    lines = {str(k.value): k.start_mark.line + 1 for k, _ in items}
    for key, value in items:
        if key.value == "task_options" and isinstance(value, yaml.MappingNode):
            lines.update({str(k.value): k.start_mark.line + 1 for k, _ in value.value if str(k.value) not in lines})
    return lines


def check_context(model: str, limits: dict[str, int]) -> None:
    """Each of `limits` ({config key: tokens a completion may generate}) fits `model`'s context length, where its
    config.json is on disk: a larger one allocated a KV cache past any memory, after the model had loaded."""
    from esft.models import context_length

    most = context_length(model)
    for key, tokens in limits.items():
        if most is not None and isinstance(tokens, int) and tokens > most:
            raise ConfigError(key, tokens, f"an integer from 1 to {most}, the context length of model {model} "
                              "(max_position_embeddings in its config.json)")


def check_names(config: Checked) -> None:
    """The model, the device and the task(s) a config names exist, and fit the config (its `check_task_fit`)."""
    from esft.tasks.custom import external_kind

    check_model("model", config.model)
    check_context(config.model, config.generation_limits())
    check_device("device", config.device)
    for key, name, options in config.task_checks():
        if external_kind(str(name)):  # a data file's task needs its field options to build at all
            task = check_task(key, name, options)
        else:
            task = check_task(key, name)
            if options:  # the name is fine: a failure now is the options' (task_options, max_passage_chars)
                try:
                    task = check_task(key, name, options)
                except ConfigError as exc:
                    raise ConfigError("task_options", options, f"options of task {name!r} "
                                      f"({exc.accepted.partition('(')[2].rstrip(')')})") from None
        config.check_task_fit(task, name)


__all__ = ["CHAT_ROLES", "EVAL_OPTIONS", "WEIGHTS_FILES", "Checked", "check_balanced_set", "check_context",
           "check_device", "check_device_name", "check_eval_options", "check_first_example", "check_model",
           "check_names", "check_passage_cut", "check_results_dir", "check_saved_names", "check_splits", "check_task",
           "check_with_task_flags", "model_folder_flaw", "require_labels", "saved_key_lines", "task_labels",
           "unread_eval_option"]
