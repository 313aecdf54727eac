"""What the sections of `esft report` share (esft.analysis.report_builder): the runs found under DIR, the output
folder (JSON results reused while their inputs are unchanged, figure paths, links relative to report.md), model
loading, and the list of analyses the runs could not support.

Each analysis module's report function (`report_weights`, `report_kl`, ...) takes a `ReportContext` and returns
rows and figures; the report itself only assembles them into Markdown.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from esft.analysis.report_cache import Cache
from esft.analysis.runs import (Chain, Pair, Plan, Run, build_chains, build_pairs, distinguish, experiment_plan,
                                find_runs)
from esft.config import passage_cut
from esft.tasks.display import shown_task


def load_model_only(base: Path, dtype: str, device: str | None):
    """The weights of `base`, loaded as esft.models.load_model does, without reading its tokenizer again."""
    from transformers import AutoModelForCausalLM

    from esft.models import default_device, parse_dtype

    device = device or default_device()
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=parse_dtype(dtype, device))
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


def shown_path(where: Any, root: Path) -> str:
    """`where` for a reader of the report: relative to `root` when inside it ("." for root itself), `~/...` when
    under the home folder, else as given; a model name that is not a path is returned as it is. So a report
    shows no machine's absolute paths for the runs and checkpoints it was given."""
    text = str(where)
    path = Path(text).expanduser()
    if not path.is_absolute():
        return text
    try:
        return str(path.resolve().relative_to(Path(root).resolve())) or "."
    except ValueError:
        pass
    try:
        return str(Path("~") / path.relative_to(Path.home()))
    except ValueError:
        return text


def task_names(keys: Iterable[str]) -> dict[str, str]:
    """{task as runs recorded it: the name an analysis gives it}: a data file by its file name
    (esft.tasks.base.shown_task), by its recorded path where another of `keys` has a file of that name."""
    keys = list(dict.fromkeys(keys))
    names = [shown_task(k) for k in keys]
    return {k: n if names.count(n) == 1 else k for k, n in zip(keys, names)}


