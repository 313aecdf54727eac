"""Countdown expressions: the safe scorer's parser and checker, and an exact solver (esft.tasks.countdown).

Scoring (paper Table 19): the last `\\boxed{...}` must hold an expression made only of digits, + - * / ( ) and
whitespace (spaces, tabs, line breaks), using each given number exactly once (as a multiset), whose exact value
is less than 1e-5 from the target (the paper's "tolerance < 1e-5": a value exactly 1e-5 away is wrong).

The expression is never passed to `eval`. A small hand-written parser (recursive descent, depth bounded by a
pre-scan) turns it into postfix, the literals are checked against the numbers *before* any arithmetic (so at
most four small numbers are ever combined), and the value is computed with `fractions.Fraction`. Unary + and -
are accepted, as the eval-based reference scorers accept them; decimals, `**`, `//`, names and any other
character are rejected. A bad expression is a rejection with a reason, never an exception out of the checker;
a malformed *puzzle* (missing or non-integer numbers, a non-numeric target) is a data bug and raises.
"""

from __future__ import annotations

import numbers
from fractions import Fraction
from itertools import combinations
from typing import Any

from esft.tasks.base import Example

#: Limits that keep the scorer fast on adversarial input (a real answer is ~20 characters).
MAX_EXPR_CHARS = 1000
MAX_LITERAL_DIGITS = 6
MAX_PAREN_DEPTH = 50
TOLERANCE = Fraction(1, 100_000)

#: the four operators, in the order variants list them
OPS = "+-*/"


#: ASCII whitespace separates tokens anywhere in an expression (models break long boxes over lines).
_WHITESPACE = " \t\n\r\f\v"
_DROP_WHITESPACE = str.maketrans("", "", _WHITESPACE)


class ExpressionError(ValueError):
    """Why an expression was rejected (reported in `details`, never raised out of `score`)."""


# ---- tokenising and parsing -----------------------------------------------------------------------------
def tokenize(expr: str) -> list[str]:
    """Numbers and single-character operators/parentheses; raises ExpressionError on anything else."""
    if len(expr) > MAX_EXPR_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPR_CHARS} characters")
    squeezed = expr.translate(_DROP_WHITESPACE)
    if "**" in squeezed or "//" in squeezed:
        raise ExpressionError("'**' and '//' are not allowed")
    tokens: list[str] = []
    depth = 0
    i, n = 0, len(expr)
    while i < n:
        c = expr[i]
        if c in _WHITESPACE:
            i += 1
        elif "0" <= c <= "9":  # ASCII digits only: str.isdigit() would accept '²' or Arabic-Indic digits
            j = i
            while j < n and "0" <= expr[j] <= "9":
                j += 1
            if j - i > MAX_LITERAL_DIGITS:
                raise ExpressionError(f"number literal longer than {MAX_LITERAL_DIGITS} digits")
            tokens.append(expr[i:j])
            i = j
        elif c in "+-*/()":
            if c == "(":
                depth += 1
                if depth > MAX_PAREN_DEPTH:
                    raise ExpressionError(f"parentheses nested deeper than {MAX_PAREN_DEPTH}")
            elif c == ")":
                depth -= 1
            tokens.append(c)
            i += 1
        else:
            raise ExpressionError(f"character {c!r} is not allowed")
    if not tokens:
        raise ExpressionError("empty expression")
    return tokens


class _Parser:
    """Recursive descent over the grammar
        expr   := term (('+' | '-') term)*
        term   := unary (('*' | '/') unary)*
        unary  := ('+' | '-')* atom          (signs folded in a loop, so no recursion per sign)
        atom   := NUMBER | '(' expr ')'
    emitting postfix. Recursion depth is bounded because `tokenize` caps parenthesis nesting."""

    def __init__(self, tokens: list[str]):
        self.tokens = tokens
        self.pos = 0
        self.out: list[str] = []  # postfix: numbers, binary ops, and "neg" for unary minus

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def parse(self) -> list[str]:
        self.expr()
        if self.pos != len(self.tokens):
            raise ExpressionError(f"unexpected {self.tokens[self.pos]!r}")
        return self.out

    def expr(self) -> None:
        self.term()
        while self.peek() in ("+", "-"):
            op = self.tokens[self.pos]
            self.pos += 1
            self.term()
            self.out.append(op)

    def term(self) -> None:
        self.unary()
        while self.peek() in ("*", "/"):
            op = self.tokens[self.pos]
            self.pos += 1
            self.unary()
            self.out.append(op)

    def unary(self) -> None:
        negative = False
        while self.peek() in ("+", "-"):
            negative ^= self.tokens[self.pos] == "-"
            self.pos += 1
        self.atom()
        if negative:
            self.out.append("neg")

    def atom(self) -> None:
        tok = self.peek()
        if tok is None:
            raise ExpressionError("expression ends early")
        if tok == "(":
            self.pos += 1
            self.expr()
            if self.peek() != ")":
                raise ExpressionError("unbalanced parentheses")
            self.pos += 1
        elif tok[0].isdigit():
            self.out.append(tok)
            self.pos += 1
        else:
            raise ExpressionError(f"unexpected {tok!r}")


