"""Accuracy along straight lines in weight space (paper Figures 3, 4 and 5).

* `interpolation_path`: theta(t) = (1 - t) theta_A + t theta_B between two checkpoints (e.g. final ES and final
  GRPO), with the straight line between the endpoint accuracies; a barrier is a drop of the path below that line.
* `direction_sweep`: theta(m) = theta_origin + m u, with u the unit vector of a direction and m an absolute
  distance ||dtheta||_2, for several directions: the ES update (theta_ES - theta_0), the GRPO update, and a random
  direction norm-matched tensor by tensor to a reference update (Figure 4, from the base model). From a later
  checkpoint and on holdout tasks this is Figure 5.

Each result records every task's constant-answer baseline of the same examples (esft.analysis.constant), dotted.

One working model is held in memory; the weights it is set to are computed tensor by tensor in float64 from
checkpoints read lazily from disk (esft.analysis.sources), so no second model is materialised.

The report's section (Figures 3-5 for the first ES-GRPO pair) is esft.analysis.landscape_report.
"""

from __future__ import annotations

import hashlib
import math
import textwrap
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from esft.analysis.barrier import path_barrier, path_score_names
from esft.analysis.constant import KEY, draw_baseline, shown, task_baselines
from esft.figure_marks import bars_label, interval_bars
from esft.analysis.score_text import scores_line
from esft.analysis.sources import TensorSource, as_source
from esft.tasks.labels import ACCURACY

#: Figure 5: distances along a checkpoint's own update, as fractions of its norm (besides 0)
HOLDOUT_FRACTIONS = (0.25, 0.5, 1.0)


# ---- directions in parameter space ------------------------------------------------------------------------------