class ReportContext:
    """The runs under `config.dir` and the report's output folder (`config`: a ReportConfig of
    esft.analysis.report_builder)."""

    def __init__(self, config: Any, progress: bool = True, tasks: Sequence[Any] = ()):
        self.config = config
        self.root = Path(config.dir)
        self.out = Path(config.output_dir) if config.output_dir else self.root / "report"
        #: made by this report: a folder holding no run gets it removed again, not an empty report/ left behind
        self.made_out = not self.out.exists()
        self.out.mkdir(parents=True, exist_ok=True)
        self.cache = Cache(self.out, config.recompute)
        self.progress = progress
        self.unsupported: list[tuple[str, str]] = []
        self.results: dict[str, Any] = {}
        self.runs: list[Run] = []
        self.chains: list[Chain] = []
        self.pairs: list[Pair] = []
        self.plan: Plan | None = None
        self.left_out: list[tuple[str, str]] = []
        self.unstarted: list[Path] = []
        """run folders that have logged nothing yet (esft.analysis.runs.find_runs)"""
        self.tokenizers: dict[str, Any] = {}
        self.given_tasks = list(tasks)
        """task objects of the runs, for the analyses that evaluate (`build_task`)"""
        self.task_objects: dict[str, Any] = {}
        self.task_names: dict[str, str] = {}
        """{task as the runs recorded it: the name the evaluating analyses give it} (`task_name`)"""

    def discover(self) -> None:
        """Find the runs under DIR, their sequential chains and ES-GRPO pairs; runs left out (by --exclude, or
        outside the plan of an experiment folder) go to `left_out` with the reason. A refusal (a run whose
        config.yaml cannot be read) leaves no empty output folder behind."""
        try:
            self.gather_runs()
        except BaseException:
            self.drop_out()
            raise

    def drop_out(self) -> None:
        """Remove the output folder while it is empty and this report made it: a report that writes nothing leaves
        no empty report/ behind."""
        if self.made_out and self.out.is_dir() and not any(self.out.iterdir()):
            self.out.rmdir()

    def gather_runs(self) -> None:
        """`discover`'s work: the runs, chains and pairs under DIR."""
        self.plan = None if self.config.all_runs else experiment_plan(self.root)
        if self.plan is None and not self.config.all_runs and (self.root / "plan.json").is_file():
            self.skip("the experiment's plan", f"{self.root / 'plan.json'} is unreadable: every run under DIR is "
                                               "reported, as with --all-runs (`esft experiment run` writes it again)")
        self.runs, self.left_out, self.unstarted = [], [], []
        for r in find_runs(self.root, unstarted=self.unstarted):
            name = self.rel_run(r)
            pattern = next((p for p in self.config.exclude if re.search(p, name)), None)
            if pattern is not None:
                self.left_out.append((name, f"matches --exclude {pattern!r}"))
            elif self.plan is not None and r.path not in self.plan.run_dirs:
                self.left_out.append((name, "no stage of the experiment's plan (plan.json) trains in it: a label or "
                                            "task since removed from the spec"))
            else:
                self.runs.append(r)
        self.unstarted = [p for p in self.unstarted if not any(re.search(x, self.shown(p)) for x in self.config.exclude)
                          and (self.plan is None or p in self.plan.run_dirs)]  # as the runs are taken
        self.chains = build_chains(self.runs, self.root, self.plan)
        self.pairs = build_pairs(self.chains)
        distinguish(self.chains, self.pairs, self.shown)
        self.task_names = task_names(t for c in self.chains for t in c.tasks)
        self.match_tasks()

    def match_tasks(self) -> None:
        """Pair each given task object with the runs that recorded it (the same task string and options in
        config.yaml: esft.tasks.custom.task_record), before any model loads; an object no run recorded is refused
        (it would be evaluated in place of nothing, or a task of other options would be taken for it)."""
        from esft.tasks.custom import absolute_data_task, instantiate, task_record
        from esft.tasks.task_values import unrecorded_options

        recorded = {r.task: dict(r.config.get("task_options") or {}) for r in self.runs if r.task}
        self.task_objects = {}
        for obj in self.given_tasks:
            name, options = task_record(obj)
            name = absolute_data_task(name)
            older = recorded.get(name) == {} and unrecorded_options(options)  # an older esft recorded no options
            if name not in recorded or (recorded[name] != options and not older):
                runs = "; ".join(f"{t} {o}" for t, o in recorded.items()) or "none"
                raise ValueError(f"task object {type(obj).__name__} records as {name} {options}, which no run under "
                                 f"{self.root} trained (their tasks and options: {runs})")
            self.task_objects[name] = instantiate(obj, name, {})

    def task_name(self, key: str) -> str:
        """The name an evaluating analysis gives the runs' task `key` in its results, tables and figures: a data
        file by its file name (esft.tasks.base.shown_task), by its recorded path where another task of the runs
        has a file of that name; `build_task` takes either."""
        return self.task_names.get(key, key)

    def build_task(self, name: str) -> Any:
        """The task `name` of the runs (as recorded, or its `task_name`): the object given for it, else built from
        its name and the options the runs recorded (esft.tasks.get_task)."""
        from esft.tasks import get_task

        name = next((k for k, n in self.task_names.items() if n == name), name)
        given = self.task_objects.get(name)
        return given if given is not None else get_task(name, **self.task_options().get(name, {}))

    def evaluable(self, chains: Sequence[Chain], analysis: str) -> list[Chain]:
        """The chains whose tasks can be built for an evaluation; each other one is skipped with the reason: a
        run that trained a task object config.yaml cannot rebuild needs that object (`build_report(tasks=...)`),
        and a task that runs trained with different options has no one evaluation that fits them all."""
        from esft.tasks.custom import script_class
        from esft.tasks.task_values import unrecorded_options

        conflicts = self.option_conflicts()
        keep = []
        for c in chains:
            clash = next((t for t in dict.fromkeys(c.tasks) if t in conflicts), None)
            if clash is not None:
                self.skip(f"{analysis} ({c.label})", conflicts[clash])
                continue
            lost = [t for t in dict.fromkeys(c.tasks) if t not in self.task_objects
                    and (script_class(t) or unrecorded_options(self.task_options().get(t, {})))]
            if not lost:
                keep.append(c)
                continue
            self.skip(f"{analysis} ({c.label})", f"task {lost[0]} was a task object that config.yaml cannot rebuild "
                      "(a class of the training script, or a value such as a function): pass the same object from "
                      "a script: esft.analysis.report_builder.build_report(config, tasks=[task])")
        return keep

    def log(self, msg: str) -> None:
        if self.progress:
            print(f"esft report: {msg}", file=sys.stderr, flush=True)

    def skip(self, analysis: str, reason: str) -> None:
        self.unsupported.append((analysis, reason))

    def fig(self, name: str) -> Path:
        return self.out / "figures" / f"{name}.png"

    def rel(self, path: Path) -> str:
        """`path` relative to the report's folder (links in report.md keep working when DIR is moved)."""
        return os.path.relpath(Path(path).resolve(), self.out.resolve())

    def rel_run(self, r: Run) -> str:
        # a report of one run directory names the run by its folder, not "."
        shown = self.shown(r.path)
        return r.path.resolve().name if shown == "." else shown

    def shown(self, where: Any) -> str:
        """A path as report.md shows it (`shown_path` under the report's root DIR); other values as they are."""
        return shown_path(where, self.root)

    def gen_config(self, chain: Chain | None = None):
        from esft.generation import GenerationConfig

        mnt = self.config.max_new_tokens
        if mnt is None:
            vals = [r.hyper("max_new_tokens", "max_completion_length") for c in ([chain] if chain else self.chains)
                    for r in c.runs]
            vals = [int(v) for v in vals if v]
            mnt = max(vals) if vals else 256
        return GenerationConfig(max_new_tokens=int(mnt), temperature=0.0, batch_size=self.config.batch_size,
                                **self.config.generation_options)

    def eval_params(self) -> dict[str, Any]:
        """What, besides limit and max_new_tokens, decides an evaluating analysis's result (part of its cache key;
        empty at the defaults, so results cached before these options existed stay valid)."""
        out: dict[str, Any] = {}
        if self.eval_dtype() != "float32":  # keyless at float32, the dtype results cached without this key had
            out["dtype"] = self.eval_dtype()
        if self.config.balanced:
            out["balanced"] = True
        if self.config.generation_options:
            out["generation_options"] = dict(self.config.generation_options)
        return out

    def eval_dtype(self) -> str:
        """The dtype the evaluating analyses load models in (`--dtype auto`: float32 on CPU, bfloat16 on GPU)."""
        from esft.models import default_device, parse_dtype

        return str(parse_dtype(self.config.dtype, self.config.device or default_device())).replace("torch.", "")

    def generation_text(self) -> str:
        """How the evaluating analyses generate, for the report's header."""
        opts = self.config.generation_options
        how = (f"engine options {', '.join(f'{k}={v}' for k, v in opts.items())}" if opts else
               "the exact path (esft engine defaults; `--generation-options fast` is ~5x faster on CPU)")
        return f"Generation: {how}; models in {self.eval_dtype()} on {self.config.device or 'the default device'}."

    def run_task_options(self, r: Run) -> dict[str, Any]:
        """The task constructor options run `r` trained with: its recorded task_options, plus the passage cut,
        which reaches BoolQ only, as in training (a Countdown run of the cpu preset records it too)."""
        o = dict(r.config.get("task_options") or {})
        for key, value in passage_cut(r.task, r.config.get("max_passage_chars")).items():
            o.setdefault(key, value)
        return o

    def task_options(self) -> dict[str, dict[str, Any]]:
        """Task constructor options the runs trained with (e.g. BoolQ passage cuts), so evaluation matches. A task
        that runs trained with different options (`option_conflicts`) is not evaluated (`evaluable`)."""
        opts: dict[str, dict[str, Any]] = {}
        for r in self.runs:
            o = self.run_task_options(r) if r.task else {}
            if o:
                opts.setdefault(r.task, o)
        return opts

    def option_conflicts(self) -> dict[str, str]:
        """Each task that the runs trained with more than one set of options, with the runs and options to show:
        evaluating it with any one of them would judge the other runs on a task they did not train on."""
        seen: dict[str, dict[str, tuple[dict[str, Any], str]]] = {}
        for r in self.runs:
            if r.task:
                o = self.run_task_options(r)
                seen.setdefault(r.task, {}).setdefault(repr(sorted(o.items())), (o, self.rel_run(r)))
        return {t: (f"runs trained task {t} with different options ("
                    + "; ".join(f"{run}: {o or 'none'}" for o, run in kinds.values())
                    + "), so no one evaluation fits them all: report them apart (--exclude)")
                for t, kinds in seen.items() if len(kinds) > 1}

    def load(self, base: Path, weights: Path | None = None):
        """A model with `weights` (a checkpoint folder) on the architecture and tokenizer of `base` (checkpoint
        folders need not carry a tokenizer)."""
        from esft.analysis.landscape import set_weights
        from esft.models import load_model

        key = str(Path(base).resolve())
        if key not in self.tokenizers:
            model, tok = load_model(str(base), dtype=self.config.dtype, device=self.config.device)
            self.tokenizers[key] = tok
        else:
            # same weights loading as load_model, without reading the tokenizer again (~0.3 s a time)
            model, tok = load_model_only(base, self.config.dtype, self.config.device), self.tokenizers[key]
        if weights is not None and Path(weights).resolve() != Path(base).resolve():
            set_weights(model, weights)
        return model, tok

    def plot(self, cached: bool, path: Path, draw: Callable[[], Any]) -> Path:
        """Draw a figure unless its data came from the cache and the PNG is already there (figures cost
        ~0.4 s each)."""
        if not (cached and path.exists()):
            draw()
        return path