def parse_expression(expr: str) -> list[str]:
    """Postfix form of a Countdown expression; raises ExpressionError if it is not a valid expression."""
    return _Parser(tokenize(expr)).parse()


def parse_ok(expr: str) -> bool:
    """True when `expr` is a syntactically valid expression (numbers not checked)."""
    try:
        parse_expression(expr)
        return True
    except ExpressionError:
        return False


def eval_postfix(postfix: list[str]) -> Fraction:
    stack: list[Fraction] = []
    for tok in postfix:
        if tok == "neg":
            stack.append(-stack.pop())
        elif tok in OPS:
            b, a = stack.pop(), stack.pop()
            if tok == "+":
                stack.append(a + b)
            elif tok == "-":
                stack.append(a - b)
            elif tok == "*":
                stack.append(a * b)
            else:
                if b == 0:
                    raise ExpressionError("division by zero")
                stack.append(a / b)
        else:
            stack.append(Fraction(int(tok)))
    return stack[0]


def check_puzzle(nums: Any, target: Any) -> tuple[list[int], Fraction]:
    """The given numbers and the target, checked: bad ones are a data bug, so this raises TypeError."""
    if not isinstance(nums, (list, tuple)) or not all(
            isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in nums):
        raise TypeError(f"malformed Countdown example: nums must be a list of integers, got {nums!r}")
    if isinstance(target, bool) or not isinstance(target, numbers.Real):
        raise TypeError(f"malformed Countdown example: target must be a number, got {target!r}")
    return sorted(int(x) for x in nums), Fraction(target)


def check_expression(expr: str, nums: list[int], target: int | float) -> tuple[bool, Fraction | None, str | None]:
    """(correct, value, reason-if-not). Literals are matched against `nums` before any arithmetic.

    A bad expression is a (False, ..., reason) result; bad `nums` or `target` raise TypeError."""
    given, goal = check_puzzle(nums, target)
    try:
        postfix = parse_expression(expr)
        used = sorted(int(t) for t in postfix if t[0].isdigit())
        if used != given:
            return False, None, f"numbers used {used} != given {given}"
        value = eval_postfix(postfix)
    except ExpressionError as exc:
        return False, None, str(exc)
    if abs(value - goal) < TOLERANCE:
        return True, value, None
    return False, value, f"value {value} != target {target}"



# ---- exact solver ---------------------------------------------------------------------------------------------
def _combine(a: dict[Fraction, str], b: dict[Fraction, str], out: dict[Fraction, str]) -> None:
    for x, ex in a.items():
        for y, ey in b.items():
            out.setdefault(x + y, f"({ex} + {ey})")
            out.setdefault(x * y, f"({ex} * {ey})")
            out.setdefault(x - y, f"({ex} - {ey})")
            out.setdefault(y - x, f"({ey} - {ex})")
            if y:
                out.setdefault(x / y, f"({ex} / {ey})")
            if x:
                out.setdefault(y / x, f"({ey} / {ex})")


def reachable_values(nums: list[int]) -> dict[Fraction, str]:
    """Every exact value reachable using all of `nums` once with + - * /, mapped to one expression for it.

    Dynamic programming over sub-multisets (bitmasks): values(S) = combine(values(A), values(S - A)) over all
    splits of S, which covers every binary expression tree. Fine for the 3-4 numbers of this task.
    """
    n = len(nums)
    table: dict[int, dict[Fraction, str]] = {1 << i: {Fraction(v): str(v)} for i, v in enumerate(nums)}
    for size in range(2, n + 1):
        for idx in combinations(range(n), size):
            mask = sum(1 << i for i in idx)
            vals: dict[Fraction, str] = {}
            sub = (mask - 1) & mask
            while sub:
                rest = mask ^ sub
                if sub < rest:  # each unordered split once; _combine tries both operand orders
                    _combine(table[sub], table[rest], vals)
                sub = (sub - 1) & mask
            table[mask] = vals
    return table[(1 << n) - 1]


def _strip_outer(expr: str) -> str:
    return expr[1:-1] if expr.startswith("(") and parse_ok(expr[1:-1]) else expr


def solve_countdown(nums: list[int], target: int) -> str | None:
    """One expression using every number once that equals `target` exactly, or None if there is none."""
    expr = reachable_values(list(nums)).get(Fraction(target))
    return None if expr is None else _strip_outer(expr)


def puzzle_key(example: Example) -> tuple[int, tuple[int, ...]]:
    """Identity of a puzzle: the target and the multiset of numbers (their order does not matter)."""
    return int(example["target"]), tuple(sorted(int(x) for x in example["nums"]))
