"""One-call entry points: `train_es(config)` and `train_grpo(config)` (also `esft.train_es`, `esft.train_grpo`).

`train_es` builds the executor the config asks for through esft.es.distributed (`executor: local | ray`,
`worker_backend: hf | vllm`) and runs the ES loop (esft.es.trainer), which itself never reaches for Ray or vLLM.
"""

from __future__ import annotations

import contextlib
import functools
import re
from pathlib import Path
from typing import Any, Iterator

from esft.es.build import check_executor_options, check_ray_installed
from esft.es.distributed.connection import disconnect_ray
from esft.es.distributed.factory import connect, make_executor
from esft.es.es_config import ESConfig
from esft.es.finished import resume_finished
from esft.es.trainer import ESTrainer
from esft.rundir import TrainResult, check_output_dir
from esft.sigterm import sigterm_interrupts
from esft.tasks.base import Task


def with_task(config: Any, task: Any) -> tuple[Any, Task | None]:
    """(config, Task or None) for `task=` of train_es / train_grpo: a string (a task name, `module:Class`, a
    data file) becomes the config's task and is built by the trainer; an object is used as `get_task` would build
    it (esft.tasks.custom.as_task: itself, or a TaskAdapter around one that is not an esft Task), and the config
    records the string that rebuilds it (`module:Class` and its non-default fields; a data task's file and options)
    so that config.yaml can resume and replay the run. An object without one (its class defined in the script,
    `__main__`, or inside a function; a constructor value YAML cannot hold, such as a function or an array) is
    recorded by its class and such values as `<not recorded: TYPE>` (esft.tasks.custom.task_record): config.yaml
    then names the task trained, and `esft train --resume` says to continue from the script instead of training
    another task."""
    if task is None:
        return config, None
    if isinstance(task, str):
        return config.replace(task=task), None
    from esft.tasks.custom import absolute_data_task, as_task, task_record
    from esft.tasks.task_values import unrecorded_options

    # a class is built without options, and an object that is not an esft Task is wrapped, as `--task module:Class`
    # builds them: the run and its resume from config.yaml prompt, score and label the same task
    task = as_task(task)
    task.validate()  # e.g. a data task: its file, fields and reward, before any model
    name, options = task_record(task)
    recorded = _recorded_task(config)
    # (config.yaml records a data file by its absolute path: compare it so)
    if recorded is None or recorded[0] == absolute_data_task(name):
        if recorded is not None and recorded[1] == {} and unrecorded_options(options):
            options = {}  # an older esft recorded no options for such an object: the run resumes as it started
        config = config.replace(task=name, task_options=options)
    return config, task


def _recorded_task(config: Any) -> tuple[str, dict[str, Any]] | None:
    """The task text and options the run being resumed recorded (None for a fresh run): a resume keeps what the
    run started with, so a run begun through the trainer directly, with its own task text, still resumes."""
    import yaml

    saved = Path(config.output_dir) / "config.yaml"
    if not config.resume or not saved.exists():
        return None
    data = yaml.safe_load(saved.read_text()) or {}
    return str(data.get("task")), dict(data.get("task_options") or {})


def _check_workers_rebuild(config: ESConfig, task: Any) -> None:
    """A Ray run's workers each build the task from the config's task string (esft.es.distributed.hf_replica), not
    from the object: refuse an object that string does not rebuild, before Ray or the model start."""
    from esft.tasks.custom import script_class, task_record
    from esft.tasks.task_values import unrecorded_options

    if config.executor != "ray":
        return
    name, options = task_record(task)
    missing = unrecorded_options(options)
    if script_class(name) or missing:
        why = ("its class is defined in the script, which the workers cannot import" if script_class(name) else
               "constructor values YAML cannot hold: " + ", ".join(f"{k}: {options[k]}" for k in missing))
        raise ValueError(f"executor 'ray' builds the task on each worker from its task string, which cannot rebuild "
                         f"this task object ({config.task}; {why}): train it with executor 'local', or pass a "
                         "module:Class whose constructor values are plain numbers, text and lists")


def check_config(config: Any, cls: type, call: str) -> None:
    """A TypeError naming the config class `call` takes, for a dict or another trainer's config (which failed
    later as an AttributeError on some field)."""
    if not isinstance(config, cls):
        how = f"{cls.__name__}(**your_dict)" if isinstance(config, dict) else f"{cls.__name__}(...)"
        raise TypeError(f"{call} takes an esft.{cls.__name__}, not a {type(config).__name__}: build one with {how}")


def check_task_before_loading(config: Any, task: Task | None) -> None:
    """The checks `esft train` makes of the task it builds before any model loads (the config's `check_task_fit`:
    the splits the run reads exist and hold examples, the first example prompts as chat and scores as a finite
    number, labels where a rule needs them), for a task object, which the command line never sees. A task string
    (task=None here) is checked by the trainer that builds it."""
    if task is not None:
        config.check_task_fit(task)


