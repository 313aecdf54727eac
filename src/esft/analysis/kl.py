"""KL(pi_after || pi_before) on a task's test prompts, token-aligned on the completions pi_after generated
(paper Figure 2, Tables 11-16).

For each prompt, pi_after generates a completion (greedy by default, as in the paper's evaluation; or sampled).
Both models then score exactly those generated ids (`Generation.completion_ids`) after exactly the same prompt ids:
nothing is decoded and re-tokenised, which would shift tokens and, on Llama, add a second BOS.
Per generated token, with r = log pi_before(y_t) - log pi_after(y_t):

    k1 = -r                        unbiased for KL(after || before) when y_t ~ pi_after; can be negative
    k3 = (e^r - 1) - r             unbiased under the same condition, and >= 0 (Schulman's estimator)
    exact = sum_v pi_after(v) (log pi_after(v) - log pi_before(v))   the full next-token KL at that prefix

Each is reported as a per-token mean (sum over all tokens / number of tokens) and as a per-sequence sum
(averaged over sequences). With greedy completions k1 and k3 are not unbiased (the tokens are argmaxes, not
samples); `exact` is the true KL of the next-token distributions along the greedy path. Log-probabilities are
computed in float64 from the models' logits.

Stages: incremental KL compares stage t with stage t-1 (t=1 with the base), cumulative compares stage t with
the base. At most two models are loaded at a time (pi_after, and one pi_before after another).

The report's section is esft.analysis.kl_report.
"""

from __future__ import annotations

import gc
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from esft.tables import se_text

ESTIMATORS = ("k1", "k3", "exact")
#: the estimator the report's tables and heatmap print (the study does not say which one its tables use)
HEADLINE = "k3_token_mean"


# ---- pure estimators -------------------------------------------------------------------------------------------

