"""A spec's YAML syntax error names the line it is on (esft.experiments.yamlines), 1-based as an editor counts.

Run: PYTHONPATH=src pytest -q tests/test_yamlines_mutmutmisc.py   (< 1 s)
"""

from __future__ import annotations

import pytest

from esft.experiments.yamlines import SpecError, load


@pytest.mark.parametrize("text, line", [
    ("a: 1\nb: 2\n  c: 3\n", 3),  # the indented key on line 3
    ("a: 1\n\n\nb: \"x\n", 5),  # an unclosed quote: the stream ends on line 5
])
def test_a_syntax_error_names_its_line(text, line):
    with pytest.raises(SpecError) as info:
        load(text, "spec.yaml")
    assert str(info.value).startswith(f"spec.yaml:{line}: YAML syntax error: "), str(info.value)


def test_sequence_and_mapping_lines_are_one_based():
    data = load("a: 1\nlist:\n  - x\n  - y\n")
    assert data.line == 1 and data.line_of("list") == 2 and data.value_lines["list"] == 3
    assert data["list"].item_lines == [3, 4] and data["list"].line_of(1) == 4 and data["list"].line_of(5) == 3


def test_a_container_built_outside_the_loader_has_no_line():
    """Line 0 is "not known": the spec's messages then name the file alone rather than a wrong line 1."""
    from esft.experiments.yamlines import LineDict, LineList

    assert LineDict().line == 0 and LineDict().line_of("tasks") == 0
    assert LineList().line == 0 and LineList([1]).line_of(0) == 0
