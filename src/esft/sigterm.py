"""SIGTERM (`kill PID`, a cluster scheduler's preemption) stops esft's work as Ctrl-C does: an ES run restores its
weights, a GRPO run checkpoints its last finished step, an experiment marks its stage stopped, and each prints how
to continue, instead of the process ending without a word. One rule for the command line and for scripts."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Ctrl-C and SIGTERM that arrive within the block are delivered as it ends. Around an import that CPython runs
    partly in C (numpy's): a KeyboardInterrupt raised while CPython builds the ImportError of an optional module can
    surface as a TypeError ("expected a message argument") with a traceback instead of as the interrupt. Main thread
    only, where the platform can block signals (POSIX); elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)  # a pending signal is handled here, at a clean point


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block SIGTERM raises KeyboardInterrupt. Only in the main thread (Python delivers signals there)
    and where SIGTERM is at its default, so a script's own handler is left alone; the default is restored after."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
