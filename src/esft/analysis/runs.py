"""Find ES and GRPO run directories under a folder and organise them for the analyses.

A run directory holds `config.yaml` and some of `metrics.jsonl`, `seeds.jsonl` (ES), `drift.jsonl` (GRPO) and
`checkpoints/<name>/` (Hugging Face folders). Runs are linked into sequential chains when a run's `model` is a
checkpoint folder of another run (stage t starts from stage t-1's weights); a single-task run is a chain of one.
Chains of ES and GRPO that start from the same base model and train the same task sequence form pairs, matched by
seed where seeds agree. Nothing here loads a model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from esft.rundir import is_run_dir, read_jsonl
from esft.saved_config import read_recorded_config
from esft.tasks.display import shown_task
from esft.tasks.labels import MEAN_REWARD, score_name

CHECKPOINTS = "checkpoints"


@dataclass
class Run:
    path: Path
    algorithm: str
    """"es", "grpo" or "unknown" """
    config: dict[str, Any]
    checkpoints: list[tuple[float, Path]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def task(self) -> str | None:
        t = self.config.get("task") or self.config.get("task_name")
        if isinstance(t, list):
            return ",".join(t)
        return t

    @property
    def model(self) -> str | None:
        return self.config.get("model") or self.config.get("model_name_or_path")

    @property
    def seed(self) -> int | None:
        s = self.config.get("seed")
        return int(s) if s is not None else None

    @property
    def final(self) -> Path | None:
        """The checkpoint called `final`, else the one with the highest step."""
        for _, p in self.checkpoints:
            if p.name == "final":
                return p
        return self.checkpoints[-1][1] if self.checkpoints else None

    @property
    def seed_log(self) -> Path | None:
        p = self.path / "seeds.jsonl"
        return p if p.exists() and p.stat().st_size > 0 else None

    @property
    def drift_log(self) -> Path | None:
        p = self.path / "drift.jsonl"
        return p if p.exists() and p.stat().st_size > 0 else None

    def eval_records(self) -> list[dict[str, Any]]:
        return [r for r in self.metrics if r.get("kind") == "eval" or "test_accuracy" in r or "eval_accuracy" in r]

    def accuracy_at(self, which: str = "last") -> dict[str, Any] | None:
        """The first or last held-out accuracy record: {"step", "accuracy", "n", "ci95"}."""
        evals = [r for r in self.eval_records() if _acc(r) is not None]
        if not evals:
            return None
        r = evals[0] if which == "first" else evals[-1]
        return {"step": r.get("step"), "accuracy": _acc(r), "n": r.get("test_n"), "ci95": r.get("test_ci95"),
                "format_rate": r.get("test_format_rate"),
                **{k: r[f"test_{k}"] for k in _BASELINE if r.get(f"test_{k}") is not None}}

    def score_name(self) -> str:
        """ACCURACY or MEAN_REWARD (esft.tasks.labels.score_name) from every held-out mean and interval bound the run
        logged, as its figure and model card decide."""
        return score_name([v for r in self.eval_records() for v in [_acc(r), *(r.get("test_ci95") or [])]])

    def hyper(self, *keys: str, default: Any = None) -> Any:
        for k in keys:
            if self.config.get(k) is not None:
                return self.config[k]
        return default


#: the constant-answer baseline of an evaluation's examples, as metrics.jsonl records it under test_<key>
_BASELINE = ("constant_baseline", "constant_baseline_ci95", "constant_answer")


def _acc(r: dict[str, Any]) -> float | None:
    for k in ("test_accuracy", "eval_accuracy", "accuracy"):
        if r.get(k) is not None and (k != "accuracy" or r.get("kind") == "eval"):
            return float(r[k])
    return None


def read_config(path: Path) -> dict[str, Any]:
    """A run's config.yaml, checked (esft.saved_config.read_recorded_config): a hand-edited or damaged file fails
    as one line naming it and the line, not deep inside an analysis."""
    return read_recorded_config(path)


def classify(path: Path, config: dict[str, Any]) -> str:
    algo = str(config.get("algorithm") or (config.get("_run") or {}).get("algorithm") or "").lower()
    if algo in ("es", "grpo"):
        return algo
    if (path / "seeds.jsonl").exists() or {"population_size", "sigma"} <= set(config):
        return "es"
    if (path / "drift.jsonl").exists() or "num_generations" in config or "learning_rate" in config:
        return "grpo"
    return "unknown"


def list_checkpoints(run_dir: Path) -> list[tuple[float, Path]]:
    """(step, folder) of checkpoint folders with weights, sorted; step from es_state.json, trainer_state.json or
    the folder name's digits; `final` without a recorded step sorts last."""
    root = run_dir / CHECKPOINTS
    out: list[tuple[float, Path]] = []
    if not root.is_dir():
        return out
    for folder in root.iterdir():
        if folder.name.startswith(".") or not folder.is_dir():
            continue
        if not any(folder.glob("*.safetensors")):
            continue
        step: float | None = None
        for state, key in (("es_state.json", "step"), ("trainer_state.json", "global_step"), ("state.json", "step")):
            f = folder / state
            if f.exists():
                try:
                    step = float(json.loads(f.read_text())[key])
                    break
                except (KeyError, ValueError, json.JSONDecodeError):
                    pass
        if step is None:
            m = re.search(r"(\d+)$", folder.name)
            step = float(m.group(1)) if m else float("inf")
        out.append((step, folder))
    return sorted(out, key=lambda x: (x[0], x[1].name == "final", x[1].name))


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's records, read as every other reader of a run does (esft.rundir.read_jsonl): a torn last
    line is ignored, an unreadable line with records after it is an error naming it, not a silent cut."""
    return read_jsonl(run_dir / "metrics.jsonl")


def load_run(path: Path) -> Run:
    path = Path(path).resolve()  # one spelling per run (symlinked roots, relative DIRs): stable cache keys
    config = read_config(path / "config.yaml")
    return Run(path=path, algorithm=classify(path, config), config=config,
               checkpoints=list_checkpoints(path), metrics=read_metrics(path))


def find_runs(root: str | Path, max_depth: int = 5, unstarted: list[Path] | None = None) -> list[Run]:
    """Every run directory at or below `root` (a folder with config.yaml and a log or checkpoints); `unstarted`,
    when given, receives each run folder that has logged nothing yet: config.yaml and the `.lock` its trainer
    took, no log or checkpoint (a config.yaml without a lock is the user's, not a run)."""
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"{root} does not exist")
    found: list[Run] = []

    def visit(p: Path, depth: int) -> None:
        if is_run_dir(p):
            found.append(load_run(p))
        elif unstarted is not None and (p / "config.yaml").is_file() and (p / ".lock").is_file():
            unstarted.append(p.resolve())
        if depth >= max_depth:
            return
        for child in sorted(p.iterdir()):
            if child.is_dir() and not child.name.startswith(".") and child.name not in (CHECKPOINTS, "samples",
                                                                                         "report", "analysis"):
                visit(child, depth + 1)

    visit(root, 0)
    return found


