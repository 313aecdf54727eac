"""Hand-written CPU kernels, compiled on first use with torch's own C++ extension builder.

Only what no library does well lives here (see each source's header comment). Everything has a path without them:
`load_decode_attention()`, `load_param_passes()` and `load_amx_linear()` return None, with the reason in
`build_error(name)`, when the machine has no C++ compiler (and no finished build), when `ESFT_NO_KERNELS=1`, when
the build fails, or (the AMX linear) when the CPU has no AMX; callers then
use the torch ops. The build (~30-60 s, once per machine and source version) is cached under
`TORCH_EXTENSIONS_DIR` (default ~/.cache/torch_extensions), in a folder of its own per CPU, source file and Python
environment (`build_dir`); a build finished in a cache this process cannot write (a read-only mount) is imported
as it is, when newer than its sources (the .cpp and kernel_common.h). Two checkouts or two virtual environments on
one machine each keep their build instead of rebuilding in turn. A build killed outright leaves torch's lock file
behind, on which every later build would wait forever: `build_lock` (an flock, which dies with its holder) tells
such a lock from a live build's and removes it, or, without flock, `clear_stale_lock` by its age.
"""

from __future__ import annotations

import errno
import hashlib
import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

_LOCK = threading.Lock()
_CACHE: dict[str, object] = {}
_ERRORS: dict[str, str] = {}

#: -ffp-contract=off keeps a*b + c*d as two rounded products and a rounded sum (what torch's elementwise ops do).
#: -fno-trapping-math lets gcc vectorise the exp polynomials (std::floor, selects); it changes no result.
#: -fopenmp: at::parallel_for is an OpenMP loop in the header; linked against the libgomp torch already loaded, it
#: shares torch's thread pool and thread count.
CFLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-trapping-math", "-fopenmp"]
LDFLAGS = ["-fopenmp"]


