"""From a Spec to an ordered list of stages: what to train, from which weights, into which folder, then evaluate.

A stage produces one evaluated model. The `base` stage evaluates the spec's model (greedy decoding does not depend
on the seed, so it is evaluated once and shared by every seed). A training stage runs its steps (one trainer run;
several for a chain such as grpo->es, each step starting from the previous one's final weights), then evaluates.

Folders (relative to the experiment directory):
    base/                                           base-model evaluation
    seed-42/single-task/countdown/es@100/           a single-task stage; ES budgets share one run:
    seed-42/single-task/countdown/es/run/              ... trained to 100, snapshotted, continued to 300
    seed-42/sequential/es/1-countdown/run/          stage 1 of every budget track of a label shares one run
    seed-42/sequential/es@100/2-math/run/           later stages start from the previous stage of their track

Runs are ordinary trainer run directories whose `model` is the previous stage's checkpoint folder, so
`esft report` links sequential stages into chains on its own.

Every stage of a chain trains with the chain's seed from step 0, so each ES run of a chain gets its own noise
stream (ESConfig.noise_stream): stage k's j-th ES step draws stream (k - 1) * (ES steps per stage) + j. Stage 1
(and every single-task stage) keeps stream 0, the seeds of a plain run with that seed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from esft.experiments.spec import Component, Method, Spec
from esft.tasks.display import shown_task

BASE = "base"


def slug(name: str) -> str:
    """A folder-safe form of a label: `grpo->es` -> `grpo-to-es` (no shell metacharacters in paths)."""
    import re

    return re.sub(r"[^A-Za-z0-9_.@+=-]+", "-", name.replace("->", "-to-")).strip("-") or "x"


_TASK_CHARS = {"+": "plus", "*": "times", "/": "div", ":": ".", ",": "."}


def task_slug(task: str) -> str:
    """A folder- and file-safe form of a task name with options, readable and one-to-one:
    `countdown:numbers=2,ops=+*` -> `countdown.numbers=2.ops=plustimes`; a name of plain characters is itself.
    When the readable form does not decode back to the name (a `.` or a word like `plus` in it, a character
    outside [A-Za-z0-9_.=-]), a hash of the name is appended, so two names never share a folder."""
    import hashlib
    import re

    out = "".join(_TASK_CHARS.get(c, c) for c in task)
    if re.fullmatch(r"[A-Za-z0-9_.=-]*", out) and _untask_slug(out) == task:
        return out
    safe = re.sub(r"[^A-Za-z0-9_.=-]", "_", out)
    return f"{safe}-{hashlib.sha1(task.encode()).hexdigest()[:6]}"


def _untask_slug(slug: str) -> str:
    """The inverse of the readable form: the first `.` was the `:` before the options, the others commas."""
    head, dot, tail = slug.partition(".")
    text = head + (":" + tail.replace(".", ",") if dot else "")
    for char, word in (("+", "plus"), ("*", "times"), ("/", "div")):
        text = text.replace(word, char)
    return text


@dataclass
class Step:
    component: Component
    run_dir: str
    """relative to the experiment directory"""
    budget: int
    snapshot: bool = False
    """keep `checkpoints/iter_<budget>` because the run is continued to a larger budget afterwards"""
    noise_stream: int = 0
    """member-seed stream of an ES step (ESConfig.noise_stream), distinct for every ES step of a chain"""
    owner: str | None = None
    """the label whose stage trains this run when a chain shares it (`_share_first_steps`), else None"""

    @property
    def algorithm(self) -> str:
        return self.component.algorithm

    def model_dir(self) -> str:
        """The checkpoint folder this step leaves as its result."""
        name = f"iter_{self.budget:06d}" if self.snapshot else "final"
        return f"{self.run_dir}/checkpoints/{name}"


@dataclass
class Stage:
    key: str
    """folder of the stage, relative to the experiment directory; also its identity"""
    kind: str
    """"base" or "train" """
    seed: int | None = None
    track: str | None = None
    """method label plus budget (`es@100`) when a label has several budgets, else the label"""
    label: str | None = None
    display: str = "Base"
    task: str | None = None
    index: int = 0
    """1-based position in the task sequence (single-task stages: 1)"""
    parent: str | None = None
    """stage whose model this one starts from; None = the spec's base model"""
    after: list[str] = field(default_factory=list)
    """stages that must be done first"""
    steps: list[Step] = field(default_factory=list)
    eval_tasks: list[str] = field(default_factory=list)
    budget: int | None = None

    def model_dir(self) -> str | None:
        return self.steps[-1].model_dir() if self.steps else None


