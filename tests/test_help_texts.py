"""What a newcomer reads first: the one-line descriptions of `esft analyze --help` and `esft experiment list`
are whole sentences (not a docstring's or comment's first line, cut mid-sentence), and an alias's help names
every value its option accepts.

    pytest -q tests/test_help_texts.py
"""

import argparse
import re

import pytest

from esft.cli import build_parser
from esft.experiments.experiment_cli import _list
from esft.experiments.spec import shipped_specs


def _sub_helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {choice.dest: choice.help for choice in action._choices_actions}


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def test_each_analysis_is_described_by_a_whole_sentence():
    helps = _sub_helps(_subparser(build_parser("analyze"), "analyze"))
    assert set(helps) == {"weights", "drift", "kl", "landscape", "sparsity"}
    for name, text in helps.items():
        assert text.endswith("."), (name, text)
    # the landscape docstring's first line ends with a comma; its paragraph goes on to Figure 5
    assert "holdout tasks from the final checkpoints (Figure 5)." in helps["landscape"]


@pytest.mark.parametrize("name", sorted(shipped_specs()))
def test_experiment_list_shows_each_spec_description_whole(name, capsys):
    _list(argparse.Namespace())
    out = capsys.readouterr().out
    entries = dict(re.findall(r"^(\S+) +(.*(?:\n {25}.*)*)", out, flags=re.M))
    text = " ".join(entries[name].split())
    assert text.endswith("."), text
    first = shipped_specs()[name].read_text().splitlines()[0].lstrip("# ").strip()
    assert text.startswith(" ".join(first.split()))


def test_the_fitness_alias_names_every_fitness_rule():
    from esft.es.es_config import RULES

    rules = re.findall(r"'([^']+)'", RULES["fitness_rule"].accepted)
    assert rules == ["mean", "dart", "balanced"]
    es = _subparser(_subparser(build_parser("train"), "train"), "es")
    alias = next(a for a in es._actions if "--fitness" in a.option_strings)
    for rule in rules:
        assert rule in alias.help, rule


def _parsers(parser: argparse.ArgumentParser, words: tuple[str, ...] = ("esft",)):
    yield words, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, words + (name,))


def test_every_argument_of_every_command_has_help_text():
    """`esft experiment tables --help` listed DIR with no word on what folder it wants."""
    bare = [f"{' '.join(words)} {'/'.join(a.option_strings) or a.metavar or a.dest}"
            for words, p in _parsers(build_parser(None)) for a in p._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and not a.help]
    assert bare == []
    tables = _subparser(_subparser(build_parser("experiment"), "experiment"), "tables").format_help()
    assert "an experiment folder" in tables


def test_the_task_and_model_help_of_each_command_names_every_form_they_take():
    """`esft train es|grpo --help` called --task a "task name" (a data file or module:Class, the documented ways to
    bring one's own task, went unmentioned) and ES's --model left out hub ids, which it takes; `esft eval`'s
    --balanced listed only boolq, chemistry and mmlu among the labelled tasks."""
    train = _subparser(build_parser("train"), "train")
    for name in ("es", "grpo"):
        helps = {a.dest: a.help for a in _subparser(train, name)._actions}
        for form in ("task name", "data file", "--prompt-field", "module:Class", "docs/custom-tasks.md"):
            assert form in helps["task"], (name, form)
        assert "hub id" in helps["model"], name
    evaluate = {a.dest: a.help for a in _subparser(build_parser("eval"), "eval")._actions}
    for labelled in ("boolq", "chemistry", "mmlu", "Countdown variant", "mcq"):
        assert labelled in evaluate["balanced"], labelled
