"""`esft analyze weights|kl|landscape|drift|sparsity`: one analysis each, writing JSON + PNG to --output-dir.

Each command is a dataclass config (flags via esft.config, like `esft eval`) and a thin function over the
library functions of its module. `esft report DIR` runs all of them over discovered runs
(esft.analysis.report_builder).

    esft analyze weights --base smollm2-135m --tuned runs/es/checkpoints/final,runs/grpo/checkpoints/final
    esft analyze drift --run runs/es --grpo-run runs/grpo
    esft analyze kl --base smollm2-135m --stages runs/es/checkpoints/final --tasks boolq --limit 50
    esft analyze landscape --base smollm2-135m --es runs/es/checkpoints/final --grpo runs/grpo/checkpoints/final
    esft analyze sparsity --base smollm2-135m --tuned runs/es/checkpoints/final --tasks boolq
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from esft import paper
from esft.analysis.checks import check_analysis
from esft.analysis.command_io import (check_previous, generation, load_with_weights, model_folder, task_options_for,
                                      write_json)
from esft.analysis.command_text import (format_drift, format_kl, format_landscape, format_sparsity,
                                         format_weights)
from esft.analysis.sparsity import SWEEP_TARGETS
from esft.analysis.start_model import check_base
from esft.config import ConfigHooks
from esft.tasks import split_task_list


# ---- weights --------------------------------------------------------------------------------------------------------

@dataclass
class WeightsConfig(ConfigHooks):
    """Update norm, sparsity, stable rank and cosine of one or more checkpoints against a base (Tables 3, 4, 20)."""

    base: str = "smollm2-135m"
    """base model: embedded name or HF folder"""
    tuned: list[str] = field(default_factory=list)
    """fine-tuned checkpoint folders (comma-separated); two give cosine and norm ratio"""
    labels: list[str] = field(default_factory=list)
    """names of the tuned checkpoints, in order; default: the algorithm of each one's run (es, grpo; es_2 for a
    second ES run), or es, grpo, tuned2, ... when a checkpoint is not inside a run folder"""
    eps: float = paper.SPARSITY_EPS
    """sparsity threshold |d| <= eps (paper Table 4)"""
    stable_ranks: bool = True
    """compute stable ranks of attention / MLP update matrices (one SVD each)"""
    stable_rank_device: str | None = None
    """device for the spectral norms (e.g. cuda for multi-billion models)"""
    check_base: bool = True
    """refuse a checkpoint whose run records another start model than --base (--no-check-base: compare it anyway)"""
    output_dir: str = "analysis/weights"
    """where weights.json and the figure go"""
    threads: int | None = None
    """torch CPU threads (None = torch's default); 1 is fastest on a busy machine, where idle OpenMP threads spin"""

    def __post_init__(self) -> None:
        check_analysis(self)


def run_weights(cfg: WeightsConfig) -> dict[str, Any]:
    from esft.analysis.weights import compare_updates, plot_weights

    if not cfg.tuned:
        raise ValueError("give at least one --tuned checkpoint")
    given = list(cfg.labels) or run_labels(cfg.tuned) or ["es", "grpo"]
    # a checkpoint past the given labels is named by its place in --tuned (tuned2 is the third)
    labels = given[:len(cfg.tuned)] + [f"tuned{i}" for i in range(len(given), len(cfg.tuned))]
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels must be distinct, got {labels}")
    check_previous(Path(cfg.output_dir), "weights.json", cfg)
    base = model_folder(cfg.base)
    if cfg.check_base:  # equal shapes pass a checkpoint of another base model of the same architecture
        check_base("weights", base, cfg.tuned, cfg.base)
    rep = compare_updates(base, dict(zip(labels, cfg.tuned)), eps=cfg.eps,
                          stable_ranks=cfg.stable_ranks, stable_rank_device=cfg.stable_rank_device, progress=True)
    out = Path(cfg.output_dir)
    rep["config"] = asdict(cfg)
    write_json(out, "weights.json", rep)
    plot_weights(rep, out / "weights.png")
    return rep


def run_labels(tuned: list[str]) -> list[str]:
    """Each checkpoint (RUN/checkpoints/NAME) named by its run's algorithm, a second of one algorithm by its place
    among them (es_2); [] when one is not in a run folder esft recognises. A fixed es, grpo default named the
    second of two ES checkpoints "grpo" and drew it in GRPO's red."""
    from esft.analysis.runs import classify, read_config

    algos = []
    for ck in map(Path, tuned):
        run = ck.parent.parent
        if ck.parent.name != "checkpoints" or not (run / "config.yaml").is_file():
            return []
        algos.append(classify(run, read_config(run / "config.yaml")))
    if "unknown" in algos:
        return []
    return [a if algos[:i].count(a) == 0 else f"{a}_{algos[:i].count(a) + 1}" for i, a in enumerate(algos)]


# ---- drift -----------------------------------------------------------------------------------------------------------

@dataclass
class DriftConfig(ConfigHooks):
    """Squared displacement per step vs alpha^2 T d / N (Figures 6, 9, 10, 11)."""

    run: str = "runs/es"
    """ES run directory (replays seeds.jsonl) or a drift JSONL file"""
    grpo_run: str | None = None
    """GRPO run directory (its drift.jsonl) or file, drawn as the inset / compared at a matched step"""
    alpha: float | None = None
    """ES step size; None = from the run's config.yaml"""
    population: int | None = None
    """ES population N; None = from the run's config.yaml"""
    device: str | None = None
    """device for the replay (must match the run's: CPU and CUDA noise differ); None = the run's"""
    output_dir: str = "analysis/drift"
    """where drift.json, the replayed series and figures go"""
    threads: int | None = None
    """torch CPU threads (None = torch's default); 1 is fastest on a busy machine, where idle OpenMP threads spin"""

    def __post_init__(self) -> None:
        check_analysis(self)


def run_drift(cfg: DriftConfig) -> dict[str, Any]:
    from esft.analysis import drift as D
    from esft.analysis.runs import read_config

    src = Path(cfg.run)  # exists: DriftConfig checked it (esft.analysis.checks)
    grpo_file = Path(cfg.grpo_run) / "drift.jsonl" if cfg.grpo_run and Path(cfg.grpo_run).is_dir() else None
    if grpo_file is not None and not grpo_file.is_file():  # before the replay; read as an empty series otherwise
        raise FileNotFoundError(f"--grpo-run {cfg.grpo_run} has no drift.jsonl (a GRPO run folder records one)")
    out = Path(cfg.output_dir)
    check_previous(out, "drift.json", cfg)
    alpha, n = cfg.alpha, cfg.population
    if src.is_dir():
        conf = read_config(src / "config.yaml") if (src / "config.yaml").exists() else {}
        alpha = alpha if alpha is not None else conf.get("alpha")
        n = n if n is not None else conf.get("population_size")
        if (src / "seeds.jsonl").exists():
            model = None
            if cfg.device:  # the run's dtype, and noise of its device type (esft.es.replay.load_base)
                from esft.es.replay import load_base

                model, _ = load_base(src, device=cfg.device)
            series = D.es_series(src, model=model, progress=True)
            series.write(out / "series.jsonl")
        elif (src / "drift.jsonl").exists():
            series = D.read_series(src / "drift.jsonl")
        else:
            raise FileNotFoundError(f"{src} has neither seeds.jsonl nor drift.jsonl")
    else:
        series = D.read_series(src)
        if not series.steps:  # said first: the alpha and N asked for below would not make it a drift log
            raise ValueError(f"no drift records in {src}: --run takes an ES run folder or a drift JSONL file (a "
                             "run's drift.jsonl, or the series.jsonl of an earlier drift analysis)")
    # a GRPO run's config.yaml: num_generations, or its recorded algorithm; --run may name the run's drift.jsonl
    folder = src if src.is_dir() else src.parent if src.name == "drift.jsonl" else None
    conf = read_config(folder / "config.yaml") if folder and (folder / "config.yaml").is_file() else {}
    is_grpo = folder is not None and (str(conf.get("algorithm", "")).lower() == "grpo" or "num_generations" in conf)
    if alpha is None or n is None:
        if is_grpo:  # no ES law's alpha and N to give
            raise ValueError(f"--run {src} is a GRPO run: give it as --grpo-run beside an ES run as --run, or "
                             "--alpha and --population of the ES law to measure it against")
        raise ValueError("alpha and population are needed (from the run's config.yaml or --alpha/--population)")
    grpo = None
    if cfg.grpo_run:
        grpo = D.read_series(grpo_file or Path(cfg.grpo_run))
    res = D.analyze_series(series, float(alpha), int(n))
    if grpo is not None:
        res["grpo_ratio_at_matched_step"] = D.displacement_ratio(series, grpo)
    res["config"] = asdict(cfg)
    write_json(out, "drift.json", res)
    # a GRPO run measured against the ES law (--alpha, --population) is drawn as GRPO's, not labelled ES
    D.plot_total(series, float(alpha), int(n), out / "drift_total.png", grpo=grpo, method="grpo" if is_grpo else "es")
    if res["tensors"]:
        D.plot_families(res, out / "drift_families.png")
        D.plot_tensor_curves(series, res, float(alpha), int(n), out / "drift_tensors.png")
        D.plot_rho_r2(res, out / "drift_rho_r2.png")
    return res


# ---- KL --------------------------------------------------------------------------------------------------------------

@dataclass
class KLConfig(ConfigHooks):
    """KL(pi_after || pi_before), incremental and cumulative, per stage and task (Figure 2, Tables 11-16)."""

    base: str = "smollm2-135m"
    """base model (stage 0)"""
    stages: list[str] = field(default_factory=list)
    """checkpoint folders of stages 1..S in order (comma-separated)"""
    stage_labels: list[str] = field(default_factory=list)
    """names of the stages (empty: the folders' run names, an experiment stage's folder above its run/)"""
    tasks: list[str] = field(default_factory=lambda: ["boolq"])
    """evaluation tasks (their test prompts)"""
    limit: int = 50
    """test examples per task"""
    max_new_tokens: int = 256
    """completion budget of pi_after"""
    temperature: float = 0.0
    """0 = greedy completions (paper evaluation); 1.0 = samples from pi_after (k1/k3 unbiased)"""
    batch_size: int = 16
    """prompts per generation batch"""
    kl_batch_size: int = 4
    """sequences per scoring batch"""
    max_passage_chars: int | None = None
    """BoolQ passages cut to this many characters (match the training runs)"""
    aggregate: list[str] = field(default_factory=list)
    """instead of computing: kl.json files of several seeds to aggregate (median [min, max], mean +- std)"""
    dtype: str = "auto"
    """model dtype"""
    device: str | None = None
    """device"""
    check_base: bool = True
    """refuse a checkpoint whose run records another start model than --base (--no-check-base: compare it anyway)"""
    output_dir: str = "analysis/kl"
    """where kl.json and the heatmap go"""
    threads: int | None = None
    """torch CPU threads (None = torch's default); 1 is fastest on a busy machine, where idle OpenMP threads spin"""

    def __post_init__(self) -> None:
        # `--tasks countdown:numbers=2,ops=+*` arrives split at every comma: join a task's options again
        self.tasks = split_task_list(self.tasks)
        check_analysis(self)


def run_kl(cfg: KLConfig) -> dict[str, Any]:
    from esft.analysis import kl as K

    out = Path(cfg.output_dir)
    # kl_heatmap.png is the figure of either result: one folder holds a single KL analysis, stages or aggregate
    check_previous(out, "kl.json", cfg)
    check_previous(out, "kl_aggregate.json", cfg)
    if cfg.aggregate:
        tables = [json.loads(Path(p).read_text()) for p in cfg.aggregate]
        tables = [t.get("result", t) for t in tables]
        agg = K.aggregate_seeds(tables)
        agg["config"] = asdict(cfg)
        write_json(out, "kl_aggregate.json", agg)
        K.plot_heatmap({"median": (K.matrix(agg, "incremental", stat="median"), agg["tasks"], agg["stages"])},
                       out / "kl_heatmap.png")
        return agg
    if not cfg.stages:
        raise ValueError("give --stages (checkpoint folders, in order)")
    base = model_folder(cfg.base)
    if cfg.check_base:
        check_base("kl", base, cfg.stages, cfg.base)
    labels = list(cfg.stage_labels) or K.stage_labels(cfg.stages)
    stages = list(zip(labels, cfg.stages))
    res = K.kl_stages(base, stages, cfg.tasks, cfg.limit,
                      generation(cfg.max_new_tokens, cfg.batch_size, cfg.temperature, 1.0), cfg.kl_batch_size,
                      task_options_for(cfg.max_passage_chars),
                      loader=lambda spec: load_with_weights(base, str(spec), cfg.dtype, cfg.device), progress=True)
    res["config"] = asdict(cfg)
    write_json(out, "kl.json", res)
    K.plot_heatmap({"incremental": (K.matrix(res, "incremental"), res["tasks"], res["stages"]),
                    "cumulative": (K.matrix(res, "cumulative"), res["tasks"], res["stages"])}, out / "kl_heatmap.png",
                   title="KL(after || before), k3 per-token mean")
    return res


# ---- landscape -------------------------------------------------------------------------------------------------------

@dataclass
class LandscapeConfig(ConfigHooks):
    """Accuracy along the ES-GRPO path (Figure 3), along update and random directions from the base (Figure 4),
    and on holdout tasks from the final checkpoints (Figure 5)."""

    base: str = "smollm2-135m"
    """base model"""
    es: str | None = None
    """ES checkpoint folder"""
    grpo: str | None = None
    """GRPO checkpoint folder"""
    tasks: list[str] = field(default_factory=lambda: ["boolq"])
    """tasks for Figures 3 and 4"""
    holdout_tasks: list[str] = field(default_factory=list)
    """tasks for Figure 5 (e.g. mmlu,ifeval); empty = skip"""
    limit: int = 50
    """test examples per task"""
    max_new_tokens: int = 256
    """generation budget"""
    batch_size: int = 16
    """prompts per generation batch"""
    interpolation_points: int = 5
    """points on the ES-GRPO path, endpoints included"""
    magnitude_points: int = 4
    """geometric grid points per direction (besides 0 and the update norms)"""
    random_seed: int = 0
    """seed of the random direction"""
    max_passage_chars: int | None = None
    """BoolQ passages cut to this many characters"""
    dtype: str = "auto"
    """model dtype"""
    device: str | None = None
    """device"""
    check_base: bool = True
    """refuse a checkpoint whose run records another start model than --base (--no-check-base: compare it anyway)"""
    output_dir: str = "analysis/landscape"
    """where landscape.json and figures go"""
    threads: int | None = None
    """torch CPU threads (None = torch's default); 1 is fastest on a busy machine, where idle OpenMP threads spin"""

    def __post_init__(self) -> None:
        # `--tasks countdown:numbers=2,ops=+*` arrives split at every comma: join a task's options again
        self.tasks = split_task_list(self.tasks)
        self.holdout_tasks = split_task_list(self.holdout_tasks)
        check_analysis(self)  # interpolation_points >= 2: the path's two endpoints at least


def run_landscape(cfg: LandscapeConfig) -> dict[str, Any]:
    from esft.analysis import landscape as L

    if not (cfg.es or cfg.grpo):
        raise ValueError("give --es and/or --grpo checkpoint folders")
    base = model_folder(cfg.base)
    out = Path(cfg.output_dir)
    check_previous(out, "landscape.json", cfg)
    if cfg.check_base:
        check_base("landscape", base, [cfg.es, cfg.grpo], cfg.base)
    model, tok = load_with_weights(base, None, cfg.dtype, cfg.device)
    gc = generation(cfg.max_new_tokens, cfg.batch_size)
    opts = task_options_for(cfg.max_passage_chars)
    tasks = L.prepare_tasks(cfg.tasks, cfg.limit, task_options=opts)
    res: dict[str, Any] = {"config": asdict(cfg)}
    ends = [(lab, p) for lab, p in (("ES", cfg.es), ("GRPO", cfg.grpo)) if p]
    if cfg.es and cfg.grpo:
        ts = [i / (cfg.interpolation_points - 1) for i in range(cfg.interpolation_points)]
        res["interpolation"] = L.interpolation_path(model, tok, cfg.es, cfg.grpo, ts, tasks, gc, progress=True)
        L.plot_interpolation(res["interpolation"], out / "interpolation.png")
    dirs = {lab: L.DeltaDirection(base, p, lab).bind(model) for lab, p in ends}
    # a zero update (a run that changed no weight) has no direction: it, and a random direction matched to its zero
    # norms, would evaluate the base model at every distance of the sweep under the name of a move
    moved = {lab: d for lab, d in dirs.items() if d.norm > 0}
    mags = L.default_magnitudes([d.norm for d in moved.values()], cfg.magnitude_points)
    swept: list[L.Direction] = list(moved.values())
    for lab in list(moved)[:1]:  # norm-matched tensor by tensor to the first update that moved
        swept.append(L.RandomDirection(moved[lab], cfg.random_seed, f"random (per-tensor norms of {lab})").bind(model))
    res["directions"] = {**L.direction_sweep(model, tok, base, swept, mags, tasks, gc, progress=True),
                         "zero": [lab for lab in dirs if lab not in moved]}
    L.plot_direction_sweep(res["directions"], out / "directions.png", title="from the base model")
    if cfg.holdout_tasks:
        hold = L.prepare_tasks(cfg.holdout_tasks, cfg.limit, task_options=opts)
        res["holdout"] = {}
        for lab, d in moved.items():
            p = dict(ends)[lab]
            mags5 = [0.0] + [f * d.norm for f in L.HOLDOUT_FRACTIONS]
            res["holdout"][lab] = L.direction_sweep(model, tok, p, [d], mags5, hold, gc, progress=True)
            L.plot_direction_sweep(res["holdout"][lab], out / f"holdout_{lab.lower()}.png",
                                   title=f"holdout tasks from the {lab} checkpoint")
    write_json(out, "landscape.json", res)
    return res


# ---- functional sparsity ---------------------------------------------------------------------------------------------

@dataclass
class SparsityConfig(ConfigHooks):
    """Keep only update entries with |d| > tau, revert the rest to the base, re-evaluate (functional sparsity)."""

    base: str = "smollm2-135m"
    """base model"""
    tuned: str = ""
    """fine-tuned checkpoint folder"""
    label: str | None = None
    """name of the update in the figure; None = its run's algorithm (es, grpo), es outside a run folder"""
    tasks: list[str] = field(default_factory=lambda: ["boolq"])
    """evaluation tasks"""
    targets: list[float] = field(default_factory=lambda: list(SWEEP_TARGETS))
    """target sparsities (thresholds chosen from a histogram of |d|)"""
    taus: list[float] = field(default_factory=list)
    """explicit thresholds instead of targets"""
    limit: int = 50
    """test examples per task"""
    max_new_tokens: int = 256
    """generation budget"""
    batch_size: int = 16
    """prompts per generation batch"""
    max_passage_chars: int | None = None
    """BoolQ passages cut to this many characters"""
    dtype: str = "auto"
    """model dtype"""
    device: str | None = None
    """device"""
    check_base: bool = True
    """refuse a checkpoint whose run records another start model than --base (--no-check-base: compare it anyway)"""
    output_dir: str = "analysis/sparsity"
    """where sparsity.json and the figure go"""
    threads: int | None = None
    """torch CPU threads (None = torch's default); 1 is fastest on a busy machine, where idle OpenMP threads spin"""

    def __post_init__(self) -> None:
        # `--tasks countdown:numbers=2,ops=+*` arrives split at every comma: join a task's options again
        self.tasks = split_task_list(self.tasks)
        check_analysis(self)


def run_sparsity(cfg: SparsityConfig) -> dict[str, Any]:
    from esft.analysis import landscape as L
    from esft.analysis import sparsity as SP

    if not cfg.tuned:
        raise ValueError("give --tuned (a checkpoint folder)")
    check_previous(Path(cfg.output_dir), "sparsity.json", cfg)
    base = model_folder(cfg.base)
    if cfg.check_base:
        check_base("sparsity", base, [cfg.tuned], cfg.base)
    model, tok = load_with_weights(base, None, cfg.dtype, cfg.device)
    tasks = L.prepare_tasks(cfg.tasks, cfg.limit, task_options=task_options_for(cfg.max_passage_chars))
    res = SP.sparsity_sweep(model, tok, base, cfg.tuned, tasks, generation(cfg.max_new_tokens, cfg.batch_size),
                            taus=cfg.taus or None, targets=cfg.targets, progress=True)
    res["config"] = asdict(cfg)
    out = Path(cfg.output_dir)
    write_json(out, "sparsity.json", res)
    SP.plot_sparsity_sweep({cfg.label or (run_labels([cfg.tuned]) or ["es"])[0]: res}, out / "sparsity.png")
    return res


COMMANDS = {
    "weights": (WeightsConfig, run_weights, format_weights),
    "drift": (DriftConfig, run_drift, format_drift),
    "kl": (KLConfig, run_kl, format_kl),
    "landscape": (LandscapeConfig, run_landscape, format_landscape),
    "sparsity": (SparsityConfig, run_sparsity, format_sparsity),
}

