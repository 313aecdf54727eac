"""Cancelling a generation from another thread: `cancel_on(event)` around it, `check_cancelled()` inside it."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


class GenerationCancelled(Exception):
    """Raised by a generation whose thread's cancel event was set (see `cancel_on`)."""


_CANCEL = threading.local()


@contextmanager
def cancel_on(event: threading.Event) -> Iterator[None]:
    """Within this block, generation on the calling thread raises `GenerationCancelled` soon after `event` is set:
    the esft engine checks once per decode step, both engines between batches (a `model.generate` call runs to its
    end). How a parallel lane of `esft.es.executor.LocalExecutor` stops when another lane fails or Ctrl-C
    arrives."""
    previous = getattr(_CANCEL, "event", None)
    _CANCEL.event = event
    try:
        yield
    finally:
        _CANCEL.event = previous


def check_cancelled() -> None:
    """Raise `GenerationCancelled` if this thread's `cancel_on` event is set (a thread-local read: ~0.1 us)."""
    event = getattr(_CANCEL, "event", None)
    if event is not None and event.is_set():
        raise GenerationCancelled("generation cancelled")
