"""Joining a Ray cluster for a run: `connect_ray` (after `check_reachable`, since Ray itself keeps retrying an
address that does not answer) and `disconnect_ray`; the driver's SIGTERM handler survives `ray.init`, and a Ctrl-C
during it stops the run once Ray can be shut down cleanly; `actor_slots` counts the workers the cluster's nodes hold."""

from __future__ import annotations

import logging
import os
import signal
from contextlib import contextmanager
from typing import Sequence


def import_ray():
    """`ray`, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the ray executor needs Ray: pip install 'esft[ray]'") from exc
    return ray


@contextmanager
def _keep_sigterm_handler():
    """ray.init replaces the driver's SIGTERM handler by `sys.exit(15)`, which would bypass esft's Ctrl-C path
    (esft.cli: weights restored, the resume command printed, exit 130); put back a Python handler it replaced.
    Without one (the default action) Ray's stays: its exit shuts down the Ray processes this driver started."""
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if callable(previous):
            signal.signal(signal.SIGTERM, previous)


class _Held(list):
    """The signals `_interrupt_after` held; `holds_sigterm`: SIGTERM is one it holds (esft's handler was set)."""

    holds_sigterm = False


@contextmanager
def _interrupt_after():
    """Hold a Ctrl-C (or esft's SIGTERM, which acts as one) that arrives during `ray.init`, which a second one
    interrupts at once; the caller shuts Ray down and raises it afterwards. A ray.init (Ray 2.60) interrupted
    halfway left the processes it had started running after the driver exited, or the driver ended with a
    segmentation fault at exit. Yields a list that holds the held signal, if any."""
    import signal
    import threading

    held = _Held()
    if threading.current_thread() is not threading.main_thread():
        yield held
        return

    def hold(signum: int, frame: object) -> None:
        if held:
            raise KeyboardInterrupt
        held.append(signum)

    # SIGTERM only where a Python handler acts on it (esft's CLI); by default it ends the process, Ray included
    signals = [signal.SIGINT] + ([signal.SIGTERM] if callable(signal.getsignal(signal.SIGTERM)) else [])
    previous = {s: signal.signal(s, hold) for s in signals}
    held.holds_sigterm = signal.SIGTERM in signals
    try:
        yield held
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


#: seconds `check_reachable` waits for a cluster's port to accept a connection
PROBE_TIMEOUT_S = 10.0


def cluster_endpoint(address: str | None) -> tuple[str, int] | None:
    """(host, port) that joining `address` connects to: "HOST:PORT" (the head's GCS) or "ray://HOST:PORT" (Ray
    Client); None for what Ray resolves itself ("auto", "local", None, anything else). "[v6]:PORT" is unbracketed."""
    text = (address or "").strip()
    if text.startswith("ray://"):
        text = text[len("ray://"):]
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or "/" in text:
        return None
    return host.strip("[]"), int(port)


