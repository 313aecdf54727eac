"""The pass@k figure: pass@k against k, one line per model (base, a method's checkpoint, one seed of it) on one task.

    from esft.passk_figure import curve_from_summary, passk_figure, save_figure
    curve = curve_from_summary("GRPO", summary)            # a sampled summary (esft.passk.summarize_samples)
    save_figure(passk_figure([curve], "pass@k on BoolQ"), "passk_boolq.png")

x is k on a log2 axis with a tick at each k evaluated; y is pass@k in %, held to [0, 100] (an autoscaled axis
would make a flat curve fill the panel); each line carries its 95% interval as error bars (several models' points
are spread a little around each k, `dodge`, so equal values stay visible instead of hiding one another); the
constant-answer baseline, where the task has one, is a dotted grey line over its own 95% band: one answer repeated
k times is right for the same questions at every k, so its pass@k is its accuracy, flat in k. A task whose answer
is one of L labels (BoolQ's yes/no, A-D; not a Countdown variant, whose labels are operators) also shows the
chance curve, a dashed grey line: a uniform random guess among the labels is right with probability 1/L on every
question, so its pass@k is 1 - (1 - 1/L)^k (BoolQ: 50, 75, 93.75% at k = 1, 2, 4), and a model's pass@k at large k
above the constant line but not above this curve could be guessing. `esft eval` writes
this figure next to its summary.json when it samples (`esft.evaluation.write_passk_figure`), an experiment next to
its methods table, one per task (`esft.experiments.method_figures`).

The bars are the summary's own `ci95`, the interval the JSON and the tables report: a percentile bootstrap over
questions of the per-question unbiased estimates 1 - C(n-c, k) / C(n, k) (2000 resamples, seeded by the
evaluation's seed; `esft.passk.bootstrap_ci`). Questions are the independent units: the n samples of one question
share its difficulty, so an interval over all Q x n completions (Wilson over samples) would be too narrow; and the
per-question estimates are bounded and skewed (many 0s and 1s), where a normal approximation over them is
symmetric where the truth is not and leaves [0, 100%] with few questions. When every question has the same
estimate (all solved) the bootstrap has nothing to resample and the interval is the Wilson interval of that rate
over the Q questions. The interval covers the draw of questions and of completions; it holds at each k on its own
(the points of one curve share their questions and samples, so they move together). Two models evaluated on the
same questions are paired: their intervals overlapping does not show that they do not differ.

pass@k counts correct samples: a task whose scores are not 0/1 (partial credit, a reward on another scale) has no
pass@k (`esft.passk.not_right_or_wrong`); its curve is left out and the panel says why.
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from esft.figure_marks import constant_line

#: colour of each algorithm (esft.analysis.plots.COLORS: ES blue, GRPO red), the base model black; other methods
#: (a second ES budget, DART-ES) take the next free colour of FALLBACK_COLORS
METHOD_COLORS = {"base": "black", "es": "tab:blue", "grpo": "tab:red", "grpo->es": "tab:purple",
                 "es->grpo": "tab:orange"}
FALLBACK_COLORS = ("tab:green", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:orange", "tab:purple")
#: line style of the i-th seed of one method (the same colour)
SEED_STYLES = ("-", "--", "-.", ":")


@dataclass
class PassKCurve:
    """One line of the figure: pass@k (in [0, 1]) and its 95% interval at each k."""

    label: str
    """legend text"""
    ks: list[int]
    values: list[float]
    lo: list[float]
    hi: list[float]
    method: str = ""
    """colour group: the seeds of one method share a colour (default: the label)"""
    style: str = "-"


@dataclass
class Baseline:
    """The constant-answer baseline of the evaluated questions: its accuracy, 95% interval and answer."""

    value: float
    ci95: tuple[float, float] | None = None
    answer: Any = None


@dataclass
class Chance:
    """pass@k of a uniform random guess among the task's answer labels at each k (esft.passk.chance_pass_at_k)."""

    labels: list[Any]
    ks: list[int]
    values: list[float]


