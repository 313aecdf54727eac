"""README set-up commands stay runnable and in sync with CI. Run: `pytest tests/test_readme.py -q`."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)


def test_exactly_two_setup_commands_one_line_each():
    cmds = setup_commands()
    assert len(cmds) == 2
    assert all("\n" not in c for c in cmds)
    assert "esft train es" in cmds[0] and "pytest" in cmds[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert setup_commands()[1] in ci


def test_install_never_pulls_unpinned_torch():
    for cmd in setup_commands():
        # torch is pinned and installed before esft, so pip never resolves an unpinned (CUDA) torch
        assert 0 <= cmd.find("torch==") < cmd.find(" -e ")
