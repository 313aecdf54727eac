"""Evaluation of one stage's model on its tasks, one JSON per task, resumable task by task.

`<stage>/eval/<task>.json` holds the summary of `esft.evaluation.evaluate_task` (accuracy, Wilson CI, format rate,
IFEval strict/loose ...) plus the settings it ran with; `<task>.jsonl` every completion. With `evaluation.passk`
in the spec, the chosen tasks are also sampled n times per question: `<task>.passk.json` / `.passk.jsonl`, and the
task's summary gains a `sampled` entry (pass@k, mean@n, maj@k with bootstrap CIs). A task whose JSON exists
with the same settings and model is not evaluated again, so an interrupted evaluation loses at most one task.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from esft.experiments.plan import task_slug
from esft.experiments.spec import Spec

EVAL_DIR = "eval"


def task_settings(spec: Spec, task: str, model: str) -> dict[str, Any]:
    ev = spec.evaluation
    te = ev.for_task(task)
    settings = {"model": model, "split": "test", "limit": te.limit, "max_new_tokens": te.max_new_tokens,
                "batch_size": te.batch_size, "temperature": 0.0, "dtype": ev.dtype, "device": ev.device,
                "task_options": spec.task_options.get(task, {})}
    if te.balanced:  # only when set, so results evaluated before the option existed stay current
        settings["balanced"] = True
    if ev.generation_options:  # likewise: the exact path's results stay current
        settings["generation_options"] = dict(ev.generation_options)
    return settings


def plan_settings(spec: Spec) -> dict[str, dict[str, Any]]:
    """{task: its greedy evaluation's settings but the model} for every task the spec evaluates, as plan.json
    records them: esft.experiments.records leaves out a stage's evaluation made with others (a run re-evaluating
    under new settings stopped before it reached that stage), so a table compares evaluations of the same examples."""
    out = {}
    for task in spec.evaluation.all_tasks:
        settings = task_settings(spec, task, "")
        del settings["model"]
        out[task] = json.loads(json.dumps(settings))  # as the evaluation files hold them (lists, not tuples)
    return out


def plan_sampled_settings(spec: Spec) -> dict[str, dict[str, Any]]:
    """{task: its sampled (pass@k) evaluation's settings but the model} for every task the spec samples, as
    plan.json's "sampled" records them: a stage's pass@k made with others is left out as its greedy one is."""
    out = {}
    for task in spec.evaluation.all_tasks:
        settings = passk_settings(spec, task, "")
        if settings is not None:
            del settings["model"]
            out[task] = json.loads(json.dumps(settings))
    return out


def passk_settings(spec: Spec, task: str, model: str) -> dict[str, Any] | None:
    """Settings of the sampled evaluation of `task`, None when the spec samples no pass@k on it."""
    pk = spec.evaluation.passk
    if pk is None or task not in pk.tasks:
        return None
    return {**task_settings(spec, task, model), **pk.settings()}


def is_current(stage_dir: Path, spec: Spec, task: str, model: str, root: Path | None = None,
               subdir: str = EVAL_DIR, with_passk: bool = True) -> bool:
    """True when `task` was evaluated in `stage_dir / subdir` with today's settings (greedy and, if asked and
    `with_passk`, sampled); `root`, the experiment folder, lets a model inside it match where the folder has moved
    (`same_model`)."""
    folder = stage_dir / subdir
    sampled = passk_settings(spec, task, model) if with_passk else None
    return _done(folder / f"{task_slug(task)}.json", task_settings(spec, task, model), root) is not None and (
        sampled is None or _done(folder / f"{task_slug(task)}.passk.json", sampled, root) is not None)


def same_model(old: str, new: str, root: Path | None, final_is_snapshot: bool = False) -> bool:
    """`old`, a model path recorded earlier, names the weights `new` (an absolute path) does: the same path, or the
    same place inside the experiment folder `root` recorded where the folder was before it moved (the records keep
    absolute paths). With `final_is_snapshot`, a budget's snapshot `<run>/checkpoints/iter_N` also matches
    `<run>/checkpoints/final`, recorded while N was the run's largest budget (a larger one was added since): the
    run ended at N then, as the fingerprint of the stage that owns the run checks. Not for evaluations: a done
    stage whose model moved to its snapshot is evaluated again, and that visit is what writes the snapshot."""
    if old == new:
        return True
    if root is None:
        return False
    try:
        rel = Path(new).relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return False
    run, _, name = rel.rpartition("/checkpoints/")
    same = [rel] + ([f"{run}/checkpoints/final"] if final_is_snapshot and run and name.startswith("iter_") else [])
    return any(old == f"{Path(root).resolve().as_posix()}/{r}" or old.endswith(f"/{r}") for r in same)


def _done(path: Path, settings: dict[str, Any] | None, root: Path | None = None) -> dict[str, Any] | None:
    prior = read_json(path)
    if not prior or "summary" not in prior or not isinstance(prior.get("settings"), dict) or settings is None:
        return None
    recorded = prior["settings"]
    if same_model(str(recorded.get("model")), str(settings.get("model")), root):
        recorded = {**recorded, "model": settings.get("model")}
    return prior["summary"] if recorded == settings else None


def write_json(path: Path, data: Any) -> None:
    """Atomic write: a reader (or a crash) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def evaluate_stage(spec: Spec, model_ref: str, tasks: list[str], stage_dir: Path,
                   load_model: Callable[[str, str, str | None], tuple[Any, Any]], progress: bool = True,
                   root: Path | None = None, subdir: str = EVAL_DIR, with_passk: bool = True) -> dict[str, Any]:
    """{task: summary} for `tasks`, reusing finished task files; loads the model only if something is left.
    `root`: the experiment folder (is_current); `subdir`: the folder under `stage_dir` the files go to (an
    intermediate checkpoint's, esft.experiments.checkpoint_eval); `with_passk` False skips the spec's pass@k."""
    from esft.evaluation import evaluate_task, format_row, load_examples
    from esft.generation import GenerationConfig
    from esft.tasks import get_task

    out_dir = stage_dir / subdir
    results: dict[str, Any] = {}
    todo = []
    for task in tasks:
        settings = task_settings(spec, task, model_ref)
        greedy = _done(out_dir / f"{task_slug(task)}.json", settings, root)
        sampled_settings = passk_settings(spec, task, model_ref) if with_passk else None
        sampled = _done(out_dir / f"{task_slug(task)}.passk.json", sampled_settings, root) if sampled_settings \
            else None
        if greedy is not None and (sampled_settings is None or sampled is not None):
            results[task] = {**greedy, "sampled": sampled} if sampled else greedy
        else:
            todo.append((task, settings, greedy, sampled_settings, sampled))
    if not todo:
        return results
    ev = spec.evaluation
    model, tokenizer = load_model(model_ref, ev.dtype, ev.device)
    try:
        for task, settings, summary, sampled_settings, sampled in todo:
            t = get_task(task, **spec.task_options.get(task, {}))
            examples = load_examples(t, "test", settings["limit"], balanced=settings.get("balanced", False))
            gen = GenerationConfig(max_new_tokens=settings["max_new_tokens"], temperature=0.0,
                                   batch_size=settings["batch_size"], **settings.get("generation_options", {}))
            if summary is None:
                t0 = time.perf_counter()
                summary = evaluate_task(model, tokenizer, t, examples, gen,
                                        output_path=out_dir / f"{task_slug(task)}.jsonl", progress=progress)
                summary["seconds"] = time.perf_counter() - t0
                if settings.get("balanced") and t.label_set() is not None:
                    summary["balanced"] = True
                write_json(out_dir / f"{task_slug(task)}.json", {"settings": settings, "summary": summary})
                if progress:
                    print(f"  {format_row(task, summary)}  ({summary['seconds']:.0f} s)", flush=True)
            if sampled_settings is not None:
                if sampled is None:
                    sampled = _sample(model, tokenizer, t, task, examples, gen, sampled_settings,
                                      out_dir / f"{task_slug(task)}.passk", progress)
                summary = {**summary, "sampled": sampled}
            results[task] = summary
    finally:
        del model
    return {task: results[task] for task in tasks}


