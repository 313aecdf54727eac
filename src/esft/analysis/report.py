"""`esft report DIR`: one Markdown report of every table and figure that the runs in DIR support.

DIR is a run directory or an experiment directory holding several. Runs are found and organised by
esft.analysis.runs (sequential chains, ES-GRPO pairs). Each analysis writes its JSON (and PNG figures) under the
output folder (default DIR/report) and is reused on the next call when its inputs and settings are unchanged, so
a report can be regenerated cheaply. Every measured table sits next to the study's value where the study gives
one (esft.analysis.paper); every analysis the runs cannot support is listed with the reason.

Analyses that generate text (KL, landscape, functional sparsity) evaluate the first `limit` test examples with
`max_new_tokens` per completion; the report states both, since both change the numbers.
"""

from __future__ import annotations

import json
import math
import re
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from esft.analysis import paper
from esft.analysis.runs import Chain, Pair, Run, build_chains, build_pairs, find_runs

ANALYSES = ("weights", "drift", "kl", "landscape", "sparsity")


@dataclass
class ReportConfig:
    """What `esft report` analyses and how much it evaluates."""

    dir: str = "runs"
    """a run directory or an experiment directory holding several runs"""
    output_dir: str | None = None
    """where report.md, JSON results and PNG figures go (default: DIR/report)"""
    analyses: list[str] = field(default_factory=lambda: list(ANALYSES))
    """which analyses to run: weights, drift, kl, landscape, sparsity"""
    limit: int = 50
    """test examples per task for the analyses that evaluate (KL, landscape, sparsity)"""
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
    sparsity_targets: list[float] = field(default_factory=lambda: [0.0, 0.5, 0.78, 0.9, 0.99])
    """target sparsities of the functional-sparsity sweep (thresholds chosen from a histogram of |d|)"""
    eps: float = 1e-5
    """sparsity threshold of Table 4"""
    device: str | None = None
    """device for evaluation and replay (None: CUDA if available)"""
    dtype: str = "auto"
    """model dtype for evaluation (auto: fp32 on CPU, bf16 on GPU)"""
    recompute: bool = False
    """ignore cached analysis results"""
    threads: int | None = None
    """torch CPU threads (None = torch's default); 1 is fastest on a busy machine, where idle OpenMP threads spin"""
    exclude: list[str] = field(default_factory=list)
    """regular expressions: runs whose path (relative to DIR) matches one are left out"""


# ---- small helpers ----------------------------------------------------------------------------------------------

def peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if math.isnan(x):
            return "n/a"
        if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
            return f"{x:.{max(1, digits - 1)}e}"
        return f"{x:.{digits}g}"
    return str(x)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _cell(c: Any) -> str:
    text = c if isinstance(c, str) else _fmt(c)
    return text.replace("|", "\\|")  # a bare pipe would end the Markdown cell (||dtheta||, "es|grpo")


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        out.append("| " + " | ".join(_cell(c) for c in r) + " |")
    return "\n".join(out)


def _fingerprint(paths: Sequence[Path | None]) -> list[Any]:
    """Identity of the inputs of a cached result: paths and the modification times of their weight files."""
    out = []
    for p in paths:
        if p is None:
            out.append(None)
            continue
        p = Path(p)
        files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
        out.append([str(p), [round(f.stat().st_mtime, 3) for f in files if f.exists()]])
    return out


class Cache:
    """JSON results under the output folder, reused when their `params` match."""

    def __init__(self, root: Path, recompute: bool):
        self.root, self.recompute = root, recompute

    def get(self, name: str, params: Any, compute: Callable[[], Any]) -> tuple[Any, bool]:
        path = self.root / "data" / f"{name}.json"
        params = json.loads(json.dumps(params, default=str))
        if path.exists() and not self.recompute:
            try:
                data = json.loads(path.read_text())
                if data.get("params") == params:
                    return data["result"], True
            except (json.JSONDecodeError, KeyError):
                pass
        t0 = time.perf_counter()
        result = compute()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"params": params, "seconds": time.perf_counter() - t0, "result": result},
                                   default=_json_default))
        return json.loads(json.dumps(result, default=_json_default)), False


def _json_default(x: Any) -> Any:
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text).strip("_")[:80]


# ---- the report ------------------------------------------------------------------------------------------------------