def kl_estimates(logp_after: torch.Tensor, logp_before: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token k1 and k3 from the log-probabilities of the generated tokens under each model (float64)."""
    la, lb = logp_after.to(torch.float64), logp_before.to(torch.float64)
    r = lb - la
    return {"k1": -r, "k3": torch.expm1(r) - r}


def exact_kl(logits_after: torch.Tensor, logits_before: torch.Tensor) -> torch.Tensor:
    """KL(softmax(a) || softmax(b)) over the last dim, per position, in float64."""
    la = torch.log_softmax(logits_after.to(torch.float64), dim=-1)
    lb = torch.log_softmax(logits_before.to(torch.float64), dim=-1)
    return (la.exp() * (la - lb)).sum(-1)


@dataclass
class SequenceKL:
    tokens: int
    k1: float
    k3: float
    exact: float


def summarize(seqs: Sequence[SequenceKL]) -> dict[str, Any]:
    """Per-token means (pooled over all tokens) and per-sequence sums (averaged over sequences), each with its
    standard error over the evaluated sequences (`k3_token_mean_se`, ...; `sequence_se`)."""
    n = len(seqs)
    tokens = sum(s.tokens for s in seqs)
    out: dict[str, Any] = {"n": n, "tokens": tokens}
    for e in ESTIMATORS:
        total = sum(getattr(s, e) for s in seqs)
        out[f"{e}_token_mean"] = total / tokens if tokens else None
        out[f"{e}_seq_mean"] = total / n if n else None
        token_se, seq_se = sequence_se([s.tokens for s in seqs], [getattr(s, e) for s in seqs])
        out[f"{e}_token_mean_se"], out[f"{e}_seq_mean_se"] = token_se, seq_se
    return out


def sequence_se(tokens: Sequence[int], sums: Sequence[float]) -> tuple[float | None, float | None]:
    """Standard errors over sequences of the per-token mean sum(x)/sum(t) and the per-sequence mean of x.

    The tokens of one completion are not independent draws (they share its prompt and prefix), so the sequence
    is the sampling unit: the per-token mean is a ratio of sequence totals, whose delta-method (linearised) SE
    is sqrt(n / (n - 1) sum_i (x_i - R t_i)^2) / sum_i t_i; the per-sequence mean's is the sample std / sqrt(n).
    None for fewer than two sequences (no spread to measure), and for the per-token mean without tokens."""
    n = len(sums)
    if n < 2:
        return None, None
    x, t = np.asarray(sums, dtype=np.float64), np.asarray(tokens, dtype=np.float64)
    seq = float(x.std(ddof=1) / math.sqrt(n))
    total = float(t.sum())
    if total <= 0:
        return None, seq
    r = float(x.sum()) / total
    return float(math.sqrt(n / (n - 1) * float(((x - r * t) ** 2).sum())) / total), seq


def seed_summary(values: Sequence[float | None]) -> dict[str, Any]:
    """median [min, max] (paper Tables 11-12) and mean +- sample std (Tables 13-14) across seeds."""
    v = np.asarray([x for x in values if x is not None and not math.isnan(x)], dtype=np.float64)
    if v.size == 0:
        return {"n": 0, "median": None, "min": None, "max": None, "mean": None, "std": None}
    return {"n": int(v.size), "median": float(np.median(v)), "min": float(v.min()), "max": float(v.max()),
            "mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0}


# ---- scoring generated ids ---------------------------------------------------------------------------------------

def _left_pad(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def _completion_logits(model, rows: list[list[int]], keep: int, pad_id: int) -> torch.Tensor:
    """Logits of the last `keep` positions of left-padded prompt+completion rows (explicit attention mask and
    position ids from the mask, as in generation, so pad == eos models lose no real eos).

    A model that ignores `logits_to_keep` (its forward takes and drops extra keyword arguments) returns every
    position: those logits are cut to the last `keep`, as the indexing of `score_pair` counts from there. Any other
    number of positions is refused, never read misaligned."""
    device = next(model.parameters()).device
    ids, mask = _left_pad(rows, pad_id, device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, logits_to_keep=keep)
    logits = out.logits
    width = ids.shape[1]
    if logits.dim() != 3 or logits.shape[0] != ids.shape[0] or logits.shape[1] not in (keep, width):
        raise ValueError(f"{type(model).__name__} returned logits of shape {tuple(logits.shape)} for a batch of "
                         f"{tuple(ids.shape)} ids: expected the last {keep} positions (logits_to_keep={keep}) or "
                         f"all {width}")
    return logits[:, width - keep:] if logits.shape[1] != keep else logits


@torch.no_grad()
def score_pair(model_after, model_before, prompt_ids: Sequence[Sequence[int]],
               completion_ids: Sequence[Sequence[int]], batch_size: int = 4, pad_id: int = 0,
               position_chunk: int = 256) -> list[SequenceKL]:
    """k1, k3 and exact KL summed over each completion's tokens, scored on the given ids by both models."""
    results: list[SequenceKL] = []
    # a completion's first token is predicted from the prompt's last one: without it, nothing predicts that token
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        if len(c) and not len(p):
            raise ValueError(f"row {i}: a completion needs at least one prompt token before it to be scored")
    order = list(range(len(prompt_ids)))
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        rows = [list(prompt_ids[i]) + list(completion_ids[i]) for i in idx]
        lens = [len(completion_ids[i]) for i in idx]
        lc = max(lens)
        if lc == 0:
            results.extend(SequenceKL(0, 0.0, 0.0, 0.0) for _ in idx)
            continue
        la = _completion_logits(model_after, rows, lc + 1, pad_id)
        lb = _completion_logits(model_before, rows, lc + 1, pad_id)
        for b, i in enumerate(idx):
            n = lens[b]
            if n == 0:
                results.append(SequenceKL(0, 0.0, 0.0, 0.0))
                continue
            # logits index k predicts the token at position (W - lc - 1 + k) + 1; completion token j sits at
            # W - n + j, so it is predicted by k = lc - n + j
            toks = torch.tensor(completion_ids[i], dtype=torch.long, device=la.device)
            k1 = k3 = ex = 0.0
            for c0 in range(0, n, position_chunk):
                c1 = min(n, c0 + position_chunk)
                a = la[b, lc - n + c0: lc - n + c1].to(torch.float64)
                bb = lb[b, lc - n + c0: lc - n + c1].to(torch.float64)
                lsa, lsb = torch.log_softmax(a, -1), torch.log_softmax(bb, -1)
                t = toks[c0:c1, None]
                est = kl_estimates(lsa.gather(-1, t).squeeze(-1), lsb.gather(-1, t).squeeze(-1))
                k1 += float(est["k1"].sum())
                k3 += float(est["k3"].sum())
                ex += float((lsa.exp() * (lsa - lsb)).sum())
            results.append(SequenceKL(n, k1, k3, ex))
        del la, lb
    return results


def generate_completions(model, tokenizer, examples: Sequence[dict], task, gen_config,
                         progress: bool = False) -> tuple[list, list]:
    """(prompt ids, completion ids) of `model` on a task's examples; prompts encoded once and reused for scoring;
    `progress` shows the generation bar."""
    from esft.generation import encode_prompts, generate

    prompts = [task.prompt(ex) for ex in examples]
    encoded = encode_prompts(tokenizer, prompts)
    gens = generate(model, tokenizer, prompts, gen_config, prompt_ids=encoded, progress=progress)
    return encoded, [g.completion_ids for g in gens]


def kl_between(model_after, model_before, tokenizer, task, examples: Sequence[dict], gen_config,
               batch_size: int = 4) -> dict[str, Any]:
    """Summary of KL(after || before) on `examples` (completions generated by `model_after`)."""
    prompt_ids, comp = generate_completions(model_after, tokenizer, examples, task, gen_config)
    seqs = score_pair(model_after, model_before, prompt_ids, comp, batch_size, _pad_id(tokenizer))
    return summarize(seqs)


def _pad_id(tokenizer) -> int:
    pid = getattr(tokenizer, "pad_token_id", None)
    if pid is None:
        pid = getattr(tokenizer, "eos_token_id", None)
    return int(pid or 0)


# ---- stages ----------------------------------------------------------------------------------------------------------

def stage_labels(paths: Sequence[str | Path]) -> list[str]:
    """A default name per stage checkpoint: its run folder's (RUN/checkpoints/NAME), else the folder's own; an
    experiment's stage runs are all folders named `run`, so theirs is the folder above (1-countdown). Names that
    still repeat (two snapshots of one run) get their stage number, "2:name" (kl_stages keys results by name)."""
    names = []
    for p in map(Path, paths):
        run = p.parent.parent if p.parent.name == "checkpoints" else p
        names.append(run.parent.name if run.name == "run" and run.parent.name else run.name)
    return names if len(set(names)) == len(names) else [f"{i + 1}:{n}" for i, n in enumerate(names)]


def _default_loader(spec: Any, dtype: str | None = None, device: str | None = None):
    from esft.models import load_model

    return load_model(str(spec), dtype=dtype, device=device)


def _free(model) -> None:
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def kl_stages(base: Any, stages: Sequence[tuple[str, Any]], tasks: Sequence[str], limit: int | None = 50,
              gen_config: Any = None, batch_size: int = 4, task_options: Mapping[str, Mapping] | None = None,
              loader: Callable[..., tuple[Any, Any]] | None = None, dtype: str | None = None,
              device: str | None = None, progress: bool = False, balanced: bool = False,
              build: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """Incremental and cumulative KL after every stage, on every task's first `limit` test examples (with
    `balanced`, a label-balanced subset of `limit`: esft.evaluation.load_examples). `build(name)` makes a task
    (default: esft.tasks.get_task with `task_options`).

    `base`, `stages[i][1]`: model specs for `loader` (default: esft.models.load_model on a path/name).
    Returns {"stages": labels, "tasks": names, "incremental": {task: {stage: summary}}, "cumulative": {...}}.
    """
    from esft.generation import GenerationConfig
    from esft.tasks import get_task

    labels = [s for s, _ in stages]
    if len(set(labels)) < len(labels):  # results are keyed by label: a repeated one would replace another stage's
        raise ValueError(f"stage labels must differ, got {labels}")
    load = loader or (lambda spec: _default_loader(spec, dtype, device))
    gen_config = gen_config or GenerationConfig(max_new_tokens=256, temperature=0.0)
    build = build or (lambda t: get_task(t, **dict((task_options or {}).get(t, {}))))
    task_objs = {t: build(t) for t in tasks}
    from esft.evaluation import load_examples

    examples = {t: load_examples(task_objs[t], "test", limit, balanced) for t in tasks}
    out: dict[str, Any] = {"stages": [s for s, _ in stages], "tasks": list(tasks), "limit": limit,
                           "generation": {"max_new_tokens": gen_config.max_new_tokens,
                                          "temperature": gen_config.temperature, "top_p": gen_config.top_p},
                           "incremental": {t: {} for t in tasks}, "cumulative": {t: {} for t in tasks}}
    prev_spec = base
    for label, spec in stages:
        after, tokenizer = load(spec)
        pad = _pad_id(tokenizer)
        comps = {}
        for t in tasks:
            # the longest part of a stage (minutes at the paper's budget), before its first line is printed
            comps[t] = generate_completions(after, tokenizer, examples[t], task_objs[t], gen_config, progress=progress)
        befores = [("incremental", prev_spec)] + ([("cumulative", base)] if prev_spec is not base else [])
        for kind, before_spec in befores:
            before, _ = load(before_spec)
            for t in tasks:
                p, c = comps[t]
                summ = summarize(score_pair(after, before, p, c, batch_size, pad))
                out[kind][t][label] = summ
                if prev_spec is base:
                    out["cumulative"][t][label] = summ
                if progress:
                    print(f"KL {kind:<11} {label:<20} {t:<10} "
                          f"k3/token {se_text(summ['k3_token_mean'], summ['k3_token_mean_se'])}  "
                          f"exact/token {se_text(summ['exact_token_mean'], summ['exact_token_mean_se'])}", flush=True)
            _free(before)
        _free(after)
        prev_spec = spec
    return out


def aggregate_seeds(tables: Sequence[Mapping[str, Any]], estimator: str = "k3_token_mean") -> dict[str, Any]:
    """Across seeds (one kl_stages result each, same stages/tasks): {kind: {task: {stage: seed_summary}}}, each
    cell with `se`, the median over seeds of each seed's standard error over its sequences (None where no seed
    recorded one: a result computed before results recorded it, or a single sequence)."""
    if not tables:
        return {}
    first = tables[0]
    for tb in tables[1:]:
        if len(tb["stages"]) != len(first["stages"]) or set(tb["tasks"]) != set(first["tasks"]):
            raise ValueError(f"seeds to aggregate must share their tasks and number of stages: {first['tasks']} "
                             f"x {len(first['stages'])} stages vs {tb['tasks']} x {len(tb['stages'])} stages")
    out: dict[str, Any] = {"estimator": estimator, "seeds": len(tables), "stages": first["stages"],
                           "tasks": first["tasks"]}
    # stages match by position: a seed's stage labels may be its own run names (es-seed42 vs es-seed52), and
    # matching them by label would leave every seed but the first out of its cell
    for kind in ("incremental", "cumulative"):
        out[kind] = {t: {s: _seed_cell([tb[kind].get(t, {}).get(tb["stages"][j], {}) for tb in tables], estimator)
                         for j, s in enumerate(first["stages"])} for t in first["tasks"]}
    return out


def _seed_cell(cells: Sequence[Mapping[str, Any]], estimator: str) -> dict[str, Any]:
    ses = [c[f"{estimator}_se"] for c in cells if c.get(f"{estimator}_se") is not None]
    return {**seed_summary([c.get(estimator) for c in cells]), "se": float(np.median(ses)) if ses else None}


def matrix(table: Mapping[str, Any], kind: str = "incremental", estimator: str = "k3_token_mean",
           stat: str | None = None) -> np.ndarray:
    """tasks x stages array from a kl_stages result (or, with `stat`, from an aggregate_seeds result)."""
    m = np.full((len(table["tasks"]), len(table["stages"])), np.nan)
    for i, t in enumerate(table["tasks"]):
        for j, s in enumerate(table["stages"]):
            cell = table[kind].get(t, {}).get(s)
            if cell is None:
                continue
            v = cell.get(stat) if stat else cell.get(estimator)
            if v is not None:
                m[i, j] = v
    return m


def text_colour(rgba: Sequence[float]) -> str:
    """Black ("k") on a light cell, white ("w") on a dark one, from the cell colour's WCAG relative luminance (the
    better contrast of the two above 0.179). A rule on the value (white below the scale's middle) wrote black on
    the darkest colour when every cell was equal (two identical models: all 0)."""
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgba[:3]]
    return "k" if 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2] > 0.179 else "w"