def es_trainer(config: ESConfig, **kwargs: Any) -> ESTrainer:
    """The `ESTrainer` of `train_es`, not yet run: its executor is built by esft.es.distributed unless `executor`
    or `executor_factory` is given (keyword seams as ESTrainer: model, tokenizer, task, generate_fn,
    fitness_rule, progress). `task` may be a task object or class, or a task string (see with_task)."""
    check_config(config, ESConfig, "train_es")
    config, kwargs["task"] = with_task(config, kwargs.get("task"))
    if all(kwargs.get(k) is None for k in ("model", "generate_fn", "executor", "executor_factory")):
        # not where the caller brings its own model, generation or executor (tests, notebooks): theirs to check
        check_task_before_loading(config, kwargs["task"])
    if kwargs["task"] is not None and kwargs.get("executor") is None and kwargs.get("executor_factory") is None:
        _check_workers_rebuild(config, kwargs["task"])
    if kwargs.get("executor") is not None or kwargs.get("executor_factory") is not None:
        return ESTrainer(config, **kwargs)
    check_output_dir(config.output_dir)  # the checks the trainer makes first, before a Ray connection's seconds
    check_executor_options(config)
    check_ray_installed(config)
    # a Ray run joins its cluster before the model loads: a wrong address fails before minutes of loading
    owns_ray = connect(config)
    kwargs["executor_factory"] = functools.partial(make_executor, owns_ray=owns_ray)
    try:
        return ESTrainer(config, **kwargs)
    except BaseException:
        if owns_ray:
            disconnect_ray()
        raise


def train_es(config: ESConfig, **kwargs: Any) -> TrainResult:
    """Run (or resume, with config.resume) ES fine-tuning on the executor the config asks for. Keyword seams:
    model, tokenizer, task (an object, a class or a task string), executor, executor_factory, generate_fn,
    fitness_rule, progress. Returns the run directory, steps done, final checkpoint, last eval."""
    given = kwargs.get("task") is not None and not isinstance(kwargs.get("task"), str)
    with sigterm_interrupts():
        # a finished run resumed answers from its files, before its model loads or Ray workers start (not where
        # the caller brings its own task, model, generation or executor: the trainer's resume checks those)
        plain = all(kwargs.get(k) is None for k in ("task", "model", "generate_fn", "executor", "executor_factory"))
        check_config(config, ESConfig, "train_es")
        done = resume_finished(config, kwargs.get("progress", True)) if plain and config.resume else None
        if done is not None:
            return _with_curve(done)
        trainer = es_trainer(config, **kwargs)
        with _script_resume_hint(trainer.task if given else None, "esft.train_es"):
            return _with_curve(trainer.train())


def train_grpo(config: Any, **kwargs: Any) -> TrainResult:
    """Run (or resume) GRPO fine-tuning (esft.grpo.run.train_grpo; TRL is imported only here). `task` may be a task
    object or class, or a task string (see with_task)."""
    from esft.grpo.grpo_config import GRPOConfig
    from esft.grpo.run import train_grpo as _train_grpo

    check_config(config, GRPOConfig, "train_grpo")
    config, kwargs["task"] = with_task(config, kwargs.get("task"))
    if kwargs.get("model") is None:
        check_task_before_loading(config, kwargs["task"])
    with sigterm_interrupts(), _script_resume_hint(kwargs["task"], "esft.train_grpo"):
        return _with_curve(_train_grpo(config, **kwargs))


@contextlib.contextmanager
def _script_resume_hint(task: Any, call: str) -> Iterator[None]:
    """An interrupted or failed run of a task object (None: a task string) that config.yaml cannot rebuild
    (esft.tasks.custom.task_record) says to continue from the script, not with `esft train ... --resume`, which
    refuses such a task."""
    from esft.rundir import RunFailed, RunInterrupted
    from esft.tasks.custom import task_spec

    try:
        yield
    except (RunInterrupted, RunFailed) as exc:
        if task is None or task_spec(task) is not None:
            raise
        again = (f"`{call}(config.replace(resume=True), task=...)` from this script, with the same task object "
                 "(config.yaml cannot rebuild it)")
        raise type(exc)(re.sub(r"`esft train [^`]*`", lambda _: again, str(exc))) from exc.__cause__


def _with_curve(result: TrainResult) -> TrainResult:
    """The run's learning curve (`<run>/curve.png`, esft.es.curve.plot_run) written beside its metrics."""
    import sys

    from esft.es.curve import plot_run

    try:
        plot_run(result.output_dir)
    except Exception as exc:  # the run is finished and saved: a figure that cannot be drawn must not fail it
        print(f"esft: warning: {result.output_dir}/curve.png not drawn: {type(exc).__name__}: {exc}", file=sys.stderr)
    return result


__all__ = ["check_config", "check_task_before_loading", "es_trainer", "train_es", "train_grpo", "with_task"]
