"""How the Ray executor tells a worker's failures apart, and how long it waits for a worker.

- A worker that is gone (process killed, node lost: `is_worker_death`) or that does not answer a call within its
  deadline (`Deadlines`, raising `WorkerTimeout`) is lost: the executor ends it and re-queues its work.
- A Python exception raised by the code a worker ran (a task's scorer, a model that cannot load) is the same on
  every worker, so it stops the run: `worker_error` turns Ray's `RayTaskError`, whose text is the worker's whole
  traceback, into a one-line `WorkerError` naming the worker, what it ran and the original exception; the Ray
  error stays attached as its cause (`esft --debug` prints it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from esft.es.distributed.connection import import_ray


class WorkerTimeout(TimeoutError):
    """A worker did not answer a call within its deadline; the executor treats it as lost."""


class WorkerError(RuntimeError):
    """A Python exception raised in a Ray worker by the code it ran; `__cause__` is Ray's error with the worker's
    traceback."""


def is_worker_death(exc: BaseException) -> bool:
    """True for a dead actor (process or node gone, or killed by Ray's memory monitor: its member goes to another
    worker); False for an exception raised by our own code in it, a replica's constructor included (Ray reports
    that as an ActorDiedError too)."""
    ray = import_ray()
    errors = tuple(getattr(ray.exceptions, n) for n in ("RayActorError", "ActorDiedError", "ActorUnavailableError",
                                                          "NodeDiedError", "WorkerCrashedError", "OwnerDiedError",
                                                          "OutOfMemoryError") if hasattr(ray.exceptions, n))
    return isinstance(exc, errors) and not getattr(exc, "actor_init_failed", False)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXCEPTION_LINE = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Z]\w*(: |$)")  # "pkg.module.Error: message", a bare "Error"


def original_exception(exc: BaseException) -> str:
    """"Type: message" of the exception raised inside the worker."""
    ray = import_ray()
    cause = getattr(exc, "cause", None) if isinstance(exc, ray.exceptions.RayTaskError) else None
    if cause is not None and not isinstance(cause, ray.exceptions.RayError):
        text = str(cause)
        return f"{type(cause).__name__}: {text}" if text else type(cause).__name__
    # a constructor that raised (ActorDiedError) or an exception Ray could not pickle carries the traceback as
    # text only: Python's "Type: message" is its last unindented line, and a message of several lines (pydantic's)
    # goes on below it, indented
    lines = [line.rstrip() for line in _ANSI.sub("", str(exc)).splitlines() if line.strip()]
    heads = [i for i, line in enumerate(lines) if _EXCEPTION_LINE.match(line)]
    if not heads:
        return lines[-1].strip() if lines else type(exc).__name__
    text = " ".join(line.strip() for line in lines[heads[-1]:])
    return text if len(text) <= 500 else text[:497] + "..."


def worker_error(worker_label: str, what: str, exc: BaseException, consequence: str) -> WorkerError:
    """The one-line error for `exc`, raised by `worker_label` while it ran `what`; raise it `from exc`."""
    return WorkerError(f"{worker_label} raised {original_exception(exc)} in {what}; {consequence} (the worker's "
                       "traceback: esft --debug)")


@dataclass
class Deadlines:
    """How long a call to a worker may run before the worker is treated as hung (then lost, as a dead one).

    The unit is one member: generating and scoring one batch of `batch_size` prompts. A call on n prompts (an
    evaluation of the unperturbed model on the test set) gets n / batch_size members' time, at least one member's;
    an update or a checksum gets one member's time (they take far less). `member_timeout_s` > 0 fixes a member's
    time; 0 derives it from the run: `factor` x the slowest member (or member-equivalent call) seen so far, at least
    `floor_s`, and `first_s` until a first call has returned (the first one can include lazy start-up work)."""

    member_timeout_s: float = 0.0
    first_s: float = 1800.0
    batch_size: int = 0
    factor: float = 10.0
    floor_s: float = 600.0
    slowest_s: float = 0.0

    def _members(self, prompts: int) -> float:
        return max(1.0, prompts / self.batch_size) if self.batch_size > 0 else 1.0

    def member_s(self) -> float:
        if self.member_timeout_s > 0:
            return float(self.member_timeout_s)
        if self.slowest_s <= 0:
            return float(self.first_s)
        return max(self.floor_s, self.factor * self.slowest_s)

    def for_prompts(self, prompts: int) -> float:
        """Seconds a call on `prompts` prompts may take."""
        return self.member_s() * self._members(prompts)

    def observe(self, seconds: float, prompts: int) -> None:
        """A call on `prompts` prompts returned after `seconds`."""
        self.slowest_s = max(self.slowest_s, seconds / self._members(prompts))

    def source(self) -> str:
        """Where the current deadline comes from, for the message that names a hung worker."""
        if self.member_timeout_s > 0:
            return "executor_options member_timeout_s"
        if self.slowest_s <= 0:
            return "start_timeout_s, until a first member returns; set executor_options member_timeout_s"
        return (f"{self.factor:g} x the slowest member so far ({self.slowest_s:.1f} s), at least {self.floor_s:g} s; "
                "set executor_options member_timeout_s")
