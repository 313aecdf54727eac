"""Helpers shared by the task modules: cached bundled data, seeded sampling, Hugging Face hub loading.

Kept out of `base.py` so the public `Task` contract stays small.
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any, Sequence, TypeVar

from esft.tasks.base import Example, UnknownTaskOption, read_bundled_jsonl

T = TypeVar("T")

#: Seed for every data split (train samples, shuffles). Splits must not move when training seeds change.
SPLIT_SEED = 42
#: Train-split size of every trained task (paper: 200 examples, the whole ES batch).
TRAIN_SIZE = 200
#: Test-split size of the tasks with a 2,000-example test set (paper Table 19).
TEST_SIZE = 2000


@lru_cache(maxsize=None)
def bundled(filename: str) -> tuple[Example, ...]:
    """Parsed rows of a bundled file, read once per process. Callers must not mutate the rows
    (every task builds fresh example dicts from them)."""
    return tuple(read_bundled_jsonl(filename))


def seeded_sample(rows: Sequence[T], k: int, seed: int = SPLIT_SEED) -> list[T]:
    """`k` rows drawn without replacement by `random.Random(seed)` (order = draw order)."""
    return random.Random(seed).sample(list(rows), min(k, len(rows)))


def seeded_shuffle(rows: Sequence[T], seed: int = SPLIT_SEED) -> list[T]:
    out = list(rows)
    random.Random(seed).shuffle(out)
    return out


def parse_hf_spec(spec: str, default_config: str | None = None) -> tuple[str, str | None]:
    """`"owner/name"` or `"owner/name:config"` -> (dataset, config)."""
    name, sep, config = spec.strip().partition(":")
    if not name:
        raise ValueError(f"empty hf_dataset spec {spec!r}")
    return name, (config if sep and config else default_config)


def load_hub_rows(spec: str, split: str, default_config: str | None = None) -> list[dict[str, Any]]:
    """Rows of one split of a Hugging Face hub dataset, as plain dicts.

    `split` accepts the `datasets` slicing syntax (e.g. "train[:10002]"). `datasets` is imported lazily: it is
    an optional dependency (`pip install 'esft[hub]'`) and the bundled data is the default everywhere.
    """
    try:
        import datasets  # noqa: PLC0415 - optional dependency, imported on demand
    except ImportError as exc:
        raise RuntimeError(
            f"hf_dataset={spec!r} needs the `datasets` package (pip install 'esft[hub]'); "
            "leave hf_dataset unset to use the bundled data"
        ) from exc
    name, config = parse_hf_spec(spec, default_config)
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except (OSError, ValueError) as exc:  # unreachable hub or missing dataset (OSError), unknown split/config
        raise RuntimeError(
            f"could not load Hugging Face dataset {name!r} (config {config!r}, split {split!r}): "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    return [dict(row) for row in ds]


def constructor_options(cls: type, options: dict[str, Any]) -> str:
    """Where `options` do not fit `cls`'s constructor: "; options: a, b" (what it takes by keyword), or why none can
    build it; "" where they fit (the constructor's own TypeError) or its signature cannot be read."""
    import inspect

    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # a builtin or C type without a readable signature
        return ""
    try:
        signature.bind(**options)
        return ""
    except TypeError:
        pass
    params = list(signature.parameters.values())
    needed = [p.name for p in params if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if needed:
        return f"; it needs positional arguments ({', '.join(needed)}), which task options cannot give"
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return f"; options: {', '.join(names)}" if names else "; it takes no options"


def unknown_option(cls: type, options: dict[str, Any]) -> str | None:
    """The first of `options` that `cls`'s constructor takes by no name (None where it takes any keyword, or its
    signature cannot be read): refused as a built-in task's unknown option is."""
    import inspect

    try:
        params = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return next((key for key in options if key not in names), None)


def construct(cls: type, name: str, options: dict[str, Any]) -> Any:
    """`cls(**options)`, the user's task class of task `name`; its failure as a ValueError naming the class, and,
    where the options do not fit the constructor (a TypeError), the options it takes."""
    unknown = unknown_option(cls, options)
    if unknown is not None:  # worded as a built-in task's (esft.tasks.get_task), with what the class takes
        raise UnknownTaskOption(f"task {name!r}: unknown option {unknown!r}{constructor_options(cls, options)}")
    try:
        return cls(**options)
    except Exception as exc:  # the user's constructor: a bad option, or its own error
        fit = constructor_options(cls, options) if isinstance(exc, TypeError) else ""
        raise ValueError(f"task {name!r}: cannot build {cls.__name__}: {type(exc).__name__}: {exc}{fit}") from exc
