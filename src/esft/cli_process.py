"""How the `esft` process behaves around its commands (esft.cli): one-line warnings and errors, the exit codes,
and a reader of its output that leaves (SIGTERM as Ctrl-C: esft.sigterm)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence


@contextlib.contextmanager
def plain_warnings(debug: bool) -> Iterator[None]:
    """esft's own warnings (a format bonus with no effect, lanes lowered for memory, ...) print as one line,
    `esft: warning: ...`, not with Python's file:line and source line, which read like a traceback to a user, and
    each text once (a check before the model loads and the run itself may warn of the same thing from two places);
    other libraries' warnings keep Python's format, and --debug keeps it for all."""
    import warnings

    default, show = warnings.formatwarning, warnings.showwarning
    package = str(Path(__file__).resolve().parent)
    shown: set[str] = set()

    def ours(filename: str) -> bool:
        return not debug and str(Path(filename).resolve()).startswith(package)

    def plain(message: Any, category: type, filename: str, lineno: int, line: str | None = None) -> str:
        return f"esft: warning: {message}\n" if ours(filename) else default(message, category, filename, lineno, line)

    def once(message: Any, category: type, filename: str, lineno: int, *args: Any, **kwargs: Any) -> None:
        if ours(filename):
            if str(message) in shown:
                return
            shown.add(str(message))
        show(message, category, filename, lineno, *args, **kwargs)

    warnings.formatwarning, warnings.showwarning = plain, once
    try:
        yield
    finally:
        warnings.formatwarning, warnings.showwarning = default, show


def as_typed(message: str, words: Sequence[str]) -> str:
    """`message` naming each data file of a task on the command line (`words`) as the user typed it: a config
    records such a file by its absolute path (esft.tasks.custom.absolute_data_task, so that config.yaml rebuilds
    the task from any folder), which errors would otherwise show."""
    import re

    for absolute, typed in sorted(typed_data_files(words).items(), key=lambda kv: -len(kv[0])):
        # the whole path only, not the tail of a longer one (/mnt/tmp/a.jsonl holds /tmp/a.jsonl)
        message = re.sub(rf"(?<![\w./~-]){re.escape(absolute)}", lambda _, t=typed: t, message)
    return message


def config_words(args: Sequence[str]) -> list[str]:
    """The text values at the top of the YAML file a `--config FILE` in `args` names (its `task`, `tasks`), which
    as_typed reads as typed too; [] where there is none or it cannot be read (its own error says so)."""
    import yaml

    names = [b for a, b in zip(args, args[1:]) if a == "--config"] + [a[9:] for a in args if a.startswith("--config=")]
    words: list[str] = []
    for name in names:
        try:
            data = yaml.safe_load(Path(name).read_text(encoding="utf-8"))
        except (OSError, ValueError, yaml.YAMLError):
            continue
        for value in (data.values() if isinstance(data, dict) else ()):
            words += [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str)]
    return words


def typed_data_files(words: Sequence[str]) -> dict[str, str]:
    """{absolute path: as typed} of the data files (a task's source and its `test_file` option) that `words` name
    relative to the working directory or under `~`; each word may be a task string, a comma list of them or
    `--flag=value`."""
    from esft.tasks.custom import absolute_file, external_kind, split_options

    found: dict[str, str] = {}
    for word in words:
        value = word.partition("=")[2] if word.startswith("-") else word
        for text in {word, value, *word.split(","), *value.split(",")}:
            try:  # a word that is no path at all (a long --trl-args, say) may fail a file test
                if external_kind(text.strip()) != "data":
                    continue
                source, options = split_options(text.strip())
                files = [source] + [value.strip() for key, _, value in (p.partition("=") for p in options.split(","))
                                    if key.strip().lower() == "test_file"]
                found.update({absolute_file(f): f for f in files if absolute_file(f) != f})
            except (OSError, ValueError):
                continue
    return found


def show_context(exc: BaseException) -> None:
    """Under --debug, the exceptions that one-line errors replace (`raise ConfigError(...) from None` around the
    user's task code, an import, a file read) are shown too: Python keeps them as `__context__`, and the
    traceback prints them once `__suppress_context__` is unset."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__suppress_context__ = False
        exc = exc.__cause__ or exc.__context__


def stdout_reader_gone() -> bool:
    """stdout is a pipe or socket whose reader has closed it (poll reports an error condition on it)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # stdout is not a file (captured, replaced)
        return False


def silence_stdout() -> None:
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a file (captured, replaced): nothing to flush
        pass


def exit_code(exc: BaseException) -> int:
    """2 for bad input (a value, a name, a path the user gave), 1 for a failure at run time (a busy or damaged
    run directory, a non-finite update, a disk error)."""
    bad_input = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
                 PermissionError)
    return 2 if isinstance(exc, bad_input) else 1
