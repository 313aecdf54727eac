"""An experiment folder's measured records, as the tables read them: the plan, every finished stage's
`result.json` and `status.json`, and the values a table cell takes from them (accuracy, the constant-answer
baseline, the evaluation settings).

A task whose reward function scores outside [0, 1] (`module:function` rewards may return any number) has a mean
reward, not an accuracy (esft.tasks.labels.score_name): its cells are plain numbers with three decimals rather than
percentages, and it has no constant-answer baseline, which is a share of examples."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from esft import paper
from esft.experiments.checkpoint_eval import STEPS_DIR
from esft.experiments.plan import task_slug
from esft.experiments.stage_eval import EVAL_DIR
from esft.tables import DASH, NA, Cell
from esft.tasks.labels import MEAN_REWARD, summaries_score_name

CONSTANT_LABEL = "Constant answer"
CONSTANT_NOTE = ("Constant answer: accuracy (%) of always giving one gold answer of the evaluated examples (the most "
                 "frequent one; under a reward function, the best of the most frequent ones), with its 95% Wilson "
                 "interval.")
#: decimals of a table cell holding a mean reward (an accuracy in % has one)
REWARD_DIGITS = 3


def task_name(task: str, short: bool = False) -> str:
    """Display name; a task with options (countdown:numbers=2,ops=+) shows them: Countdown (numbers=2, ops=+)."""
    base, _, options = task.partition(":")
    name = (paper.TASK_DISPLAY_SHORT if short else paper.TASK_DISPLAY).get(base, base)
    return f"{name} ({options.replace(',', ', ')})" if options else name


@dataclass
class Experiment:
    root: Path
    spec: dict[str, Any]
    stages: list[dict[str, Any]]
    """plan entries (plan.json), in execution order"""
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    """stage key -> result.json of finished stages"""
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    stale: dict[str, list[str]] = field(default_factory=dict)
    """stage key -> the tasks whose evaluation there was made with other settings than plan.json's, left out"""
    stale_sampled: dict[str, list[str]] = field(default_factory=dict)
    """stage key -> the tasks whose sampled (pass@k) evaluation there was made with other settings, left out"""

    @property
    def seeds(self) -> list[int]:
        return list(self.spec.get("seeds", []))

    @property
    def tasks(self) -> list[str]:
        return list(self.spec.get("tasks", []))

    @property
    def holdout(self) -> list[str]:
        return list(self.spec.get("evaluation", {}).get("holdout", []))

    @property
    def ifeval_metric(self) -> str:
        return self.spec.get("ifeval_metric", "prompt_strict")

    def tracks(self, kind: str) -> list[tuple[str, str]]:
        """(track, display) of the training stages of a kind ("single-task" / "sequential"), in plan order."""
        seen: dict[str, str] = {}
        for s in self.stages:
            if s["kind"] == "train" and f"/{kind}/" in f"/{s['key']}/":
                seen.setdefault(s["track"], s["display"])
        return list(seen.items())

    def find(self, kind: str, seed: int, track: str, task: str | None = None, index: int | None = None
             ) -> dict[str, Any] | None:
        for s in self.stages:
            if (s["kind"] == "train" and s["seed"] == seed and s["track"] == track and f"/{kind}/" in f"/{s['key']}/"
                    and (task is None or s["task"] == task) and (index is None or s["index"] == index)):
                return self.results.get(s["key"])
        return None

    @property
    def base(self) -> dict[str, Any] | None:
        return self.results.get("base")

    def cell(self, get: Callable[[int], float | None], bold: bool = False,
             ci: Callable[[int], tuple[float, float] | None] | None = None, digits: int = 1, once: bool = False
             ) -> Cell:
        """A table cell holding `get(seed)` for every seed of the experiment (and `ci(seed)`, its 95% interval);
        `once`: for the first seed only, a value measured once for all of them (the base model's), shown with its
        interval rather than as a mean +- 0 over copies of itself."""
        seeds = self.seeds[:1] if once else self.seeds
        return Cell({seed: get(seed) for seed in seeds}, bold,
                    {seed: ci(seed) for seed in seeds} if ci is not None else {}, digits, shared=once)

    def score_name(self, task: str) -> str:
        """ACCURACY or MEAN_REWARD (esft.tasks.labels.score_name) for `task`, from every recorded evaluation of it:
        the mean and the 95% interval bounds."""
        return summaries_score_name((((rec or {}).get("eval") or {}).get(task) or {} for rec in self.results.values()),
                                    "accuracy", "ci95")

    def is_reward(self, task: str) -> bool:
        return self.score_name(task) == MEAN_REWARD


