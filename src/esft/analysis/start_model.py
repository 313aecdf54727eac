"""Which model a checkpoint was fine-tuned from, as its run folder records it, checked against the base that an
analysis measures its update from (`esft analyze weights --base`).

Equal tensor shapes do not tell a checkpoint of another base model of the same architecture: its update measured
from --base would be the difference of two pretrained models. A checkpoint RUN/checkpoints/NAME records its start
model in RUN/config.yaml (`model`, or `model_name_or_path`); a later stage of a sequence started from an earlier
stage's checkpoint, so the record is followed back through such checkpoints until it reaches --base. Two folders
hold the same model when they are the same folder, or when their tensors agree in names, shapes and first rows (a
copy of the base elsewhere). A checkpoint outside a run folder (a bare Hugging Face folder, an export) records
nothing, and one whose recorded start model is not on disk here cannot be checked: each gets a one-line note.

`check_base` is that check in `esft analyze weights|kl|landscape|sparsity` (each command's `--no-check-base`
skips it).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterable

import torch

from esft.analysis.runs import CHECKPOINTS, Run, read_config, resolve_model


def recorded_start(checkpoint: Path) -> tuple[Path, str | None] | None:
    """(run folder, the model spec its config.yaml records, None if none) for a checkpoint inside a run folder;
    None for one outside a run folder."""
    run = checkpoint.parent.parent
    if checkpoint.parent.name != CHECKPOINTS or not (run / "config.yaml").is_file():
        return None
    config = read_config(run / "config.yaml")
    spec = config.get("model") or config.get("model_name_or_path")
    return run, (str(spec) if spec else None)


def same_weights(a: Path, b: Path) -> bool | None:
    """Whether folders `a` and `b` hold the same model: the same folder, or every tensor's name, shape and first
    row equal (one row per tensor: cheap for any size, and fine-tuning or another seed changes them all); None
    when either folder's weights cannot be read (no safetensors)."""
    from esft.analysis.sources import CheckpointSource

    if a.resolve() == b.resolve():
        return True
    try:
        sa, sb = CheckpointSource(a), CheckpointSource(b)
    except (OSError, ValueError):
        return None
    shapes = sa.shapes()
    if shapes != sb.shapes():
        return False
    for key, shape in shapes.items():
        rows = (0, 1) if shape else (None, None)
        if not torch.equal(sa.read(key, *rows), sb.read(key, *rows)):  # values: a bf16 copy re-saved as fp32 passes
            return False
    return True


def check_start_model(checkpoint: str | Path, base: str | Path, base_spec: str | None = None) -> str | None:
    """None when `checkpoint`'s recorded start model is `base` (directly or through earlier stages'
    checkpoints); a one-line note when nothing records it or the record cannot be checked here; ValueError, naming
    the recorded model, when it started from another model."""
    ck, base = Path(checkpoint), Path(base)
    shown = base_spec or str(base)
    steps: list[str] = []
    visited: set[Path] = set()
    here, same = ck, False
    while True:
        rec = recorded_start(here)
        if rec is None:
            if not steps:
                return (f"{ck}: not inside a run folder, so nothing records which model it was fine-tuned from; "
                        f"not checked against --base {shown}")
            break  # an earlier stage's start that is not --base and records nothing further
        run, spec = rec
        if spec is None:
            return f"{ck}: {run / 'config.yaml'} records no start model; not checked against --base {shown}"
        start = resolve_model(spec, Run(run, "unknown", {}))
        if start is None:
            return (f"{ck}: its run records the start model {spec!r} ({run / 'config.yaml'}), which is not on disk "
                    f"here; not checked against --base {shown}")
        steps.append(f"{spec!r} ({run / 'config.yaml'})")
        same = same_weights(start, base)
        if same is None:
            return f"{ck}: the weights of its start model {start} cannot be read; not checked against --base {shown}"
        if same or start in visited:
            break
        visited.add(start)
        here = start
    if same:
        return None
    chain = ", which started from ".join(steps)
    raise ValueError(f"{ck} was fine-tuned from {chain}, not from --base {shown}: its update would be measured "
                     "from another model. Give that model as --base, or --no-check-base to compare anyway")


def check_start_models(base: str | Path, checkpoints: Iterable[str | Path], base_spec: str | None = None,
                       ) -> list[str]:
    """`check_start_model` for every checkpoint folder: the notes, in order; ValueError at the first checkpoint
    fine-tuned from another model than `base`."""
    notes = [check_start_model(ck, base, base_spec) for ck in checkpoints]
    return [n for n in notes if n]


def check_base(command: str, base: str | Path, checkpoints: Iterable[str | Path | None], base_spec: str) -> None:
    """What `esft analyze COMMAND` runs before its heavy work: `check_start_models` of the checkpoints given (None
    for one not given), each note a line on stderr."""
    for note in check_start_models(base, [ck for ck in checkpoints if ck], base_spec):
        print(f"esft analyze {command}: {note}", file=sys.stderr, flush=True)
