"""Evaluate a model on tasks: batched generation, the task's own scorer, accuracy with a 95% CI.

Writes, per task, every completion with its score to `<output_dir>/<task>.jsonl`, and a summary of all tasks to
`<output_dir>/summary.json` (after Ctrl-C or SIGTERM, of the tasks that finished, with `unfinished` naming the
others). The same scorer is the training reward (nanochat's rule: reward is evaluation).

Default: one greedy completion per question (the paper's protocol). With `samples > 1` (or `k` given) every
question gets n sampled completions and the summary adds pass@k, mean@n and maj@k with bootstrap CIs over
questions (`esft.passk`; pass@k only for 0/1 scores, n/a for a reward on another scale), and with an output
folder `<task>.passk.png` draws pass@k over k (`write_passk_figure`); `pass_at_k(n, c, k)` is re-exported here.
A task whose answer is one of L labels (BoolQ's yes/no, A-D) also gets `chance_pass@k`, the pass@k of a uniform
random guess, 1 - (1 - 1/L)^k (`chance_entry`), which climbs with k where the constant answer stays flat.

Every summary carries, next to the accuracy and its 95% Wilson interval, the *constant-answer baseline* of the same
examples (`constant_baseline`, `constant_baseline_ci95`, `constant_answer`: always giving the most frequent gold
answer), so that an accuracy a prior alone could reach is visible as such. With `balanced` the labelled tasks
(esft.tasks.labels.LABELLED_TASKS; a Countdown variant over the target's operator) are evaluated
on a label-balanced subset of the split instead of its first `limit` examples (`esft.tasks.labels`), where that
baseline is 1/K; the task's scorer is the same either way.
"""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from esft.eval_config import EvalConfig, task_options
from esft.generation import Generation, GenerationConfig, generate
from esft.passk import answer_key, chance_pass_at_k, parse_ks, pass_at_k, summarize_samples
from esft.rundir import RunInterrupted, write_text_atomic
from esft.sample_rows import sample_row
from esft.tasks import Task, get_task, task_file_stem
from esft.tasks.base import checks_format
from esft.tasks.labels import ACCURACY, BALANCE_SEED, balanced_subset, score_name, summaries_score_name
from esft.validation import check_results_dir


def load_examples(task: Task, split: str, limit: int | None = None, balanced: bool = False,
                  seed: int = BALANCE_SEED) -> list[dict]:
    """The examples to evaluate: the first `limit` of the split, or with `balanced` (tasks with a label set
    only; others ignore it) a label-balanced subset of `limit` examples (None = as many as the rarest label
    allows), in split order."""
    labels = task.label_set() if balanced else None
    if labels is None:
        return task.load(split, limit=limit)
    rows = task.load(split)
    chosen = balanced_subset(rows, [task.balance_key(r) for r in rows], limit, seed, labels)
    if limit is not None and len(chosen) < limit:  # rounded down to equal counts: say so, not only n= in the row
        warnings.warn(f"{task.name}: the balanced subset holds {len(chosen)} examples, not {limit}: "
                      f"{len(chosen) // len(set(labels))} of each of its {len(set(labels))} labels", stacklevel=2)
    return chosen