def chance_from_summary(summary: dict[str, Any] | None) -> Chance | None:
    """The chance curve a sampled summary recorded (`chance_pass@k`), None where it has none (open answers, a
    Countdown variant, scores not 0/1, a summary written before esft recorded it)."""
    entry = (summary or {}).get("chance_pass@k")
    if not entry or not entry.get("pass@k"):
        return None
    ks = sorted(entry["pass@k"], key=int)
    return Chance(list(entry.get("labels") or []), [int(k) for k in ks], [float(entry["pass@k"][k]) for k in ks])


def curve_from_summary(label: str, summary: dict[str, Any], method: str = "", style: str = "-"
                       ) -> PassKCurve | None:
    """The curve of a sampled summary's `pass@k` ({"k": {"value", "ci95"}}), None when it has none (scores not
    0/1: `pass@k_note` says why, `skipped_note` reads it)."""
    pk = summary.get("pass@k")
    if not pk:
        return None
    ks = sorted(pk, key=int)
    return PassKCurve(label, [int(k) for k in ks], [float(pk[k]["value"]) for k in ks],
                      [float(pk[k]["ci95"][0]) for k in ks], [float(pk[k]["ci95"][1]) for k in ks],
                      method or label, style)


def skipped_note(summaries: Sequence[tuple[str, dict[str, Any]]]) -> str | None:
    """`GRPO: pass@k needs right/wrong scores ...` for the first (label, summary) without pass@k, else None."""
    for label, summary in summaries:
        if summary.get("pass@k") is None and summary.get("pass@k_note"):
            return f"{label}: {summary['pass@k_note']}"
    return None


def baseline_from_summary(summary: dict[str, Any]) -> Baseline | None:
    """The constant-answer baseline an evaluation summary recorded (esft.evaluation), None where it has none."""
    if summary.get("constant_baseline") is None:
        return None
    ci = summary.get("constant_baseline_ci95")
    return Baseline(float(summary["constant_baseline"]), tuple(ci) if ci else None, summary.get("constant_answer"))


def model_label(model: Any) -> str:
    """A model for a legend: a registered name or hub id (owner/name) as it is, a checkpoint with its run folder
    (`run/checkpoints/final`), another folder by its last two parts."""
    text = str(model).rstrip("/")
    parts = Path(text).parts
    if len(parts) >= 3 and parts[-2] == "checkpoints":
        return "/".join(parts[-3:])
    return "/".join(parts[-2:]) if len(parts) > 2 else text


def method_color(method: str, taken: set[str]) -> str:
    """Colour of `method` (METHOD_COLORS by its name before any " (", e.g. "ES (iter=4)" is ES), or the next
    colour not in `taken` when that one is already used by another method."""
    known = METHOD_COLORS.get(method.split(" (")[0].strip().lower())
    if known and known not in taken:
        return known
    free = [c for c in FALLBACK_COLORS if c not in taken]
    return free[0] if free else FALLBACK_COLORS[len(taken) % len(FALLBACK_COLORS)]


def dodge(index: int, count: int, step: float = 0.045) -> float:
    """Factor on k of the `index`-th of `count` curves: several models' points spread a little around each k (on
    the log2 axis, +- step/2 octave per neighbour) so equal values and their bars stay visible, not drawn over one
    another; one curve sits on k itself."""
    return 2.0 ** (step * (index - (count - 1) / 2)) if count > 1 else 1.0


def _k_axis(ax: Any, ks: Sequence[int]) -> None:
    """log2 x axis with one integer tick per k evaluated, no minor ticks; a lone k gets room around it."""
    from matplotlib.ticker import FixedLocator, NullLocator, StrMethodFormatter

    ax.set_xscale("log", base=2)
    ticks = sorted(set(ks))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:.0f}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(ticks[0] / 2 ** 0.25, ticks[-1] * 2 ** 0.25)
    ax.set_xlabel("k (samples drawn per question; log2 scale)")