def resolve_model(spec: str | None, run: Run | None = None, root: Path | None = None) -> Path | None:
    """A local folder for a model spec: an existing path (absolute, or relative to the working directory, the run's
    parents or `root`), or an embedded model's cache folder. None for hub ids that are not on disk."""
    if not spec:
        return None
    p = Path(spec).expanduser()
    candidates = [p] if p.is_absolute() else [Path.cwd() / p]
    if run is not None and not p.is_absolute():
        candidates += [parent / p for parent in run.path.parents]
    if root is not None and not p.is_absolute():
        candidates.append(root / p)
    for c in candidates:
        if (c / "config.json").exists():
            return c.resolve()
    try:
        from esft.models import resolve_model_path

        local = Path(resolve_model_path(spec))
        if (local / "config.json").exists():
            return local.resolve()
    except Exception:  # embedded package missing, hub id offline ...: not on disk
        return None
    return None


@dataclass
class StageRef:
    """One trained stage of a chain: the run(s) that trained it and the checkpoint it left."""

    runs: list[Run]
    checkpoint: Path | None
    task: str | None = None

    @property
    def run(self) -> Run:
        """The run that produced the stage's weights (the last of a multi-step stage such as grpo->es)."""
        return self.runs[-1]


@dataclass
class Chain:
    """Stages of one training sequence: stage i starts from stage i-1's checkpoint (stage 1 from `base`)."""

    algorithm: str
    """"es", "grpo", or a label such as "grpo->es" for mixed chains"""
    stages: list[StageRef]
    base: Path | None
    base_spec: str | None
    name: str | None = None
    """track name from an experiment (e.g. "es@100"), else None"""
    where: str | None = None
    """where the label says the chain ends: its last run's folder name, or (`distinguish`) its path under the
    report's root when another chain's label would read the same"""

    @property
    def runs(self) -> list[Run]:
        return [s.run for s in self.stages]

    @property
    def seed(self) -> int | None:
        return self.stages[0].run.seed

    @property
    def tasks(self) -> list[str]:
        return [s.task or s.run.task or "?" for s in self.stages]

    @property
    def shown_tasks(self) -> list[str]:
        """`tasks` as a reader sees them (esft.tasks.base.shown_task: a data file by its file name)."""
        return [shown_task(t) for t in self.tasks]

    @property
    def label(self) -> str:
        seed = f" seed {self.seed}" if self.seed is not None else ""
        name = self.name or self.algorithm.upper()
        last = self.stages[-1].run.path
        where = self.where or (last.name if self.name is None else last.parent.name)
        return f"{name} {'->'.join(self.shown_tasks)}{seed} ({where})"

    def checkpoints(self) -> list[tuple[str, Path | None]]:
        """(stage label, checkpoint) per stage."""
        return [(f"{i + 1}:{t}", s.checkpoint) for i, (s, t) in enumerate(zip(self.stages, self.shown_tasks))]


