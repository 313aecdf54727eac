"""Summaries and the learning-curve figure of an ES or GRPO run, read from its run directory only.

    from esft.es.curve import summarize, plot_run
    summarize("runs/es-demo")                 # seconds/iteration, time split, peak RSS, first/last evaluation
    plot_run("runs/es-demo", "curve.png")     # train fitness (mean, min-max band) and held-out accuracy (95% CI)

Held-out accuracy is shown beside the constant-answer baseline of the same held-out examples (always giving their
most frequent gold answer, with its 95% Wilson interval; under a reward function, the best of the most frequent
gold answers, with its scores' interval; `heldout_constant_baseline`): a curve that climbs only to that band has
learned the answer prior, not the task. A reward on another scale than [0, 1] (a custom
`module:function` reward) is shown as a held-out mean reward, without that baseline (`esft.tasks.labels.score_name`).

The figure's title names the run from its config.yaml (`run_title`): algorithm and variant, task, model, and an ES
run's population N and sigma; the train panel names the fitness its rule computes (a DART-ES fitness is a
difficulty-weighted score up to ~1.9, not an accuracy).
"""

from __future__ import annotations

from pathlib import Path, PurePath
from typing import Any

import numpy as np
import yaml

from esft import rundir
from esft.config import passage_cut
from esft.evaluation import load_examples
from esft.figure_marks import constant_line
from esft.passk_figure import METHOD_COLORS
from esft.saved_config import saved_algorithm
from esft.tasks.display import shown_task
from esft.tasks.labels import ACCURACY, summaries_score_name


def _split(run_dir: str | Path) -> tuple[list[dict], list[dict]]:
    metrics = rundir.read_jsonl(Path(run_dir) / "metrics.jsonl")
    return [m for m in metrics if m.get("kind") == "train"], [m for m in metrics if m.get("kind") == "eval"]


def heldout_constant_baseline(run_dir: str | Path) -> dict[str, Any] | None:
    """`constant_baseline`, `constant_baseline_ci95`, `constant_answer` of the run's held-out examples, or None.

    Taken from the evaluations when they recorded it (`test_constant_baseline`), else recomputed from
    config.yaml: the first `eval_limit` test examples of the task (with its options), which is what the trainer
    evaluated. None when the task has no gold answers (IFEval), cannot be built or loaded here, or the recomputed
    count differs from the logged `test_n` (then they were not the same examples). None too when the evaluations
    were on different held-out sets (`eval_limit` or `eval_balanced` changed on resume): each evaluation's own
    baseline is then in its record; and None for a mean reward (`summaries_score_name`)."""
    from esft.tasks import get_task

    _, evals = _split(run_dir)
    ev = [e for e in evals if "test_n" in e]
    if heldout_set_changed(ev) or summaries_score_name(ev) != ACCURACY:  # no share of examples beside a mean reward
        return None
    for e in ev:
        if e.get("test_constant_baseline") is not None:
            return {"constant_baseline": e["test_constant_baseline"],
                    "constant_baseline_ci95": e.get("test_constant_baseline_ci95"),
                    "constant_answer": e.get("test_constant_answer")}
    cfg = _run_config(run_dir)
    if not ev or cfg is None or _sample_scores_name(Path(run_dir), ev) != ACCURACY:
        return None
    if not cfg.get("task") or not cfg.get("eval_limit"):
        return None
    options = {**passage_cut(cfg["task"], cfg.get("max_passage_chars")), **(cfg.get("task_options") or {})}
    try:
        task = get_task(cfg["task"], **options)
        examples = load_examples(task, "test", int(cfg["eval_limit"]), bool(cfg.get("eval_balanced")))
    except (ValueError, TypeError, RuntimeError, OSError):  # e.g. a hub dataset that cannot be reached here
        return None
    if len(examples) != ev[0]["test_n"]:
        return None
    # the task's own baseline, as the trainer records it (a reward task's is the best constant answer under its
    # reward, esft.tasks.labels.best_constant_answer, not the most frequent gold answer's share; a reward that
    # raises on another row's gold answer gives none, with a warning: DatasetTask.constant_baseline)
    return task.constant_baseline([{"index": i, "example": x} for i, x in enumerate(examples)]) or None