#: the largest |KL| over the smallest non-zero one from which Figure 2's colours may go logarithmic
LOG_SCALE_SPAN = 100.0


def heat_norm(values: np.ndarray) -> Any:
    """Figure 2's colour scale for these cell values (NaN = not measured): linear from min(0, smallest) to the
    largest, or symmetric-log (linear within the smallest non-zero magnitude of 0, so a zero and a negative k1
    estimate keep their places) where the non-zero magnitudes span LOG_SCALE_SPAN or more and the cells' colours
    then lie more evenly: ES and GRPO KLs often differ by decades, and on a linear scale every small cell is the
    same dark colour, while one near-zero cell among similar ones would, on a log scale, squeeze the rest."""
    from matplotlib.colors import Normalize, SymLogNorm

    finite = values[np.isfinite(values)]
    vmin = min(0.0, float(finite.min())) if finite.size else 0.0
    vmax = float(finite.max()) if finite.size else 1.0
    if vmax <= vmin:
        return Normalize(vmin=vmin, vmax=vmin + 1e-12)
    linear = Normalize(vmin=vmin, vmax=vmax)
    sizes = np.abs(finite[finite != 0])
    if not sizes.size or sizes.max() / sizes.min() < LOG_SCALE_SPAN:
        return linear
    log = SymLogNorm(linthresh=float(sizes.min()), linscale=1.0, vmin=vmin, vmax=vmax, base=10)
    return log if evenness(log, finite) > evenness(linear, finite) else linear