@dataclass
class Track:
    label: str
    name: str
    display: str
    method: Method
    budget: int | None
    """the budget every stage of this track trains to (extendable methods), None = each config's own"""


def tracks(method: Method, spec: Spec) -> list[Track]:
    comp = method.components[0]
    algo = comp.spec
    if method.is_chain:
        return [Track(method.label, method.label, method.display, method, None)]
    budgets = method.budgets  # a list only where extendable
    if not budgets:  # one budget, from the option block / preset / default; a per_task one is named with its task
        per_task = {t: getattr(spec.config(comp, t, spec.seeds[0]), algo.budget_field) for t in spec.tasks}
        budget = per_task[spec.tasks[0]]
        other = "".join(f"; {shown_task(t)} {b}" for t, b in per_task.items() if b != budget)
        return [Track(method.label, method.label, f"{method.display} ({algo.budget_short}={budget}{other})", method,
                      None)]
    many = len(budgets) > 1
    return [Track(method.label, f"{method.label}@{b}" if many else method.label,
                  f"{method.display} ({algo.budget_short}={b})", method, b) for b in budgets]


def has_noise_stream(comp: Component) -> bool:
    return any(f.name == "noise_stream" for f in dataclasses.fields(comp.spec.config_cls))


def _steps(spec: Spec, method: Method, task: str, seed: int, run_base: str, budget: int | None,
           snapshot: bool, index: int = 1) -> list[Step]:
    steps = []
    streamed = [i for i, c in enumerate(method.components) if has_noise_stream(c)]
    for i, comp in enumerate(method.components):
        b = budget if budget is not None else getattr(spec.config(comp, task, seed), comp.spec.budget_field)
        run_dir = run_base if len(method.components) == 1 else f"{run_base}-{i + 1}-{comp.algorithm}"
        stream = (index - 1) * len(streamed) + streamed.index(i) if i in streamed else 0
        steps.append(Step(comp, run_dir, int(b), snapshot and i == len(method.components) - 1, stream))
    return steps


def build_plan(spec: Spec, root: Path | None = None) -> list[Stage]:
    """Every stage of the experiment, in execution order (seed by seed; a stage comes after its prerequisites).
    SpecError when two labels of the spec would share a folder. `root`: the experiment folder, when it exists, whose
    runs decide what a chain already trained on its own (`_share_first_steps`)."""
    ev = spec.evaluation
    stages = [Stage(key=BASE, kind="base", eval_tasks=ev.all_tasks)]
    for seed in spec.seeds:
        if spec.kind == "single-task":
            stages += _single_task(spec, seed)
        else:
            stages += _sequential(spec, seed)
    _share_first_steps(spec, stages, root)
    _check_folders(spec, stages)
    return stages


def _share_first_steps(spec: Spec, stages: list[Stage], root: Path | None = None) -> None:
    """A chain's first step that trains exactly what an earlier stage's step trains (same seed and task, both from
    the base model, the same resolved config, budget and noise stream: `grpo->es` beside `grpo` with the same
    options) takes that step's run instead of training it a second time: the chain's stage then runs after that
    stage and finds the run done (the runner's `_run_step` skips a run trained to its budget). A chain whose own
    first run already exists in `root` keeps it: an earlier esft trained it there, and the chain's later steps
    started from its weights (their recorded start model, which the runner's fingerprint check compares)."""
    done: dict[tuple[Any, ...], tuple[Stage, Step]] = {}

    def identity(stage: Stage, step: Step) -> tuple[Any, ...]:
        config = spec.config(step.component, stage.task, stage.seed, step.budget)
        return (stage.seed, stage.task, step.algorithm, step.budget, step.noise_stream, repr(config))

    for stage in stages:
        if stage.kind == BASE or stage.parent is not None or not stage.steps:
            continue
        key = identity(stage, stage.steps[0])
        own = root is not None and (root / stage.steps[0].run_dir).exists()
        if len(stage.steps) > 1 and key in done and not own:
            owner_stage, owner_step = done[key]
            stage.steps[0] = dataclasses.replace(owner_step, owner=owner_stage.label)
            stage.after = list(dict.fromkeys([*stage.after, owner_stage.key]))
        elif len(stage.steps) == 1:
            done.setdefault(key, (stage, stage.steps[0]))
        elif root is not None and not own and (kept := _recorded_share(root, stage)) is not None:
            stage.steps[0] = kept