def _sample_scores_name(run_dir: Path, evals: list[dict]) -> str:
    """`score_name` of the evaluations' own scores where their sample files (`samples/eval_<step>.jsonl`) are kept:
    one score of 1.05 among 0s and 1s leaves a mean and interval inside [0, 1], but makes a mean reward."""
    from esft.tasks.labels import score_name

    scores = []
    for e in evals:
        rows = rundir.read_jsonl(run_dir / "samples" / f"eval_{int(e['step']):06d}.jsonl")
        scores += [float(r["score"]) for r in rows if isinstance(r.get("score"), (int, float))]
    return score_name(scores)


def heldout_set_changed(evals: list[dict]) -> bool:
    """Whether a run's held-out evaluations were not all on the same examples: their counts, or the constant
    baselines they recorded, differ. Resuming may change `eval_limit` and `eval_balanced`."""
    recorded = {(e["test_constant_baseline"], e.get("test_constant_answer")) for e in evals
                if e.get("test_constant_baseline") is not None}
    return len({e["test_n"] for e in evals if "test_n" in e}) > 1 or len(recorded) > 1


def _run_config(run_dir: str | Path) -> dict[str, Any] | None:
    """The mapping of the run's config.yaml, or None when it is missing, unreadable or not a mapping: the figure
    and summary of such a run are still drawn from metrics.jsonl."""
    try:
        data = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


#: per ES `fitness_rule` (esft.es.fitness.FITNESS_RULES): (variant in the title, legend name, y-axis label)
FITNESS_NAMES = {
    "mean": ("", "fitness mean", "fitness (mean reward)"),
    "dart": ("DART-ES", "DART-ES fitness mean (difficulty-weighted)", "DART-ES weighted fitness"),
    "balanced": ("class-balanced fitness", "class-balanced fitness mean", "class-balanced fitness"),
}


def _short_name(value: Any) -> str:
    """A model path by its last part (a checkpoint with its run folder: `es/checkpoints/final`; an experiment
    stage's, whose run folders are all `run`, with its stage folder too: `1-countdown/run/checkpoints/final`), a hub
    id by its name; a registered name as it is."""
    text = str(value)
    if "/" not in text or ":" in text:
        return text
    parts = PurePath(text).parts
    if len(parts) < 3 or parts[-2] != "checkpoints":
        return parts[-1]
    return "/".join(parts[-4:] if parts[-3] == "run" else parts[-3:])


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def run_title(cfg: dict[str, Any], es: bool = True) -> str:
    """`ES (DART-ES, low-rank noise rank 4) | task boolq | model smollm2-135m | N=8, sigma=0.003` from a run's
    config.yaml mapping; `es` (from the metrics) decides the algorithm when the config shows neither."""
    algorithm = saved_algorithm(cfg) or ("es" if es else "grpo")
    if algorithm == "es":
        rule = cfg.get("fitness_rule") or "mean"
        variant = [FITNESS_NAMES[rule][0] if rule in FITNESS_NAMES else f"fitness_rule {rule}"]
        if cfg.get("noise") == "lowrank":
            variant.append(f"low-rank noise rank {cfg.get('rank', 1)}")
        variant = [v for v in variant if v]
        head = f"ES ({', '.join(variant)})" if variant else "ES"
    else:
        head = "GRPO (class-balanced reward)" if cfg.get("class_balanced") else "GRPO"
    parts = [head]
    if cfg.get("task") is not None:
        parts.append(f"task {shown_task(cfg['task'])}")
    if cfg.get("model") is not None:
        parts.append(f"model {_short_name(cfg['model'])}")
    if algorithm == "es":
        sizes = [f"{name}={_number(cfg[key])}" for name, key in (("N", "population_size"), ("sigma", "sigma"))
                 if cfg.get(key) is not None]
        parts += [", ".join(sizes)] if sizes else []
    return " | ".join(parts)


