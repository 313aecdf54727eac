"""Every complete `esft train|eval|bench` command of README.md and docs/*.md is accepted as written: parsed, its
config built and checked (presets, value ranges, task names), up to the call that would load a model, which is
replaced here. Run: `pytest tests/test_docs_commands.py -q`."""

from __future__ import annotations

import os
import re
import sys

import pytest

from test_docs_custom_tasks import write_files
from test_readme import DOC_PAGES, ROOT, esft_commands

#: commands the docs quote from a dated record, which esft has refused since: {command: (the refusal, the note
#: the page must carry right after the command so that no reader copies it)}; each must still be refused and quoted
HISTORICAL = {
    "bench --exact --population 1": ("--population must be >= 2", "before the bench asked for at least 2 members"),
    "bench --workloads decode-heavy --population 1 --no-naive": ("--population must be >= 2",
                                                                  "a population the bench has refused since"),
}
CHECKED = ("train", "eval", "bench")


def _placeholder(word: str) -> bool:
    """RUN, DIR, `...`, `n` in `--samples n`, `es|grpo`, `[--flag ...]`: a word a reader replaces."""
    return bool(re.fullmatch(r"[A-Z_]+|[a-z]|\.\.\.", word)) or "|" in word or "[" in word


def doc_commands() -> list[tuple[str, str]]:
    """(page, command) of every complete checked command, once each, in page order."""
    found = {}
    for page in DOC_PAGES:
        for words in esft_commands(page.read_text()):
            if words[0] in CHECKED and "--help" not in words and not any(map(_placeholder, words)):
                found.setdefault(" ".join(words), page.relative_to(ROOT).as_posix())
    return [(page, command) for command, page in found.items()]


class Reached(Exception):
    """The command got to the call that would load a model or start the work."""


def _reached(*args, **kwargs):
    raise Reached


@pytest.fixture
def stubbed(tmp_path, monkeypatch):
    """In a scratch folder with the files docs/custom-tasks.md's commands read (sums.jsonl, my_rewards.py,
    my_tasks.py); training, evaluation and the bench stop where they would start."""
    import esft.api
    import esft.bench
    import esft.evaluation

    import signal

    monkeypatch.chdir(tmp_path)
    # esft.cli.main sets these for the process it runs in; this one is pytest's
    monkeypatch.setenv("OMP_WAIT_POLICY", os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    previous = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(signal, "signal", lambda *a: previous)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    write_files(tmp_path)
    (tmp_path / "sums.jsonl").write_text("".join(f'{{"question": "What is {i} + {i}?", "answer": "{2 * i}"}}\n'
                                                 for i in range(40)))
    for module, name in [(esft.api, "train_es"), (esft.api, "train_grpo"), (esft.evaluation, "run_eval"),
                         (esft.bench, "run_bench")]:
        monkeypatch.setattr(module, name, _reached)


def outcome(command: str, capsys) -> str:
    """"reached", or the error line the command stops with."""
    import shlex

    from esft.cli import main

    try:
        code = main(shlex.split(command))
    except Reached:
        return "reached"
    except SystemExit as exc:
        code = exc.code
    return f"exit {code}: {capsys.readouterr().err.strip()}"


def _names_an_option(command: str, result: str) -> bool:
    """`esft train es --resume` in prose names the option; its value is the reader's (the text around it says)."""
    return (f"argument {command.split()[-1]}: expected one argument" in result
            or command.endswith("--resume") and "--resume names no run" in result)


def _needs_cuda(command: str, result: str) -> bool:
    import torch

    return "--device cuda" in command and not torch.cuda.is_available() and "sees no CUDA device" in result


def test_the_commands_are_found():
    commands = [c for _, c in doc_commands()]
    assert len(commands) >= 30
    assert "train es --preset cpu-countdown --output-dir runs/es-cpu" in commands
    assert all(c.split()[0] in CHECKED for c in commands)
    assert set(HISTORICAL) <= set(commands)


def test_every_doc_command_is_accepted(stubbed, capsys):
    bad = []
    for page, command in doc_commands():
        if command in HISTORICAL:
            continue
        result = outcome(command, capsys)
        if result != "reached" and not _needs_cuda(command, result) and not _names_an_option(command, result):
            bad.append(f"{page}: esft {command}\n    {result}")
    assert not bad, "\n".join(bad)


def test_historical_commands_are_still_refused_and_marked(stubbed, capsys):
    text = " ".join(" ".join(page.read_text() for page in DOC_PAGES).split())
    for command, (message, note) in HISTORICAL.items():
        result = outcome(command, capsys)
        assert result.startswith("exit 2") and message in result, (command, result)
        after = text.split(f"esft {command}`", 1)[1][:200]
        assert note in after, f"the docs quote `esft {command}` without saying it is refused now: {after!r}"