def _sample(model: Any, tokenizer: Any, task: Any, name: str, examples: list[dict], greedy: Any,
            settings: dict[str, Any], stem: Path, progress: bool) -> dict[str, Any]:
    """pass@k / mean@n / maj@k of `settings["samples"]` sampled completions per question; written next to the
    greedy files and returned. `name`: the spec's task string, options included, as the greedy line prints it."""
    import dataclasses

    from esft.evaluation import evaluate_task_sampled

    gen = dataclasses.replace(greedy, temperature=settings["temperature"], top_p=settings["top_p"],
                              seed=settings["seed"])
    t0 = time.perf_counter()
    sampled = evaluate_task_sampled(model, tokenizer, task, examples, gen, settings["samples"], settings["k"],
                                    output_path=stem.with_suffix(".passk.jsonl"), progress=progress)
    sampled["seconds"] = time.perf_counter() - t0
    write_json(stem.with_suffix(".passk.json"), {"settings": settings, "summary": sampled})
    if progress:
        ks = (", ".join(f"pass@{k} {v['value']:.3f}" for k, v in sampled["pass@k"].items()) if sampled["pass@k"]
              else f"pass@k n/a (scores not 0/1), mean@{settings['samples']} {sampled['accuracy']:.3f}")
        print(f"  {name:<10} sampled x{settings['samples']}: {ks}  ({sampled['seconds']:.0f} s)", flush=True)
    return sampled
