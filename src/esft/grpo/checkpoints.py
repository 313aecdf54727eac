"""A GRPO run's checkpoints: which are complete, which are damaged, and which one a resume starts from."""

from __future__ import annotations

import warnings
from pathlib import Path

from esft import rundir
from esft.grpo.trl_trainer import TRAINER_STATE


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of the complete checkpoints of a GRPO run, sorted by step (`final` last among its step)."""
    found = rundir.list_checkpoints(Path(run_dir), TRAINER_STATE, "global_step")
    return sorted(found, key=lambda x: (x[0], x[1].name == "final"))


#: what transformers reads to resume exactly; it skips a missing one without a word (a fresh AdamW, the LR schedule
#: restarted, other sampling), so a checkpoint without them is damaged, not a starting point
RESUME_FILES = ("optimizer.pt", "scheduler.pt", "rng_state*.pth")


def checkpoint_damage(folder: Path, model_only: bool = False) -> str | None:
    """Why transformers could not resume exactly from `folder`, or None: no weights, one of RESUME_FILES missing
    (unless `model_only`: a run with TRL's save_only_model never writes them), a safetensors file whose header does
    not cover it (a truncated copy), or a torch-saved file (optimizer, scheduler, RNG, arguments) that is no whole
    zip archive."""
    import zipfile

    from safetensors import safe_open

    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        return "no safetensors weights"
    missing = [] if model_only else [name for name in RESUME_FILES if not any(folder.glob(name))]
    if missing:
        return f"no {', '.join(missing)}"
    for path in weights:
        try:
            with safe_open(str(path), "pt"):
                pass
        except Exception as exc:  # safetensors raises its own error type for every kind of bad file
            return f"{path.name}: {exc}"
    for path in sorted([*folder.glob("*.pt"), *folder.glob("*.pth"), *folder.glob("*.bin")]):
        try:
            with zipfile.ZipFile(path):
                pass
        except (zipfile.BadZipFile, OSError) as exc:
            return f"{path.name}: {exc}"
    return None


def resume_checkpoint(run_dir: Path, num_iterations: int = 1, max_steps: int | None = None,
                      model_only: bool = False) -> tuple[int, Path | None]:
    """(step, folder) of the newest checkpoint transformers can resume from, (0, None) when there is none; a
    damaged newer one is skipped with a warning, as the ES trainer skips one, and the steps after the one taken are
    trained again. So is one (before max_steps) inside a generation round of num_iterations > 1 updates: TRL keeps
    that round's completions only in memory and would sample a new round there, which the uninterrupted run did not.
    `model_only`: the run saves weights alone (TRL's save_only_model), see checkpoint_damage."""
    found = list_checkpoints(run_dir)
    for i in range(len(found) - 1, -1, -1):
        step, folder = found[i]
        then = "resuming from the one before it" if i else "no checkpoint before it: training again from step 0"
        damage = checkpoint_damage(folder, model_only)
        if damage is None and step % num_iterations and (max_steps is None or step < max_steps):
            warnings.warn(f"checkpoint {folder} (step {step}) lies inside a generation round of num_iterations = "
                          f"{num_iterations} updates, whose completions were not saved; {then}", stacklevel=2)
            continue
        if damage is None:
            return step, folder
        warnings.warn(f"checkpoint {folder} is damaged ({damage}); {then}", stacklevel=2)
    return 0, None


__all__ = ["RESUME_FILES", "checkpoint_damage", "list_checkpoints", "resume_checkpoint"]
