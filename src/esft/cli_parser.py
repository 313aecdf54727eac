"""The `esft` argument parser (esft.cli builds its options): one-line errors naming the closest option, a
sub-command's unknown option reported by that sub-command, and options with two spellings (`Alias`) refused when
given both with different values."""

from __future__ import annotations

import argparse
import re
from typing import Any, NoReturn

#: namespace attribute of an alias's value (`Alias`), read and removed once the parse ends (`Parser`)
ALIAS_MARK = "alias given: "
#: namespace attribute {dest: the alias typed for it}, so that a refused value is named by the flag typed
ALIASES_TYPED = "aliases typed"


class Alias(argparse.Action):
    """A second spelling of another option (`canonical`, same dest): given both with different values, the command
    is refused instead of the last one silently winning; the same value twice is accepted."""

    def __init__(self, *args: Any, canonical: str, **kwargs: Any) -> None:
        from esft.config_flags import ONCE

        super().__init__(*args, **kwargs)
        self.canonical = canonical
        self.once = self.dest in ONCE  # the alias itself repeated with another value is refused too

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if hasattr(namespace, self.dest):
            current, previous = getattr(namespace, self.dest), getattr(namespace, ALIAS_MARK + self.dest, None)
            by_alias = previous is not None and previous[2] == current  # else the canonical option set it
            # the alias repeated: the last one wins, as for most options; the canonical's value: refused if other
            if current != values and (not by_alias or self.once):
                _refuse_both(parser, previous[0] if by_alias else self.canonical, current, option_string, values)
        setattr(namespace, self.dest, values)
        setattr(namespace, ALIAS_MARK + self.dest, (option_string, self.canonical, values))


def _refuse_both(parser: argparse.ArgumentParser, first: str, first_value: Any, second: Any, value: Any) -> NoReturn:
    def shown(v: Any) -> str:
        return ",".join(map(str, v)) if isinstance(v, list) else str(v)

    parser.error(f"{first} {shown(first_value)} and {second} {shown(value)} name the same option with different "
                 "values: give one of them")


class Parser(argparse.ArgumentParser):
    """The `esft` parser; its sub-parsers are of this class too (add_subparsers). An option a sub-command does not
    have is reported by that sub-command, as one line with its closest option: argparse reported it with the
    top-level usage, which lists none of a sub-command's options."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # a negative number in scientific notation (`--alpha -1e-3`) is a value, not an option: argparse's own
        # pattern (Python 3.11, 3.12) knows only plain decimals, and refused it as "expected one argument"
        self._negative_number_matcher = re.compile(r"^-(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        namespace, extra = super().parse_known_args(args, namespace)
        for key in [k for k in vars(namespace) if k.startswith(ALIAS_MARK)]:  # the alias came before its canonical
            option, canonical, value = vars(namespace).pop(key)
            dest = key.removeprefix(ALIAS_MARK)
            if getattr(namespace, dest) != value:
                _refuse_both(self, option, value, canonical, getattr(namespace, dest))
            vars(namespace).setdefault(ALIASES_TYPED, {})[dest] = option
        if extra:  # a sub-parser runs inside its parent's parse: the deepest one that got the option reports it
            import difflib

            known = [s for action in self._actions for s in action.option_strings if s.startswith("--")]
            word = extra[0].split("=")[0]
            close = difflib.get_close_matches(word, known, n=1) if word.startswith("-") else []
            hint = f"; did you mean {close[0]}?" if close else ""
            self.exit(2, f"{self.prog}: error: unrecognized arguments: {' '.join(extra)}{hint} "
                         f"(`{self.prog} --help` lists the options)\n")
        return namespace, extra

    def error(self, message: str) -> NoReturn:
        # a missing sub-command: argparse names it by its dest (command, algorithm, ...), which no usage shows
        for action in self._actions:
            if isinstance(action.choices, dict) and message == f"the following arguments are required: {action.dest}":
                message = (f"a sub-command is required: {', '.join(action.choices)} (`{self.prog} --help` "
                           "describes them)")
        message += _none_hint(self, message)
        choice = re.match(r"argument (\S+): invalid choice: '(.*)' \(choose from (.*)\)$", message)
        if choice:  # a sub-command's dest (command, algorithm) is a name no usage shows; and the closest choice
            from esft.names import did_you_mean

            options = re.findall(r"'([^']*)'", choice.group(3))
            what = choice.group(1) if choice.group(1).startswith("-") else "sub-command"
            message = (f"unknown {what} {choice.group(2)!r}{did_you_mean(choice.group(2), options)}; choose from "
                       f"{', '.join(options)}")
        # one line, as every other refusal of esft: argparse printed the whole usage (30+ lines) before it
        help_hint = "" if "--help" in message else f" (`{self.prog} --help` lists the options)"
        self.exit(2, f"{self.prog}: error: {message}{help_hint}\n")


def aliases_typed(args: argparse.Namespace) -> dict[str, str]:
    """{field: the alias flag it was given with} (build_config's flag_names)."""
    return getattr(args, ALIASES_TYPED, {})


def _none_hint(parser: argparse.ArgumentParser, message: str) -> str:
    """"; or none" for a refused value of an option that also takes `none` (`--limit all`: `--limit none` is the
    whole split), "" otherwise."""
    found = re.match(r"argument (--[\w-]+)(?:/[^:]*)?: invalid \w+ value: ", message)
    action = parser._option_string_actions.get(found.group(1)) if found else None
    try:
        takes_none = action is not None and callable(action.type) and action.type("none") is None
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        takes_none = False
    return f"; {found.group(1)} takes a number or none" if takes_none else ""
