"""esft.config's flag help, list splitting and mapping parsing, pinned where a mutation audit found them untested:
each test names the behaviour a user relies on."""

from __future__ import annotations

import pytest


def test_each_flag_help_ends_with_the_fields_default():
    """`esft train es --help` names each option's default: a plain default as it is, a default_factory's value
    (an empty list or mapping) as it is built, and a literal % in a docstring survives argparse's formatting."""
    import argparse
    import dataclasses

    from esft.config_flags import add_dataclass_arguments

    @dataclasses.dataclass
    class Demo:
        rate: float = 0.25
        """a rate in %"""
        items: list[str] = dataclasses.field(default_factory=lambda: ["a", "b"])
        """the items"""
        none: list[str] = dataclasses.field(default_factory=list)
        """no items"""

    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, Demo)
    helps = {a.dest: a.help for a in parser._actions}
    assert helps["rate"] == "a rate in %% (default: 0.25)"
    # a list as the flag takes it (comma text), not Python's ['a', 'b']
    assert helps["items"] == "the items (default: a,b)" and helps["none"] == "no items (default: empty)"
    assert "a rate in % (default: 0.25)" in " ".join(parser.format_help().split())


@pytest.mark.parametrize("text, items", [
    (r"[ab],c", ["[ab]", "c"]),  # a comma after a closed class separates
    (r"[a^],b", ["[a^]", "b"]),  # a `^` closing the class's text is no negation: the `]` closes it
    (r"[],]x,y", ["[],]x", "y"]),  # a `]` right after `[` is a character; the comma after it belongs to the class
    (r"[^]],b", ["[^]]", "b"]),
])
def test_a_regex_list_splits_after_a_character_class_closes(text, items):
    """A character class ends at its first `]` that is not its first character: commas inside it belong to the
    pattern, commas after it separate the patterns of `--include` / `--exclude`."""
    from esft.config_flags import split_items

    assert split_items(text) == items


def test_a_mapping_flag_that_is_not_yaml_names_the_column():
    """`--task-options '{a: [1'` is refused naming where YAML stopped reading it (1-based column)."""
    from esft.config import parse_mapping

    with pytest.raises(ValueError, match=r"task_options '\{a: \[1' is not a YAML / JSON mapping such as "
                                         r"\{key: value\} at column 7: "):
        parse_mapping("task_options", "{a: [1")
