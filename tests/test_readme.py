"""README set-up commands stay runnable and in sync with CI. Run: `pytest tests/test_readme.py -q`."""

from __future__ import annotations

import functools
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


def test_the_test_command_keeps_only_failed_tests_temporary_folders(pytestconfig):
    """CI's temporary disk filled up once part-way through the suite (every later tmp_path test errored): pytest
    kept each test's folder, 2.4 GB by a third of the suite. A passing test's folder goes when it ends."""
    assert pytestconfig.getini("tmp_path_retention_policy") == "failed"


def test_install_never_pulls_unpinned_torch():
    for cmd in setup_commands():
        # torch is pinned and installed before esft, so pip never resolves an unpinned (CUDA) torch
        assert 0 <= cmd.find("torch==") < cmd.find(" -e ")


# ---- the repository stands alone: no internal files, every cited result is committed ------------------------------
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".txt", ".toml", ".cfg", ".cpp", ".h", ".json", ".jsonl", ".csv"}
INTERNAL = re.compile(r"REFERENCE\.md|\bREFERENCE (?:section|trap)\b|\.\./shared\b|/work/shared\b")


def _text_files(*roots: str):
    for root in roots:
        path = ROOT / root
        if path.is_file():
            yield path
            continue
        for f in sorted(path.rglob("*")):
            if f.is_file() and f.suffix in TEXT_SUFFIXES and "__pycache__" not in f.parts:
                yield f


def test_no_reference_to_files_outside_the_repository():
    """A user of the repository cannot see the development notes (REFERENCE.md) or the shared folder next to the
    checkout: src/, docs/ and README.md cite the papers and esft's own docs instead."""
    hits = []
    for f in _text_files("src", "docs", "README.md"):
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            if INTERNAL.search(line):
                hits.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)


def _cited_results(text: str, prefix: str) -> set[str]:
    return {m.rstrip(".,;:)") for m in re.findall(re.escape(prefix) + r"[\w./-]+", text)}


def test_results_cited_in_readme_exist():
    cited = _cited_results((ROOT / "README.md").read_text(), "docs/results/")
    assert cited, "README cites no docs/results folder"
    missing = sorted(c for c in cited if not (ROOT / c).exists())
    assert not missing, f"README cites results that are not committed: {missing}"


def test_results_linked_from_docs_exist():
    missing = []
    for f in (ROOT / "docs").glob("*.md"):
        for c in _cited_results(f.read_text(), "results/"):
            if not (ROOT / "docs" / c).exists():
                missing.append(f"{f.name}: {c}")
    assert not missing, missing


def test_generated_results_summaries_are_current():
    """summary.md and constant_baselines.md are what their committed scripts print from committed data, so the
    numbers the docs quote from them can be recomputed."""
    import subprocess
    import sys

    for script, out in [("docs/results/es-cpu-demo/summarize.py", "docs/results/es-cpu-demo/summary.md"),
                        ("docs/results/constant_baselines.py", "docs/results/constant_baselines.md")]:
        run = subprocess.run([sys.executable, str(ROOT / script)], capture_output=True, text=True, cwd=ROOT,
                             check=True)
        assert run.stdout == (ROOT / out).read_text(), f"{out} is stale: run `python {script} > {out}`"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _relative_links(text: str) -> list[str]:
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    targets = re.findall(r"\]\(([^)\s]+)\)", prose) + re.findall(r"^\[[^\]]+\]:\s*(\S+)", prose, flags=re.M)
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_relative_links_in_readme_and_docs_resolve():
    """Every relative link (file or #anchor) in README.md and docs/*.md points at a committed file and, for an
    anchor, at a heading of the target page."""
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in _relative_links(page.read_text()):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path) if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", dest.read_text(), flags=re.S),
                                      flags=re.M)
                if anchor not in {_slug(h) for h in headings}:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken


def test_sections_named_in_the_source_exist():
    """A docstring or comment that sends the reader to `docs/PAGE.md, "Section"` (the help of --parallel-members,
    among others) names a heading of that page, or a bold lever name in it (`**Threads**`), case aside."""
    missing = []
    for source in sorted((ROOT / "src").rglob("*.py")):
        text = re.sub(r"\s*\n\s*", " ", source.read_text())
        for page, name in re.findall(r'(docs/[\w-]+\.md),? \(?"([^"]+)"', text):
            doc = (ROOT / page).read_text()
            places = re.findall(r"^#+ (.+)$", doc, flags=re.M) + re.findall(r"\*\*([^*]+)\*\*", doc)
            if not any(name.lower() in place.lower() for place in places):
                missing.append(f"{source.relative_to(ROOT)}: {page}, \"{name}\"")
    assert not missing, missing