def _cpu_tag(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> str:
    """Short hash of this CPU's instruction-set flags: the build uses -march=native, so a cache shared between
    machines (a cluster's home directory) must not hand one CPU's binary to another. x86 Linux lists them as
    "flags", arm64 Linux as "Features"."""
    import platform

    flags = platform.machine()
    try:
        with open(cpuinfo) as f:
            flags += next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags += platform.processor()
    return hashlib.sha256(flags.encode()).hexdigest()[:10]


#: a build takes about a minute (a few on a loaded machine): a lock this old belongs to a build that was killed
STALE_LOCK_S = 900


def build_dir(name: str, source: Path | None = None) -> Path:
    """The build folder of kernel `name`: under TORCH_EXTENSIONS_DIR (or torch's default root), keyed by this CPU's
    flags (the build uses -march=native), the source file's path (torch's build file records it, so another
    checkout's build would be redone) and the Python environment with its torch (headers and ABI)."""
    import torch
    from torch.utils.cpp_extension import get_default_build_root

    source = Path(source or Path(__file__).with_name(f"{name}.cpp")).resolve()
    where = hashlib.sha256(f"{source}|{sys.prefix}|{torch.__version__}".encode()).hexdigest()[:8]
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    return root / "esft" / f"{name}_{_cpu_tag()}_{where}"


def clear_stale_lock(folder: Path, name: str, now: float | None = None) -> str | None:
    """Remove `folder`'s build lock when it is older than STALE_LOCK_S (its build was killed: torch would wait on
    it forever); what was done, as a line for stderr, or None when there is no lock. A younger lock is another
    process's build in progress, which the caller waits for (the line says so)."""
    lock = folder / "lock"
    try:
        age = (time.time() if now is None else now) - lock.stat().st_mtime
    except FileNotFoundError:
        return None
    if age > STALE_LOCK_S:
        lock.unlink(missing_ok=True)
        return f"esft: removed {lock}, left {age / 60:.0f} min ago by a build of the {name} kernel that was killed"
    return f"esft: waiting for another process's build of the {name} kernel (its lock: {lock})"


@contextmanager
def build_lock(folder: Path, name: str) -> Iterator[None]:
    """Held while this process builds or loads kernel `name` in `folder`: an flock on `folder`/esft.lock, which
    the kernel releases when its holder dies, however it dies, and which names its last holder's host. Every esft
    build takes it before torch's lock file, so a torch lock found under it, its last holder on this host, was left
    by a killed build and is removed at once (torch would wait on it forever); a process that has to wait for
    another's build says so. A last holder on another host (a shared home directory, whose file system may keep
    flocks per host) or none, or no flock at all (no fcntl, a file system without locks): `clear_stale_lock`'s
    age rule decides instead."""
    import socket

    path, here = folder / "esft.lock", socket.gethostname()
    try:
        import fcntl

        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except (ImportError, OSError):  # Windows, a read-only folder (torch then fails and says why)
        fd = None
    last = None
    try:
        if fd is not None:
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    print(f"esft: waiting for another process's build of the {name} kernel (its lock: {path})",
                          file=sys.stderr, flush=True)
                    fcntl.flock(fd, fcntl.LOCK_EX)
                last = os.read(fd, 256).decode(errors="replace").split("\n")[0]
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{here}\n{os.getpid()}\n".encode(), 0)
            except OSError:  # a file system without locks
                last = None
        lock = folder / "lock"
        if last == here and lock.exists():
            lock.unlink(missing_ok=True)
            print(f"esft: removed {lock}, left by a build of the {name} kernel that was killed", file=sys.stderr,
                  flush=True)
        elif (line := clear_stale_lock(folder, name)) is not None:
            print(line, file=sys.stderr, flush=True)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the flock


def missing_compiler() -> str | None:
    """Why torch's builder cannot compile here, said before it tries (it would print a screen-wide warning that
    the compiler "is not compatible" and fail on "ninja: build stopped"); None when the C++ compiler it calls
    (`CXX`, else c++) is an executable on PATH."""
    import shlex
    import shutil

    cxx = os.environ.get("CXX", "c++")
    words = shlex.split(cxx) if cxx.strip() else []
    if words and shutil.which(words[0]):
        return None
    where = f"CXX={cxx!r} is not an executable" if "CXX" in os.environ else "c++ is not on PATH"
    return f"no C++ compiler: {where} (install g++ or set CXX)"


def build_reason(exc: BaseException) -> str:
    """One line saying why a build failed: the compiler's first error line where torch's message holds the build
    log (whose last line is ninja's "build stopped"), else the message's last line."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    marks = ("error:", "not found", "cannot find", "no such file")  # compiler, shell and linker errors
    errors = [line for line in lines[1:] if any(mark in line.lower() for mark in marks)]
    why = errors[0] if errors else lines[-1] if lines else ""
    return f"{type(exc).__name__}: {why}" if why else type(exc).__name__


@contextmanager
def _quiet_compiler_check(quiet: bool) -> Iterator[None]:
    """Without the compiler torch's builder still checks it before it finds the build up to date, and warns over a
    screen that the compiler "is not compatible": a finished build is loaded without that warning."""
    if not quiet:
        yield
        return
    import logging

    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _load(name: str):
    with _LOCK:
        if name in _CACHE:
            return _CACHE[name]
        if name in _ERRORS:
            return None
        if os.environ.get("ESFT_NO_KERNELS", "") not in ("", "0"):
            _ERRORS[name] = "disabled by ESFT_NO_KERNELS"
            return None
        no_compiler = missing_compiler()
        module_name, source = f"esft_{name}_{_cpu_tag()}", Path(__file__).with_name(f"{name}.cpp")
        folder = None
        try:
            from torch.utils.cpp_extension import load

            folder = build_dir(name)
            # without a compiler only a finished build can load (ninja finds it up to date and compiles nothing)
            if no_compiler is not None and not (folder / f"{module_name}.so").exists():
                _ERRORS[name] = no_compiler
                return None
            folder.mkdir(parents=True, exist_ok=True)
            with build_lock(folder, name), _quiet_compiler_check(no_compiler is not None):
                module = load(name=module_name, sources=[str(source)], extra_cflags=CFLAGS, extra_ldflags=LDFLAGS,
                              build_directory=str(folder), verbose=False)
        except OSError as exc:  # a cache this process cannot write: a build finished there is still usable
            not_writable = folder is not None and exc.errno in _NOT_WRITABLE
            module = _import_finished_build(folder, module_name, source) if not_writable else None
            if module is None:
                _ERRORS[name] = no_compiler or build_reason(exc) + (
                    "; set TORCH_EXTENSIONS_DIR to a writable folder" if not_writable else "")
                return None
        except Exception as exc:  # no compiler, no headers, build error: the torch path takes over
            _ERRORS[name] = no_compiler or build_reason(exc)
            return None
        _CACHE[name] = module
        return module


#: the header every kernel source includes: a build older than it is another version's
COMMON_HEADER = "kernel_common.h"

#: errno values of a folder this process cannot write
_NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def _import_finished_build(folder: Path, module_name: str, source: Path):
    """The library a finished build left in `folder`, imported without torch's loader (which first creates a lock
    file there, and fails where it cannot); None where there is none, or where it is older than `source` and may
    be another version's build."""
    import importlib.util

    library = folder / f"{module_name}.so"
    try:
        if library.stat().st_mtime < max(p.stat().st_mtime for p in (source, source.with_name(COMMON_HEADER))):
            return None
        spec = importlib.util.spec_from_file_location(module_name, library)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except (OSError, ImportError):  # none there, or not loadable here: the caller reports the build's error
        return None
    return module