def not_an_experiment(root: Path, advice: str = "") -> FileNotFoundError:
    """The refusal of a folder without plan.json: one that does not exist, one of training runs (`esft report`
    reads those), or any other folder (`advice` says how one becomes an experiment folder)."""
    from esft.rundir import is_run_dir

    if not root.exists():
        return FileNotFoundError(f"{root} does not exist (an experiment folder is `esft experiment run`'s "
                                 "--output-dir)")
    if root.is_dir() and any(is_run_dir(p.parent) for p in root.rglob("config.yaml")):
        what = "is a training run's folder" if is_run_dir(root) else "holds training runs"
        return FileNotFoundError(f"{root} is not an experiment folder (no plan.json): it {what}, which "
                                 f"`esft report {root}` reports on")
    return FileNotFoundError(f"{root} is not an experiment folder (no plan.json{advice})")


def read_plan(root: Path, advice: str = "") -> dict[str, Any]:
    """The plan.json of the experiment folder `root`; one that cannot be read is named, with how to get it back
    (a bare JSON error said neither which file nor what to do)."""
    path = root / "plan.json"
    if not path.exists():
        raise not_an_experiment(root, advice)
    try:
        plan = json.loads(path.read_text())
        if isinstance(plan, dict) and isinstance(plan.get("stages"), list):
            return plan
        problem = "not an experiment plan"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        problem = str(exc)
    raise ValueError(f"{path} is unreadable ({problem}): `esft experiment run SPEC --output-dir {root}` writes it "
                     "again from the spec, keeping every stage it finished")


def load_experiment(root: str | Path) -> Experiment:
    """The plan, every stage's status.json and the result.json of every stage whose status is done (or unknown)."""
    root = Path(root)
    plan = read_plan(root, "; run `esft experiment run` first")
    exp = Experiment(root, plan["spec"], plan["stages"])
    for s in exp.stages:
        for name, target in (("result.json", exp.results), ("status.json", exp.statuses)):
            path = root / s["key"] / name
            if path.exists():
                try:
                    target[s["key"]] = json.loads(path.read_text())
                except json.JSONDecodeError:
                    pass
        status = exp.statuses.get(s["key"])
        if isinstance(status, dict) and status.get("status") != "done":
            # a stage being run again (its evaluation settings changed) keeps its earlier result.json until it is
            # done: those numbers were measured under other settings, perhaps on other examples than its neighbours'
            exp.results.pop(s["key"], None)
    _leave_out_stale(exp, plan.get("evaluation"), plan.get("sampled"))
    return exp


def _saved_settings(path: Path) -> dict[str, Any] | None:
    """The settings an evaluation file was made with, but the model; None when there is no file to read."""
    try:
        saved = dict(json.loads(path.read_text()).get("settings") or {})
    except (OSError, json.JSONDecodeError):
        return None
    saved.pop("model", None)
    return saved


def _leave_out_stale(exp: Experiment, settings: dict[str, dict[str, Any]] | None,
                     sampled: dict[str, dict[str, Any]] | None) -> None:
    """Drop each stage's evaluation of a task made with other settings than the plan's (esft.experiments.stage_eval.
    plan_settings, plan_sampled_settings; none to compare with in a plan of an older esft), naming it in
    `exp.stale` (`exp.stale_sampled` for a pass@k alone): a run that re-evaluates under new settings and stops before
    a stage leaves that stage's old result, perhaps on other examples or with another n, k or temperature."""
    for key, record in exp.results.items():
        evals = record.get("eval") or {}
        for task in list(evals if settings else ()):
            saved = _saved_settings(exp.root / key / EVAL_DIR / f"{task_slug(task)}.json")
            if saved is not None and task in settings and saved != settings[task]:
                del evals[task]
                exp.stale.setdefault(key, []).append(task)
        for task in list(evals if sampled is not None else ()):
            if not isinstance(evals[task], dict) or "sampled" not in evals[task]:
                continue
            if task not in sampled:  # the spec samples it no more: its tables show no pass@k of it, nothing is stale
                continue
            saved = _saved_settings(exp.root / key / EVAL_DIR / f"{task_slug(task)}.passk.json")
            if saved is not None and saved != sampled[task]:
                del evals[task]["sampled"]
                exp.stale_sampled.setdefault(key, []).append(task)


