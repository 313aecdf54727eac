"""`esft report DIR`: one Markdown report of every table and figure that the runs in DIR support.

DIR is a run directory or an experiment directory holding several. Runs are found and organised by
esft.analysis.runs (sequential chains, ES-GRPO pairs). Each analysis writes its JSON (and PNG figures) under the
output folder (default DIR/report) and is reused on the next call when its inputs and settings are unchanged, so
a report can be regenerated cheaply. Every measured table sits next to the study's value where the study gives
one (esft.paper); every analysis the runs cannot support is listed with the reason.

Analyses that generate text (KL, landscape, functional sparsity) evaluate the first `limit` test examples with
`max_new_tokens` per completion; the report states both, since both change the numbers.

This module only assembles the report: each section's rows and figures come from its analysis module
(`report_weights` in esft.analysis.weights_report, `report_drift` in esft.analysis.drift_runs, `report_kl` in
kl_report, `report_landscape` in landscape_report, `report_sparsity`; the runs and their accuracy from
esft.analysis.runs), which share an
esft.analysis.report_context.ReportContext; esft.tables renders the Markdown.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from esft import paper
from esft.analysis.checks import RULES
from esft.analysis.drift_runs import RunDrift, drift_notes, family_rows, grpo_family_rows, law_rows, report_drift
from esft.analysis.kl_report import kl_rows, paper_cells, report_kl
from esft.analysis.landscape_report import report_landscape
from esft.analysis.landscape_tables import (
    interpolation_header, interpolation_notes, interpolation_rows, sweep_notes, sweep_rows,
)
from esft.analysis.report_cache import json_default
from esft.analysis.report_context import ReportContext
from esft.analysis.run_tables import accuracy_rows, run_rows
from esft.analysis.sparsity import (SWEEP_TARGETS, report_sparsity, sweep_table_header, sweep_table_notes,
                                   sweep_table_rows)
from esft.analysis.weights_report import UpdateComparison, report_weights
from esft.config import ConfigError, ConfigHooks
from esft.config_rules import Rule, one_of
from esft.rundir import peak_rss_mb, write_text_atomic
from esft.tables import NA, fmt, grid
from esft.tasks.labels import MEAN_REWARD

ANALYSES = ("weights", "drift", "kl", "landscape", "sparsity")


@dataclass
class ReportConfig(ConfigHooks):
    """What `esft report` analyses and how much it evaluates."""

    dir: str = "runs"
    """a run directory or an experiment directory holding several runs"""
    output_dir: str | None = None
    """where report.md, JSON results and PNG figures go (None: DIR/report)"""
    analyses: list[str] = field(default_factory=lambda: list(ANALYSES))
    """which analyses to run: weights, drift, kl, landscape, sparsity"""
    limit: int = 50
    """test examples per task for the analyses that evaluate (KL, landscape, sparsity)"""
    balanced: bool = False
    """those analyses evaluate a label-balanced subset of `limit` test examples (tasks with a label set: BoolQ,
    chemistry, MMLU, a Countdown variant over the target's operator; esft.evaluation.load_examples) instead of the
    first `limit`, so a prior cannot pass for a skill on the curves"""
    generation_options: dict[str, Any] = field(default_factory=dict)
    """how the engine runs those evaluations: empty = the exact path, "fast" = esft.config.FAST_CPU_GENERATION
    (~5x faster on CPU, logits equal to ~1e-6), or a mapping of esft.generation.ENGINE_OPTIONS"""
    max_new_tokens: int | None = None
    """generation budget; None = the runs' own max_new_tokens (max_completion_length for GRPO), else 256"""
    batch_size: int = 16
    """prompts per generation batch"""
    kl_batch_size: int = 4
    """sequences per KL scoring batch (two models' full logits are held per batch)"""
    holdout_tasks: list[str] = field(default_factory=lambda: ["mmlu", "ifeval"])
    """tasks for Figure 5 (perturbation from the final checkpoints); empty to skip"""
    interpolation_points: int = 5
    """points on the ES-GRPO path (Figure 3), endpoints included"""
    magnitude_points: int = 4
    """geometric grid points per direction (Figure 4), besides 0 and the two update norms"""
    sparsity_targets: list[float] = field(default_factory=lambda: list(SWEEP_TARGETS))
    """target sparsities of the functional-sparsity sweep (thresholds chosen from a histogram of |d|)"""
    eps: float = paper.SPARSITY_EPS
    """sparsity threshold of Table 4"""
    device: str | None = None
    """device for evaluation (None: CUDA if available) and for an ES run's replay where it is of the run's device
    type (CPU and CUDA noise differ: a run is replayed on its own device type)"""
    dtype: str = "auto"
    """model dtype for evaluation (auto: fp32 on CPU, bf16 on GPU)"""
    recompute: bool = False
    """ignore cached analysis results"""
    threads: int | None = None
    """torch CPU threads (None = torch's default); 1 is fastest on a busy machine, where idle OpenMP threads spin"""
    exclude: list[str] = field(default_factory=list)
    """regular expressions: runs whose path (relative to DIR) matches one are left out"""
    all_runs: bool = False
    """in an experiment folder (one with plan.json), report every run under DIR; by default only the runs of the
    stages its plan lists, as stage folders of labels or tasks since removed from its spec stay on disk"""

    def __post_init__(self) -> None:
        from esft.generation import engine_options, options_refusal
        from esft.tasks import split_task_list
        from esft.tasks.custom import external_kind
        from esft.validation import check_task

        try:
            self.generation_options = engine_options(self.generation_options)
        except ValueError as exc:  # a ConfigError, located at its flag or line as every other value
            raise options_refusal(self.generation_options, exc) from None
        self.holdout_tasks = split_task_list(self.holdout_tasks)
        # a misspelt one failed Figure 5 only after the analyses before it had run; a data file or an imported task
        # is built later with the options its runs recorded (prompt_field, ...), without which it may not build
        for name in self.holdout_tasks:
            if not external_kind(name):
                check_task("holdout_tasks", name)
        check_report_options(self)


#: ranges of the options the analyses read only after the weights (and drift) sections have run for minutes
REPORT_RULES = {**{k: RULES[k] for k in ("limit", "max_new_tokens", "batch_size", "kl_batch_size", "eps", "threads",
                                          "interpolation_points", "magnitude_points")},
                "sparsity_targets": RULES["targets"],
                "dtype": one_of("auto", "fp32", "float32", "bf16", "bfloat16", "fp16", "float16"),
                "analyses": Rule(f"a list of {', '.join(ANALYSES)}", lambda v: set(v) <= set(ANALYSES))}


def check_report_options(config: ReportConfig) -> None:
    """ConfigError for the first option out of range, a name that is no torch device or an --exclude that is no
    regular expression, before any run is read."""
    import re

    from esft.validation import check_device, check_device_name

    for name, rule in REPORT_RULES.items():
        value = getattr(config, name)
        if value is not None and not rule.ok(value):
            raise ConfigError(name, value, rule.accepted)
    if config.device is not None:  # the name only where nothing evaluates: drift replays on the runs' device type
        evaluates = set(config.analyses) & {"kl", "landscape", "sparsity"}
        (check_device if evaluates else check_device_name)("device", config.device)
    for pattern in config.exclude:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError("exclude", pattern, f"regular expressions ({pattern!r}: {exc})") from None



DRIFT_PAPER = paper.DRIFT["matrices"] + "; " + paper.DRIFT["norms"] + "."


class Report(ReportContext):
    """The report's sections, in order, and report.md / results.json from them."""

    def __init__(self, config: ReportConfig, progress: bool = True, tasks: Sequence[Any] = ()):
        super().__init__(config, progress, tasks)
        self.sections: list[str] = []
        self.timings: dict[str, float] = {}
        self.cost: dict[str, list[tuple[str, bool, float]]] = {}
        """analysis -> the cached results it asked for: (name, reused, seconds of their computation)"""
        self.failed: list[str] = []
        """analyses that raised (the report records why; the CLI exits 1)"""

    def _cost_note(self, a: str) -> str:
        entries = self.cost.get(a) or []
        reused = [e for e in entries if e[1]]
        return f" ({len(reused)} of {len(entries)} results from the cache)" if reused else ""

    def build(self) -> Path:
        self.failed = []
        if self.config.threads:
            import torch

            torch.set_num_threads(int(self.config.threads))
        t_start = time.perf_counter()
        self.discover()
        if not self.runs:  # a mistyped folder must not look like an empty success
            self.drop_out()
            if self.left_out:  # runs there, every one left out: "no run directory" would send the user looking
                shown = "; ".join(f"{name}: {why}" for name, why in self.left_out[:3])
                more = f"; and {len(self.left_out) - 3} more" if len(self.left_out) > 3 else ""
                raise ValueError(f"every run under {self.root} was left out ({len(self.left_out)}): {shown}{more}"
                                 + ("" if self.config.all_runs or self.plan is None else
                                    " (--all-runs takes the runs outside the plan)"))
            raise ValueError(f"no run directory under {self.root} (a folder with config.yaml and metrics.jsonl, "
                             "seeds.jsonl, drift.jsonl or checkpoints)" + _inside_run(self.root)
                             + "".join(f"; {p} has logged nothing yet ({not_started_reason(p)})"
                                       for p in self.unstarted[:3]))
        self.log(f"{len(self.runs)} runs, {len(self.chains)} chains, {len(self.pairs)} ES-GRPO pairs"
                 + (f"; {len(self.left_out)} runs left out (listed under Runs)" if self.left_out else "")
                 + (f"; {len(self.unstarted)} runs have logged nothing yet (listed under Runs)"
                    if self.unstarted else ""))
        self.section_runs()
        self.section_accuracy()
        wanted = [a for a in self.config.analyses]
        for a in wanted:
            if a not in ANALYSES:
                raise ValueError(f"unknown analysis {a!r}; choose from {', '.join(ANALYSES)}")
        for a in ANALYSES:
            if a not in wanted:
                self.skip(a, "not requested (--analyses)")
                continue
            t0, n0 = time.perf_counter(), len(self.cache.entries)
            self.log(f"{a} ...")
            try:
                getattr(self, f"section_{a}")()
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: say what is kept and how to go on, not only "interrupted"
                # before any result there is no data folder to point to
                kept = (f"the finished analysis results ({len(self.cache.entries)}) are kept in {self.out / 'data'}, "
                        "and the same command continues from them" if self.cache.entries else
                        "no analysis result had finished, and the same command starts again")
                raise KeyboardInterrupt(f"esft report: interrupted in {a}; {kept} (report.md is written when it "
                                        "finishes)") from None
            except Exception as exc:  # one failing analysis must not lose the others
                self.sections.append(f"## {a}\n\nFailed: `{type(exc).__name__}: {exc}`\n")
                self.skip(a, f"failed with {type(exc).__name__}: {exc}")
                self.failed.append(a)
                self.log(f"{a} failed: {exc!r}")
            self.timings[a] = time.perf_counter() - t0
            self.cost[a] = self.cache.entries[n0:]
            self.log(f"{a}: {self.timings[a]:.1f} s" + self._cost_note(a))
        self.timings["total"] = time.perf_counter() - t_start
        return self.write()

    def evaluation_text(self) -> str:
        """How the evaluating analyses evaluate; that none did where --analyses names none of them, or where those
        it names found nothing to evaluate (e.g. kl without an ES-GRPO pair): a header that gave a limit and a
        generation path read as if the report had evaluated."""
        cfg = self.config
        evaluating = [a for a in ("kl", "landscape", "sparsity") if a in cfg.analyses]
        if not evaluating:
            return "No evaluations (--analyses has none of kl, landscape, sparsity). "
        if not any(self.cost.get(a) for a in evaluating):  # each evaluation is a result asked of the cache
            failed = [a for a in evaluating if a in self.failed]
            why = f"{', '.join(failed)} failed before evaluating" if failed else "nothing to evaluate in these runs"
            return f"No evaluations ({', '.join(evaluating)}: {why}). "
        return (f"Evaluations use {'a label-balanced subset of' if cfg.balanced else 'the first'} {cfg.limit} test "
                "examples per task, greedy decoding, "
                f"max_new_tokens {self.gen_config().max_new_tokens if self.chains else 'n/a'}. "
                f"{self.generation_text()} ")

    def write(self) -> Path:
        cfg = self.config
        lines = [f"# esft report: {self.root}", ""]
        lines.append(f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')}. Runs: {len(self.runs)}, sequential chains: "
                     f"{len(self.chains)}, ES-GRPO pairs (same base model and task sequence): {len(self.pairs)}. "
                     + self.evaluation_text()
                     + "Paper values are from the study (Qwen3-4B-Instruct unless noted), at its scale.")
        lines.append("")
        lines.extend(self.sections)
        lines.append("## What these runs could not support\n")
        if self.unsupported:
            for a, why in self.unsupported:
                lines.append(f"- **{a}**: {why}")
        else:
            lines.append("Nothing: every analysis ran.")
        lines.append("")
        lines.append("## Cost\n")
        lines.append(grid(["analysis", "seconds (this call)", "results from the cache", "seconds to compute them"],
                          [self._cost_row(k, v) for k, v in self.timings.items()]))
        lines.append("\nA result from the cache took no time in this call; the last column is the time its "
                     "computation took when it was made.")
        lines.append(f"\nPeak resident memory of the report process: {peak_rss_mb():.0f} MiB.")
        path = self.out / "report.md"  # each whole or not at all (a Ctrl-C while written)
        write_text_atomic(path, "\n".join(lines) + "\n")
        write_text_atomic(self.out / "results.json", json.dumps(
            {"config": asdict(cfg), "results": self.results, "unsupported": self.unsupported,
             "timings": self.timings, "cache": self.cost, "peak_rss_mb": peak_rss_mb()},
            indent=1, default=json_default))
        return path

    def _cost_row(self, analysis: str, seconds: float) -> list[str]:
        entries = [e for k, es in self.cost.items() for e in es if analysis in (k, "total")]
        if not entries:
            return [analysis, f"{seconds:.1f}", NA, NA]
        return [analysis, f"{seconds:.1f}", f"{sum(e[1] for e in entries)} of {len(entries)}",
                f"{sum(e[2] for e in entries):.1f}"]

    # -- sections ------------------------------------------------------------------------------------------------------
    def section_runs(self) -> None:
        rows = run_rows(self.runs, self.rel_run, self.shown)
        s = ["## Runs\n", grid(["run", "algorithm", "task", "seed", "started from", "steps", "final checkpoint",
                                "precision"], rows) if rows else "No run directories found."]
        if self.plan is not None:
            s.append(f"\nDIR is an experiment folder: the runs of the {len(self.plan.keys)} training stages its "
                     "plan.json lists (`--all-runs` reports every run under DIR).")
            for key, status in sorted(self.plan.unfinished.items()):
                went = "it has no run yet" if status in ("not started", "blocked") else \
                    "its run is reported as far as it went"
                self.skip(f"stage {key}", f"{status}, not done: {went} (`esft experiment status DIR`; run the "
                                          "experiment again to finish it)")
        left = self.left_out + [(self.shown(p), f"nothing logged yet ({not_started_reason(p)})")
                                for p in self.unstarted]
        if left:
            s.append("\nLeft out:\n\n" + "\n".join(f"- `{name}`: {why}" for name, why in left))
        if self.chains:
            s.append("\nChains (stage order): " + "; ".join(c.label for c in self.chains))
        self.sections.append("\n".join(s) + "\n")
        if not self.runs:
            self.skip("everything",
                      f"no run directory (config.yaml with metrics/seeds/drift/checkpoints) under {self.root}")

    def section_accuracy(self) -> None:
        tables = self.root / "tables" / "tables.md"
        if tables.exists():
            # an `esft experiment run` directory: its runner already wrote the accuracy tables per stage
            self.sections.append("## Accuracy per stage (paper Tables 1, 2, 5-8, 18; pass@k)\n\nWritten by the "
                                 "experiment runner from its stage evaluations: "
                                 f"[{self.rel(tables)}]({self.rel(tables)}).\n")
        rows = accuracy_rows(self.runs, self.rel_run)
        if rows:
            rewards = any(r.score_name() == MEAN_REWARD for r in self.runs)
            what = "accuracy or mean reward" if rewards else "accuracy"
            self.sections.append(f"## Held-out {what} during training (paper Table 1)\n\n" + grid(
                ["run", "algorithm", "task", "first eval", "last eval", "95% CI", "n", "format rate",
                 "constant answer (last eval)", "paper (%)"], rows)
                + "\n\nFrom each run's own `metrics.jsonl` evaluations. Constant answer: always giving one gold "
                "answer of the last evaluation's examples (the most frequent one; under a reward function, the best of "
                "the most frequent ones), with its 95% Wilson interval.\n")
        elif tables.exists():  # Table 1 is in the runner's tables; only the runs' own curves are missing
            self.skip("held-out accuracy during training", "no evaluation records (kind=eval with test_accuracy) in "
                      f"the runs' metrics.jsonl; the stages' accuracy (Table 1) is in {self.rel(tables)}")
        else:
            self.skip("accuracy (Table 1)", "no evaluation records (kind=eval with test_accuracy) in metrics.jsonl")

    def section_weights(self) -> None:
        comparisons = report_weights(self)
        if comparisons is None:
            return
        s = ["## Weight-space geometry (paper Tables 3, 4, 20)\n",
             "Update = checkpoint - base model, float64. "
             f"Sparsity: fraction of entries with |d| <= {self.config.eps:g}. "
             "In brackets, where it differs: the sparsity of the weights rounded to bf16, as a bf16 checkpoint holds "
             "them (the study's models are bf16, and rounding hides most small changes). "
             "Stable rank ||dW||_F^2/||dW||_2^2 averaged over attention q/k/v/o and MLP gate/up/down matrices; "
             "Gaussian s.r.: the same average for i.i.d. Gaussian matrices of their shapes, mn/(sqrt(m)+sqrt(n))^2, "
             "about the most a noise-built ES update reaches. Tied embeddings are counted once. The study's values "
             "are cumulative over its sequence (countdown, math, chemistry, boolq): they stand beside a stage only "
             "where the chain trained that sequence up to it.\n"]
        for c in comparisons:
            s += self._weights_tables(c)
        self.sections.append("\n".join(s) + "\n")

    def _weights_tables(self, c: UpdateComparison) -> list[str]:
        s = [f"### {c.label}\n", f"Base model: `{self.shown(c.base)}`.\n"]
        if c.paired:
            s.append("**Table 3: update norm ||dtheta||_2**\n\n" + grid(
                ["stage", "ES norm", "GRPO norm", "ES/GRPO", "paper ES / GRPO / ratio"], c.norms))
            s.append("\n**Table 4: sparsity and stable rank**\n\n" + grid(
                ["stage", "sparsity ES", "sparsity GRPO", "stable rank ES", "stable rank GRPO",
                 "Gaussian s.r.", "paper sp. ES / GRPO / s.r. ES / GRPO"], c.sparsity))
            s.append("\n**Table 20: cosine(ES update, GRPO update)**\n\n" + grid(
                ["stage", "cosine", "paper"], c.cosines))
        else:
            s.append("**Table 3: update norm**\n\n" + grid(["stage", f"{c.algorithm.upper()} norm", "paper"], c.norms))
            s.append("\n**Table 4: sparsity and stable rank**\n\n" + grid(
                ["stage", "sparsity", "stable rank", "Gaussian s.r.", "paper sparsity / stable rank"], c.sparsity))
        if c.budget:
            s.append(f"\n{c.budget} By the random-walk law an ES update's norm grows as the square root of its "
                     "iterations.")
        if c.notes:
            s.append("\nMissing checkpoints: " + " ".join(c.notes))
        if c.families is not None:
            s.append("\n" + f"Per family, at stage {c.last_stage}:\n\n" + grid(*c.families))
        if c.figure is not None:
            s.append(f"\n![per-layer update norms and stable ranks, stage {c.last_stage}]({self.rel(c.figure)})\n")
        return s

    def section_drift(self) -> None:
        s = ["## Drift against the random-walk law (paper Figures 6, 9, 10, 11)\n",
             "Prediction for ES with z-scored fitness: ||dtheta_T||^2 = alpha^2 T d / N, no fitted parameter. "
             "Per tensor, a fit through the origin gives d_eff and rho = d_eff / d_p; R^2 is centred (can be "
             "negative). Paper: " + DRIFT_PAPER + "\n"]
        runs, grpo_only = report_drift(self)
        for d in runs:
            s.append(self._drift_text(d))
            s.append("".join(f"![{caption}]({self.rel(path)})\n" for caption, path in d.figures))
        for name, gs in grpo_only:
            s.append(f"### GRPO {name}\n\n{len(gs.steps)} steps, final ||dtheta||^2 = "
                     f"{fmt(gs.total[-1]) if gs.total else NA} (no ES run to compare with).\n")
        self.sections.append("\n".join(s) + "\n")

    def _drift_text(self, d: RunDrift) -> str:
        out = [f"### ES {d.name}\n", grid(["quantity", "value"], law_rows(d.result, d.grpo is not None))]
        notes = drift_notes(d.run)
        if notes:
            out.append("\nNotes: " + "; ".join(notes) + ".")
        fam = family_rows(d.result)
        if fam:
            out.append("\nPer family (median [IQR] over tensors; paper: matrices rho ~ 1, R^2 ~ 1; norms scatter):\n\n"
                       + grid(["family", "tensors", "entries each", "rho", "R^2 (fit)", "R^2 (theory) median"], fam))
        grpo_fam = grpo_family_rows(d.result) if d.grpo is not None else []
        if grpo_fam:
            out.append("\nGRPO with the same scaling (rho in units of the ES law; no law is expected):\n\n"
                       + grid(["family", "tensors", "rho", "R^2 (fit)"], grpo_fam))
        return "\n".join(out) + "\n"

    def section_kl(self) -> None:
        found = report_kl(self)
        if found is None:
            return
        groups, figure = found
        s = ["## KL(pi_after || pi_before) on test prompts (paper Figure 2, Tables 11-16)\n",
             "Completions generated greedily by pi_after and scored token-aligned by both models. Headline "
             "estimator: k3 per-token mean; k1 and the exact next-token KL are in the JSON (the study does not "
             "say which estimator its tables use). Incremental: stage t vs t-1; cumulative: stage t vs base. "
             "± is the standard error over the evaluated sequences (the sequence, not the token, is the sampling "
             "unit; with several seeds, the median of the seeds' SEs); none where a result predates it "
             "(`--recompute`) or holds one sequence.\n"]
        for g in groups:
            n = len(g.seeds)
            s.append(f"### {g.title} ({g.over})\n")
            for kind in ("incremental", "cumulative"):
                s.append(f"**{kind}** ({'median [min, max] over ' + g.over.split()[1] if n > 1 else 'one seed'})\n\n"
                         + grid(*kl_rows(g, kind)) + "\n")
            if not paper_cells(g):
                continue
            budget = paper.es_budget_note(g.iterations)
            s.append("Paper values are the study's cell for the same evaluation task after training the same task "
                     "in its sequence (Countdown -> Math -> Chemistry -> BoolQ, Qwen3-4B): for incremental KL "
                     "whatever stage that is here, for cumulative KL (Tables 13, 14: from the base, over its "
                     "sequence) only where the chain trained that sequence up to the stage; the study gives no "
                     "per-cell values for ES's incremental KL (Table 11)."
                     + (f" {budget}" if budget else "") + "\n")
        if figure is not None:
            s.append(f"![incremental KL heatmap (Figure 2)]({self.rel(figure)})\n")
        self.sections.append("\n".join(s) + "\n")

    def section_landscape(self) -> None:
        found = report_landscape(self)
        if found is None:
            return
        s = ["## Loss landscape along straight lines (paper Figures 3, 4, 5)\n"]
        if found.note:
            s.append(found.note + "\n")
        la, lb = found.labels
        if found.interpolation is not None:
            res = found.interpolation
            s.append(f"### Figure 3: {la.upper()} (t=0) to {lb.upper()} (t=1), distance {fmt(res['distance'])}\n\n"
                     + grid(interpolation_header(res, found.tasks, (la.upper(), lb.upper())),
                            interpolation_rows(res, found.tasks))
                     + "".join(f"\n\n{note}" for note in interpolation_notes(res, found.tasks))
                     + f"\n\nPaper: {paper.LANDSCAPE['interpolation']}.\n\n"
                       f"![interpolation]({self.rel(found.interpolation_figure)})\n")
        if found.directions_figure is not None:  # none where every update is zero (said among the unsupported)
            s.append("### Figure 4: from the base along each update and a norm-matched random direction\n\n"
                     + grid(*sweep_rows(found.directions))
                     + "".join(f"\n\n{n}" for n in sweep_notes(found.directions))
                     + f"\n\nPaper: {paper.LANDSCAPE['directions']}.\n\n"
                     f"![directions]({self.rel(found.directions_figure)})\n")
        for lab, r5, path in found.holdout:
            s.append(f"### Figure 5: holdout tasks, from the final {lab.upper()} checkpoint along its own update\n\n"
                     + grid(*sweep_rows(r5)) + "".join(f"\n\n{n}" for n in sweep_notes(r5))
                     + f"\n\n![holdout {lab}]({self.rel(path)})\n")
        self.sections.append("\n".join(s) + "\n")

    def section_sparsity(self) -> None:
        found = report_sparsity(self)
        if found is None:
            return
        sweeps, figure = found
        s = ["## Functional sparsity (keep |d| > tau, revert the rest, re-evaluate)\n",
             f"Reference: {paper.FUNCTIONAL_SPARSITY}.\n"]
        for sw in sweeps:
            s.append(f"### {sw.label}\n\n" + grid(sweep_table_header(sw), sweep_table_rows(sw))
                     + "".join(f"\n\n{n}" for n in sweep_table_notes(sw)) + "\n")
        s.append(f"![functional sparsity]({self.rel(figure)})\n")
        self.sections.append("\n".join(s) + "\n")


def _inside_run(root: Path) -> str:
    """`; ROOT is inside the run folder RUN: esft report RUN` where a folder inside a run (its checkpoint, its
    samples/) was given instead of the run, else ''."""
    from esft.rundir import enclosing_run_dir

    run = enclosing_run_dir(root)
    return f"; {root} is inside the run folder {run}: give that (esft report {run})" if run else ""


def not_started_reason(run: Path) -> str:
    """Why run folder `run` holds no log yet: a trainer holds its lock, or it stopped before its first step."""
    from esft.rundir import lock_held

    return ("a run in its first iteration: an esft process holds its lock" if lock_held(run) else
            "a run stopped before its first iteration ended")


def build_report(config: ReportConfig, progress: bool = True, tasks: Sequence[Any] = ()) -> Path:
    """Write report.md (and JSON, figures) for the runs under config.dir; returns the report's path.

    `tasks`: the task objects of runs trained through the Python API whose config.yaml cannot rebuild them (a
    class of the training script, a value such as a function: esft.tasks.custom.task_record), each the same
    object (class and values) the run trained; the analyses that evaluate (KL, landscape, functional sparsity)
    skip a run's chain without it. An object no run recorded is refused."""
    return Report(config, progress, tasks).build()