def check_reachable(address: str | None, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise ConnectionError unless the cluster `address` names (or $RAY_ADDRESS, when it is None) accepts a TCP
    connection within `timeout_s`. Ray 2.60's `ray.init` keeps retrying an unreachable HOST:PORT (measured:
    a closed port was still retried, with a warning every ~40 s, when stopped after 60 s:
    docs/results/bench/ray-unreachable-2026-12-02), so a typo would hang the run."""
    import socket

    address = address or os.environ.get("RAY_ADDRESS")
    endpoint = cluster_endpoint(address)
    if endpoint is None:
        if (address or "").strip().startswith("ray://") and "/" in address.strip()[len("ray://"):]:
            # Ray Client hands the text after ray:// to gRPC as host:port, path and all
            raise ValueError(f"Ray address {address!r} has a path: Ray Client addresses are ray://HOST:PORT, with "
                             "nothing after the port; fix --ray-address or $RAY_ADDRESS")
        if (address or "").strip().startswith("ray://"):
            # Ray Client would dial gRPC's default port (443) and report only a timeout after 30 s
            raise ValueError(f"Ray address {address!r} names no port: Ray Client addresses are ray://HOST:PORT "
                             "(the head's client server listens on 10001 unless `ray start --ray-client-server-port` "
                             "says otherwise); fix --ray-address or $RAY_ADDRESS")
        text = (address or "").strip()
        port = text.rpartition(":")[2]
        if ":" in text and "://" not in text and "]" not in port and not port.isdigit():
            # "localhost:" or "HOST:PORTX": Ray's own error names neither the flag nor the form it wants
            raise ValueError(f"Ray address {address!r} names no port number: a cluster's address is HOST:PORT (the "
                             "head's GCS port, 6379 unless `ray start --port` says otherwise); fix --ray-address or "
                             "$RAY_ADDRESS")
        return
    if not 0 < endpoint[1] < 65536:  # the resolver would take it modulo 65536 and probe another port
        raise ValueError(f"Ray address {address!r}: {endpoint[1]} is not a TCP port (1-65535); fix --ray-address "
                         "or $RAY_ADDRESS")
    try:
        socket.create_connection(endpoint, timeout=timeout_s).close()
    except OSError as exc:
        why = "host name not found" if isinstance(exc, socket.gaierror) else (
            f"no answer within {timeout_s:g} s" if isinstance(exc, TimeoutError) else exc.strerror or str(exc))
        raise ConnectionError(
            f"cannot reach a Ray cluster at {address!r} ({why}): is `ray start --head` running on {endpoint[0]} "
            f"with that port? Fix --ray-address or $RAY_ADDRESS (docs/distributed.md)") from exc


#: the GCS's refusal of a client's token (none sent, or not the cluster's), as Ray 2.60 words it; ray.init raises
#: a bare "Failed to connect to Ray cluster at ..." ConnectionError whose cause's text holds it
#: (docs/results/bench/ray-token-auth-2026-12-05)
GCS_AUTH_REFUSED = "InvalidAuthToken: Authentication token is missing or incorrect"
#: the same refusal by Ray Client's server (a `ray://` address), which Ray 2.60's client only logs at DEBUG level
#: while it retries, then raises "ray client connection timeout" (docs/results/bench/ray-token-auth-2026-12-05)
CLIENT_AUTH_REFUSED = "Invalid or missing authentication token"


@contextmanager
def _client_log():
    """The messages Ray Client logs while it connects (`ray.util.client.worker`, DEBUG included), for
    `auth_failure`; the log's handlers still see only what they saw before."""
    log = logging.getLogger("ray.util.client.worker")
    level, shown = log.level, log.getEffectiveLevel()
    lines: list[str] = []

    def keep(record: logging.LogRecord) -> bool:
        lines.append(record.getMessage())
        return record.levelno >= shown

    log.setLevel(logging.DEBUG)
    log.addFilter(keep)
    try:
        yield lines
    finally:
        log.removeFilter(keep)
        log.setLevel(level)


def auth_failure(exc: BaseException, client_log: Sequence[str] = ()) -> str | None:
    """Ray's reason when `exc`, raised by `ray.init`, is a failure of its token authentication, else None: Ray's
    AuthenticationError (RAY_AUTH_MODE=token here and no token found), or the cluster's refusal of the token, which
    Ray 2.60 reports only as text in the cause of a ConnectionError, or, through Ray Client, in its log
    (`client_log`) before a ConnectionError."""
    if isinstance(exc, ConnectionError) and any(CLIENT_AUTH_REFUSED in line for line in client_log):
        return CLIENT_AUTH_REFUSED
    seen: BaseException | None = exc
    while seen is not None:
        if any(c.__module__ == "ray.exceptions" and c.__name__ == "AuthenticationError" for c in type(seen).__mro__):
            return str(getattr(seen, "message", "")) or type(seen).__name__
        if GCS_AUTH_REFUSED in str(seen):
            return GCS_AUTH_REFUSED
        seen = seen.__cause__
    return None


