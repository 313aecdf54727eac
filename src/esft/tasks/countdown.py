"""Countdown: combine the given numbers with + - * / to reach the target (TinyZero / Qiu et al. task).

Scoring (paper Table 19): the last `\\boxed{...}` must hold an expression made only of digits, + - * / ( ) and
whitespace (spaces, tabs, line breaks), using each given number exactly once (as a multiset), whose exact value
equals the target within 1e-5.

The expression is never passed to `eval`. A small hand-written parser (recursive descent, depth bounded by a
pre-scan) turns it into postfix, the literals are checked against the numbers *before* any arithmetic (so at
most four small numbers are ever combined), and the value is computed with `fractions.Fraction`. Unary + and -
are accepted, as the eval-based reference scorers accept them; decimals, `**`, `//`, names and any other
character are rejected. Whatever the completion holds, it scores 0.0 or 1.0 without raising; a malformed
*example* (missing `nums` or `target`, non-integer numbers) is a data bug and raises.

Splits: `test` = the first 2,000 of the 2,001 test rows; `train_pool` = the 8,001 train rows minus the 5 that
repeat a test puzzle with the numbers in another order (7,996); `train` = 200 of those drawn by
`random.Random(42)`; `generated` = `generated_size` fresh solvable puzzles from `generate_countdown`
(seed `generated_seed`, none equal to a test puzzle).
"""

from __future__ import annotations

import hashlib
import numbers
import random
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import combinations
from typing import Any

from esft.tasks.base import Example, Messages, Task, chat, last_boxed
from esft.tasks.common import TEST_SIZE, TRAIN_SIZE, bundled, load_hub_rows, seeded_sample

HF_DATASET = "Jiayi-Pan/Countdown-Tasks-3to4"

#: Limits that keep the scorer fast on adversarial input (a real answer is ~20 characters).
MAX_EXPR_CHARS = 1000
MAX_LITERAL_DIGITS = 6
MAX_PAREN_DEPTH = 50
TOLERANCE = Fraction(1, 100_000)

SYSTEM_PROMPT = (
    "You are given a list of numbers and a target. Write an arithmetic expression that uses each given number "
    "exactly once, with only + - * / and parentheses, and equals the target. Think step by step, then give the "
    "final expression (not its value, and without \"= target\") in \\boxed{}. For example, for the numbers "
    "[3, 7, 25] and the target 46, finish with \\boxed{25 + 3 * 7}."
)

_OPS = "+-*/"


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
        elif tok in _OPS:
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


def _puzzle(nums: Any, target: Any) -> tuple[list[int], Fraction]:
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
    given, goal = _puzzle(nums, target)
    try:
        postfix = parse_expression(expr)
        used = sorted(int(t) for t in postfix if t[0].isdigit())
        if used != given:
            return False, None, f"numbers used {used} != given {given}"
        value = eval_postfix(postfix)
    except ExpressionError as exc:
        return False, None, str(exc)
    if abs(value - goal) <= TOLERANCE:
        return True, value, None
    return False, value, f"value {value} != target {target}"


# ---- exact solver and puzzle generator ---------------------------------------------------------------------
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


def _random_expression(nums: list[int], rng: random.Random, ops: str = _OPS) -> tuple[Fraction, str] | None:
    """Combine `nums` in a random binary tree with operators drawn from `ops`; None on division by zero."""
    items = [(Fraction(v), str(v)) for v in nums]
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        (a, ea), (b, eb) = items[i], items[j]
        op = rng.choice(ops)
        if op == "/" and b == 0:
            return None
        value = a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b
        items = [it for k, it in enumerate(items) if k not in (i, j)] + [(value, f"({ea} {op} {eb})")]
    value, expr = items[0]
    return value, (expr[1:-1] if len(nums) > 1 else expr)