def _fitness_names(cfg: dict[str, Any] | None, es: bool, key: str) -> tuple[str, str]:
    """(legend name of the train mean, y-axis label) of the score the run's train panel plots."""
    if cfg is None:
        return f"{key} mean", key
    if es:
        rule = cfg.get("fitness_rule") or "mean"
        return FITNESS_NAMES[rule][1:] if rule in FITNESS_NAMES else (f"{rule} fitness mean", f"{rule} fitness")
    if cfg.get("class_balanced"):
        return "class-balanced reward mean", "reward (class-balanced)"
    return "reward mean", "reward"


def _scored(train: list[dict]) -> tuple[bool, str, list[dict]]:
    """(ES run?, "fitness" or a GRPO run's "reward", the train records that carry it as a summary dict): a GRPO
    step that sampled no completion logs no reward."""
    es = not train or "fitness" in train[0]
    key = "fitness" if es else "reward"
    return es, key, [m for m in train if isinstance(m.get(key), dict)]


#: the parts of an ES iteration timed per member: with several lanes (or Ray workers) each is summed over them
MEMBER_PARTS = ("perturb", "generate", "score", "restore")


def wall_fractions(split: dict[str, float], serial: tuple[str, ...] = ("score",)) -> dict[str, float]:
    """Each part of an iteration's time split (seconds) as a share of its wall time `total`. "evaluate" spans the
    member parts, so it is no part itself. Where the member parts run side by side (lanes, Ray workers) their
    seconds are summed and may add up to more than that span: those that ran in parallel are then scaled to the
    span less the `serial` ones (the local executor scores on the calling thread after its lanes; Ray workers
    score their own members: `serial=()`), so the shares stay shares of wall time."""
    total = split.get("total", 0.0) or 1e-9
    parallel = [k for k in MEMBER_PARTS if k in split and k not in serial]
    summed = sum(split[k] for k in parallel)
    span = split.get("evaluate")
    room = None if span is None else span - sum(split.get(k, 0.0) for k in serial if k in MEMBER_PARTS)
    scale = room / summed if room is not None and summed > room > 0 else 1.0
    return {k: v * (scale if k in parallel else 1.0) / total for k, v in split.items()
            if k not in ("total", "evaluate")}


def summarize(run_dir: str | Path) -> dict[str, Any]:
    """Means over logged iterations: seconds per iteration and its split, tokens/s; peak RSS; evaluations.
    The first and last train batch's mean score is `fitness_mean_*` in an ES run, `reward_mean_*` in GRPO's."""
    train, evals = _split(run_dir)
    out: dict[str, Any] = {"iterations": len(train), "evaluations": len(evals)}
    if train:
        es, key, scored = _scored(train)
        keys = sorted({k for m in train for k in m["time"]})
        split = {k: float(np.mean([m["time"].get(k, 0.0) for m in train])) for k in keys}
        out.update({
            "seconds_per_iteration": split.get("total"),
            "time_split_s": split,
            "time_split_fraction": wall_fractions(split, () if (_run_config(run_dir) or {}).get("executor") == "ray"
                                                  else ("score",)),
            "generated_tokens_per_s": float(np.mean([m["generated_tokens_per_s"] for m in train])),
            f"{key}_mean_first": scored[0][key]["mean"] if scored else None,
            f"{key}_mean_last": scored[-1][key]["mean"] if scored else None,
            "format_rate_first": scored[0].get("format_rate") if scored else None,
            "format_rate_last": scored[-1].get("format_rate") if scored else None,
        })
        if es:  # only ES logs `zero_update`; a GRPO step's weights can stay put without it saying so
            out["zero_updates"] = sum(bool(m.get("zero_update")) for m in train)
    rss = [m["peak_rss_mb"] for m in train + evals if "peak_rss_mb" in m]
    if rss:
        out["peak_rss_mb"] = max(rss)
    if evals:
        keep = ("step", "test_n", "test_accuracy", "test_ci95", "test_format_rate",
                "test_accuracy_among_well_formed", "train_reward", "test_constant_baseline",
                "test_constant_baseline_ci95", "test_constant_answer")
        out["eval_first"] = {k: evals[0].get(k) for k in keep}
        out["eval_last"] = {k: evals[-1].get(k) for k in keep}
        constant = heldout_constant_baseline(run_dir)
        if constant:
            out["heldout_constant_baseline"] = constant
    return out