def _recorded_share(root: Path, stage: Stage) -> Step | None:
    """The first step of a chain stage as recorded when another label's stage trained it and that run is still in
    the folder: a spec that no longer lists that label keeps what the chain started from (its later steps' recorded
    start model), instead of the chain's own run it never trained. A finished stage's result.json says it; an
    interrupted one's status.json records where its second step started (`_started_share`)."""
    import json

    try:
        first = json.loads((root / stage.key / "result.json").read_text())["steps"][0]
        run_dir, model_dir, owner = first["run_dir"], first["model_dir"], first["trained_by"]
    except OSError:
        return _started_share(root, stage)
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    if not (isinstance(run_dir, str) and (root / run_dir).is_dir()):
        return None
    step = stage.steps[0]
    return dataclasses.replace(step, run_dir=run_dir, owner=owner,
                               snapshot=model_dir != f"{run_dir}/checkpoints/final")


def _started_share(root: Path, stage: Stage) -> Step | None:
    """The first step of an interrupted chain stage (no result.json) whose second step started from another run's
    weights, as its status.json fingerprint records them: that run's step, or a SpecError saying what to do where
    those weights are gone. None where status.json records no second step's start model (a stage that never
    started) or one of its own run."""
    import json

    try:
        fingerprint = json.loads((root / stage.key / "status.json").read_text())["fingerprint"]
        start = fingerprint[1]["config"]["model"]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    rel = _inside(root, str(start), stage.key)
    run_dir, _, name = (rel or "").rpartition("/checkpoints/")
    step = stage.steps[0]
    if not run_dir or run_dir == step.run_dir:
        return None
    try:  # the label of the stage that trained the run, for the records
        owner = str(json.loads(((root / run_dir).parent / "result.json").read_text())["label"])
    except (OSError, ValueError, KeyError, TypeError):
        owner = Path(run_dir).parent.name
    if not (root / rel / "config.json").is_file():
        from esft.experiments.yamlines import SpecError

        raise SpecError(f"{root / stage.key} is unfinished, and its {stage.steps[1].algorithm} step started from "
                        f"{root / rel}, which is gone: add label {owner!r} back to the spec to train that run again, "
                        f"or delete {root / stage.key} to train the whole chain anew")
    return dataclasses.replace(step, run_dir=run_dir, owner=str(owner), snapshot=name != "final")


def _inside(root: Path, path: str, key: str) -> str | None:
    """`path`, recorded as an absolute path, relative to the experiment folder `root`; also where the folder has
    moved since (then found from the stage key's `seed-N/kind/`, where every run folder of the experiment starts)."""
    base = f"{root.resolve().as_posix()}/"
    if path.startswith(base):
        return path[len(base):]
    anchor = "/" + "/".join(key.split("/")[:2]) + "/"
    at = path.rfind(anchor)
    return path[at + 1:] if at >= 0 else None


def _single_task(spec: Spec, seed: int) -> list[Stage]:
    ev = spec.evaluation
    out = []
    for task in spec.tasks:
        eval_tasks = {"all": ev.all_tasks, "trained": [task],
                      "trained+holdout": list(dict.fromkeys([task, *ev.holdout]))}[ev.after_single_task]
        for method in spec.methods:
            ts = tracks(method, spec)
            top = max((t.budget or 0) for t in ts)
            run_base = f"seed-{seed}/single-task/{task_slug(task)}/{slug(method.label)}/run"
            previous: str | None = None
            for t in ts:
                key = f"seed-{seed}/single-task/{task_slug(task)}/{slug(t.name)}"
                shared = len(ts) > 1
                out.append(Stage(key=key, kind="train", seed=seed, track=t.name, label=method.label,
                                 display=t.display, task=task, index=1, parent=None,
                                 after=[previous] if previous else [],
                                 steps=_steps(spec, method, task, seed, run_base if shared else f"{key}/run",
                                              t.budget, shared and (t.budget or 0) < top),
                                 eval_tasks=eval_tasks, budget=t.budget))
                previous = key
    return out


