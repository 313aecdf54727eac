"""esft.yaml_keys.repeated_key: a key given twice in one mapping of a YAML config (PyYAML keeps the last value
silently); merge keys and keys of other types are no repeats."""

from __future__ import annotations

import yaml

from esft.yaml_keys import repeated_key


def first_repeat(text: str):
    return repeated_key(yaml.compose(text, Loader=yaml.SafeLoader))


def test_a_key_repeated_at_any_depth_is_found_with_both_lines():
    assert first_repeat("sigma: 1\nalpha: 2\nsigma: 3\n") == ("sigma", 1, 3)
    assert first_repeat("task_options:\n  reward: a\n  reward: b\n") == ("reward", 2, 3)
    assert first_repeat("runs:\n  - {a: 1, a: 2}\n") == ("a", 2, 2)
    assert first_repeat("sigma: 1\nalpha: {sigma: 2}\n") is None  # another mapping's key


def test_merge_keys_and_keys_of_other_types_are_not_repeats():
    text = "a: &a {x: 1}\nb: &b {y: 2}\nc:\n  <<: *a\n  <<: *b\n  x: 5\n"
    assert first_repeat(text) is None and yaml.safe_load(text)["c"] == {"x": 5, "y": 2}
    assert first_repeat('1: a\n"1": b\n') is None
