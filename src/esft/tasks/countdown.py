"""Countdown: combine the given numbers with + - * / to reach the target (TinyZero / Qiu et al. task).

Scoring (paper Table 19): the last `\\boxed{...}` must hold an expression using each given number exactly once,
with + - * / and parentheses only, whose exact value equals the target (esft.tasks.countdown_expression: a safe
parser, never `eval`). Whatever the completion holds, it scores 0.0 or 1.0 without raising; a malformed *example*
(missing `nums` or `target`, non-integer numbers) is a data bug and raises.

Splits: `test` = the first 2,000 of the 2,001 test rows; `train_pool` = the 8,001 train rows minus the 5 that
repeat a test puzzle with the numbers in another order (7,996); `train` = 200 of those drawn by
`random.Random(42)`; `generated` = `generated_size` fresh solvable puzzles from `generate_countdown`
(seed `generated_seed`, none equal to a test puzzle).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from esft.tasks.base import Example, Messages, Task, chat, extracted_fields, last_boxed
from esft.tasks.common import TEST_SIZE, TRAIN_SIZE, bundled, load_hub_rows, seeded_sample
from esft.tasks.countdown_expression import OPS, check_expression, check_puzzle, parse_ok, puzzle_key
from esft.tasks.countdown_variants import (
    VARIANT_DEFAULTS, format_shot, generate_countdown, generate_variant, target_operator, variant_options,
)

HF_DATASET = "Jiayi-Pan/Countdown-Tasks-3to4"

SYSTEM_PROMPT = (
    "You are given a list of numbers and a target. Write an arithmetic expression that uses each given number "
    "exactly once, with only + - * / and parentheses, and equals the target. Think step by step, then give the "
    "final expression (not its value, and without \"= target\") in \\boxed{}. For example, for the numbers "
    "[3, 7, 25] and the target 46, finish with \\boxed{25 + 3 * 7}."
)


# ---- the task ---------------------------------------------------------------------------------------------------
def hub_row_to_example(row: dict[str, Any], index: int) -> Example:
    """Map a `Jiayi-Pan/Countdown-Tasks-3to4` row (`target`, `nums`) to an example."""
    return {"id": f"hf/{index}", "nums": [int(x) for x in row["nums"]], "target": int(row["target"]), "hf_row": index}


def _bundled_example(row: dict[str, Any], split: str) -> Example:
    return {"id": f"{split}/{row['hf_row']}", "nums": list(row["nums"]), "target": row["target"],
            "hf_row": row["hf_row"]}


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
    #: with ask_format: how many worked puzzles, the k-th built with the k-th operator of `ops` (cycling), so that
    #: e.g. `ops=+*,shots=2` shows one addition and one multiplication instead of only the first operator
    shots: int = 1
    _variant: bool = field(default=False, init=False, repr=False, compare=False)
    # the most frequent target is no answer the scorer takes (it needs an expression of the given numbers)
    constant_baseline_is_bound = True
    _cache: dict[str, list[Example]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.shots, bool) or not isinstance(self.shots, int) or self.shots < 1:
            raise ValueError(f"shots must be an integer >= 1, got {self.shots!r}")
        given = {k: getattr(self, k) for k in VARIANT_DEFAULTS if getattr(self, k) is not None}
        if not given:
            return
        if self.hf_dataset:
            raise ValueError("a procedural Countdown variant is generated; it does not read hf_dataset")
        for key, value in variant_options(given).items():
            setattr(self, key, value)
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

    def why_empty(self, split: str) -> str:
        """A variant's split is empty when its numbers allow too few distinct puzzles (test puzzles are kept out of
        train): the options that decide it."""
        if not self._variant:
            return ""
        low, high = self.numbers if isinstance(self.numbers, tuple) else (self.numbers, self.numbers)
        numbers = low if low == high else f"{low}..{high}"
        return (f"numbers={numbers}, min_number={self.min_number} and max_number={self.max_number} allow too "
                f"few distinct puzzles for a {split} split (each split's puzzles are kept out of the other's): "
                "widen min_number..max_number, or use more numbers")

    def _user_turn(self, nums: list[int], target: int) -> str:
        ops = " ".join(self.ops) if self._variant else "+ - * /"
        ops = ops if len(ops) == 1 else f"{ops} and parentheses"  # one operator needs no grouping
        return (f"Numbers: [{', '.join(str(x) for x in nums)}]\nTarget: {target}\n"
                f"Use each number exactly once with {ops} to make the target. Put the final expression in \\boxed{{}}.")

    def prompt(self, example: Example) -> Messages:
        messages = chat(self.system_prompt, self._user_turn(example["nums"], example["target"]))
        if self.ask_format:
            ops = self.ops if self._variant else OPS
            shots = []
            for k in range(self.shots):
                nums, target, expr = format_shot(ops[k % len(ops):], self.numbers[0] if self._variant else 3)
                shots += [{"role": "user", "content": self._user_turn(nums, target)},
                          {"role": "assistant", "content": f"{expr} = {target}, so the answer is \\boxed{{{expr}}}."}]
            messages = messages[:1] + shots + messages[1:]
        return messages

    def label_set(self) -> tuple[str, ...] | None:
        """A variant with several operators balances its held-out puzzles over the operator that reaches the
        target (`target_operator`): on `ops=+*` "always add" then scores 50%, not the split's share of additions.
        The label looks over all four operators, as the scorer accepts all four: x * 1 (also x / 1) is "other" on
        `ops=+*` and never drawn. The CPU study's held-out sets and results (docs/results/cpu-study) are drawn
        with these labels."""
        return tuple(self.ops) if self._variant and len(self.ops) > 1 else None

    def balance_key(self, example: Example) -> Any:
        return target_operator(example)

    def _check(self, completion: str, example: Example) -> tuple[bool, str | None, str | None]:
        nums, target = example["nums"], example["target"]
        check_puzzle(nums, target)  # a malformed example raises even when the completion has no box
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
        out: dict[str, Any] = extracted_fields(expr)
        if reason:
            out["error"] = reason
        return out