def _sequential(spec: Spec, seed: int) -> list[Stage]:
    ev = spec.evaluation
    out = []
    for method in spec.methods:
        ts = tracks(method, spec)
        top = max((t.budget or 0) for t in ts)
        first_stage: dict[int, str] = {}  # budget -> key of the track's stage 1 (shared run, ascending order)
        for t in ts:
            parent: str | None = None
            for k, task in enumerate(spec.tasks, start=1):
                key = f"seed-{seed}/sequential/{slug(t.name)}/{k}-{task_slug(task)}"
                after = [parent] if parent else []
                if k == 1 and len(ts) > 1:
                    # every budget track starts from the base model on the same task: one run, snapshotted
                    run_base = f"seed-{seed}/sequential/{slug(method.label)}/1-{task_slug(task)}/run"
                    lower = [first_stage[b] for b in sorted(first_stage) if b < (t.budget or 0)]
                    after += lower[-1:]
                    steps = _steps(spec, method, task, seed, run_base, t.budget, (t.budget or 0) < top, k)
                    first_stage[t.budget or 0] = key
                else:
                    steps = _steps(spec, method, task, seed, f"{key}/run", t.budget, False, k)
                out.append(Stage(key=key, kind="train", seed=seed, track=t.name, label=method.label,
                                 display=t.display, task=task, index=k, parent=parent, after=after, steps=steps,
                                 eval_tasks=ev.all_tasks, budget=t.budget))
                parent = key
    return out


def _check_folders(spec: Spec, stages: list[Stage]) -> None:
    """Every stage and every run of the plan in a folder of its own: labels that differ only in characters the
    folder names drop (`my es` / `my-es`, `grpo->es` / `grpo-to-es`) or that spell another label's budget track
    (`es@100` beside `es: {iterations: [100, 300]}`) would otherwise train into one folder, and the later stage
    would be skipped as done with the other's result. SpecError naming the second label's line. The budget
    tracks of one label share its run on purpose (one ES run snapshotted at each budget)."""
    from esft.experiments.yamlines import SpecError

    stage_owner: dict[str, str] = {}
    run_owner: dict[str, str] = {}
    for stage in stages:
        label = stage.label or ""
        clashes = [(stage.key, stage_owner.get(stage.key))]
        clashes += [(step.run_dir, run_owner.get(step.run_dir)) for step in stage.steps]
        stage_owner[stage.key] = label
        clashes = [(folder, first) for folder, first in clashes
                   if not any(step.run_dir == folder and step.owner == first for step in stage.steps)]
        for step in stage.steps:
            run_owner.setdefault(step.run_dir, label)
        for folder, first in clashes:
            if first is not None and (first != label or folder == stage.key):
                line = spec.method(label).line
                where = f"{spec.path or '<spec>'}:{line}" if line else spec.path or "<spec>"
                raise SpecError(f"{where}: algorithms.{label} would train in the folder {folder}, which is "
                                f"algorithms.{first}'s; rename one of the two labels")


def describe(stages: list[Stage]) -> str:
    """One line per stage (for `esft experiment run --dry-run`)."""
    lines = []
    for s in stages:
        if s.kind == BASE:
            lines.append(f"{s.key:<48} evaluate the base model on {', '.join(s.eval_tasks)}")
            continue
        start = s.parent or "base model"
        run = " then ".join(f"{st.algorithm} to {st.budget} in {st.run_dir}" + (" (snapshot)" if st.snapshot else "")
                            + (f" (trained by {st.owner}'s stage)" if st.owner else "")
                            + (f" (noise stream {st.noise_stream})" if st.noise_stream else "") for st in s.steps)
        lines.append(f"{s.key:<48} from {start}: {run}; evaluate {', '.join(s.eval_tasks)}")
    return "\n".join(lines)


def stage_map(stages: list[Stage]) -> dict[str, Stage]:
    return {s.key: s for s in stages}


def as_dict(stage: Stage) -> dict[str, Any]:
    return {"key": stage.key, "kind": stage.kind, "seed": stage.seed, "track": stage.track, "label": stage.label,
            "display": stage.display, "task": stage.task, "index": stage.index, "parent": stage.parent,
            "budget": stage.budget, "eval_tasks": stage.eval_tasks,
            "steps": [{"algorithm": st.algorithm, "run_dir": st.run_dir, "budget": st.budget,
                       "snapshot": st.snapshot, "model_dir": st.model_dir(), "noise_stream": st.noise_stream,
                       **({"trained_by": st.owner} if st.owner else {})}
                      for st in stage.steps]}


__all__ = ["BASE", "Stage", "Step", "Track", "build_plan", "describe", "stage_map", "tracks", "as_dict", "slug",
           "task_slug"]
