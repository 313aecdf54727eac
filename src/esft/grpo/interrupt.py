"""The checkpoint of the last finished step when a GRPO run is interrupted (Ctrl-C, SIGTERM).

Checkpoints come every save_steps (by default only the final one), and a resume starts from the newest one and
drops the log lines after it: without this, a run stopped at step 79 of 80 would restart from step 0. A step is
finished once its train record is written; the weights, AdamW state and LR schedule then stay those of that step
until the next optimizer update begins, so an interrupt outside an update can save them. An interrupt during the
step's held-out evaluation (greedy: it draws no random numbers) keeps the step, and the resumed run evaluates it
first. The RNG states saved with them are the ones a scheduled checkpoint of that step would have held (taken when
the step finished, before the next generation round draws from them), so the resumed run samples what an
uninterrupted one would. TRL's count of input tokens seen is saved as at the step's end too: TRL adds a round's
tokens when it generates them, before the round's first update.

Such a checkpoint holds a mark (INTERRUPT_MARK), written before it is moved into checkpoints/: once the run has
a newer checkpoint, a marked one that save_steps did not ask for is deleted (`drop_interrupt_saves`), and
save_total_limit never counts one, so a run interrupted and resumed ends with the checkpoints an uninterrupted one
has. A second Ctrl-C while the step is saved leaves no half-written checkpoint.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback


def rng_states() -> dict[str, Any]:
    """The states transformers saves in a checkpoint's rng_state.pth (one process)."""
    states: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                              "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.random.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["cpu"])
    if "cuda" in states:
        torch.cuda.random.set_rng_state_all(states["cuda"])


class StepBoundary(TrainerCallback):
    """Tracks whether the trainer's weights and optimizer are those of a finished step. Added after every other
    callback, so that a step's update begins after their pre-update hooks; its `recorded()` mark goes right after
    the callback that writes a step's train record (esft.grpo.run), before the step's evaluation."""

    def __init__(self) -> None:
        self.finished: int | None = None  # the latest finished step (its train record written)
        self.saved: int | None = None  # the latest step with a checkpoint
        self.updating = False  # inside an optimizer update: the weights are between two steps
        self.rng: dict[str, Any] | None = None
        # TRL's token count at the step's end: it adds a round's tokens when it generates them, so an interrupt
        # after the next round began would save them with the finished step
        self.tokens_seen: int | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any):
        self.finished = self.saved = int(state.global_step)  # a fresh run (0) or the checkpoint resumed from
        self.updating = False

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any):
        self.updating = True

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any):
        # last of the step's callbacks: its evaluation and every other callback ran, so the RNG states are those a
        # scheduled checkpoint of the step holds (a reward drawing random numbers at evaluation moved them)
        if logs and "train_runtime" not in logs:  # a step's record, not the end-of-training summary
            self.mark(state)
            self.rng = rng_states()

    def mark(self, state: Any) -> None:
        """The step of `state` is finished: its RNG states and token count are taken at its first mark (the RNG
        states again at the boundary's own on_log, after the step's evaluation)."""
        step = int(state.global_step)
        if self.finished != step or self.updating:
            self.updating = False
            self.finished = step
            self.rng = rng_states()
            self.tokens_seen = state.num_input_tokens_seen

    def recorded(self) -> TrainerCallback:
        """A callback whose on_log of a step marks it finished (`mark`), for the place right after the train
        record's writer: an interrupt during the step's evaluation then saves the step with the RNG states of
        before the evaluation, which equal those after it when the evaluation draws no random numbers (greedy)."""
        boundary = self

        class Recorded(TrainerCallback):
            def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any):
                if logs and "train_runtime" not in logs:
                    boundary.mark(state)

        return Recorded()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any):
        self.saved = int(state.global_step)

    def unsaved_step(self, state: Any) -> int | None:
        """The finished step to checkpoint now, or None: none finished since the last checkpoint, or the weights
        are mid-update (or a step's records are not all written yet)."""
        step = int(state.global_step)
        if self.updating or self.finished != step or step == self.saved or self.rng is None:
            return None
        return step


#: the file that marks a checkpoint written because the run was interrupted, not because save_steps asked for it
INTERRUPT_MARK = "esft_interrupt_save.json"


def mark_interrupt_save(folder: Path, step: int) -> None:
    (Path(folder) / INTERRUPT_MARK).write_text(json.dumps({"step": int(step)}) + "\n")


def interrupt_only(step: int, folder: Path, save_steps: int) -> bool:
    """Whether the checkpoint (step, folder) was written on an interrupt at a step save_steps does not ask for
    (`save_steps` as TRL's arguments hold it: max_steps where esft's is 0, only the final one)."""
    return folder.name.startswith("iter_") and (folder / INTERRUPT_MARK).exists() and (
        save_steps <= 0 or bool(step % save_steps))


def drop_interrupt_saves(checkpoints: list[tuple[int, Path]], save_steps: int) -> list[Path]:
    """Delete the `interrupt_only` checkpoints among (step, folder); returns them."""
    dropped = [folder for step, folder in checkpoints if interrupt_only(step, folder, save_steps)]
    for folder in dropped:
        shutil.rmtree(folder)
    return dropped


def interrupted_message(finished: int, total: int, saved: Path | None, pending: int | None, again: bool,
                        num_iterations: int, saved_step: int | None, cont: int, run_dir: Path) -> str:
    """The one line a Ctrl-C ends a GRPO run with: the steps finished, what was saved of them (`saved` now, or
    `saved_step` before; `pending`, the step not saved; `again`, a second Ctrl-C stopped its save) and how to go on."""
    what = (f": saved {saved}" if saved is not None
            else f": interrupted again while step {pending} was saved, so it is not saved" if again
            else f": step {pending} lies inside a generation round of num_iterations = {num_iterations} updates, "
                 "not saved" if pending is not None
            else f": step {saved_step} is saved already" if saved_step is not None else "")
    return (f"interrupted with {finished} of {total} step{'s' * (total != 1)} finished{what}; continue from step "
            f"{cont} with `esft train grpo --resume --output-dir {run_dir}`")