# ---- commands shown in the docs are commands esft has --------------------------------------------------------------
DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _code_spans(text: str) -> list[str]:
    """Each line of a fenced block (continuation lines joined, `#` comments cut) and each inline code span."""
    spans = []
    for block in re.findall(r"```[\w-]*\n(.*?)```", text, flags=re.S):
        spans += [line.split(" #")[0] for line in block.replace("\\\n", " ").splitlines()]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    # an inline span may wrap onto the next line, never across a paragraph
    spans += [s.replace("\n", " ") for s in re.findall(r"`([^`]+)`", prose) if "\n\n" not in s]
    return spans


def esft_commands(text: str) -> list[list[str]]:
    """The words after `esft` of every command the page shows (one list per command; `&&` and `;` end one)."""
    commands = []
    for span in _code_spans(text):
        for part in re.split(r"&&|;", span):
            found = re.search(r"(?:^|\s|/bin/)esft ((?:-|[a-z]).*)", part)  # also a venv's bin/esft
            if found:
                commands.append(found.group(1).split())
    return commands


def _sub_parsers(parser) -> dict:
    import argparse

    return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


@functools.cache
def _esft_parser():
    from esft.cli import build_parser

    return build_parser()


def command_parsers(words: list[str]) -> list:
    """The parsers of the sub-command the words name (`train es|grpo` names two), the top-level one for none."""
    parsers = [_esft_parser()]
    for word in words:
        if word.startswith("-") and parsers[0].prog == "esft":
            continue  # a top-level option (--debug) before the sub-command
        choices = _sub_parsers(parsers[0])
        alternatives = word.split("|")
        if not choices or not all(a in choices for a in alternatives):
            break
        parsers = [choices[a] for a in alternatives]
    return parsers


def unknown_flags(text: str) -> list[str]:
    bad = []
    for words in esft_commands(text):
        parsers = command_parsers(words)
        for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", " ".join(words)):
            if flag in ("--debug", "--help"):  # accepted after any sub-command (esft.cli.main)
                continue
            for parser in parsers:
                if flag not in {s for action in parser._actions for s in action.option_strings}:
                    bad.append(f"`{parser.prog}` has no {flag}: esft {' '.join(words)}")
    return bad


def test_flag_checker_finds_a_flag_of_another_command():
    assert esft_commands("run `esft train es|grpo --resume` or\n\n```bash\nesft bench --json  # one object\n```") == [
        ["bench", "--json"], ["train", "es|grpo", "--resume"]]
    assert esft_commands("```bash\n~/.cache/venv/bin/esft train es \\\n    --fitness dart\n```") == [
        ["train", "es", "--fitness", "dart"]]
    assert unknown_flags("`esft train es|grpo --resume --output-dir RUN`") == []
    assert unknown_flags("`esft train grpo --checkpoint-every 5`") == [
        "`esft train grpo` has no --checkpoint-every: esft train grpo --checkpoint-every 5"]
    assert unknown_flags("```bash\nesft bench \\\n    --iterations 2\n```") == [
        "`esft bench` has no --iterations: esft bench --iterations 2"]


def test_every_flag_in_the_docs_is_an_option_of_its_command():
    """Every `--flag` of an `esft ...` command in README.md and docs/*.md (code blocks and inline code) is an option
    of the sub-command it follows: a renamed or removed option, or one put on the wrong command, fails here."""
    bad = [f"{page.relative_to(ROOT)}: {b}" for page in DOC_PAGES for b in unknown_flags(page.read_text())]
    assert not bad, "\n".join(bad)


def test_every_sub_command_in_the_docs_exists():
    """`esft WORD` in the docs names a sub-command (and `esft train`/`analyze`/`experiment` WORD one of theirs)."""
    bad = []
    for page in DOC_PAGES:
        for words in esft_commands(page.read_text()):
            parser = command_parsers(words)[0]
            rest = [w for w in words[len(parser.prog.split()) - 1:] if not w.startswith("-") and w != "..."]
            if _sub_parsers(parser) and rest:
                bad.append(f"{page.relative_to(ROOT)}: `{parser.prog}` has no sub-command {rest[0]!r}: "
                           f"esft {' '.join(words)}")
    assert not bad, "\n".join(bad)


def esft_imports_missing(source: str) -> list[str]:
    """`from esft... import name` statements of a script (at any depth) whose module or name esft lacks."""
    import ast
    import importlib
    import importlib.util

    missing = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "esft"):
            continue
        try:
            module = importlib.import_module(node.module)
        except ModuleNotFoundError:
            missing.append(f"line {node.lineno}: no module {node.module}")
            continue
        for alias in node.names:
            if not hasattr(module, alias.name) and importlib.util.find_spec(f"{node.module}.{alias.name}") is None:
                missing.append(f"line {node.lineno}: {node.module} has no {alias.name}")
    return missing