def _algorithm_of(runs: list[Run]) -> str:
    algos = [r.algorithm for r in runs]
    uniq = [a for i, a in enumerate(algos) if i == 0 or a != algos[i - 1]]
    return uniq[0] if len(set(algos)) == 1 else "->".join(uniq)


@dataclass
class Plan:
    """The training stages an experiment folder's plan.json lists: what `esft experiment run` last planned from
    its spec (stage folders of labels or tasks since removed from the spec stay on disk, outside the plan)."""

    keys: set[str]
    run_dirs: set[Path]
    unfinished: dict[str, str] = field(default_factory=dict)
    """training stage key -> its status where it is not done ("stopped", "failed", "running", "not started", ...)"""


def experiment_plan(root: Path) -> Plan | None:
    """The plan of an experiment folder, None when `root` has no readable plan.json."""
    try:
        plan = json.loads((Path(root) / "plan.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    stages = [s for s in plan.get("stages", []) if isinstance(s, dict) and s.get("steps")]
    unfinished = {}
    for s in stages:
        try:
            status = json.loads((Path(root) / s["key"] / "status.json").read_text()).get("status")
        except (OSError, json.JSONDecodeError, AttributeError):
            status = None
        if status != "done":
            unfinished[s["key"]] = status or "not started"
    return Plan({s["key"] for s in stages},
                {(Path(root) / st["run_dir"]).resolve() for s in stages for st in s["steps"]}, unfinished)


def build_chains(runs: list[Run], root: Path | None = None, plan: Plan | None = None) -> list[Chain]:
    """Chains from an experiment's stage records (`result.json` with steps, written by `esft experiment run`) when
    DIR holds them (those of `plan`'s stages only, when given), else by linking runs whose model is another run's
    checkpoint folder. A stage's checkpoint is the folder the next stage started from (a budget snapshot such as
    iter_000100 of a run continued to 300), else the run's final checkpoint."""
    if root is not None:
        staged = chains_from_stage_records(runs, root, keys=plan.keys if plan is not None else None)
        if staged:
            return staged
    by_ckpt: dict[Path, Run] = {}
    for r in runs:
        for _, folder in r.checkpoints:
            by_ckpt[folder.resolve()] = r
    parent: dict[Path, Run] = {}
    start: dict[Path, Path | None] = {}
    for r in runs:
        local = resolve_model(r.model, r, root)
        start[r.path] = local
        if local is not None and local in by_ckpt and by_ckpt[local] is not r:
            parent[r.path] = by_ckpt[local]
    children: dict[Path, list[Run]] = {}
    for r in runs:
        if r.path in parent:
            children.setdefault(parent[r.path].path, []).append(r)
    chains = []
    for r in runs:
        if r.path in parent:
            continue
        # follow every child at each stage; branching sequences (budget tracks) give one chain per leaf
        stack = [[r]]
        while stack:
            seq = stack.pop()
            kids = children.get(seq[-1].path, [])
            final = seq[-1].final
            # a run ends a chain when nothing continued from it, or when its children started from an earlier
            # snapshot (a budget track) while its final checkpoint is a result of its own
            if not kids or (final is not None and all(start[k.path] != final.resolve() for k in kids)):
                stages = []
                for i, run in enumerate(seq):
                    ck = start[seq[i + 1].path] if i + 1 < len(seq) else run.final
                    stages.append(StageRef([run], ck, run.task))
                chains.append(Chain(_algorithm_of(seq), stages, start[r.path], r.model))
            for k in kids:
                stack.append(seq + [k])
    return chains


def chains_from_stage_records(runs: list[Run], root: Path, max_depth: int = 7,
                              keys: set[str] | None = None) -> list[Chain]:
    """Chains of an `esft experiment run` directory, one per (seed, kind, track), from its stage records (those
    whose key is in `keys`, when given); a chain whose later stages' runs are missing from `runs` ends at the last
    stage present."""
    by_path = {r.path: r for r in runs}
    records: dict[str, dict[str, Any]] = {}
    for f in _walk(root, "result.json", max_depth):
        try:
            rec = json.loads(f.read_text())
        except (json.JSONDecodeError, OSError):
            continue
        if isinstance(rec, dict) and rec.get("kind") == "train" and rec.get("steps") and rec.get("key"):
            if keys is None or rec["key"] in keys:
                records[rec["key"]] = rec
    if not records:
        return []
    has_child = {rec.get("parent") for rec in records.values() if rec.get("parent")}
    chains = []
    for key, rec in records.items():
        if key in has_child:
            continue
        seq = [rec]
        while seq[0].get("parent") in records:
            seq.insert(0, records[seq[0]["parent"]])
        if seq[0].get("parent"):  # parent stage not done: the chain is incomplete
            continue
        stages = []
        for st in seq:
            stage_runs = [by_path.get((root / step["run_dir"]).resolve()) for step in st["steps"]]
            if any(r is None for r in stage_runs):
                break
            ck = root / (st.get("model") or st["steps"][-1]["model_dir"])
            # the task as its runs recorded it (a data file by its absolute path, the key of their task options)
            task = stage_runs[-1].task or st.get("task")
            stages.append(StageRef(stage_runs, ck if (ck / "config.json").exists() else None, task))
        if not stages:  # its first stage's runs are not among `runs` (left out by --exclude)
            continue
        # later stages left out (--exclude '/2-'): the chain ends at the last stage present
        first = stages[0].runs[0]
        # from the runs (labels are free text): a grpo->es chain's stages are each grpo->es, not one long chain
        per_stage = {_algorithm_of(s.runs) for s in stages}
        algo = per_stage.pop() if len(per_stage) == 1 else _algorithm_of([r for s in stages for r in s.runs])
        chains.append(Chain(algo, stages, resolve_model(first.model, first, root), first.model,
                            name=seq[0].get("track") or seq[0].get("label")))
    return sorted(chains, key=lambda c: (c.seed or 0, c.name or "", c.tasks))


def _walk(root: Path, filename: str, max_depth: int) -> list[Path]:
    out = []

    def visit(p: Path, depth: int) -> None:
        f = p / filename
        if f.exists():
            out.append(f)
        if depth >= max_depth:
            return
        for child in sorted(p.iterdir()):
            if child.is_dir() and not child.name.startswith(".") and child.name not in (CHECKPOINTS, "samples",
                                                                                         "report", "eval"):
                visit(child, depth + 1)

    visit(root, 0)
    return out


@dataclass
class Pair:
    es: Chain
    grpo: Chain
    where: str | None = None
    """the two chains' run folders, set by `distinguish` when another pair's label would read the same"""

    @property
    def label(self) -> str:
        seed = self.es.seed if self.es.seed == self.grpo.seed else f"{self.es.seed}/{self.grpo.seed}"
        where = f" ({self.where})" if self.where else ""
        return (f"{self.es.name or 'ES'} vs {self.grpo.name or 'GRPO'}, {'->'.join(self.es.shown_tasks)}, "
                f"seed {seed}{where}")


def build_pairs(chains: list[Chain]) -> list[Pair]:
    """ES and GRPO chains with the same base model and task sequence, matched by seed, then in order."""
    groups: dict[tuple, dict[str, list[Chain]]] = {}
    for c in chains:
        if c.algorithm not in ("es", "grpo") or c.base is None:
            continue
        groups.setdefault((str(c.base), tuple(c.tasks)), {"es": [], "grpo": []})[c.algorithm].append(c)
    pairs = []
    for g in groups.values():
        es, grpo = g["es"], g["grpo"]
        # same seed first (several ES budget tracks of a seed all pair with that seed's GRPO chain), else the
        # first GRPO chain that no ES chain has by seed and none took yet: the pairs do not depend on run order
        used = {id(x) for x in grpo if any(x.seed == e.seed for e in es)}
        taken: set[int] = set()
        for e in es:
            same = [x for x in grpo if x.seed == e.seed]
            # an experiment's ES tracks of a seed (es@100, es@300) all compare with its first GRPO chain; runs of
            # no track (a folder of runs) each take a GRPO run of the seed that no other took, while one is left
            free = [x for x in same if id(x) not in taken] if e.name is None else []
            match = free[0] if free else (same[0] if same else None)
            if match is None:
                match = next((x for x in grpo if id(x) not in used), None)
            if match is not None:
                used.add(id(match))
                taken.add(id(match))
                pairs.append(Pair(e, match))
    return pairs


def distinguish(chains: list[Chain], pairs: list[Pair], shown: Any) -> None:
    """Give chains, and pairs, whose labels would read alike (runs of the same names and task in other folders) the
    paths of their last runs (`shown`: a path as the report shows it), so that no two share a heading, a cached
    result or a figure."""
    def clashing(items: list[Any]) -> list[Any]:
        count: dict[str, int] = {}
        for x in items:
            count[x.label] = count.get(x.label, 0) + 1
        return [x for x in items if count[x.label] > 1]

    for c in clashing(chains):
        c.where = shown(c.stages[-1].run.path)
    for p in clashing(pairs):
        p.where = f"{shown(p.es.stages[-1].run.path)} vs {shown(p.grpo.stages[-1].run.path)}"


# ---- the report's first sections: the runs, and the held-out accuracy they logged ----------------------------------

def logged_steps(r: Run) -> int | None:
    """Training steps a run logged: seed-log lines (ES), drift records (GRPO), else the largest metrics step."""
    for log in (r.seed_log, r.drift_log):
        if log is not None:
            with open(log, encoding="utf-8") as fh:
                return sum(1 for line in fh if line.strip() and '"header"' not in line[:20])
    steps = [m.get("step") for m in r.metrics if isinstance(m.get("step"), (int, float))]
    if steps:
        return int(max(steps))
    finite = [s for s, _ in r.checkpoints if s != float("inf")]
    return int(max(finite)) if finite else None
