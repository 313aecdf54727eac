"""Evaluation of one stage's model on its tasks, one JSON per task, resumable task by task.

`<stage>/eval/<task>.json` holds the summary of `esft.evaluation.evaluate_task` (accuracy, Wilson CI, format rate,
IFEval strict/loose ...) plus the settings it ran with; `<task>.jsonl` every completion. A task whose JSON exists
with the same settings and model is not evaluated again, so an interrupted evaluation loses at most one task.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from esft.experiments.spec import Spec

EVAL_DIR = "eval"


def task_settings(spec: Spec, task: str, model: str) -> dict[str, Any]:
    ev = spec.evaluation
    te = ev.for_task(task)
    return {"model": model, "split": "test", "limit": te.limit, "max_new_tokens": te.max_new_tokens,
            "batch_size": te.batch_size, "temperature": 0.0, "dtype": ev.dtype, "device": ev.device,
            "task_options": spec.task_options.get(task, {})}


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
                   load_model: Callable[[str, str, str | None], tuple[Any, Any]], progress: bool = True
                   ) -> dict[str, Any]:
    """{task: summary} for `tasks`, reusing finished task files; loads the model only if something is left."""
    from esft.evaluation import evaluate_task, format_row
    from esft.generation import GenerationConfig
    from esft.tasks import get_task

    out_dir = stage_dir / EVAL_DIR
    results: dict[str, Any] = {}
    todo = []
    for task in tasks:
        settings = task_settings(spec, task, model_ref)
        prior = read_json(out_dir / f"{task}.json")
        if prior and prior.get("settings") == settings and "summary" in prior:
            results[task] = prior["summary"]
        else:
            todo.append((task, settings))
    if not todo:
        return results
    ev = spec.evaluation
    model, tokenizer = load_model(model_ref, ev.dtype, ev.device)
    try:
        for task, settings in todo:
            t = get_task(task, **spec.task_options.get(task, {}))
            examples = t.load("test", settings["limit"])
            gen = GenerationConfig(max_new_tokens=settings["max_new_tokens"], temperature=0.0,
                                   batch_size=settings["batch_size"])
            t0 = time.perf_counter()
            summary = evaluate_task(model, tokenizer, t, examples, gen, output_path=out_dir / f"{task}.jsonl",
                                    progress=progress)
            summary["seconds"] = time.perf_counter() - t0
            write_json(out_dir / f"{task}.json", {"settings": settings, "summary": summary})
            results[task] = summary
            if progress:
                print(f"  {format_row(task, summary)}  ({summary['seconds']:.0f} s)", flush=True)
    finally:
        del model
    return {task: results[task] for task in tasks}
