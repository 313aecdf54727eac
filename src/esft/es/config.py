"""`ESConfig`: every knob of an ES run in one dataclass (CleanRL style), with presets and YAML / argparse glue.

Precedence when building a config: dataclass defaults < preset < YAML file (`--config run.yaml`) < explicit
command-line flags. The resolved config is written to `<output_dir>/config.yaml`.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass
class ESConfig:
    """An ES fine-tuning run. esft maximises reward: fitness = mean task reward over the batch."""

    model: str = "smollm2-135m"
    """model name (esft.models registry) or local Hugging Face folder"""
    task: str = "boolq"
    """task name (esft.tasks.get_task)"""
    population_size: int = 30
    """N: members per iteration (even when antithetic)"""
    sigma: float = 0.0015
    """perturbation scale: member weights are theta + sign * sigma * eps, eps ~ N(0, I)"""
    alpha: float = 0.00075
    """step size: theta += (alpha / N) sum_n z_n eps_n (SGD); the learning rate when optimizer=adam"""
    batch_size: int = 200
    """train prompts per iteration (each member answers the same batch); sampled from the train split"""
    iterations: int = 100
    """number of ES updates"""
    max_new_tokens: int = 1024
    """generation budget per completion (greedy decoding)"""
    seed: int = 42
    """run seed: member seeds and batches are pure functions of (seed, iteration)"""
    output_dir: str = "runs/es"
    """run directory (config.yaml, metrics.jsonl, seeds.jsonl, samples/, checkpoints/)"""
    antithetic: bool = False
    """mirrored sampling: members (seed, +1) and (seed, -1); the paper does not use it (and the random-walk law
    ||dtheta_T||^2 = alpha^2 T d / N assumes independent members)"""
    noise: str = "per-tensor"
    """"per-tensor" (independent stream per tensor) or "shared-seed" (public code's correlated noise)"""
    fitness_shaping: str = "zscore"
    """"zscore" (paper: (f - mean) / (std + 1e-8)), "centered_rank" or "raw" """
    optimizer: str = "sgd"
    """"sgd" (paper rule, no optimizer state) or "adam" (torch Adam on the fp32 master weights)"""
    include: list[str] = field(default_factory=list)
    """regexes (re.search on parameter names) of parameters to perturb; empty = all"""
    exclude: list[str] = field(default_factory=list)
    """regexes of parameters to keep frozen, e.g. ["norm"] for RMSNorm gains"""
    format_bonus: float = 0.0
    """reward added for a well-formed answer (DART-ES / Qiu et al.); 0 = the paper's binary reward"""
    fitness_rule: str = "mean"
    """how per-example rewards become member fitness ("mean"; later e.g. DART-ES)"""
    generation_batch_size: int = 32
    """prompts per generate() call"""
    dtype: str | None = None
    """model dtype ("float32", "bfloat16"); None = the loader's default. Masters are fp32 regardless."""
    device: str | None = None
    """torch device; None = the loader's default"""
    eval_every: int = 10
    """evaluate the unperturbed model every k iterations (and at start and end); 0 = never"""
    eval_limit: int = 200
    """held-out (test split) examples for those evaluations"""
    checkpoint_every: int = 0
    """save a Hugging Face checkpoint every k iterations (0 = only the final one); seeds.jsonl covers the rest"""
    samples_per_iteration: int = 4
    """completions of member 0 written to samples/ each iteration"""
    max_passage_chars: int | None = None
    """task option (BoolQ): cut passages to this many characters to shorten prompts on CPU"""
    task_options: dict[str, Any] = field(default_factory=dict)
    """further keyword options for the task's constructor"""
    resume: bool = False
    """continue the run in output_dir from its latest checkpoint and seed log"""

    def task_kwargs(self) -> dict[str, Any]:
        kw = dict(self.task_options)
        if self.max_passage_chars is not None:
            kw.setdefault("max_passage_chars", self.max_passage_chars)
        return kw

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "ESConfig":
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, dict[str, Any]] = {
    # Paper, Table 17 (Qwen3-4B / Llama-3.2-3B on GPUs).
    "paper": dict(sigma=0.0015, alpha=0.00075, population_size=30, batch_size=200, max_new_tokens=1024,
                  iterations=100, antithetic=False, fitness_shaping="zscore", optimizer="sgd"),
    # 2-core CPU with SmolLM2-135M: REFERENCE.md section 6 probe (~145 s / iteration, learning within 10 its).
    "cpu": dict(task="boolq", max_passage_chars=400, population_size=8, batch_size=16, max_new_tokens=24,
                sigma=3e-3, alpha=1.5e-3, format_bonus=0.1, iterations=10, eval_every=5, eval_limit=200,
                generation_batch_size=16, dtype="float32", device="cpu", checkpoint_every=5),
}

