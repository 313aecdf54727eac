"""A YAML loader that remembers line numbers, so spec errors can name the offending line.

PyYAML drops source positions once a document becomes Python objects. This loader builds `LineDict` and
`LineList` (plain dict / list subclasses) that keep the 1-based line of the container, of every key and of every
value or item, taken from the node start marks. Scalars stay plain Python values; their lines live in the parent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class SpecError(ValueError):
    """An invalid experiment spec; the message starts with `file:line:` where the line is known."""


class LineDict(dict):
    """A dict with `line` (where the mapping starts), `key_lines[key]` and `value_lines[key]`."""

    line: int = 0

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.key_lines: dict[Any, int] = {}
        self.value_lines: dict[Any, int] = {}

    def line_of(self, key: Any) -> int:
        """Line of `key` when present, else the line of the mapping itself."""
        return self.key_lines.get(key, self.line)


class LineList(list):
    """A list with `line` (where the sequence starts) and `item_lines[i]`."""

    line: int = 0

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.item_lines: list[int] = []

    def line_of(self, index: int) -> int:
        return self.item_lines[index] if 0 <= index < len(self.item_lines) else self.line


def plain(value: Any) -> Any:
    """The same data with LineDict / LineList replaced by plain dict / list (for configs that are saved with
    yaml.safe_dump, which refuses subclasses)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


class _Loader(yaml.SafeLoader):
    """SafeLoader (no arbitrary objects) with position-keeping containers."""


def _mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)  # resolves `<<: *anchor` merges first
    out = LineDict()
    out.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in out:
            # plain YAML keeps the last value silently; in a spec that is almost always a mistake
            raise SpecError(f"{node.start_mark.name}:{key_node.start_mark.line + 1}: duplicate key {key!r} "
                            f"(first on line {out.key_lines[key]})")
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = key_node.start_mark.line + 1
        out.value_lines[key] = value_node.start_mark.line + 1
    return out


def _sequence(loader: _Loader, node: yaml.SequenceNode) -> LineList:
    out = LineList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _sequence)


def load(text: str, name: str = "<spec>") -> Any:
    """Parse YAML text into LineDict / LineList / scalars; syntax errors become SpecError with the line."""
    loader = _Loader(text)
    loader.name = name
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 0
        raise SpecError(f"{name}:{line}: YAML syntax error: {exc.problem or exc}") from None
    finally:
        loader.dispose()


def load_file(path: str | Path) -> Any:
    path = Path(path)
    return load(path.read_text(encoding="utf-8"), str(path))