class Report:
    def __init__(self, config: ReportConfig, progress: bool = True):
        self.config = config
        self.root = Path(config.dir)
        self.out = Path(config.output_dir) if config.output_dir else self.root / "report"
        self.out.mkdir(parents=True, exist_ok=True)
        self.cache = Cache(self.out, config.recompute)
        self.progress = progress
        self.sections: list[str] = []
        self.unsupported: list[tuple[str, str]] = []
        self.timings: dict[str, float] = {}
        self.results: dict[str, Any] = {}
        self.runs: list[Run] = []
        self.chains: list[Chain] = []
        self.pairs: list[Pair] = []
        self._tokenizers: dict[str, Any] = {}

    # -- utilities
    def log(self, msg: str) -> None:
        if self.progress:
            print(f"esft report: {msg}", file=sys.stderr, flush=True)

    def skip(self, analysis: str, reason: str) -> None:
        self.unsupported.append((analysis, reason))

    def fig(self, name: str) -> Path:
        return self.out / "figures" / f"{name}.png"

    def rel(self, path: Path) -> str:
        """`path` relative to the report's folder (links in report.md keep working when DIR is moved)."""
        import os

        return os.path.relpath(Path(path).resolve(), self.out.resolve())

    def gen_config(self, chain: Chain | None = None):
        from esft.generation import GenerationConfig

        mnt = self.config.max_new_tokens
        if mnt is None:
            vals = [r.hyper("max_new_tokens", "max_completion_length") for c in ([chain] if chain else self.chains)
                    for r in c.runs]
            vals = [int(v) for v in vals if v]
            mnt = max(vals) if vals else 256
        return GenerationConfig(max_new_tokens=int(mnt), temperature=0.0, batch_size=self.config.batch_size)

    def task_options(self) -> dict[str, dict[str, Any]]:
        """Task constructor options the runs trained with (e.g. BoolQ passage cuts), so evaluation matches."""
        opts: dict[str, dict[str, Any]] = {}
        for r in self.runs:
            t = r.task
            if not t:
                continue
            o = dict(r.config.get("task_options") or {})
            if r.config.get("max_passage_chars"):
                o.setdefault("max_passage_chars", r.config["max_passage_chars"])
            if o:
                opts.setdefault(t, o)
        return opts

    def load(self, base: Path, weights: Path | None = None):
        """A model with `weights` (a checkpoint folder) on the architecture and tokenizer of `base` (checkpoint
        folders need not carry a tokenizer)."""
        from esft.analysis.landscape import set_weights
        from esft.models import load_model

        key = str(Path(base).resolve())
        if key not in self._tokenizers:
            model, tok = load_model(str(base), dtype=self.config.dtype, device=self.config.device)
            self._tokenizers[key] = tok
        else:
            # same weights loading as load_model, without reading the tokenizer again (~0.3 s a time)
            model, tok = _load_model_only(base, self.config.dtype, self.config.device), self._tokenizers[key]
        if weights is not None and Path(weights).resolve() != Path(base).resolve():
            set_weights(model, weights)
        return model, tok

    def plot(self, cached: bool, path: Path, draw: Callable[[], Any]) -> Path:
        """Draw a figure unless its data came from the cache and the PNG is already there (figures cost
        ~0.4 s each)."""
        if not (cached and path.exists()):
            draw()
        return path

    # -- main
    def build(self) -> Path:
        if self.config.threads:
            import torch

            torch.set_num_threads(int(self.config.threads))
        t_start = time.perf_counter()
        self.runs = [r for r in find_runs(self.root)
                     if not any(re.search(p, self.rel_run(r)) for p in self.config.exclude)]
        self.chains = build_chains(self.runs, self.root)
        self.pairs = build_pairs(self.chains)
        self.log(f"{len(self.runs)} runs, {len(self.chains)} chains, {len(self.pairs)} ES-GRPO pairs")
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
            t0 = time.perf_counter()
            self.log(f"{a} ...")
            try:
                getattr(self, f"section_{a}")()
            except Exception as exc:  # one failing analysis must not lose the others
                self.sections.append(f"## {a}\n\nFailed: `{type(exc).__name__}: {exc}`\n")
                self.skip(a, f"failed with {type(exc).__name__}: {exc}")
                self.log(f"{a} failed: {exc!r}")
            self.timings[a] = time.perf_counter() - t0
        self.timings["total"] = time.perf_counter() - t_start
        return self.write()

    def write(self) -> Path:
        cfg = self.config
        lines = [f"# esft report: {self.root}", ""]
        lines.append(f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')}. Runs: {len(self.runs)}, sequential chains: "
                     f"{len(self.chains)}, ES-GRPO pairs (same base model and task sequence): {len(self.pairs)}. "
                     f"Evaluations use the first {cfg.limit} test examples per task, greedy decoding, "
                     f"max_new_tokens {self.gen_config().max_new_tokens if self.chains else 'n/a'}. "
                     "Paper values are from the study (Qwen3-4B-Instruct unless noted), at its scale.")
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
        lines.append(table(["analysis", "seconds"], [[k, f"{v:.1f}"] for k, v in self.timings.items()]))
        lines.append(f"\nPeak resident memory of the report process: {peak_rss_mb():.0f} MiB.")
        path = self.out / "report.md"
        path.write_text("\n".join(lines) + "\n")
        (self.out / "results.json").write_text(json.dumps(
            {"config": asdict(cfg), "results": self.results, "unsupported": self.unsupported,
             "timings": self.timings, "peak_rss_mb": peak_rss_mb()}, indent=1, default=_json_default))
        return path

    # -- sections ------------------------------------------------------------------------------------------------------
    def section_runs(self) -> None:
        rows = []
        for r in self.runs:
            steps = _steps(r)
            rows.append([self.rel_run(r), r.algorithm, r.task or "?", r.seed, r.model or "?", steps,
                         r.final.name if r.final else "none", _precision(r)])
        s = ["## Runs\n", table(["run", "algorithm", "task", "seed", "started from", "steps", "final checkpoint",
                                 "precision"], rows) if rows else "No run directories found."]
        if self.chains:
            s.append("\nChains (stage order): " + "; ".join(c.label for c in self.chains))
        self.sections.append("\n".join(s) + "\n")
        if not self.runs:
            self.skip("everything", f"no run directory (config.yaml with metrics/seeds/drift/checkpoints) under {self.root}")

    def rel_run(self, r: Run) -> str:
        try:
            return str(r.path.relative_to(self.root.resolve())) or "."
        except ValueError:
            return str(r.path)

    def section_accuracy(self) -> None:
        tables = self.root / "tables" / "tables.md"
        if tables.exists():
            # an `esft experiment run` directory: its runner already wrote the accuracy tables per stage
            self.sections.append("## Accuracy per stage (paper Tables 1, 2, 5-8, 18)\n\nWritten by the experiment "
                                 f"runner from its stage evaluations: [{self.rel(tables)}]({self.rel(tables)}).\n")
        rows = []
        for r in self.runs:
            first, last = r.accuracy_at("first"), r.accuracy_at("last")
            if last is None:
                continue
            ref = paper.TABLE1.get(r.task or "")
            ref_s = (f"base {ref[0]}, ES(100) {ref[1]}, ES(300) {ref[2]}, GRPO {ref[3]}" if ref else "n/a")
            ci = last.get("ci95")
            rows.append([self.rel_run(r), r.algorithm, r.task or "?",
                         _pct(first["accuracy"]) + f" (step {first['step']})" if first else "n/a",
                         _pct(last["accuracy"]) + f" (step {last['step']})",
                         f"[{_pct(ci[0])}, {_pct(ci[1])}]" if ci else "n/a", last.get("n") or "n/a",
                         _pct(last.get("format_rate")) if last.get("format_rate") is not None else "n/a", ref_s])
        if rows:
            self.sections.append("## Held-out accuracy during training (paper Table 1)\n\n" + table(
                ["run", "algorithm", "task", "first eval", "last eval", "95% CI", "n", "format rate",
                 "paper (%)"], rows) + "\n\nFrom each run's own `metrics.jsonl` evaluations.\n")
        else:
            self.skip("accuracy (Table 1)", "no evaluation records (kind=eval with test_accuracy) in metrics.jsonl")

    # weights: Tables 3, 4, 20 ---------------------------------------------------------------------------------------
    def section_weights(self) -> None:
        from esft.analysis.weights import compare_updates

        s = ["## Weight-space geometry (paper Tables 3, 4, 20)\n",
             f"Update = checkpoint - base model, float64. Sparsity: fraction of entries with |d| <= {self.config.eps:g}. "
             "Stable rank ||dW||_F^2/||dW||_2^2 averaged over attention q/k/v/o and MLP gate/up/down matrices. "
             "Tied embeddings are counted once.\n"]
        done_chain: set[int] = set()
        out: dict[str, Any] = {}
        items: list[tuple[str, Chain, Chain | None]] = [(p.label, p.es, p.grpo) for p in self.pairs]
        paired = {id(p.es) for p in self.pairs} | {id(p.grpo) for p in self.pairs}
        items += [(c.label, c, None) for c in self.chains if id(c) not in paired]
        if not items:
            self.skip("weights", "no runs with checkpoints")
            return
        for label, a, b in items:
            if a.base is None:
                self.skip(f"weights ({label})", f"base model {a.base_spec!r} is not a folder on disk")
                continue
            stages_rows3, stages_rows4, stages_rows20 = [], [], []
            last_rep, cached = None, False
            for i, (stage, task) in enumerate(zip(a.stages, a.tasks)):
                run = stage.run
                ck_a = stage.checkpoint
                ck_b = b.stages[i].checkpoint if b is not None and i < len(b.stages) else None
                if ck_a is None or (b is not None and ck_b is None):
                    self.skip(f"weights ({label}, stage {i + 1})", "a stage has no checkpoint")
                    continue
                la, lb = a.algorithm, (b.algorithm if b is not None else None)
                tuned = {la: ck_a} if lb is None else {la: ck_a, lb: ck_b}
                if lb == la:
                    tuned = {la: ck_a, f"{lb}_2": ck_b}
                params = {"base": _fingerprint([a.base]), "tuned": {k: _fingerprint([v]) for k, v in tuned.items()},
                          "eps": self.config.eps}
                rep, cached = self.cache.get(f"weights_{_slug(label)}_stage{i + 1}", params,
                                             lambda: compare_updates(a.base, tuned, eps=self.config.eps,
                                                                     progress=self.progress))
                last_rep = rep
                out[f"{label} stage {i + 1}"] = rep["total"]
                tot = rep["total"]
                k = paper.STAGE_TASKS.index(task) if task in paper.STAGE_TASKS else None
                pref = f"{i + 1}: {task}"
                if b is not None:
                    ea, gb = tot[la], tot[list(tuned)[1]]
                    ratio = tot.get(f"norm_ratio:{la}|{list(tuned)[1]}")
                    p3 = paper.TABLE3[k] if k is not None else None
                    stages_rows3.append([pref, ea["norm"], gb["norm"], f"{ratio:.3g}x" if ratio else "n/a",
                                         f"{p3[0]} / {p3[1]} / {p3[2]}x (after {paper.stage_label(k)})" if p3 else "n/a"])
                    p4 = paper.TABLE4[k] if k is not None else None
                    stages_rows4.append([pref, _pct(ea["sparsity"]), _pct(gb["sparsity"]), ea["stable_rank_mean"],
                                         gb["stable_rank_mean"],
                                         f"{_pct(p4[0])} / {_pct(p4[1])} / {p4[2]} / {p4[3]}" if p4 else "n/a"])
                    cos = tot.get(f"cos:{la}|{list(tuned)[1]}")
                    p20 = paper.TABLE20[k] if k is not None else None
                    stages_rows20.append([pref, cos, f"{p20[0]:.1e} (Qwen) / {p20[1]:.1e} (Llama)" if p20 else "n/a"])
                else:
                    ea = tot[la]
                    if la not in ("es", "grpo"):
                        k = None  # mixed chains (grpo->es): the study has no such run
                    p3 = paper.TABLE3[k] if k is not None else None
                    p4 = paper.TABLE4[k] if k is not None else None
                    col = 0 if la == "es" else 1
                    stages_rows3.append([pref, ea["norm"], f"{p3[col]}" if p3 else "n/a"])
                    stages_rows4.append([pref, _pct(ea["sparsity"]), ea["stable_rank_mean"],
                                         f"{_pct(p4[col])} / {p4[2 + col]}" if p4 else "n/a"])
            s.append(f"### {label}\n")
            s.append(f"Base model: `{a.base}`.\n")
            if b is not None:
                s.append("**Table 3: update norm ||dtheta||_2**\n\n" + table(
                    ["stage", "ES norm", "GRPO norm", "ES/GRPO", "paper ES / GRPO / ratio"], stages_rows3))
                s.append("\n**Table 4: sparsity and stable rank**\n\n" + table(
                    ["stage", "sparsity ES", "sparsity GRPO", "stable rank ES", "stable rank GRPO",
                     "paper sp. ES / GRPO / s.r. ES / GRPO"], stages_rows4))
                s.append("\n**Table 20: cosine(ES update, GRPO update)**\n\n" + table(
                    ["stage", "cosine", "paper"], stages_rows20))
            else:
                s.append("**Table 3: update norm**\n\n" + table(["stage", f"{a.algorithm.upper()} norm", "paper"],
                                                                 stages_rows3))
                s.append("\n**Table 4: sparsity and stable rank**\n\n" + table(
                    ["stage", "sparsity", "stable rank", "paper sparsity / stable rank"], stages_rows4))
                self.skip(f"ES/GRPO norm ratio and cosine (Tables 3, 20) for {label}",
                          "no run of the other algorithm from the same base model on the same task sequence")
            if last_rep is not None:
                s.append("\n" + self._family_table(last_rep))
                fig = self.plot(cached, self.fig(f"weights_{_slug(label)}"),
                                lambda rep=last_rep, label=label: plot_weights(rep, self.fig(f"weights_{_slug(label)}")))
                s.append(f"\n![per-layer update norms and stable ranks]({self.rel(fig)})\n")
            done_chain.add(id(a))
        self.results["weights"] = out
        self.sections.append("\n".join(s) + "\n")

    def _family_table(self, rep: dict[str, Any]) -> str:
        labels = rep["labels"]
        head = ["family", "tensors", "entries"]
        for lab in labels:
            head += [f"{lab} norm", f"{lab} sparsity", f"{lab} stable rank"]
        pairs = rep.get("pairs", [])
        head += [f"cos {p}" for p in pairs]
        rows = []
        for fam, v in rep["families"].items():
            row = [fam, v["tensors"], v["numel"]]
            for lab in labels:
                row += [v[lab]["norm"], _pct(v[lab]["sparsity"]), v[lab]["stable_rank_mean"]]
            row += [v.get(f"cos:{p}") for p in pairs]
            rows.append(row)
        return "Per family, last stage:\n\n" + table(head, rows)

    # drift: Figures 6, 9, 10, 11 ------------------------------------------------------------------------------------
    def section_drift(self) -> None:
        from esft.analysis import drift as D
        from esft.analysis.sources import CheckpointSource

        s = ["## Drift against the random-walk law (paper Figures 6, 9, 10, 11)\n",
             "Prediction for ES with z-scored fitness: ||dtheta_T||^2 = alpha^2 T d / N, no fitted parameter. "
             "Per tensor, a fit through the origin gives d_eff and rho = d_eff / d_p; R^2 is centred (can be "
             "negative). Paper: " + D_PAPER + "\n"]
        es_runs = [r for r in self.runs if r.algorithm == "es"]
        grpo_runs = [r for r in self.runs if r.algorithm == "grpo"]
        if not es_runs:
            self.skip("ES drift (Figures 6, 9-11)", "no ES run")
        grpo_series: dict[Path, Any] = {}
        for g in grpo_runs:
            if g.drift_log is None:
                self.skip(f"GRPO drift ({self.rel_run(g)})", "the run has no drift.jsonl")
                continue
            numel = None
            base = _base_folder(g, self.root)
            if base is not None:
                shapes = CheckpointSource(base).shapes()
                numel = {k: int(math.prod(v)) for k, v in shapes.items()}
            grpo_series[g.path] = D.read_series(g.drift_log, numel)
        partner = {p.es.runs[i].path: p.grpo.runs[i] for p in self.pairs
                   for i in range(min(len(p.es.runs), len(p.grpo.runs)))}
        out: dict[str, Any] = {}
        for r in es_runs:
            name = self.rel_run(r)
            if r.seed_log is None:
                self.skip(f"ES drift ({name})", "no seeds.jsonl to replay")
                continue
            alpha, n = r.hyper("alpha"), r.hyper("population_size")
            if alpha is None or n is None:
                self.skip(f"ES drift ({name})", "config.yaml lacks alpha or population_size")
                continue
            params = {"seeds": _fingerprint([r.seed_log]), "config": r.config.get("model")}
            cache_path = self.out / "data" / f"drift_{_slug(str(r.path))[-60:]}.jsonl"
            key = json.dumps(params, default=str)
            meta = cache_path.with_suffix(".params")
            cached = cache_path.exists() and meta.exists() and meta.read_text() == key and not self.config.recompute
            if cached:
                series = D.read_series(cache_path)
            else:
                self.log(f"replaying {name} (one noise regeneration per member per step)")
                model = None
                if self.config.device:
                    from esft.models import load_model

                    model, _ = load_model(r.model, dtype=r.config.get("dtype"), device=self.config.device)
                series = D.es_series(r.path, model=model, progress=self.progress)
                series.write(cache_path)
                meta.write_text(key)
                del model
            res = D.analyze_series(series, float(alpha), int(n))
            g = partner.get(r.path)
            gs = grpo_series.get(g.path) if g is not None else None
            if gs is None and len(grpo_series) == 1 and not self.pairs:
                gs = next(iter(grpo_series.values()))
            if gs is not None:
                res["grpo"] = {"steps": gs.steps[-1] if gs.steps else None,
                               "final_sq": gs.total[-1] if gs.total else None,
                               "ratio_at_matched_step": D.displacement_ratio(series, gs)}
                if gs.per_tensor:
                    res["grpo"]["fit"] = {k: v for k, v in D.analyze_series(gs, float(alpha), int(n)).items()
                                          if k in ("total", "families", "kinds")}
            out[name] = {k: v for k, v in res.items() if k != "tensors"}
            out[name]["tensors"] = res["tensors"]
            s.append(self._drift_text(name, r, series, res, gs))
            figs = {"total": self.fig(f"drift_total_{_slug(name)}"), "families": self.fig(f"drift_families_{_slug(name)}"),
                    "curves": self.fig(f"drift_tensors_{_slug(name)}"), "rho_r2": self.fig(f"drift_rho_r2_{_slug(name)}")}
            a_, n_ = float(alpha), int(n)
            self.plot(cached, figs["total"], lambda: D.plot_total(series, a_, n_, figs["total"], grpo=gs, title=name))
            if res["tensors"]:
                self.plot(cached, figs["families"], lambda: D.plot_families(res, figs["families"]))
                self.plot(cached, figs["curves"], lambda: D.plot_tensor_curves(series, res, a_, n_, figs["curves"]))
                self.plot(cached, figs["rho_r2"], lambda: D.plot_rho_r2(res, figs["rho_r2"]))
                s.append(f"![total drift (Figure 9 / 6A)]({self.rel(figs['total'])})\n"
                         f"![rho and R^2 per family (Figure 10)]({self.rel(figs['families'])})\n"
                         f"![per-tensor drift (Figure 11)]({self.rel(figs['curves'])})\n"
                         f"![rho vs R^2 (Figure 6C)]({self.rel(figs['rho_r2'])})\n")
            else:
                s.append(f"![total drift (Figure 9 / 6A)]({self.rel(figs['total'])})\n")
        for g in grpo_runs:
            if g.path in grpo_series and g.path not in partner.values() and not es_runs:
                gs = grpo_series[g.path]
                s.append(f"### GRPO {self.rel_run(g)}\n\n{len(gs.steps)} steps, final ||dtheta||^2 = "
                         f"{_fmt(gs.total[-1]) if gs.total else 'n/a'} (no ES run to compare with).\n")
        self.results["drift"] = out
        self.sections.append("\n".join(s) + "\n")

    def _drift_text(self, name: str, r: Run, series, res: dict[str, Any], gs) -> str:
        t = res.get("total", {})
        notes = []
        if r.config.get("optimizer", "sgd") != "sgd":
            notes.append("the run used Adam: the random-walk law does not apply to its steps")
        if r.config.get("antithetic"):
            notes.append("antithetic sampling: members are not independent, the law's N differs")
        if r.config.get("fitness_shaping", "zscore") != "zscore":
            notes.append(f"fitness shaping {r.config.get('fitness_shaping')}: sum z^2 != N, compare with the "
                         "logged expectation instead")
        zero = sum(1 for m in r.metrics if m.get("kind") == "train" and m.get("zero_update"))
        if zero:
            notes.append(f"{zero} steps had zero fitness spread and made no update")
        rows = [["steps T", res["steps"]], ["d (perturbed parameters)", res.get("num_params")],
                ["alpha / N", f"{res['alpha']:g} / {res['population']}"],
                ["final ||dtheta||^2", t.get("final_sq")], ["predicted alpha^2 T d / N", t.get("predicted_final_sq")],
                ["measured / predicted", t.get("final_ratio")],
                ["R^2 of the theory line (no fitted parameter)", _r2(t.get("r2_theory"))],
                ["R^2 vs expectation from the logged coefficients", _r2(res.get("r2_logged_expectation"))],
                ["measured / that expectation (steps that moved)", res.get("final_over_logged_expectation")],
                ["free fit through origin: rho = d_eff / d", t.get("rho")], ["free fit R^2", _r2(t.get("r2_fit"))]]
        if gs is not None and res.get("grpo"):
            ratio = res["grpo"].get("ratio_at_matched_step") or {}
            rows.append(["GRPO final ||dtheta||^2", res["grpo"].get("final_sq")])
            rows.append([f"ES/GRPO displacement at matched step {ratio.get('step', '?')}", ratio.get("ratio")])
        fam_rows = []
        for fam, v in res["families"].items():
            fam_rows.append([fam, v["n"], v["numel"], _iqr(v["rho"]), _iqr(v["r2_fit"]), _fmt(v["r2_theory"]["median"])])
        out = [f"### ES {name}\n", table(["quantity", "value"], rows)]
        if notes:
            out.append("\nNotes: " + "; ".join(notes) + ".")
        if fam_rows:
            out.append("\nPer family (median [IQR] over tensors; paper: matrices rho ~ 1, R^2 ~ 1; norms scatter):\n\n"
                       + table(["family", "tensors", "entries each", "rho", "R^2 (fit)", "R^2 (theory) median"],
                               fam_rows))
        if gs is not None and res.get("grpo", {}).get("fit", {}).get("families"):
            g_rows = [[fam, v["n"], _iqr(v["rho"]), _iqr(v["r2_fit"])]
                      for fam, v in res["grpo"]["fit"]["families"].items()]
            out.append("\nGRPO with the same scaling (rho in units of the ES law; no law is expected):\n\n"
                       + table(["family", "tensors", "rho", "R^2 (fit)"], g_rows))
        return "\n".join(out) + "\n"

    # KL: Figure 2, Tables 11-16 -----------------------------------------------------------------------------------------
    def section_kl(self) -> None:
        from esft.analysis import kl as K

        s = ["## KL(pi_after || pi_before) on test prompts (paper Figure 2, Tables 11-16)\n",
             "Completions generated greedily by pi_after and scored token-aligned by both models. Headline "
             "estimator: k3 per-token mean; k1 and the exact next-token KL are in the JSON (the study does not "
             "say which estimator its tables use). Incremental: stage t vs t-1; cumulative: stage t vs base.\n"]
        chains = [c for c in self.chains if c.base is not None and all(st.checkpoint is not None for st in c.stages)]
        for c in self.chains:
            if c not in chains:
                self.skip(f"KL ({c.label})", "base model not on disk or a stage without checkpoint")
        if not chains:
            self.skip("KL", "no chain with a base model folder and checkpoints")
            return
        # seeds of the same method, track (e.g. es@100 vs es@300) and task sequence are aggregated together
        tables: dict[tuple[str, str, tuple[str, ...]], list[dict[str, Any]]] = {}
        all_cached = True
        opts = self.task_options()
        for c in chains:
            tasks = list(dict.fromkeys(c.tasks))
            gc = self.gen_config(c)
            stages = c.checkpoints()
            params = {"base": _fingerprint([c.base]), "stages": [(l, _fingerprint([p])) for l, p in stages],
                      "tasks": tasks, "limit": self.config.limit, "max_new_tokens": gc.max_new_tokens,
                      "options": opts}

            def compute(c=c, stages=stages, tasks=tasks, gc=gc):
                return K.kl_stages(c.base, stages, tasks, self.config.limit, gc, self.config.kl_batch_size, opts,
                                   loader=lambda spec: self.load(c.base, Path(spec)), progress=self.progress)

            res, cached = self.cache.get(f"kl_{_slug(c.label)}", params, compute)
            all_cached = all_cached and cached
            tables.setdefault((c.algorithm, c.name or c.algorithm, tuple(c.tasks)), []).append(res)
        est = "k3_token_mean"
        panels = {}
        out = {}
        for (algo, track, tasks), tbs in tables.items():
            agg = K.aggregate_seeds(tbs, est)
            out[f"{track} {'->'.join(tasks)}"] = {"seeds": tbs, "aggregate": agg}
            n = len(tbs)
            s.append(f"### {track.upper()} {'->'.join(tasks)} ({n} seed{'s' if n != 1 else ''})\n")
            for kind in ("incremental", "cumulative"):
                head = ["eval task"] + [f"after {st}" for st in agg["stages"]]
                rows = []
                for t in agg["tasks"]:
                    row = [t]
                    for j, st in enumerate(agg["stages"]):
                        cell = agg[kind][t][st]
                        trained = st.split(":", 1)[-1]
                        ref = _paper_kl(algo, kind, t, trained)
                        val = (f"{_fmt(cell['median'])} [{_fmt(cell['min'])}, {_fmt(cell['max'])}]" if n > 1
                               else _fmt(cell["median"]))
                        row.append(val + (f" (paper {ref})" if ref else ""))
                    rows.append(row)
                s.append(f"**{kind}** ({'median [min, max] over seeds' if n > 1 else 'one seed'})\n\n"
                         + table(head, rows) + "\n")
            s.append("Paper values are the study's cell for the same evaluation task after training the same task "
                     "in its sequence (Countdown -> Math -> Chemistry -> BoolQ, Qwen3-4B), whatever stage that is "
                     "here; the study gives no per-cell values for ES's incremental KL (Table 11).\n")
            m = K.matrix(agg, "incremental", stat="median")
            panels[f"{track.upper()} {'->'.join(tasks)}" if len(tables) > 2 else track.upper()] = (
                m, agg["tasks"], agg["stages"])
        if panels:
            fig = self.plot(all_cached, self.fig("kl_heatmap"), lambda: K.plot_heatmap(
                panels, self.fig("kl_heatmap"), title=f"incremental KL ({est}, median over seeds)"))
            s.append(f"![incremental KL heatmap (Figure 2)]({self.rel(fig)})\n")
        if len(self.chains) and all(len(c.runs) == 1 for c in self.chains):
            self.skip("KL across stages (Figure 2's columns, Tables 13-16's rows)",
                      "single-stage runs only: incremental and cumulative KL coincide")
        self.results["kl"] = out
        self.sections.append("\n".join(s) + "\n")

    # landscape: Figures 3, 4, 5 -----------------------------------------------------------------------------------------
    def section_landscape(self) -> None:
        from esft.analysis import landscape as L

        s = ["## Loss landscape along straight lines (paper Figures 3, 4, 5)\n"]
        opts = self.task_options()
        out: dict[str, Any] = {}
        items: list[tuple[Chain, Chain | None]] = [(p.es, p.grpo) for p in self.pairs[:1]]
        if not items:
            cands = [c for c in self.chains if c.base is not None and c.stages[-1].checkpoint is not None]
            items = [(cands[0], None)] if cands else []
            self.skip("interpolation ES <-> GRPO (Figure 3)", "needs an ES and a GRPO run from the same base on the "
                      "same tasks")
        if len(self.pairs) > 1:
            s.append(f"(Computed for the first of {len(self.pairs)} pairs: {self.pairs[0].label}.)\n")
        if not items:
            self.skip("landscape (Figures 3-5)", "no run with a base model folder and a final checkpoint")
            return
        a, b = items[0]
        if a.base is None:
            self.skip("landscape", f"base model {a.base_spec!r} is not on disk")
            return
        gc = self.gen_config(a)
        tasks = list(dict.fromkeys(a.tasks))
        n = self.config.limit
        fa, fb = a.stages[-1].checkpoint, (b.stages[-1].checkpoint if b is not None else None)
        la, lb = a.algorithm, (b.algorithm if b is not None else None)
        common = {"base": _fingerprint([a.base]), "a": _fingerprint([fa]), "b": _fingerprint([fb]), "limit": n,
                  "max_new_tokens": gc.max_new_tokens, "options": opts}
        model, tok = None, None

        def ensure_model():
            nonlocal model, tok
            if model is None:
                model, tok = self.load(a.base)
            return model, tok

        # Figure 3
        if b is not None:
            ts = [i / (self.config.interpolation_points - 1) for i in range(self.config.interpolation_points)]

            def interp():
                m, t = ensure_model()
                return L.interpolation_path(m, t, fa, fb, ts, L.prepare_tasks(tasks, n, task_options=opts), gc,
                                            progress=self.progress)

            res, cached = self.cache.get("landscape_interpolation", {**common, "ts": ts, "tasks": tasks}, interp)
            out["interpolation"] = res
            fig = self.plot(cached, self.fig("landscape_interpolation"), lambda: L.plot_interpolation(
                res, self.fig("landscape_interpolation"), labels=(la.upper(), lb.upper())))
            rows = [[t, _pct(res["accuracy"][t][0]), _pct(res["accuracy"][t][-1]), _pct(res["barrier"][t]["min_accuracy"]),
                     f"{res['barrier'][t]['max_drop']:+.3f} at t={res['barrier'][t]['at']:.2f}",
                     _fmt(res["barrier"][t]["se"]), "yes" if res["barrier"][t]["barrier"] else "no"]
                    for t in tasks]
            s.append(f"### Figure 3: {la.upper()} (t=0) to {lb.upper()} (t=1), distance {_fmt(res['distance'])}\n\n" + table(
                ["task", f"{la.upper()} acc", f"{lb.upper()} acc", "min on path", "largest drop below the line",
                 "binomial SE", "barrier (> 2 SE)"], rows)
                + f"\n\nPaper: {paper.LANDSCAPE['interpolation']}.\n\n![interpolation]({self.rel(fig)})\n")
        # Figure 4
        def sweep():
            m, t = ensure_model()
            dirs = [L.DeltaDirection(a.base, fa, la.upper())]
            if fb is not None:
                dirs.append(L.DeltaDirection(a.base, fb, lb.upper()))
            dirs.append(L.RandomDirection(dirs[0], seed=0, label=f"random (per-tensor norms of {la.upper()})"))
            for d in dirs:
                d.bind(m)
            mags = L.default_magnitudes([d.norm for d in dirs[:-1]], self.config.magnitude_points)
            return L.direction_sweep(m, t, a.base, dirs, mags, L.prepare_tasks(tasks, n, task_options=opts), gc,
                                     progress=self.progress)

        res, cached = self.cache.get("landscape_directions", {**common, "tasks": tasks,
                                                              "points": self.config.magnitude_points}, sweep)
        out["directions"] = res
        fig = self.plot(cached, self.fig("landscape_directions"), lambda: L.plot_direction_sweep(
            res, self.fig("landscape_directions"), title="from the base model"))
        s.append("### Figure 4: from the base along each update and a norm-matched random direction\n\n"
                 + _sweep_table(res) + f"\n\nPaper: {paper.LANDSCAPE['directions']}.\n\n![directions]({self.rel(fig)})\n")
        # Figure 5
        hold = [t for t in self.config.holdout_tasks if t]
        if hold:
            def holdout():
                m, t = ensure_model()
                results = {}
                prepared = L.prepare_tasks(hold, n, task_options=opts)
                for lab, fin in ((la, fa), (lb, fb)):
                    if fin is None:
                        continue
                    d = L.DeltaDirection(a.base, fin, lab.upper()).bind(m)
                    mags = [0.0] + [f * d.norm for f in (0.25, 0.5, 1.0)]
                    results[lab] = L.direction_sweep(m, t, fin, [d], mags, prepared, gc, progress=self.progress)
                return results

            res5, cached = self.cache.get("landscape_holdout", {**common, "holdout": hold}, holdout)
            out["holdout"] = res5
            for lab, r5 in res5.items():
                fig = self.plot(cached, self.fig(f"landscape_holdout_{lab}"), lambda r5=r5, lab=lab: L.plot_direction_sweep(
                    r5, self.fig(f"landscape_holdout_{lab}"), title=f"holdout tasks from the final {lab.upper()} checkpoint"))
                s.append(f"### Figure 5: holdout tasks, from the final {lab.upper()} checkpoint along its own update\n\n"
                         + _sweep_table(r5) + f"\n\n![holdout {lab}]({self.rel(fig)})\n")
        else:
            self.skip("Figure 5", "no holdout tasks given")
        self.results["landscape"] = out
        self.sections.append("\n".join(s) + "\n")

    # functional sparsity ---------------------------------------------------------------------------------------------------
    def section_sparsity(self) -> None:
        from esft.analysis import landscape as L
        from esft.analysis import sparsity as SP

        s = ["## Functional sparsity (keep |d| > tau, revert the rest, re-evaluate)\n",
             f"Reference: {paper.FUNCTIONAL_SPARSITY}.\n"]
        opts = self.task_options()
        chains = [c for c in self.chains if c.base is not None and c.stages[-1].checkpoint is not None]
        seen: set[tuple] = set()
        todo = []
        for c in chains:  # one per algorithm and task sequence (the first seed)
            key = (c.name or c.algorithm, tuple(c.tasks))
            if key not in seen:
                seen.add(key)
                todo.append(c)
        if not todo:
            self.skip("functional sparsity", "no run with a base model folder and a final checkpoint")
            return
        results = {}
        all_cached = True
        model = tok = None
        for c in todo:
            gc = self.gen_config(c)
            tasks = list(dict.fromkeys(c.tasks))
            fin = c.stages[-1].checkpoint
            params = {"base": _fingerprint([c.base]), "tuned": _fingerprint([fin]), "limit": self.config.limit,
                      "max_new_tokens": gc.max_new_tokens, "targets": self.config.sparsity_targets, "options": opts}

            def compute(c=c, fin=fin, gc=gc, tasks=tasks):
                nonlocal model, tok
                if model is None:
                    model, tok = self.load(c.base)
                return SP.sparsity_sweep(model, tok, c.base, fin, L.prepare_tasks(tasks, self.config.limit,
                                                                                  task_options=opts), gc,
                                         targets=self.config.sparsity_targets, progress=self.progress)

            res, cached = self.cache.get(f"sparsity_{_slug(c.label)}", params, compute)
            all_cached = all_cached and cached
            label = c.name or c.algorithm
            results[label if label not in results else c.label] = res
            rows = [[_fmt(r["tau"]), _pct(r["sparsity"])] + [_pct(r["accuracy"][t]) for t in tasks] for r in res["rows"]]
            rows.append(["base (all reverted)", "100%"] + [_pct(res["base_accuracy"][t]) for t in tasks])
            s.append(f"### {c.label}\n\n" + table(["tau", "sparsity"] + [f"{t} acc" for t in tasks], rows) + "\n")
        fig = self.plot(all_cached, self.fig("functional_sparsity"),
                        lambda: SP.plot_sparsity_sweep(results, self.fig("functional_sparsity")))
        s.append(f"![functional sparsity]({self.rel(fig)})\n")
        self.results["sparsity"] = results
        self.sections.append("\n".join(s) + "\n")