def generate_countdown(
    n: int,
    seed: int = 0,
    *,
    min_count: int = 3,
    max_count: int = 4,
    num_range: tuple[int, int] = (1, 99),
    target_range: tuple[int, int] = (10, 100),
    exclude: set[tuple[int, tuple[int, ...]]] | None = None,
) -> list[Example]:
    """`n` solvable puzzles, deterministic in `seed` (the recipe of the dataset's SOURCE.md).

    Draw 3-4 numbers, combine them in a random expression tree with random operators, keep the puzzle when
    the exact value is an integer in `target_range`. The witness expression is then re-checked by the same
    exact checker the scorer uses, so every puzzle is solvable and its `solution` scores 1.0. (Drawing the
    target uniformly from all reachable values with `reachable_values` would be ~20x slower.) `exclude` holds
    (target, sorted nums) pairs to avoid, e.g. the test set; duplicates within the output are skipped too.
    """
    rng = random.Random(seed)
    seen = set(exclude or ())
    lo_t, hi_t = target_range
    out: list[Example] = []
    count = rng.randint(min_count, max_count)  # drawn per puzzle, kept across retries: 4-number draws are
    while len(out) < n:                        # rejected more often and would otherwise be under-represented
        nums = [rng.randint(*num_range) for _ in range(count)]
        made = _random_expression(nums, rng)
        if made is None or made[0].denominator != 1 or not lo_t <= made[0] <= hi_t:
            continue
        target, expr = int(made[0]), made[1]
        key = puzzle_key({"target": target, "nums": nums})
        if key in seen or not check_expression(expr, nums, target)[0]:
            continue
        seen.add(key)
        out.append({"id": f"generated/{seed}/{len(out)}", "nums": nums, "target": target, "solution": expr})
        count = rng.randint(min_count, max_count)
    return out