def accuracy_axis(ax: Any, label: str = "accuracy") -> None:
    """Hold an accuracy axis to [0, 1]: autoscaled, a flat curve (0.50 to 0.51) would fill the panel and read as
    large swings. A custom reward may score outside [0, 1] (a -1 penalty, a bonus above 1): the axis then widens
    to the data, since the lines are drawn unclipped (markers on 0 or 1 show whole on the frame) and would
    otherwise cross into the next panel."""
    low, high = ax.dataLim.intervaly  # (inf, -inf) before anything is drawn
    low, high = min(0.0, low) if np.isfinite(low) else 0.0, max(1.0, high) if np.isfinite(high) else 1.0
    # a side widened to the data gets a margin: an error bar's cap on the frame hid in its line
    pad = 0.04 * (high - low)
    ax.set_ylim(low - pad if low < 0.0 else low, high + pad if high > 1.0 else high)
    if label:
        ax.set_ylabel(label)
    for line in ax.get_lines():
        line.set_clip_on(False)


def _legend_or_note(ax: Any, note: str) -> None:
    if ax.get_legend_handles_labels()[0]:
        # under the panel: inside it, the legend hid points (a min-max band can fill the whole panel)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    else:
        ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes, color="grey")


def _heldout_panel(ax: Any, ev: list[dict], run_dir: Path, colour: str) -> None:
    """Held-out accuracy with its 95% CI and the constant-answer baseline: one band for one held-out set, or
    each evaluation's own (with its CI) when resuming changed the set, so no point sits beside another set's.
    Scores outside [0, 1] are a mean reward, shown without the baseline (`score_name`)."""
    if not ev:
        return
    name = summaries_score_name(ev)
    steps = [e["step"] for e in ev]
    acc = np.array([e["test_accuracy"] for e in ev])
    lo = acc - np.array([e["test_ci95"][0] for e in ev])
    hi = np.array([e["test_ci95"][1] for e in ev]) - acc
    changed = heldout_set_changed(ev)
    counts = sorted({e["test_n"] for e in ev})
    n = f"n={counts[0]}-{counts[-1]}" if len(counts) > 1 else f"n={counts[0]}"
    ax.errorbar(steps, acc, yerr=[lo, hi], marker="o", capsize=3, color=colour,
                label=f"held-out {name} ({n}{'; set changed on resume' if changed else ''})")
    if all(e.get("test_format_rate") is not None for e in ev):
        ax.plot(steps, [e["test_format_rate"] for e in ev], ls="--", marker="x", color="tab:orange",
                label="held-out format rate")
    if name != ACCURACY:
        return
    if changed:
        own = [e for e in ev if e.get("test_constant_baseline") is not None]
        if own:
            base = np.array([e["test_constant_baseline"] for e in own])
            ci = np.array([e.get("test_constant_baseline_ci95") or (b, b) for e, b in zip(own, base)])
            # 7 points beside its evaluation's point, on any length of run: on it, the grey bar hid the held-out one
            from matplotlib.transforms import offset_copy

            beside = offset_copy(ax.transData, fig=ax.figure, x=7, units="points")
            ax.errorbar([e["step"] for e in own], base, yerr=[base - ci[:, 0], ci[:, 1] - base], fmt="_",
                        color="grey", capsize=3, markersize=12, transform=beside,
                        label="constant answer of each evaluation (95% CI)")
        return
    constant = heldout_constant_baseline(run_dir)
    if constant:
        constant_line(ax, constant["constant_baseline"], constant["constant_baseline_ci95"],
                      label=f"constant answer \"{constant['constant_answer']}\" (95% CI)")


def plot_run(run_dir: str | Path, path: str | Path | None = None) -> Path:
    """`run_figure(run_dir)` written to `<run_dir>/curve.png` by default (esft.api does it at the end of every
    training run), as every esft figure is: cropped to its content, written whole or not at all
    (`esft.passk_figure.save_figure`), so a run stopped while it draws keeps its earlier curve."""
    from esft.passk_figure import save_figure

    run_dir = Path(run_dir)
    return save_figure(run_figure(run_dir), Path(path) if path else run_dir / "curve.png")