def _draw_baseline(ax: Any, baseline: Baseline) -> None:
    answer = str(baseline.answer) if baseline.answer is not None else ""
    answer = answer if len(answer) <= 16 else answer[:16] + "..."
    constant_line(ax, baseline.value, baseline.ci95, scale=100,
                  label=f"constant answer \"{answer}\" (95% CI)" if answer else "constant answer (95% CI)")


def chance_label(chance: Chance) -> str:
    """Legend text of the chance curve: `random guess of 2 labels (yes/no): 1-(1-1/2)^k`."""
    shown = "/".join(str(x) for x in chance.labels)
    shown = f" ({shown})" if chance.labels and len(shown) <= 20 else ""
    count = len(chance.labels)
    return f"random guess of {count} labels{shown}: 1-(1-1/{count})^k"


def _draw_chance(ax: Any, chance: Chance) -> None:
    ax.plot(chance.ks, [100 * v for v in chance.values], color="grey", ls="--", lw=1.2, marker="x", ms=4,
            label=chance_label(chance), clip_on=False)


def passk_figure(curves: Sequence[PassKCurve], title: str, baseline: Baseline | None = None,
                 note: str | None = None, subtitle: str = "", chance: Chance | None = None) -> Any:
    """A matplotlib Figure (not registered with pyplot): the curves with their 95% error bars, the baseline and
    the chance curve (module docstring). Without a curve the panel shows `note` (e.g. why pass@k is n/a) instead of
    an empty axis; a `note` beside curves is printed under the axis."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.6, 4.2))
    ax = fig.subplots()
    colors: dict[str, str] = {}
    for i, curve in enumerate(curves):
        group = curve.method or curve.label
        if group not in colors:
            colors[group] = method_color(group, set(colors.values()))
        x = [k * dodge(i, len(curves)) for k in curve.ks]
        y = [100 * v for v in curve.values]
        low = [v - 100 * lo for v, lo in zip(y, curve.lo)]
        high = [100 * hi - v for v, hi in zip(y, curve.hi)]
        bars = ax.errorbar(x, y, yerr=[low, high], marker="o", ms=4, capsize=3, color=colors[group], ls=curve.style,
                           label=curve.label, clip_on=False)
        for part in bars.lines[1] + bars.lines[2]:  # caps and bars at 0 or 100% show whole on the frame
            part.set_clip_on(False)
    if baseline is not None and curves:
        _draw_baseline(ax, baseline)
    if chance is not None and curves:
        _draw_chance(ax, chance)
    ax.set_ylim(0, 100)
    ax.set_ylabel("pass@k (%)")
    ks = sorted({k for c in curves for k in c.ks})
    if ks:
        _k_axis(ax, ks)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="bars: 95% CI over questions\n"
                  "(bootstrap; Wilson where all score alike)", title_fontsize=7)
        if note:
            fig.text(0.5, 0.005, textwrap.fill(note, 110), ha="center", va="bottom", fontsize=7, color="grey")
    else:
        ax.set_xticks([])
        ax.text(0.5, 0.5, textwrap.fill(note or "no pass@k evaluated", 60), ha="center", va="center",
                transform=ax.transAxes, color="grey", fontsize=9)
    if subtitle:
        ax.set_title(subtitle, fontsize=8)
    fig.suptitle(title, fontsize=10, wrap=True)
    fig.tight_layout(rect=(0, 0.04 if ks and note else 0, 1, 1))
    return fig


def save_figure(fig: Any, path: str | Path) -> Path:
    """Write `fig` as a PNG (110 dpi, as the analyses' figures), creating the folder. Written aside and renamed
    over, so a Ctrl-C or SIGTERM while it is written leaves the earlier figure or none, never a cut PNG (which
    `esft report`, finding its data cached and the file there, would keep and not draw again)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format=path.suffix[1:].lower() or "png")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


__all__ = ["Baseline", "Chance", "PassKCurve", "baseline_from_summary", "chance_from_summary", "chance_label",
           "curve_from_summary", "method_color", "model_label", "passk_figure", "save_figure", "skipped_note",
           "METHOD_COLORS", "SEED_STYLES"]
