"""esft.kernels at the edges test_kernels.py leaves open: the CPU tag of a machine without /proc/cpuinfo, a finished
build as old as its source, `kernel_status`, and which build error is told to move the cache."""

from __future__ import annotations

import os
import platform

from esft import kernels
from test_kernels import ext  # noqa: F401  (fixture: the built kernel)


def test_without_cpuinfo_the_cpu_tag_still_tells_processors_apart(tmp_path, monkeypatch):
    """No /proc/cpuinfo (macOS, some containers): the tag falls back on platform.processor(), so two processors
    of one machine type sharing a cache still build in folders of their own."""
    missing = tmp_path / "no-cpuinfo"
    monkeypatch.setattr(platform, "processor", lambda: "cpu-one")
    one = kernels._cpu_tag(missing)
    monkeypatch.setattr(platform, "processor", lambda: "cpu-two")
    assert kernels._cpu_tag(missing) != one


def test_a_finished_build_as_old_as_its_source_is_used_from_a_read_only_cache(ext, tmp_path, monkeypatch):
    """A cache copied with its times kept (an image, `cp -p`) can give the build its sources' own time: not older
    than the source or the shared header it includes, so it is this version's build and is used."""
    import errno
    import os
    import shutil
    from pathlib import Path

    import torch.utils.cpp_extension as cpp_extension

    library = f"esft_decode_attention_{kernels._cpu_tag()}.so"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = kernels.build_dir("decode_attention")
    folder.mkdir(parents=True)
    shutil.copy(Path(ext.__file__), folder / library)
    source = Path(kernels.__file__).with_name("decode_attention.cpp")
    same = max(p.stat().st_mtime_ns for p in (source, source.with_name(kernels.COMMON_HEADER)))
    os.utime(folder / library, ns=(same, same))

    def read_only(**kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(folder / "lock"))

    monkeypatch.setattr(cpp_extension, "load", read_only)
    monkeypatch.setattr(kernels, "_CACHE", {})
    monkeypatch.setattr(kernels, "_ERRORS", {})
    assert kernels.load_decode_attention() is not None, kernels.build_error()


def test_kernel_status_says_loaded_why_not_or_nothing_yet(ext, monkeypatch):
    """What `esft bench` reports as `decode_attention_kernel`: "loaded" once built, the reason where it was not,
    None before anything asked for it (it builds nothing itself)."""
    assert kernels.kernel_status("decode_attention") == "loaded"
    monkeypatch.setattr(kernels, "_CACHE", {})
    monkeypatch.setattr(kernels, "_ERRORS", {})
    assert kernels.kernel_status("decode_attention") is None
    monkeypatch.setenv("ESFT_NO_KERNELS", "1")
    assert kernels.load_decode_attention() is None
    assert kernels.kernel_status("decode_attention") == "disabled by ESFT_NO_KERNELS"


def test_only_a_cache_this_process_cannot_write_is_told_to_move(tmp_path, monkeypatch):
    """A build that fails on another OSError (a full disk) is reported as it is: setting TORCH_EXTENSIONS_DIR to a
    writable folder is the remedy of a read-only or forbidden cache only."""
    import errno

    import torch.utils.cpp_extension as cpp_extension

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "missing_compiler", lambda: None)  # the same on a machine without one
    for code, advised in ((errno.ENOSPC, False), (errno.EACCES, True)):
        def fail(**kwargs):
            raise OSError(code, os.strerror(code), str(tmp_path / "x.o"))

        monkeypatch.setattr(cpp_extension, "load", fail)
        monkeypatch.setattr(kernels, "_CACHE", {})
        monkeypatch.setattr(kernels, "_ERRORS", {})
        assert kernels.load_decode_attention() is None
        why = kernels.build_error()
        assert f"Error: [Errno {code}] {os.strerror(code)}" in why  # OSError, or its PermissionError
        assert ("set TORCH_EXTENSIONS_DIR to a writable folder" in why) == advised, why


def test_the_record_a_build_leaves_tells_the_next_build_its_lock_was_left_by_a_killed_build(
        tmp_path, monkeypatch, capsys):
    """esft.lock holds the host and pid of its last holder, as the next build reads it: a build of this host
    that died leaving torch's lock is recognised as such, and its lock removed at once."""
    import socket

    import torch.utils.cpp_extension as cpp_extension

    from test_kernels import _fresh_build_folder, _torch_like_load

    folder = _fresh_build_folder(tmp_path, monkeypatch)
    monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: "first")
    assert kernels.load_decode_attention() == "first", kernels.build_error()
    assert (folder / "esft.lock").read_text() == f"{socket.gethostname()}\n{os.getpid()}\n"
    (folder / "lock").write_text("")  # the next build of this host was killed in torch's build
    monkeypatch.setattr(kernels, "_CACHE", {})
    monkeypatch.setattr(kernels, "_ERRORS", {})
    seen: list[bool] = []
    monkeypatch.setattr(cpp_extension, "load", _torch_like_load(folder, seen, patience=0.3))
    assert kernels.load_decode_attention() == "module", kernels.build_error()
    assert seen == [False] and "that was killed" in capsys.readouterr().err