D_PAPER = paper.DRIFT["matrices"] + "; " + paper.DRIFT["norms"] + "."


def _load_model_only(base: Path, dtype: str, device: str | None):
    from transformers import AutoModelForCausalLM

    from esft.models import default_device, parse_dtype

    device = device or default_device()
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=parse_dtype(dtype, device))
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


def _steps(r: Run) -> int | None:
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


def _r2(x: float | None) -> str:
    # R^2 near 1 is the point (the paper resolves the top 2e-4 of its range): keep six decimals
    return "n/a" if x is None else f"{x:.6f}"


def _iqr(q: dict[str, Any]) -> str:
    if not q or q.get("median") is None:
        return "n/a"
    return f"{_fmt(q['median'])} [{_fmt(q['q1'])}, {_fmt(q['q3'])}]"


def _precision(r: Run) -> str:
    info = r.config.get("_run") or {}
    dt = info.get("param_dtypes") or r.config.get("dtype") or r.config.get("torch_dtype")
    master = info.get("master_dtype") or r.config.get("master_dtype")
    parts = []
    if info.get("precision"):
        parts.append(str(info["precision"]))
    if dt:
        parts.append(f"weights {dt if isinstance(dt, str) else ','.join(dt)}")
    if master:
        parts.append(f"masters {master}")
    return "; ".join(parts) or "not recorded"


