"""Hand-written CPU kernels, compiled on first use with torch's own C++ extension builder.

Only what no library does well lives here (see each source's header comment). Everything has a pure-torch path:
`load_decode_attention()` returns None, with the reason in `build_error()`, when the machine has no C++ compiler,
when `ESFT_NO_KERNELS=1`, or when the build fails; callers then use the torch ops. The build (~30-60 s, once per
machine and source version) is cached by torch under `TORCH_EXTENSIONS_DIR` (default ~/.cache/torch_extensions).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

_LOCK = threading.Lock()
_CACHE: dict[str, object] = {}
_ERRORS: dict[str, str] = {}

#: -ffp-contract=off keeps a*b + c*d as two rounded products and a rounded sum (what torch's elementwise ops do).
#: -fno-trapping-math lets gcc vectorise the exp polynomials (std::floor, selects); it changes no result.
#: -fopenmp: at::parallel_for is an OpenMP loop in the header; linked against the libgomp torch already loaded, it
#: shares torch's thread pool and thread count.
CFLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-trapping-math", "-fopenmp"]
LDFLAGS = ["-fopenmp"]


def _cpu_tag() -> str:
    """Short hash of this CPU's instruction-set flags: the build uses -march=native, so a cache shared between
    machines (a cluster's home directory) must not hand one CPU's binary to another."""
    import hashlib
    import platform

    flags = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            flags += next((line for line in f if line.startswith("flags")), "")
    except OSError:
        flags += platform.processor()
    return hashlib.sha256(flags.encode()).hexdigest()[:10]


def _load(name: str):
    with _LOCK:
        if name in _CACHE:
            return _CACHE[name]
        if name in _ERRORS:
            return None
        if os.environ.get("ESFT_NO_KERNELS", "") not in ("", "0"):
            _ERRORS[name] = "disabled by ESFT_NO_KERNELS"
            return None
        try:
            from torch.utils.cpp_extension import load

            module = load(name=f"esft_{name}_{_cpu_tag()}", sources=[str(Path(__file__).with_name(f"{name}.cpp"))],
                          extra_cflags=CFLAGS, extra_ldflags=LDFLAGS, verbose=False)
        except Exception as exc:  # no compiler, no headers, build error: the torch path takes over
            _ERRORS[name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
            return None
        _CACHE[name] = module
        return module


def load_decode_attention():
    """The compiled `decode_attention` module, or None (then `build_error("decode_attention")` says why)."""
    return _load("decode_attention")


def build_error(name: str = "decode_attention") -> str | None:
    return _ERRORS.get(name)