def run_figure(run_dir: str | Path) -> Any:
    """Two panels: train fitness per iteration (mean and min-max band, each batch at the number of updates
    applied to the weights that sampled it, as the held-out point of the same weights; a GRPO run's reward per
    step) and held-out accuracy with its 95% CI, beside the held-out examples' constant-answer baseline (band: its
    95% CI) when it is known. The held-out panel's axis is held to [0, 1]: autoscaled, a flat curve (0.50 to
    0.51) would fill the panel and read as large swings. A matplotlib Figure (not registered with pyplot)."""
    # a Figure without pyplot: no backend is switched, no figure of the caller's (a notebook's) is touched
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    run_dir = Path(run_dir)
    train, evals = _split(run_dir)
    fig = Figure(figsize=(10, 4.8))
    ax1, ax2 = fig.subplots(1, 2)
    es, key, train = _scored(train)
    cfg = _run_config(run_dir)
    if cfg is not None and saved_algorithm(cfg):  # the config says which trainer ran, not only the metrics' keys
        es = saved_algorithm(cfg) == "es"
    mean_name, ylabel = _fitness_names(cfg, es, key)
    who = "members" if es else "completions"
    colour = METHOD_COLORS["es" if es else "grpo"]  # the study's colours, as in the report's figures
    if train:
        # a batch sits at the number of updates applied to the weights that sampled it, above the held-out point
        # of the same weights: an ES batch at its `iteration` (step - 1); a GRPO step's completions at the start of
        # their generation round (num_iterations updates per generated batch), which a step-1 ES batch shares
        mu = int((cfg or {}).get("num_iterations") or 1) if not es else 1
        steps = [(m["step"] - 1) - (m["step"] - 1) % mu for m in train]
        ax1.plot(steps, [m[key]["mean"] for m in train], marker="o", color=colour, label=mean_name)
        low, high = [m[key]["min"] for m in train], [m[key]["max"] for m in train]
        if len(steps) > 1:
            ax1.fill_between(steps, low, high, color=colour, alpha=0.25, label=f"min-max over {who}")
        else:  # a band over one step has no width: the range is a bar there
            ax1.errorbar(steps, low, yerr=[[0.0], [high[0] - low[0]]], fmt="none", color=colour, alpha=0.5,
                         capsize=6, lw=6, label=f"min-max over {who}")
        if all(m.get("format_rate") is not None for m in train):  # none for a task that checks no format
            # a line through one step draws nothing: its point is marked
            ax1.plot(steps, [m["format_rate"] for m in train], ls="--", marker="x" if len(steps) == 1 else "",
                     color="tab:orange", label="format rate")
    xlabel = "iteration (updates applied)" if es else "step (updates applied)"
    ax1.set_xlabel(xlabel)
    ax1.set_ylabel(ylabel)
    ax1.set_title("train batch (perturbed members)" if es else "train batch (sampled completions)")
    _legend_or_note(ax1, "no training iteration logged")
    heldout = [e for e in evals if "test_accuracy" in e]
    _heldout_panel(ax2, heldout, run_dir, colour)
    ax2.set_xlabel(xlabel)
    for ax in (ax1, ax2):  # steps are whole numbers: no 1.25 tick on a run of a few steps, nor 0.96 on one step
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    accuracy_axis(ax2, f"held-out {summaries_score_name(heldout)}" if heldout else "")
    ax2.set_title("unperturbed model" if es else "model")
    _legend_or_note(ax2, "no held-out evaluation (eval_every or eval_limit 0)")
    if cfg is not None:
        fig.suptitle(run_title(cfg, es), fontsize=10, wrap=True)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    """python -m esft.es.curve RUN_DIR [PNG]: print the summary as JSON and write the figure."""
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(main.__doc__)
        return 2
    if not (Path(args[0]) / "metrics.jsonl").is_file():  # not a run: no empty figure written into it
        print(f"esft.es.curve: error: {args[0]} is not a run directory (no metrics.jsonl)", file=sys.stderr)
        return 2
    print(json.dumps(summarize(args[0]), indent=2))
    print(f"wrote {plot_run(args[0], args[1] if len(args) > 1 else None)}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