def evenness(norm: Any, values: np.ndarray) -> float:
    """The median gap between neighbouring colour positions (0-1) of the distinct `values` under `norm`: how
    evenly a scale spreads the cells over the colour map (larger is more even)."""
    positions = np.unique(np.asarray(norm(np.unique(values)), dtype=float))
    return float(np.median(np.diff(positions))) if positions.size > 1 else 0.0


#: characters per line of a heatmap's row label (a task name)
ROW_LABEL_CHARS = 32


def plot_heatmap(panels: Mapping[str, tuple[np.ndarray, Sequence[str], Sequence[str]]], path: str | Path,
                 title: str = "incremental KL(after || before)") -> Path:
    """Figure 2: one heatmap per method (rows: evaluation task, columns: after training stage), one shared
    colour scale (`heat_norm`), value written in each cell."""
    from matplotlib.colors import SymLogNorm
    from matplotlib.ticker import ScalarFormatter

    from esft.analysis.plots import pyplot, save

    plt = pyplot()
    norm = heat_norm(np.concatenate([m.ravel() for m, _, _ in panels.values()] or [np.array([])]))
    # a long task name (a data file's path, a task with options) as a row label: wrapped, and given its room by a
    # wider panel and the constrained layout, instead of running over the cells of the panel to its left
    # (a task's options break after their commas: `max_number=5` / `0` read as another number)
    wrap = {r: textwrap.fill(r.replace(",", ", "), ROW_LABEL_CHARS, break_on_hyphens=False).replace(", ", ",")
            for _, rows, _ in panels.values() for r in rows}
    longest = max((len(r) for r in wrap), default=0)
    width = max(4.2, 3.2 + 0.07 * min(longest, ROW_LABEL_CHARS))
    # and a taller figure for many rows or wrapped ones: each label line needs its height, or they print over each other
    lines = max((sum(wrap[r].count("\n") + 1 for r in rows) for _, rows, _ in panels.values()), default=0)
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels) + 0.8, max(3.6, 1.8 + 0.15 * lines)),
                             squeeze=False,
                             layout="constrained")
    im = None
    for ax, (label, (m, rows, cols)) in zip(axes[0], panels.items()):
        im = ax.imshow(m, cmap="viridis", norm=norm, aspect="auto")
        ax.set_xticks(range(len(cols)))
        ax.set_xticklabels([f"after {c}" for c in cols], rotation=30, ha="right", fontsize=8)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([wrap[r] for r in rows], fontsize=8)
        ax.set_title(label)
        for i in range(m.shape[0]):
            for j in range(m.shape[1]):
                if np.isfinite(m[i, j]):
                    ax.text(j, i, f"{m[i, j]:.3g}", ha="center", va="center", fontsize=7,
                            color=text_colour(im.cmap(im.norm(m[i, j]))))
                else:  # a cell not measured is blank white, which read as a colour of the scale or a drawing fault
                    ax.text(j, i, "n/a", ha="center", va="center", fontsize=7, color="grey")
    if im is not None:
        # every panel is a per-token mean of a natural-log KL (esft.analysis.kl.matrix's estimators)
        bar = fig.colorbar(im, ax=list(axes[0]), shrink=0.8)
        bar.set_label("KL per token (nats, log scale)" if isinstance(norm, SymLogNorm) else "KL per token (nats)")
        if not isinstance(norm, SymLogNorm):
            # a power of ten above the bar: small KLs would otherwise be labelled 0.00000 to 0.00010
            bar.formatter = ScalarFormatter(useMathText=True)
            bar.formatter.set_powerlimits((-2, 3))
            bar.update_ticks()
    fig.suptitle(title, fontsize=10)
    return save(fig, path)