def test_import_checker_finds_a_moved_module():
    assert esft_imports_missing("def run():\n    from esft.es.config import preset\n") == [
        "line 2: no module esft.es.config"]
    assert esft_imports_missing("from esft.es import runlog, es_config\nfrom esft.rundir import read_jsonl\n") == [
        "line 1: esft.es has no runlog"]


def test_scripts_import_only_what_esft_has():
    """The scripts the docs tell users to run (scripts/*.py) import esft's modules inside their functions, where
    no import error shows until a run reaches them: a module that moved must fail here instead."""
    bad = [f"{script.relative_to(ROOT)} {m}" for script in sorted((ROOT / "scripts").glob("*.py"))
           for m in esft_imports_missing(script.read_text())]
    assert not bad, "\n".join(bad)


# ---- names the docs tell users to import or look up exist ---------------------------------------------------------
def esft_names(text: str) -> list[str]:
    """Every dotted `esft.module.name` of the page's code (blocks and inline spans), in order, once each."""
    names = [n for span in _code_spans(text) for n in re.findall(r"(?<![\w./-])esft(?:\.[A-Za-z_]\w*)+", span)]
    return list(dict.fromkeys(names))


def missing_name(dotted: str) -> str | None:
    """Why `dotted` does not resolve (the longest importable module, then attributes), None when it does. A module
    that needs an optional package that is not installed (vllm) counts as resolving: its name is esft's."""
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as exc:
            if exc.name and not exc.name.startswith("esft"):
                return None
            continue
        for j, attr in enumerate(parts[i:], i):
            if not hasattr(obj, attr):
                return f"{'.'.join(parts[:j])} has no {attr}"
            obj = getattr(obj, attr)
        return None
    return f"no module {parts[0]}"


def test_name_checker_finds_a_moved_name():
    assert esft_names("`esft.es.executor.MMAP_THRESHOLD` and\n\n```python\nfrom esft.es import ESConfig\n```") == [
        "esft.es", "esft.es.executor.MMAP_THRESHOLD"]
    assert missing_name("esft.es.executor.MMAP_THRESHOLD") == "esft.es.executor has no MMAP_THRESHOLD"
    assert missing_name("esft.es.nosuchmodule") == "esft.es has no nosuchmodule"
    assert missing_name("esft.es.lanes.MMAP_THRESHOLD") is None


def test_every_esft_name_in_the_docs_exists():
    """Every `esft.a.b` the docs name (a module, function, class or constant) imports: a renamed or moved name
    must fail here, not in a reader's Python session."""
    bad = [f"{page.relative_to(ROOT)}: {name}: {why}" for page in DOC_PAGES for name in esft_names(page.read_text())
           if (why := missing_name(name))]
    assert not bad, "\n".join(bad)


# ---- what the docs' option tables say a preset sets is what it sets ----------------------------------------------
def preset_claims(text: str) -> list[tuple[str, str, str]]:
    """(flag, preset, value) for each "the `PRESET` preset uses VALUE" in a table row whose first cell is a flag."""
    claims = []
    for line in text.splitlines():
        row = re.match(r"\|\s*`(--[a-z][\w-]*)[^|]*\|(.*)", line)
        if row:
            claims += [(row.group(1), p, v) for p, v in re.findall(r"the `([\w-]+)` preset uses ([\w.-]+)", row[2])]
    return claims


def wrong_preset_claims(text: str) -> list[str]:
    from esft.es.es_config import PRESETS, ESConfig

    parser = command_parsers(["train", "es"])[0]
    dests = {s: a.dest for a in parser._actions for s in a.option_strings}
    bad = []
    for flag, preset, value in preset_claims(text):
        field = dests[flag]
        actual = PRESETS[preset].get(field, getattr(ESConfig(), field)) if preset in PRESETS else "no such preset"
        if str(actual) != value:
            bad.append(f"{flag}: the `{preset}` preset uses {actual}, not {value}")
    return bad


def test_preset_claim_checker_reads_option_rows():
    row = "| `--parallel-members K` | K lanes (the `cpu` preset uses 2, the `cpu-countdown` preset uses 2) |"
    assert preset_claims(row + "\nthe `cpu` preset uses 5 outside a table") == [
        ("--parallel-members", "cpu", "2"), ("--parallel-members", "cpu-countdown", "2")]
    assert wrong_preset_claims(row) == ["--parallel-members: the `cpu` preset uses 1, not 2"]


def test_option_tables_state_the_presets_values():
    """An option table that says what a preset sets (docs/distributed.md: `--parallel-members`) follows the preset
    when it changes."""
    bad = [f"{page.relative_to(ROOT)}: {b}" for page in DOC_PAGES for b in wrong_preset_claims(page.read_text())]
    assert not bad, "\n".join(bad)