def accuracy(record: dict[str, Any] | None, task: str, ifeval_metric: str = "prompt_strict",
             scale: float = 100.0) -> float | None:
    """Accuracy in % of `task` in a stage record (IFEval: the chosen strict/loose level); `scale` 1 leaves the
    score as recorded (a mean reward)."""
    if not record:
        return None
    summary = record.get("eval", {}).get(task)
    if not summary:
        return None
    key = ifeval_metric if task == "ifeval" else "accuracy"
    if key == "prompt_strict" and key not in summary:  # IFEval's `accuracy` is its prompt-strict level
        key = "accuracy"
    value = summary.get(key)  # a missing loose or instruction level is None, not the strict figure
    return None if value is None else scale * float(value)


def interval(record: dict[str, Any] | None, task: str, ifeval_metric: str = "prompt_strict", scale: float = 100.0
             ) -> tuple[float, float] | None:
    """The 95% interval (in %, or times `scale`) of `accuracy(record, task, ifeval_metric, scale)`, None where the
    evaluation gave none for that metric (IFEval's intervals are of its `accuracy`, the prompt-strict level)."""
    summary = ((record or {}).get("eval") or {}).get(task) or {}
    ci = summary.get("ci95")
    if not ci or None in ci:
        return None
    if task == "ifeval":
        # the Wilson interval of a share of the n prompts is another prompt-level share's only where the two are
        # equal, and never an instruction-level share's: that is a share of the instructions, another count
        level = accuracy(record, task, ifeval_metric, 1.0)
        if ifeval_metric.startswith("instruction") or level is None or level != summary.get("accuracy"):
            return None
    return scale * float(ci[0]), scale * float(ci[1])


def percent(value: Any, scale: float = 100.0) -> float | None:
    """`value` (a share, or a mean reward with `scale` 1) times `scale`; None stays None."""
    return None if value is None else scale * float(value)


def ci_text(summary: dict[str, Any], scale: float = 100.0, digits: int = 1) -> str:
    """`[a, b]`: the `ci95` of a summary (an evaluation's, or one pass@k entry's) times `scale`, or a dash."""
    ci = summary.get("ci95")
    return f"[{scale * ci[0]:.{digits}f}, {scale * ci[1]:.{digits}f}]" if ci and None not in ci else DASH


def table_slug(track: str) -> str:
    """A track's part of a table's file name: `es@100` -> `es_100`, `grpo->es` -> `grpo-es`."""
    return track.replace("@", "_").replace("->", "-").replace("/", "-")


def constant_baseline(exp: Experiment, task: str) -> dict[str, Any] | None:
    """The constant-answer baseline of `task`'s evaluated examples: from the base model's evaluation, else from
    the first stage that recorded one (every stage evaluates the same examples). None for a mean reward."""
    if exp.is_reward(task):
        return None
    for rec in [exp.base, *exp.results.values()]:
        summary = ((rec or {}).get("eval") or {}).get(task) or {}
        if summary.get("constant_baseline") is not None:
            return summary
    return None


def constant_text(summary: dict[str, Any] | None, ci: bool = True) -> str:
    """`63.5 [56.6, 69.9]` (%, with the Wilson interval), or a dash."""
    if not summary:
        return DASH
    text = f"{100 * float(summary['constant_baseline']):.1f}"
    interval = summary.get("constant_baseline_ci95")
    return f"{text} [{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]" if ci and interval else text


def constant_row(exp: Experiment, tasks: Sequence[str], repeat: int = 1) -> tuple[str, list[Cell | str]] | None:
    """A table row of constant-answer baselines, one per task, each repeated `repeat` times (n/a for a mean
    reward); None without any."""
    found = [constant_baseline(exp, t) for t in tasks]
    if not any(found):
        return None
    return CONSTANT_LABEL, [NA if exp.is_reward(t) else constant_text(f) for t, f in zip(tasks, found)
                            for _ in range(repeat)]