def load_decode_attention():
    """The compiled `decode_attention` module, or None (then `build_error("decode_attention")` says why)."""
    return _load("decode_attention")


def load_param_passes():
    """The compiled `param_passes` module (ES's perturbation and update passes over the masters), or None (then
    `build_error("param_passes")` says why)."""
    return _load("param_passes")


#: the CPU flags (/proc/cpuinfo) the AMX linear needs
AMX_FLAGS = ("amx_tile", "amx_bf16", "avx512f")


def cpu_flags(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> list[str]:
    """This CPU's feature flags, in the order Linux lists them on the first 'flags' (x86) or 'Features' (Arm) line
    of /proc/cpuinfo; empty where there is none (macOS, Windows). The one reader (esft.generation.precision too)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return value.split()
    except OSError:
        pass
    return []


def amx_missing(flags: Iterable[str]) -> str | None:
    """Why the AMX linear cannot run on a CPU with these flags (None when it can), said before any build."""
    flags = set(flags)
    missing = [f for f in AMX_FLAGS if f not in flags]
    return f"this CPU has no {'/'.join(missing)}" if missing else None


def load_amx_linear():
    """The compiled `amx_linear` module (bf16 linears on AMX tiles, esft.generation.packed), or None (then
    `build_error("amx_linear")` says why: a CPU without AMX is told so before anything is built, and a build whose
    process Linux does not let use the tiles counts as unavailable)."""
    with _LOCK:
        if "amx_linear" not in _CACHE and "amx_linear" not in _ERRORS:
            if (why := amx_missing(cpu_flags())) is not None:
                _ERRORS["amx_linear"] = why
    module = _load("amx_linear")
    if module is None or module.available():
        return module
    with _LOCK:
        _CACHE.pop("amx_linear", None)
        _ERRORS["amx_linear"] = "Linux did not grant this process the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)"
    return None


def build_error(name: str = "decode_attention") -> str | None:
    return _ERRORS.get(name)


def kernel_status(name: str = "decode_attention") -> str | None:
    """"loaded", why it did not build (`build_error`), or None when nothing in this process asked for it yet;
    builds nothing."""
    return "loaded" if name in _CACHE else _ERRORS.get(name)
