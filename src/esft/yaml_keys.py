"""A YAML mapping's repeated key, which PyYAML's loaders accept silently, keeping the last value: a config or spec
with `sigma` twice would run with the second while its author reads the first."""

from __future__ import annotations

from typing import Any

import yaml


def repeated_key(node: Any) -> tuple[str, int, int] | None:
    """(key, its first line, the line it repeats at) of the first key given twice in one mapping of a YAML node
    tree, else None."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            if key.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`, which may repeat: merged, not a key
                continue
            name, line = str(key.value), key.start_mark.line + 1
            if (key.tag, name) in seen:  # by tag too: `1` and `"1"` are two keys
                return name, seen[(key.tag, name)], line
            seen[(key.tag, name)] = line
        children = [value for _, value in node.value]
    else:
        children = node.value if isinstance(node, yaml.SequenceNode) else []
    return next((found for child in children if (found := repeated_key(child)) is not None), None)