def _aliases(model: torch.nn.Module) -> dict[str, list[str]]:
    """Parameter name -> every state-dict name of the same tensor (a tied lm_head is stored under one of them)."""
    by_id: dict[int, list[str]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        by_id.setdefault(id(t), []).append(name)
    return {name: by_id.get(id(p), [name]) for name, p in model.named_parameters()}


def _key_for(name: str, aliases: Mapping[str, list[str]], keys: Mapping[str, Any]) -> str | None:
    return next((a for a in aliases.get(name, [name]) if a in keys), None)


class Direction:
    """A vector in parameter space, read one parameter tensor at a time (float64)."""

    label: str = ""

    def bind(self, model: torch.nn.Module) -> "Direction":
        """Resolve parameter names of `model` against the underlying sources (call before tensor/norm)."""
        return self

    def tensor(self, name: str) -> torch.Tensor | None:
        raise NotImplementedError

    def tensor_norms(self) -> dict[str, float]:
        raise NotImplementedError

    @property
    def norm(self) -> float:
        return math.sqrt(sum(v * v for v in self.tensor_norms().values()))


class DeltaDirection(Direction):
    """theta_to - theta_from (e.g. an ES or GRPO update: tuned - base)."""

    def __init__(self, start: Any, end: Any, label: str = "delta"):
        self.start, self.end = as_source(start), as_source(end)
        self.label = label
        self._keys: dict[str, tuple[str, str]] = {}
        self._norms: dict[str, float] | None = None
        self._bound: torch.nn.Module | None = None

    def bind(self, model: torch.nn.Module) -> "DeltaDirection":
        if self._bound is model:
            return self  # already resolved (its per-tensor norms cost a full pass over both checkpoints)
        self._bound = model
        aliases = _aliases(model)
        ks, ke = self.start.shapes(), self.end.shapes()
        self._keys = {}
        for name, p in model.named_parameters():
            a, b = _key_for(name, aliases, ks), _key_for(name, aliases, ke)
            if a is not None and b is not None:
                if not tuple(ks[a]) == tuple(ke[b]) == tuple(p.shape):
                    raise ValueError(f"{name}: shape {tuple(ks[a])} in {self.start.name}, {tuple(ke[b])} in "
                                     f"{self.end.name}, {tuple(p.shape)} in the model")
                self._keys[name] = (a, b)
        if not self._keys:
            raise ValueError(f"no parameter of the model found in {self.start.name} and {self.end.name}")
        self._norms = None
        return self

    def tensor(self, name: str) -> torch.Tensor | None:
        if name not in self._keys:
            return None
        a, b = self._keys[name]
        return self.end.read(b).to(torch.float64) - self.start.read(a).to(torch.float64)

    def tensor_norms(self) -> dict[str, float]:
        if self._norms is None:
            self._norms = {n: float(self.tensor(n).norm()) for n in self._keys}
        return self._norms


def _seed_for(seed: int, name: str) -> int:
    # stable across processes (Python's hash() is salted), distinct per tensor: no shared noise between layers
    return int.from_bytes(hashlib.sha256(f"random-direction:{seed}:{name}".encode()).digest()[:8], "little") >> 1


class RandomDirection(Direction):
    """Gaussian direction rescaled tensor by tensor to the norms of a reference direction, so it moves every
    tensor as far as the reference does (paper Figure 4's control)."""

    def __init__(self, reference: Direction, seed: int = 0, label: str = "random"):
        self.reference = reference
        self.seed = seed
        self.label = label
        self._shapes: dict[str, torch.Size] = {}

    def bind(self, model: torch.nn.Module) -> "RandomDirection":
        self.reference.bind(model)  # idempotent
        self._shapes = {n: p.shape for n, p in model.named_parameters()}
        return self

    def tensor(self, name: str) -> torch.Tensor | None:
        target = self.reference.tensor_norms().get(name)
        if target is None:
            return None
        g = torch.Generator().manual_seed(_seed_for(self.seed, name))
        r = torch.randn(self._shapes[name], generator=g, dtype=torch.float64)
        n = float(r.norm())
        return r * (target / n) if n > 0 else r

    def tensor_norms(self) -> dict[str, float]:
        return dict(self.reference.tensor_norms())


@torch.no_grad()
def set_weights(model: torch.nn.Module, origin: Any, terms: Sequence[tuple[float, Direction]] = ()) -> None:
    """model <- origin + sum_i c_i direction_i, computed per tensor in float64 and cast to each parameter's dtype.
    Parameters absent from `origin` keep their values; a direction without a tensor contributes zero; a stored
    tensor of another shape than its parameter is refused."""
    src: TensorSource = as_source(origin)
    keys = src.shapes()
    aliases = _aliases(model)
    for name, param in model.named_parameters():
        key = _key_for(name, aliases, keys)
        if key is None:
            continue
        if tuple(keys[key]) != tuple(param.shape):  # a reshape would scramble it (e.g. a transposed layout)
            raise ValueError(f"{key}: shape {tuple(keys[key])} in {src.name}, {tuple(param.shape)} in the model")
        value = src.read(key).to(torch.float64)
        for coef, direction in terms:
            if coef == 0.0:
                continue
            t = direction.tensor(name)
            if t is not None:
                value.add_(t, alpha=float(coef))
        param.copy_(value.reshape(param.shape).to(device=param.device, dtype=param.dtype))


# ---- evaluation ------------------------------------------------------------------------------------------------------

def prepare_tasks(names: Sequence[str], limit: int | None, split: str = "test",
                  task_options: Mapping[str, Mapping] | None = None, balanced: bool = False,
                  build: Callable[[str], Any] | None = None) -> dict[str, tuple[Any, list]]:
    """{name: (task, examples)}: the first `limit` examples of `split`, or with `balanced` a label-balanced subset
    of `limit` (esft.evaluation.load_examples). `build(name)` makes a task (default: esft.tasks.get_task with
    `task_options`)."""
    from esft.evaluation import load_examples
    from esft.tasks import get_task

    out = {}
    for n in names:
        task = build(n) if build is not None else get_task(n, **dict((task_options or {}).get(n, {})))
        out[n] = (task, load_examples(task, split, limit, balanced))
    return out


def accuracy(model, tokenizer, tasks: Mapping[str, tuple[Any, list]], gen_config,
             scores_out: dict[str, list[float]] | None = None, progress: bool = False) -> dict[str, float]:
    """Accuracy (or mean reward) per task with esft.evaluation.evaluate_task (the task's own scorer); `scores_out`,
    when given, receives each task's per-example scores; `progress` shows the generation bar (minutes a point)."""
    from esft.evaluation import evaluate_task

    out = {}
    for n, (task, ex) in tasks.items():
        records: list[dict[str, Any]] = []
        out[n] = float(evaluate_task(model, tokenizer, task, ex, gen_config, progress=progress,
                                     records_out=records)["accuracy"])
        if scores_out is not None:
            scores_out[n] = [float(r["score"]) for r in records]
    return out


def interpolation_path(model, tokenizer, a: Any, b: Any, ts: Sequence[float], tasks: Mapping[str, tuple[Any, list]],
                       gen_config, progress: bool = False) -> dict[str, Any]:
    """Accuracy (or mean reward) at theta(t) = (1 - t) a + t b for each t (0 and 1 are always included), with
    each task's score name ("score", from the per-example scores), the barrier test on that scale and each task's
    constant-answer baseline (KEY)."""
    ts = sorted(set([0.0, 1.0, *[float(t) for t in ts]]))
    sa = as_source(a)
    direction = DeltaDirection(sa, b, "a->b").bind(model)
    accs: dict[str, list[float]] = {n: [] for n in tasks}
    scores: dict[str, list[list[float] | None]] = {n: [] for n in tasks}
    for t in ts:
        set_weights(model, sa, [(t, direction)])
        got: dict[str, list[float]] = {}
        res = accuracy(model, tokenizer, tasks, gen_config, scores_out=got, progress=progress)
        for n, v in res.items():
            accs[n].append(v)
            scores[n].append(got.get(n))
        if progress:
            print(f"interpolation t={t:.3f} {scores_line(res, got)}", flush=True)
    names = path_score_names(scores, accs)
    return {"t": ts, "accuracy": accs, "distance": direction.norm, "score": names,
            "barrier": {n: path_barrier(ts, accs[n], scores[n], len(tasks[n][1]), names[n]) for n in tasks},
            "n": {n: len(tasks[n][1]) for n in tasks}, KEY: task_baselines(tasks)}


def default_magnitudes(norms: Sequence[float], points: int = 6) -> list[float]:
    """0, each norm, and `points` points of a geometric grid from min(norms)/4 to 1.5 max(norms) (the study's ES
    and GRPO norms differ ~90x, so a linear grid would not resolve the GRPO scale); `points` 0 adds none, 1 only
    min(norms)/4, as `--magnitude-points` reads ("besides 0 and the update norms")."""
    if points < 0:
        raise ValueError(f"magnitude points must be >= 0, got {points}")
    pos = [float(x) for x in norms if x and x > 0]
    if not pos:
        return [0.0]
    lo, hi = min(pos) / 4, 1.5 * max(pos)
    grid = np.geomspace(lo, hi, points)  # hi / lo = 6 max / min >= 6: a geometric grid always has room
    vals = sorted(set([0.0, *[float(x) for x in grid], *pos]))
    return vals


def direction_sweep(model, tokenizer, origin: Any, directions: Sequence[Direction], magnitudes: Sequence[float],
                    tasks: Mapping[str, tuple[Any, list]], gen_config, progress: bool = False) -> dict[str, Any]:
    """Accuracy (or mean reward) at origin + m * direction / ||direction|| for each direction and absolute
    distance m, with each task's score name ("score", from the per-example scores) and constant-answer baseline."""
    so = as_source(origin)
    out: dict[str, Any] = {"origin": so.name, "magnitudes": [float(m) for m in magnitudes], "directions": {},
                           "n": {n: len(tasks[n][1]) for n in tasks}, KEY: task_baselines(tasks)}
    cache_zero: tuple[dict[str, float], dict[str, list[float]]] | None = None  # the origin's means and scores
    scores: dict[str, list[list[float] | None]] = {n: [] for n in tasks}
    for d in directions:
        d.bind(model)
        norm = d.norm
        accs: dict[str, list[float]] = {n: [] for n in tasks}
        for m in magnitudes:
            if m == 0.0 and cache_zero is not None:
                res, got = cache_zero  # the origin itself: identical for every direction
            else:
                got = {}
                set_weights(model, so, [(m / norm if norm > 0 else 0.0, d)])
                res = accuracy(model, tokenizer, tasks, gen_config, scores_out=got, progress=progress)
                for n in tasks:
                    scores[n].append(got.get(n))
                if m == 0.0:
                    cache_zero = res, got
            for n, v in res.items():
                accs[n].append(v)
            if progress:
                print(f"{d.label} |d|={m:.4g} {scores_line(res, got)}", flush=True)
        out["directions"][d.label] = {"norm": norm, "accuracy": accs}
    out["score"] = path_score_names(scores, {n: [v for d in out["directions"].values() for v in d["accuracy"][n]]
                                             for n in tasks})
    return out


# ---- figures --------------------------------------------------------------------------------------------------------

def plot_interpolation(result: Mapping[str, Any], path: str | Path, labels: tuple[str, str] = ("ES", "GRPO")) -> Path:
    """Figure 3: accuracy along the path, with the dashed straight line between endpoint accuracies; each accuracy
    with its 95% Wilson interval over the result's n examples (none for a mean reward)."""
    from esft.analysis.plots import accuracy_axis, pyplot, save

    plt = pyplot()
    tasks = list(result["accuracy"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.8 * len(tasks), 3.2), squeeze=False)
    for ax, n in zip(axes[0], tasks):
        ts, acc = result["t"], result["accuracy"][n]
        ax.plot(ts, acc, "o-", color="tab:purple", label=f"weights (1 - t) {labels[0]} + t {labels[1]}")
        ax.plot([ts[0], ts[-1]], [acc[0], acc[-1]], "--", color="gray", label="straight line between the ends")
        score = (result.get("score") or {}).get(n, ACCURACY)
        count = (result.get("n") or {}).get(n)
        if score == ACCURACY and count:
            interval_bars(ax, ts, acc, count, "tab:purple", label=bars_label(count))
        b = result["barrier"][n]
        name = textwrap.fill(n.replace(",", ", "), 36) if len(n) > 36 else n  # task options: wider than a panel
        ax.set_title(f"{name}: max drop {b['max_drop']:+.3f}" + (" (barrier)" if b["barrier"] else ""), fontsize=9)
        ax.set_xlabel(f"t  ({labels[0]} = 0, {labels[1]} = 1)")
        draw_baseline(ax, shown(result, {n: score})[n])
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)  # under: hides no point
        accuracy_axis(ax, score)
    return save(fig, path)