# fields that may change when resuming (everything else must match the original run)
RESUMABLE_CHANGES = {"iterations", "eval_every", "eval_limit", "checkpoint_every", "samples_per_iteration",
                     "resume", "generation_batch_size", "output_dir"}


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(ESConfig)]


def from_dict(data: dict[str, Any], base: ESConfig | None = None) -> ESConfig:
    unknown = set(data) - set(field_names())
    if unknown:
        raise ValueError(f"unknown ES config keys: {sorted(unknown)}")
    return dataclasses.replace(base or ESConfig(), **data)


def preset(name: str, **overrides: Any) -> ESConfig:
    """A preset config ("paper" or "cpu") with overrides."""
    try:
        values = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}") from None
    return from_dict({**values, **overrides})


def load_yaml(path: str | Path, base: ESConfig | None = None) -> ESConfig:
    data = yaml.safe_load(Path(path).read_text()) or {}
    if "preset" in data:
        base = preset(data.pop("preset"))
    return from_dict(data, base)


def save_yaml(config: ESConfig, path: str | Path, extra: dict[str, Any] | None = None) -> None:
    data = config.to_dict()
    if extra:
        data = {**data, "_run": extra}
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))


def read_run_config(run_dir: str | Path) -> tuple[ESConfig, dict[str, Any]]:
    """(config, run info) from `<run_dir>/config.yaml` as written by the trainer."""
    data = yaml.safe_load((Path(run_dir) / "config.yaml").read_text()) or {}
    extra = data.pop("_run", {}) or {}
    return from_dict(data), extra


# ---- argparse glue (used by `esft train es`) ---------------------------------------------------------------------

def _field_doc(name: str) -> str:
    """Docstring under a dataclass field (read from the source, so the help text has one home)."""
    return _FIELD_DOCS.get(name, "")


def _collect_field_docs() -> dict[str, str]:
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(ESConfig)))
    except (OSError, TypeError):  # pragma: no cover - source unavailable (frozen app)
        return {}
    docs: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr) \
                and isinstance(getattr(nxt, "value", None), ast.Constant) and isinstance(nxt.value.value, str):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


_FIELD_DOCS = _collect_field_docs()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--preset`, `--config` and one `--flag` per ESConfig field (defaults None = not given)."""
    parser.add_argument("--preset", choices=sorted(PRESETS), help="start from a preset")
    parser.add_argument("--config", help="YAML file of ESConfig fields (may contain `preset: NAME`)")
    hints = typing.get_type_hints(ESConfig)
    for f in dataclasses.fields(ESConfig):
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        help_text = _field_doc(f.name).replace("%", "%%")
        if f.name == "resume":
            parser.add_argument(flag, nargs="?", const=True, default=None, metavar="DIR",
                                help="continue the run in DIR (or --output-dir)")
        elif hint is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif f.name in ("include", "exclude"):
            parser.add_argument(flag, nargs="*", default=None, help=help_text)
        elif f.name == "task_options":
            parser.add_argument(flag, type=yaml.safe_load, default=None, help=help_text + " (YAML mapping)")
        else:
            base = {int: int, float: float, str: str}.get(hint) or _optional_base(hint)
            parser.add_argument(flag, type=base, default=None, help=help_text)


def _optional_base(hint: Any) -> Any:
    for arg in typing.get_args(hint):
        if arg in (int, float, str):
            return arg
    return str


def config_from_args(args: argparse.Namespace) -> ESConfig:
    """Resolve defaults < preset < --config YAML < explicit flags. `--resume DIR` sets output_dir=DIR."""
    config = preset(args.preset) if getattr(args, "preset", None) else ESConfig()
    if getattr(args, "config", None):
        config = load_yaml(args.config, base=config)
    changes = {}
    for name in field_names():
        value = getattr(args, name, None)
        if value is None:
            continue
        if name == "resume":
            if isinstance(value, str):
                changes["output_dir"] = value
            value = True
        changes[name] = value
    return from_dict(changes, config)