# ---- procedural variants -------------------------------------------------------------------------------------------
def _int_option(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if number < low or (high is not None and number > high):
        raise ValueError(f"{name} must be >= {low}" + (f" and <= {high}" if high is not None else "")
                         + f", got {value!r}")
    return number


#: Defaults of a procedural variant for the options it does not set (the bundled data's shape: 3-4 numbers, 1-99).
VARIANT_DEFAULTS = {"numbers": (3, 4), "min_number": 1, "max_number": 99, "ops": _OPS, "data_seed": 0,
                    "train_size": 1000, "test_size": 500}
MAX_COUNT = 6
#: One puzzle in HELDOUT_SHARE, chosen by a hash of its key, belongs to the held-out split.
HELDOUT_SHARE = 4
#: A variant split stops early (with fewer puzzles) after this many draws in a row add nothing: the puzzle space
#: of a small variant (2 numbers in 1-20 with + only has 210 puzzles) can run out.
MAX_MISSES = 20_000


def parse_count_range(value: Any) -> tuple[int, int]:
    """How many numbers a puzzle has: 2, "2", "2..3" or [2, 3] -> (low, high), with 2 <= low <= high <= 6."""
    try:
        if isinstance(value, str):
            lo_text, sep, hi_text = value.strip().partition("..")
            lo, hi = (int(lo_text), int(hi_text)) if sep else (int(lo_text), int(lo_text))
        elif isinstance(value, (list, tuple)) and len(value) == 2:
            lo, hi = int(value[0]), int(value[1])
        elif isinstance(value, int) and not isinstance(value, bool):
            lo = hi = value
        else:
            raise TypeError
    except (TypeError, ValueError):
        raise ValueError(f"numbers must be a count or a range like 2..3, got {value!r}") from None
    if not 2 <= lo <= hi <= MAX_COUNT:
        raise ValueError(f"numbers must lie in 2..{MAX_COUNT} with low <= high, got {value!r}")
    return lo, hi


def parse_ops(value: Any) -> str:
    """The operators a variant's targets are built with, e.g. "+*", in the order + - * /."""
    text = str(value).replace(" ", "")
    bad = sorted(set(text) - set(_OPS))
    if not text or bad:
        raise ValueError(f"ops must be a non-empty string of + - * /, got {value!r}")
    return "".join(op for op in _OPS if op in text)


def is_heldout(key: tuple[int, tuple[int, ...]]) -> bool:
    """Whether a puzzle belongs to a variant's held-out split: a hash of its key, the same for every seed and
    size, so train and test never share a puzzle."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % HELDOUT_SHARE == 0


def generate_variant(n: int, split: str, *, numbers: tuple[int, int], num_range: tuple[int, int], ops: str,
                     seed: int = 0, max_misses: int = MAX_MISSES) -> list[Example]:
    """Up to `n` distinct puzzles of a procedural variant's `split` ("train" or "test"), deterministic in `seed`.

    Each draw takes a count in `numbers`, that many integers in `num_range`, and a random expression tree over
    them with operators from `ops` (esft's generator recipe); its value is the target when it is a positive
    integer. Train and test draw from separate streams (`random.Random("countdown/<split>/<seed>")`) and keep only
    puzzles on their side of `is_heldout`, so they are disjoint; within a split no puzzle (target and multiset
    of numbers) repeats. Fewer than `n` come back when `max_misses` draws in a row add nothing.
    """
    if split not in ("train", "test"):
        raise ValueError(f"a Countdown variant has the splits train and test, got {split!r}")
    rng = random.Random(f"countdown/{split}/{seed}")
    heldout = split == "test"
    seen: set[tuple[int, tuple[int, ...]]] = set()
    out: list[Example] = []
    misses = 0
    while len(out) < n and misses < max_misses:
        misses += 1
        nums = [rng.randint(*num_range) for _ in range(rng.randint(*numbers))]
        made = _random_expression(nums, rng, ops)
        if made is None or made[0].denominator != 1 or made[0] < 1:
            continue
        target, expr = int(made[0]), made[1]
        key = puzzle_key({"target": target, "nums": nums})
        if key in seen or is_heldout(key) != heldout or not check_expression(expr, nums, target)[0]:
            continue
        seen.add(key)
        out.append({"id": f"{split}/{seed}/{len(out)}", "nums": nums, "target": target, "solution": expr})
        misses = 0
    return out


#: With `ask_format` the prompt shows the answer format on one worked puzzle, a user turn and an answer in that
#: format, before the real one. Probed on SmolLM2-135M (greedy, 2 numbers in 1-20, + only): with the system prompt
#: alone it writes equations like "17 + 16 = 33" but boxes none; a user turn that adds "e.g. \boxed{3 + 5}" gets
#: every answer boxed, as "\boxed{3 + 5}" copied; after the worked puzzle it boxes every answer with its own numbers.
FORMAT_SHOT_NUMBERS = {"+": [3, 5, 2, 4, 6, 1], "-": [20, 5, 3, 2, 1, 1], "*": [3, 5, 2, 4, 1, 2],
                       "/": [48, 2, 3, 2, 2, 1]}


def format_shot(ops: str, count: int) -> tuple[list[int], int, str]:
    """(numbers, target, expression) of the worked puzzle: `count` numbers joined by the first of `ops`."""
    op = ops[0]
    nums = FORMAT_SHOT_NUMBERS[op][:count]
    expr = f" {op} ".join(str(x) for x in nums)
    return nums, int(eval_postfix(parse_expression(expr))), expr


# ---- the task ---------------------------------------------------------------------------------------------------
def hub_row_to_example(row: dict[str, Any], index: int) -> Example:
    """Map a `Jiayi-Pan/Countdown-Tasks-3to4` row (`target`, `nums`) to an example."""
    return {"id": f"hf/{index}", "nums": [int(x) for x in row["nums"]], "target": int(row["target"]), "hf_row": index}


def _bundled_example(row: dict[str, Any], split: str) -> Example:
    return {"id": f"{split}/{row['hf_row']}", "nums": list(row["nums"]), "target": row["target"], "hf_row": row["hf_row"]}


@dataclass
class CountdownTask(Task):
    name: str = "countdown"
    splits: tuple[str, ...] = ("train", "test", "train_pool", "generated")
    system_prompt: str = SYSTEM_PROMPT
    #: load from the Hugging Face hub instead of the bundled copy (rows [0, 8001) train, [8001, 10002) test)
    hf_dataset: str | None = None
    generated_size: int = 2000
    generated_seed: int = 0
    #: Setting any of the next seven options makes a procedural variant (`generate_variant`; the rest take
    #: VARIANT_DEFAULTS): splits train and test only, neither from the bundled data. How many numbers: 2 or "2..3".
    numbers: Any = None
    min_number: int | None = None
    max_number: int | None = None
    #: operators the targets are built with and the user turn names, e.g. "+*" (the scorer accepts all four)
    ops: str | None = None
    data_seed: int | None = None
    train_size: int | None = None
    test_size: int | None = None
    #: show the answer format on a worked puzzle before the real one (`format_shot`), for the bundled data too
    ask_format: bool = False
    _variant: bool = field(default=False, init=False, repr=False, compare=False)
    _cache: dict[str, list[Example]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        given = {k: getattr(self, k) for k in VARIANT_DEFAULTS if getattr(self, k) is not None}
        if not given:
            return
        if self.hf_dataset:
            raise ValueError("a procedural Countdown variant is generated; it does not read hf_dataset")
        opts = {**VARIANT_DEFAULTS, **given}
        self.numbers = parse_count_range(opts["numbers"])
        self.ops = parse_ops(opts["ops"])
        self.min_number = _int_option("min_number", opts["min_number"], 1, 10**MAX_LITERAL_DIGITS - 1)
        self.max_number = _int_option("max_number", opts["max_number"], self.min_number, 10**MAX_LITERAL_DIGITS - 1)
        self.data_seed = _int_option("data_seed", opts["data_seed"], 0)
        self.train_size = _int_option("train_size", opts["train_size"], 1)
        self.test_size = _int_option("test_size", opts["test_size"], 1)
        self.splits = ("train", "test")
        self._variant = True

    def _pools(self) -> tuple[list[Example], list[Example]]:
        if "pool" not in self._cache:
            if self.hf_dataset:
                rows = load_hub_rows(self.hf_dataset, "train[:10002]")
                pool = [hub_row_to_example(r, i) for i, r in enumerate(rows)]
                self._cache["pool"], self._cache["test_all"] = pool[:8001], pool[8001:]
            else:
                self._cache["pool"] = [_bundled_example(r, "train") for r in bundled("countdown_train.jsonl.gz")]
                self._cache["test_all"] = [_bundled_example(r, "test") for r in bundled("countdown_test.jsonl.gz")]
        return self._cache["pool"], self._cache["test_all"]

    def _load(self, split: str) -> list[Example]:
        if self._variant:
            if split not in self._cache:
                size = self.train_size if split == "train" else self.test_size
                self._cache[split] = generate_variant(size, split, numbers=self.numbers, ops=self.ops,
                                                      num_range=(self.min_number, self.max_number),
                                                      seed=self.data_seed)
            return [dict(r, nums=list(r["nums"])) for r in self._cache[split]]
        pool, test_all = self._pools()
        test_keys = {puzzle_key(r) for r in test_all}
        if split in ("train", "train_pool"):
            # 5 train rows repeat a test puzzle up to the order of the numbers: drop them (no leakage).
            rows = [r for r in pool if puzzle_key(r) not in test_keys]
            if split == "train":
                rows = seeded_sample(rows, TRAIN_SIZE)
        elif split == "test":
            rows = test_all[:TEST_SIZE]
        else:  # generated
            rows = generate_countdown(self.generated_size, self.generated_seed, exclude=test_keys)
        return [dict(r, nums=list(r["nums"])) for r in rows]  # fresh copies: callers may mutate examples

    def _user_turn(self, nums: list[int], target: int) -> str:
        ops = " ".join(self.ops) if self._variant else "+ - * /"
        ops = ops if len(ops) == 1 else f"{ops} and parentheses"  # one operator needs no grouping
        return (f"Numbers: [{', '.join(str(x) for x in nums)}]\nTarget: {target}\n"
                f"Use each number exactly once with {ops} to make the target. Put the final expression in \\boxed{{}}.")

    def prompt(self, example: Example) -> Messages:
        messages = chat(self.system_prompt, self._user_turn(example["nums"], example["target"]))
        if self.ask_format:
            nums, target, expr = format_shot(self.ops if self._variant else _OPS, self.numbers[0] if self._variant else 3)
            shot = [{"role": "user", "content": self._user_turn(nums, target)},
                    {"role": "assistant", "content": f"{expr} = {target}, so the answer is \\boxed{{{expr}}}."}]
            messages = messages[:1] + shot + messages[1:]
        return messages

    def _check(self, completion: str, example: Example) -> tuple[bool, str | None, str | None]:
        nums, target = example["nums"], example["target"]
        _puzzle(nums, target)  # a malformed example raises even when the completion has no box
        expr = last_boxed(completion)
        if expr is None:
            return False, None, "no \\boxed{} answer"
        ok, _, reason = check_expression(expr, nums, target)
        return ok, expr, reason

    def score(self, completion: str, example: Example) -> float:
        return 1.0 if self._check(completion, example)[0] else 0.0

    def is_well_formed(self, completion: str, example: Example) -> bool:
        expr = last_boxed(completion)
        return expr is not None and parse_ok(expr)

    def details(self, completion: str, example: Example) -> dict[str, Any]:
        ok, expr, reason = self._check(completion, example)
        out: dict[str, Any] = {"extracted": expr if expr is None or len(expr) <= 200 else expr[:200] + "..."}
        if reason:
            out["error"] = reason
        return out