def plot_direction_sweep(result: Mapping[str, Any], path: str | Path,
                         reference: Mapping[str, Mapping[str, float]] | None = None, title: str = "") -> Path:
    """Figure 4/5: accuracy vs distance moved along each direction; dashed verticals at each update's norm,
    dash-dotted horizontals at reference accuracies (e.g. base and checkpoints; {label: {task: acc}}); each accuracy
    with its 95% Wilson interval over the result's n examples, as in the sweep's table."""
    from esft.analysis.plots import accuracy_axis, color, distance_axis, pyplot, save, say_empty

    plt = pyplot()
    mags = np.asarray(result["magnitudes"], dtype=np.float64)
    tasks = list(next(iter(result["directions"].values()))["accuracy"]) if result["directions"] else []
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(4.2 * max(1, len(tasks)), 3.4), squeeze=False)
    for ax, n in zip(axes[0], tasks):
        score = (result.get("score") or {}).get(n, ACCURACY)
        count = (result.get("n") or {}).get(n) if score == ACCURACY else None
        for k, (label, d) in enumerate(result["directions"].items()):  # each thinner: equal curves all show
            style = {"marker": "os^D"[k % 4], "ms": max(2, 7 - 2 * k), "lw": max(0.8, 3 - k)}
            ax.plot(mags, d["accuracy"][n], color=color(label.split()[0]), label=label, **style)
            if count:
                interval_bars(ax, mags, d["accuracy"][n], count, color(label.split()[0]),
                              label=bars_label(count) if k == 0 else None)
            if not label.lower().startswith("random"):
                ax.axvline(d["norm"], color=color(label.split()[0]), ls="--", lw=1, label=f"norm of the {label} update")
        for j, (lab, accs) in enumerate((reference or {}).items()):
            if n in accs:
                # dash-dot, as the sparsity figure's base lines: dotted, they looked like the constant answer's line
                ax.axhline(accs[n], color="k", ls="-.", lw=1, alpha=min(1.0, 0.5 + 0.25 * j))  # later ones darker
                ax.text(mags.max(), accs[n], lab, fontsize=6, ha="right", va="bottom")
        distance_axis(ax, mags[mags > 0])
        ax.set_xlabel(r"distance moved $\|\Delta\theta\|_2$")
        draw_baseline(ax, shown(result, {n: score})[n])
        accuracy_axis(ax, score)
        ax.set_title(n, fontsize=9)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)  # inside, it hid points
    if not tasks:
        say_empty(axes[0][0], "no direction or task evaluated")
    if title:
        fig.suptitle(title, fontsize=10)
    return save(fig, path)