def auth_message(address: str | None, reason: str) -> str:
    """The error for a token authentication that `auth_failure` found failed: what to set, and where."""
    where = f" at {address!r}" if address else ""
    sends = os.environ.get("RAY_AUTH_MODE", "").strip().lower() == "token"
    fix = ("give the cluster's token" if sends else
           "this client sends no token unless RAY_AUTH_MODE=token: set it and give the cluster's token")
    refused = reason in (GCS_AUTH_REFUSED, CLIENT_AUTH_REFUSED)
    what = f"the Ray cluster{where} refused authentication" if refused else (
        f"cannot authenticate to the Ray cluster{where}")
    return (f"{what} (Ray: {reason}); {fix} as "
            "$RAY_AUTH_TOKEN, in a file named by $RAY_AUTH_TOKEN_PATH, or in ~/.ray/auth_token (`ray get-auth-token` "
            "on the head prints it) (docs/distributed.md)")


def connect_ray(address: str | None) -> bool:
    """Connect this process to Ray (`ray.init`) unless it already is; True when this call connected. address None
    lets Ray resolve $RAY_ADDRESS or a running local cluster, else start one; auth is left at Ray's defaults
    (token auth on clusters that use it). An address whose port does not answer raises ConnectionError
    (`check_reachable`) before Ray is asked; a failed token authentication, one that says what to set."""
    ray = import_ray()
    if ray.is_initialized():
        return False  # a caller (script, test) owns the connection
    check_reachable(address)
    with _keep_sigterm_handler(), _interrupt_after() as interrupted, _client_log() as client_log:
        try:
            ray.init(address=address or None, logging_level=logging.WARNING)
        except SystemExit as exc:
            # ray.init first installs a SIGTERM handler of its own, `sys.exit(SIGTERM)` (Ray 2.60), so a SIGTERM
            # during it would end the driver with status 15 and no word; where esft's handler was in place it
            # stops the run as the held interrupt does
            if not (interrupted.holds_sigterm and exc.code == signal.SIGTERM):
                raise
            interrupted.append(exc.code)
        except Exception as exc:
            reason = auth_failure(exc, client_log)
            if reason is not None:
                raise ConnectionError(auth_message(address or os.environ.get("RAY_ADDRESS"), reason)) from exc
            # where the address came from, in esft's words (Ray's messages name its own `--address`)
            source = ("the address is $RAY_ADDRESS's; esft's flag is --ray-address" if not address
                      and os.environ.get("RAY_ADDRESS") else "esft's flag is --ray-address")
            if isinstance(exc, ValueError):  # an address Ray cannot parse; its message may run over several lines
                raise ValueError(f"{' '.join(str(exc).split())} ({source})") from exc
            if not isinstance(exc, ConnectionError):
                raise
            raise ConnectionError(f"{exc} ({source})") from exc  # e.g. "auto" with no cluster
    if interrupted:
        ray.shutdown()
        raise KeyboardInterrupt
    return True


def disconnect_ray() -> None:
    """Shut down this process's Ray connection (and the local instance it started), if any."""
    ray = import_ray()
    if ray.is_initialized():
        ray.shutdown()


#: what `actor_slots` counts on a node for an actor that asks for no CPU and no GPU
UNBOUNDED_SLOTS = 1 << 30


def actor_slots(nodes: Sequence[dict[str, float]], num_cpus: float, num_gpus: float) -> int:
    """How many actors asking for `num_cpus` CPUs and `num_gpus` GPUs each the nodes (their total resources, as
    `ray.nodes()` reports them) hold at once: an actor runs on one node, so a node's leftovers do not add up."""
    total = 0
    for res in nodes:
        # Ray counts fractional resources in units of 1e-4: a small tolerance keeps 1.0 // (1 / 3) at 3
        counts = [int((float(res.get(key, 0)) + 1e-6) // need) for key, need in (("CPU", num_cpus), ("GPU", num_gpus))
                  if need > 0]
        total += min(counts) if counts else UNBOUNDED_SLOTS
    return total


def workers_use_gpu(device: str | None, use_gpu: bool | None, cluster_gpus: int) -> bool:
    """Whether the Ray workers run on GPUs, one rule for the threads they are given and the resources they ask
    for: `use_gpu` (an executor option) when set; else by `device`, where None means the loader's default (CUDA
    where there is one), so GPU workers exactly where the cluster has GPUs."""
    if use_gpu is not None:
        return bool(use_gpu)
    if device is None:
        return cluster_gpus > 0
    return not str(device).startswith("cpu")