def evaluate_task(
    model,
    tokenizer,
    task: Task,
    examples: Sequence[dict],
    gen_config: GenerationConfig,
    output_path: Path | None = None,
    progress: bool = True,
    records_out: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Generate for `examples`, score each completion, return the task's summary metrics; `records_out`, when
    given, receives the per-completion records (the rows of `output_path`)."""
    t0 = time.perf_counter()
    prompts = [task.prompt(ex) for ex in examples]
    gens: list[Generation] = generate(model, tokenizer, prompts, gen_config, progress=progress)
    gen_s = time.perf_counter() - t0
    records = [completion_record(task, ex, g, {"index": i}) for i, (ex, g) in enumerate(zip(examples, gens))]
    summary = task_summary(task, records)
    summary.update(generation_stats(gens, gen_s))
    write_jsonl(output_path, records)
    if records_out is not None:
        records_out.extend(records)
    return summary


def task_summary(task: Task, records: list[dict[str, Any]]) -> dict[str, Any]:
    """`task.aggregate(records)` without the constant-answer baseline when a score lies outside [0, 1]: that
    baseline is a share of examples, no companion for a mean reward. Task.aggregate leaves it out itself; this also
    covers a task whose own `aggregate` adds one."""
    summary = task.aggregate(records)
    if score_name(float(r["score"]) for r in records) != ACCURACY:
        for key in ("constant_baseline", "constant_baseline_ci95", "constant_answer", "constant_baseline_bound"):
            summary.pop(key, None)
    return summary


def completion_record(task: Task, example: dict, g: Generation, head: dict[str, Any],
                      details: dict[str, Any] | None = None, score: float | None = None) -> dict[str, Any]:
    """One JSONL row (esft.sample_rows): ids first, then score, format flag, the task's details, the completion
    and its example."""
    return sample_row(head, score=task.score(g.text, example) if score is None else score,
                      well_formed=task.is_well_formed(g.text, example) if checks_format(task) else None,
                      details=task.details(g.text, example) if details is None else details,
                      finished=g.finished, prompt_tokens=g.prompt_tokens, completion_tokens=len(g.completion_ids),
                      completion=g.text, example=example)


def generation_stats(gens: Sequence[Generation], seconds: float) -> dict[str, Any]:
    """Measured token accounting of a set of generations."""
    return {
        "generation_s": round(seconds, 3),
        "prompt_tokens": sum(g.prompt_tokens for g in gens),
        "completion_tokens": sum(len(g.completion_ids) for g in gens),
        "truncated_rate": (sum(not g.finished for g in gens) / len(gens)) if gens else 0.0,
    }


def write_jsonl(path: Path | None, records: Sequence[dict[str, Any]]) -> None:
    """Replace `path` whole: a Ctrl-C while the records are written leaves the file of an earlier evaluation into
    the same folder as it was (its summary.json describes it), not cut short."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "".join(json.dumps(rec, ensure_ascii=False, default=str) + "\n" for rec in records))


def sample_seed(seed: int, sample: int) -> int:
    """Generation seed of sample s: independent streams per sample (SeedSequence), reproducible from the seed."""
    return int(np.random.SeedSequence([int(seed), int(sample)]).generate_state(1, dtype=np.uint32)[0])


def evaluate_task_sampled(model, tokenizer, task: Task, examples: Sequence[dict], gen_config: GenerationConfig,
                          samples: int, ks: Sequence[int], output_path: Path | None = None,
                          progress: bool = True) -> dict[str, Any]:
    """n sampled completions per question; the task's summary plus pass@k, mean@n, maj@k (bootstrap CIs).

    One generate() call per sample index, each over all questions with its own seed (`sample_seed`): sample s of
    question i is drawn from the stream keyed by (sample seed s, i), so it is the same whatever `samples` is and
    whatever the batch size."""
    t0 = time.perf_counter()
    prompts = [task.prompt(ex) for ex in examples]
    per_sample: list[list[Generation]] = []
    seeds = [sample_seed(gen_config.seed, s) for s in range(samples)]
    # each generate call's bar reads "16/16 prompts" alike: this one says how many of the n passes are done
    bar = _samples_bar(samples) if progress else None
    try:
        for seed in seeds:
            cfg = dataclasses.replace(gen_config, seed=seed)
            per_sample.append(generate(model, tokenizer, prompts, cfg, progress=progress))
            if bar is not None:
                bar.update(1)
    finally:  # cleared before whatever follows is printed, Ctrl-C's message too
        if bar is not None:
            bar.close()
    gen_s = time.perf_counter() - t0
    q = len(examples)
    scores = np.zeros((q, samples))
    keys: list[list[Any]] = [[None] * samples for _ in range(q)]
    has_answers = False
    records = []
    for i, ex in enumerate(examples):
        for s in range(samples):
            g = per_sample[s][i]
            details = task.details(g.text, ex)
            has_answers = has_answers or bool({"extracted", "normalized", "vote_key"} & details.keys())
            keys[i][s] = answer_key(details)
            score = task.score(g.text, ex)
            scores[i, s] = score
            records.append(completion_record(task, ex, g, {"index": i, "sample": s}, details, score))
    summary = task_summary(task, records)  # task metrics (format rate, IFEval levels ...) over all completions
    # maj@k only where the task extracts answers to vote on (IFEval has none)
    metrics = summarize_samples(scores, keys if has_answers else None, ks, seed=gen_config.seed)
    gens = [g for row in per_sample for g in row]
    summary.update({
        "n": q, "completions": q * samples, "accuracy": metrics["mean@n"]["value"],
        "ci95": metrics["mean@n"]["ci95"], "temperature": gen_config.temperature, "top_p": gen_config.top_p,
        "sample_seeds": seeds, **metrics, **generation_stats(gens, gen_s),
    })
    chance = chance_entry(task, metrics)
    if chance is not None:
        summary["chance_pass@k"] = chance
    write_jsonl(output_path, records)
    return summary


def chance_entry(task: Task, metrics: dict[str, Any]) -> dict[str, Any] | None:
    """The pass@k of a uniform random guess among the task's answer labels (`Task.answer_labels`: BoolQ's yes/no,
    A-D) at the summary's k (esft.passk.chance_pass_at_k); None for a task without such labels (open answers, a
    Countdown variant whose labels are operators) or without pass@k (scores not 0/1)."""
    own = getattr(task, "answer_labels", None)  # a bare task object may lack the Task methods
    labels = own() if callable(own) else None
    if not labels or not metrics.get("pass@k"):
        return None
    return chance_pass_at_k(labels, [int(k) for k in metrics["pass@k"]])


def _samples_bar(samples: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=samples, desc="samples", unit="sample", leave=False)


def config_changes(old: dict[str, Any], config: EvalConfig, unrecorded: bool = False) -> list[str]:
    """What differs between a summary.json's recorded config `old` and `config` ("key: old there, new now"); empty
    for the same evaluation. output_dir names the folder, however it is spelled (res/, res, /abs/res): where, not
    what, was evaluated. Options a newer esft added, which `old` does not record, do not count, unless
    `unrecorded`: then one set to other than its default does (results kept from `old` must have been measured
    as `config` would measure them)."""
    new = json.loads(json.dumps(asdict(config), default=str))  # as summary.json records it
    defaults = json.loads(json.dumps(asdict(EvalConfig()), default=str))
    return [f"{k}: {old.get(k, 'not recorded')!r} there, {new[k]!r} now" for k in new if k != "output_dir"
            and (old[k] != new[k] if k in old else unrecorded and new[k] != defaults.get(k))]


def check_previous_results(config: EvalConfig) -> None:
    """FileExistsError when output_dir's summary.json holds another evaluation (other model, tasks, limit, ...):
    this one would replace it without a word. The same evaluation again (repeated or interrupted) may overwrite
    its own; options a newer esft added, which that summary does not record, do not count. A run's or a model's
    folder is refused (esft.validation.check_results_dir)."""
    if config.output_dir:
        check_results_dir(config.output_dir)
    path = Path(config.output_dir) / "summary.json" if config.output_dir else None
    try:
        old = json.loads(path.read_text(encoding="utf-8"))["config"] if path and path.is_file() else None
    except (OSError, ValueError, KeyError, TypeError):
        old = None  # not a summary of esft's: nothing of an evaluation to keep
    if not isinstance(old, dict):
        return
    changed = config_changes(old, config)
    if changed:
        raise FileExistsError(f"{path} holds the results of another evaluation ({'; '.join(changed[:3])}"
                              f"{', ...' if len(changed) > 3 else ''}): choose another --output-dir, or delete that "
                              "summary.json to replace them")


def run_eval(config: EvalConfig, model=None, tokenizer=None, progress: bool = True) -> dict[str, Any]:
    """Evaluate `config.model` on every task in `config.tasks`; returns {task: summary}."""
    from esft.models import load_model

    from esft.tasks.custom import external_kind

    tasks = {name: get_task(name, **task_options(name, config.max_passage_chars),
                            **(config.task_options if external_kind(name) else {})) for name in config.tasks}
    if model is None:
        model, tokenizer = load_model(config.model, dtype=config.dtype, device=config.device)
    gen_config = GenerationConfig(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                                  top_p=config.top_p, batch_size=config.batch_size, seed=config.seed,
                                  **config.generation_options)
    out_dir = Path(config.output_dir) if config.output_dir else None
    results: dict[str, Any] = {}
    try:
        for name, task in tasks.items():
            examples = load_examples(task, config.split, config.limit, config.balanced, config.balance_seed)
            path = out_dir / f"{task_file_stem(name)}.jsonl" if out_dir else None
            if config.sampled:
                results[name] = evaluate_task_sampled(model, tokenizer, task, examples, gen_config, config.samples,
                                                      parse_ks(config.k, config.samples), path, progress)
            else:
                results[name] = evaluate_task(model, tokenizer, task, examples, gen_config, path, progress)
            if config.balanced:
                results[name]["balanced"] = task.label_set() is not None
            if progress:
                print(format_row(name, results[name]), flush=True)
            if out_dir is not None and config.sampled:
                write_passk_figure(out_dir / f"{task_file_stem(name)}.passk.png", name, config.model, results[name])
    except KeyboardInterrupt:
        raise RunInterrupted(_keep_finished(config, out_dir, results)) from None
    if out_dir is not None:
        payload = {"config": asdict(config), "results": results}
        write_text_atomic(out_dir / "summary.json", json.dumps(payload, indent=2, default=str))  # old or new, whole
    return results


def _keep_finished(config: EvalConfig, out_dir: Path | None, results: dict[str, Any]) -> str:
    """After Ctrl-C or SIGTERM: summary.json of the tasks that finished, `unfinished` naming the others, so that
    their summaries are not only on the screen (a task's JSONL is written when it finishes); the results of an
    earlier run of this same evaluation in the folder are kept for the tasks this one did not reach. Returns the
    message that says what was kept."""
    left = [name for name in config.tasks if name not in results]
    if out_dir is None or not results:
        return f"interrupted: {len(results)} of {len(config.tasks)} tasks evaluated"
    path = out_dir / "summary.json"
    try:
        old = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        same = (isinstance(old, dict) and isinstance(old.get("config"), dict) and isinstance(old.get("results"), dict)
                and not config_changes(old["config"], config, unrecorded=True))
    except (OSError, ValueError):
        same = False
    kept = {name: old["results"][name] for name in left if same and name in old["results"]}
    left = [name for name in left if name not in kept]
    merged = {**kept, **results}
    payload = {"config": asdict(config), "results": {name: merged[name] for name in config.tasks if name in merged},
               "unfinished": left}
    write_text_atomic(path, json.dumps(payload, indent=2, default=str))
    return (f"interrupted: {path} holds {', '.join(results)}"
            + (f" (and, from an earlier run of this evaluation, {', '.join(kept)})" if kept else "")
            + (f"; not evaluated: {', '.join(left)} (listed under `unfinished` there)" if left else ""))


def write_passk_figure(path: Path, name: str, model: str, summary: dict[str, Any]) -> Path:
    """The pass@k figure (esft.passk_figure) of one task's sampled summary: the model's curve with its bootstrap
    intervals, the constant-answer baseline and, for a task answered by one of a few labels, the chance curve; for
    scores that are not 0/1, the reason pass@k is n/a in its place."""
    from esft.passk_figure import (baseline_from_summary, chance_from_summary, curve_from_summary, model_label,
                                   passk_figure, save_figure, skipped_note)

    label = model_label(model)
    curve = curve_from_summary(label, summary)
    subtitle = (f"{summary['samples']} samples per question at temperature {summary['temperature']:g}, top_p "
                f"{summary['top_p']:g}; {summary['n']} questions")
    fig = passk_figure([curve] if curve else [], f"pass@k on {name} | model {model}", baseline_from_summary(summary),
                       note=skipped_note([(label, summary)]), subtitle=subtitle,
                       chance=chance_from_summary(summary))
    return save_figure(fig, path)


def format_row(name: str, s: dict[str, Any]) -> str:
    """One task's printed line. A reward scored outside [0, 1] reads `mean reward`, not `acc`, and shows no
    constant-answer baseline (esft.tasks.labels.score_name)."""
    lo, hi = s["ci95"]
    accuracy = summaries_score_name([s], "accuracy", "ci95") == ACCURACY
    extra = ""
    if "prompt_strict" in s:
        extra = (f"  prompt strict/loose {s['prompt_strict']:.3f}/{s['prompt_loose']:.3f}"
                 f"  instr strict/loose {s['instruction_strict']:.3f}/{s['instruction_loose']:.3f}")
    fmt = f"  format {s['format_rate']:.3f}" if "format_rate" in s else ""
    fmt += constant_text(s) if accuracy else ""
    if "pass@k" in s:  # sampled protocol: accuracy is mean@n; then pass@k and maj@k per k
        if s["pass@k"] is None:  # scores not 0/1 (esft.passk.not_right_or_wrong)
            extra += "  pass@k n/a (scores not 0/1)"
        for metric in ("pass@k", "maj@k"):
            for k, m in (s.get(metric) or {}).items():
                extra += f"  {metric[:-1]}{k} {m['value']:.3f} [{m['ci95'][0]:.3f}, {m['ci95'][1]:.3f}]"
        return (f"{name:<10} n={s['n']:<5} x{s['samples']} mean@{s['samples']} {s['accuracy']:.3f}  "
                f"95% CI [{lo:.3f}, {hi:.3f}]{fmt}{extra}")
    label = "acc" if accuracy else "mean reward"
    return f"{name:<10} n={s['n']:<5} {label} {s['accuracy']:.3f}  95% CI [{lo:.3f}, {hi:.3f}]{fmt}{extra}"


def constant_text(s: dict[str, Any]) -> str:
    """`  const 0.635 [0.566, 0.699] (yes)` for a summary with a constant-answer baseline, else ''; a baseline
    without its interval (a task's own `aggregate`) shows the point alone, as every other place does, and an upper
    bound (`constant_baseline_bound`, Countdown's) reads `const at most 0.020 ...`."""
    if s.get("constant_baseline") is None:
        return ""
    interval = s.get("constant_baseline_ci95")
    bounds = f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else ""
    answer = str(s.get("constant_answer", ""))
    answer = answer if len(answer) <= 12 else answer[:12] + "..."
    balanced = "  balanced" if s.get("balanced") else ""
    bound = f"{s['constant_baseline_bound']} " if s.get("constant_baseline_bound") else ""
    return f"  const {bound}{s['constant_baseline']:.3f}{bounds} ({answer}){balanced}"


def format_table(results: dict[str, Any]) -> str:
    return "\n".join(format_row(k, v) for k, v in results.items())


__all__ = ["chance_entry", "check_previous_results", "constant_text", "evaluate_task", "evaluate_task_sampled",
           "format_row", "format_table", "load_examples", "pass_at_k", "run_eval", "sample_seed", "write_passk_figure"]