def _base_folder(r: Run, root: Path) -> Path | None:
    from esft.analysis.runs import resolve_model

    return resolve_model(r.model, r, root)


def _paper_kl(algo: str, kind: str, task: str, trained: str) -> str | None:
    """The study's value for KL on `task` after training `trained` (its stage index in the paper's sequence)."""
    if trained not in paper.STAGE_TASKS or task not in paper.STAGE_TASKS:
        return None
    k, j = paper.STAGE_TASKS.index(trained), paper.STAGE_TASKS.index(task)
    if kind == "incremental" and algo == "grpo":
        med, lo, hi = paper.TABLE12_GRPO_INCREMENTAL[task][k]
        return f"{med} [{lo}, {hi}]"
    if kind == "cumulative" or k == 0:  # after the first stage incremental == cumulative
        tab = paper.TABLE13_ES_CUMULATIVE if algo == "es" else paper.TABLE14_GRPO_CUMULATIVE
        mean, sd = tab[k][j]
        return f"{mean} +- {sd}"
    return None


def _sweep_table(res: dict[str, Any]) -> str:
    mags = res["magnitudes"]
    tasks = list(next(iter(res["directions"].values()))["accuracy"]) if res["directions"] else []
    rows = []
    for label, d in res["directions"].items():
        for t in tasks:
            rows.append([label, _fmt(d["norm"]), t] + [_pct(v) for v in d["accuracy"][t]])
    return table(["direction", "its norm", "task"] + [f"|d|={_fmt(m, 3)}" for m in mags], rows)