def eval_note(exp: Experiment, tasks: Sequence[str]) -> str:
    ev = exp.spec.get("evaluation", {})
    parts = []
    for t in tasks:
        per = ev.get("per_task", {}).get(t, {})
        limit = per.get("limit", ev.get("limit"))
        tokens = per.get("max_new_tokens", ev.get("max_new_tokens"))
        n = eval_n(exp, t)
        parts.append(f"{task_name(t)} n={n if n is not None else limit or 'all'}, {tokens} new tokens")
    return "Greedy evaluation on the test split: " + "; ".join(parts) + "."


def eval_n(exp: Experiment, task: str) -> int | None:
    for r in exp.results.values():
        s = r.get("eval", {}).get(task)
        if s and "n" in s:
            return int(s["n"])
    return None


def seed_note(exp: Experiment) -> str:
    n = len(exp.seeds)
    if n == 1:
        return f"Seed {exp.seeds[0]}."
    return f"Mean ± sample std (ddof=1) over {n} seeds ({', '.join(map(str, exp.seeds))}); the base model is " \
           f"evaluated once (greedy decoding does not depend on the seed)."


def score_words(exp: Experiment, tasks: Sequence[str]) -> str:
    """What the cells of `tasks` are: "accuracy (%)", "mean reward", or "accuracy (%) or mean reward"."""
    rewards = sum(exp.is_reward(t) for t in tasks)
    if not rewards:
        return "accuracy (%)"
    return MEAN_REWARD if rewards == len(tasks) else f"accuracy (%) or {MEAN_REWARD}"


def reward_note(exp: Experiment, tasks: Sequence[str]) -> list[str]:
    """The note of a table with mean-reward cells (none without any)."""
    names = [task_name(t) for t in dict.fromkeys(tasks) if exp.is_reward(t)]
    if not names:
        return []
    return [f"Mean reward, a plain number on its reward function's scale (not %): {', '.join(names)}; [a, b] is "
            "the 95% normal-approximation interval of its mean, and it has no constant-answer baseline (a share "
            "of examples)."]


def checkpoint_evaluations(exp: Experiment) -> dict[str, dict[int, dict[str, dict[str, Any]]]]:
    """Stage key -> step -> task -> {"accuracy", "ci95", "n", "constant_baseline", "constant_baseline_ci95"} of the
    intermediate checkpoints of every done stage (spec: evaluation.checkpoints; esft.experiments.checkpoint_eval):
    shares in [0, 1], `ci95` the Wilson interval (None where the metric has none: IFEval's loose levels). As a
    stage's own evaluations, one made with other settings than plan.json's is left out, so a curve never mixes
    examples; stages with no checkpoint evaluated are absent."""
    settings = read_plan(exp.root).get("evaluation") or {}
    ev = exp.spec.get("evaluation", {})
    slugs = {task_slug(t): t for t in dict.fromkeys([*ev.get("tasks", exp.tasks), *exp.holdout])}
    out: dict[str, dict[int, dict[str, dict[str, Any]]]] = {}
    for key in exp.results:
        for folder in sorted((exp.root / key / STEPS_DIR).glob("[0-9]*")):
            points = {task: _checkpoint_point(exp, task, folder / f"{slug}.json", settings.get(task))
                      for slug, task in slugs.items()}
            points = {task: p for task, p in points.items() if p is not None}
            if points:
                out.setdefault(key, {})[int(folder.name)] = points
    return out


def _checkpoint_point(exp: Experiment, task: str, path: Path, settings: dict[str, Any] | None
                      ) -> dict[str, Any] | None:
    """One checkpoint's evaluation of `task` (checkpoint_evaluations), None when missing or made with other
    settings than `settings` (plan.json's for the task; None in a plan of an older esft: any)."""
    try:
        saved = json.loads(path.read_text())
        summary = saved["summary"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return None
    recorded = {k: v for k, v in (saved.get("settings") or {}).items() if k != "model"}
    if settings is not None and recorded != settings:
        return None
    record = {"eval": {task: summary}}
    return {"accuracy": accuracy(record, task, exp.ifeval_metric, 1.0),
            "ci95": interval(record, task, exp.ifeval_metric, 1.0), "n": summary.get("n"),
            "constant_baseline": summary.get("constant_baseline"),
            "constant_baseline_ci95": summary.get("constant_baseline_ci95")}
