"""docs/custom-tasks.md is tested as written: its Python blocks run in order (files marked `# file:` are written
first), its shell commands parse with esft's own parser, its spec and pyproject snippets load."""

from __future__ import annotations

import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest

from esft.cli import build_parser

DOC = Path(__file__).resolve().parents[1] / "docs" / "custom-tasks.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)\n```", DOC.read_text(), flags=re.S)


def write_files(folder: Path) -> list[str]:
    """Write the `# file: NAME` blocks into folder; return the other Python blocks."""
    code = []
    for block in blocks("python"):
        first, _, rest = block.partition("\n")
        if first.startswith("# file: "):
            (folder / first[len("# file: "):].strip()).write_text(rest)
        else:
            code.append(block)
    return code


def test_every_command_parses():
    commands = [line for block in blocks("bash") for line in block.splitlines() if line.startswith("esft ")]
    assert len(commands) >= 4
    parser = build_parser()
    for line in commands:
        parser.parse_args(shlex.split(line)[1:])  # an unknown flag would exit here


def test_spec_and_entry_point_snippets(tmp_path, monkeypatch):
    from esft.experiments.spec import parse_spec
    from esft.experiments.yamlines import load

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the reward module is found in the current folder
    write_files(tmp_path)
    (tmp_path / "sums.jsonl").write_text("".join(f'{{"question": "q{i}", "answer": "{i}"}}\n' for i in range(10)))
    (spec_text,) = blocks("yaml")
    spec = parse_spec(load(spec_text), "spec.yaml")
    assert spec.tasks == ["sums.jsonl"] and spec.task_options["sums.jsonl"]["reward"] == "my_rewards:correct_sum"
    (toml_text,) = blocks("toml")
    assert tomllib.loads(toml_text)["project"]["entry-points"]["esft.tasks"] == {"doubling": "my_tasks:Doubling"}
    from esft.tasks import get_task

    assert get_task("my_tasks:Doubling", count=3).load("test", limit=1) == [{"n": 1000, "answer": "2000"}]


@pytest.mark.slow
def test_python_blocks_run_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    code = write_files(tmp_path)
    assert len(code) == 2
    namespace: dict = {}
    es_run = tmp_path / "runs" / "sums-es"
    for block in code:
        exec(compile(block, str(DOC), "exec"), namespace)
        if (es_run / "checkpoints" / "final" / "model.safetensors").exists():
            # checked, then dropped: with the GRPO run's model and optimizer state this test held 2.1 GB of disk
            assert (es_run / "checkpoints" / "final" / "config.json").exists()
            (es_run / "checkpoints" / "final" / "model.safetensors").unlink()
    assert (es_run / "checkpoints" / "final" / "config.json").exists()
    saved = (es_run / "config.yaml").read_text()
    # the data file by its absolute path: --resume and replay work from any directory
    assert f"task: {tmp_path / 'sums.jsonl'}" in saved and "my_rewards:correct_sum" in saved
    grpo_run = tmp_path / "runs" / "doubling-grpo"
    assert "task: my_tasks:Doubling" in (grpo_run / "config.yaml").read_text()
    assert namespace["result"].steps == 1


def test_commands_without_their_files_stop_as_the_page_says(tmp_path, monkeypatch, capsys):
    """Run in a folder without sums.jsonl and my_rewards.py, each command stops with an error the page quotes."""
    import os
    import signal

    from esft.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_WAIT_POLICY", os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))  # main() sets it
    previous = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(signal, "signal", lambda *a: previous)  # main()'s SIGTERM handler, not pytest's
    intro = DOC.read_text().split("```bash", 1)[0].rstrip().rsplit("\n\n", 1)[1]
    quoted = [" ".join(part.split()) for span in re.findall(r"`([^`]+)`", intro) for part in span.split("...")
              if len(part.strip()) > 20]
    assert len(quoted) >= 2
    commands = [line for line in blocks("bash")[0].splitlines() if line.startswith("esft ")]
    for line in commands:
        code = main(shlex.split(line)[1:])
        error = " ".join(capsys.readouterr().err.split())
        assert code == 2 and any(q in error for q in quoted), (line, error, quoted)