def plot_weights(rep: dict[str, Any], path: Path) -> Path:
    """Per-layer update norm and stable rank of each matrix family, one shade per family and update (ES blues,
    GRPO reds)."""
    from matplotlib.ticker import MaxNLocator

    from esft.analysis.plots import pyplot, save

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    fams = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    maps = {"es": "Blues", "grpo": "Reds"}
    for j, lab in enumerate(rep["labels"]):
        cmap = plt.get_cmap(maps.get(lab.split("_")[0], ["Greens", "Purples", "Oranges"][j % 3]))
        for k, fam in enumerate(fams):
            rows = sorted((r for r in rep["tensors"] if r["role"] == fam and r["layer"] is not None),
                          key=lambda r: r["layer"])
            if not rows:
                continue
            layers = [r["layer"] for r in rows]
            kw = dict(color=cmap(0.35 + 0.65 * k / (len(fams) - 1)), lw=1.2, marker=".", ms=3)
            axes[0].plot(layers, [math.sqrt(r[lab]["sq"]) for r in rows], label=f"{lab} {fam}", **kw)
            sr = [r[lab]["stable_rank"] for r in rows]
            if any(v is not None for v in sr):
                axes[1].plot(layers, [v if v is not None else float("nan") for v in sr], **kw)
    axes[0].set_yscale("log")
    axes[0].set_ylabel(r"$\|\Delta W\|_F$")
    axes[1].set_ylabel("stable rank")
    for ax in axes:
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].legend(fontsize=5, ncol=2)
    return save(fig, path)


def build_report(config: ReportConfig, progress: bool = True) -> Path:
    """Write report.md (and JSON, figures) for the runs under config.dir; returns the report's path."""
    return Report(config, progress).build()
