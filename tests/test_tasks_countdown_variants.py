"""Procedural Countdown variants and task names with options (esft.tasks.get_task, esft.tasks.countdown)."""

from __future__ import annotations

from pathlib import Path

import pytest

from esft.eval_config import EvalConfig, task_options
from esft.tasks import get_task, is_task_name, parse_task_name, split_task_list, task_file_stem
from esft.tasks.countdown import CountdownTask
from esft.tasks.countdown_expression import check_expression, puzzle_key
from esft.tasks.countdown_variants import (
    MAX_COUNT, format_shot, generate_variant, is_heldout, parse_count_range, parse_ops,
)

SMALL = "countdown:numbers=2,max_number=20,ops=+*"


def keys(rows):
    return [puzzle_key(r) for r in rows]


# ---- task names with options ---------------------------------------------------------------------------------
def test_name_options_reach_the_constructor():
    task = get_task(" Countdown:numbers=2..3, max_number=20, ops=*+, ask_format=true ")
    assert isinstance(task, CountdownTask)
    assert task.numbers == (2, 3) and task.max_number == 20 and task.min_number == 1
    assert task.ops == "+*" and task.ask_format is True and task.splits == ("train", "test")
    assert get_task("boolq:max_passage_chars=400").max_passage_chars == 400
    assert parse_task_name("countdown:ops=+-*/,numbers=2") == ("countdown", {"ops": "+-*/", "numbers": "2"})
    assert parse_task_name("mmlu") == ("mmlu", {})


@pytest.mark.parametrize("name,words", [
    ("countdown:numbers=0", ["numbers", "2..6"]),
    ("countdown:numbers=1", ["numbers"]),
    (f"countdown:numbers={MAX_COUNT + 1}", ["numbers"]),
    ("countdown:numbers=3..2", ["low <= high"]),
    ("countdown:numbers=two", ["numbers"]),
    ("countdown:numbers=2..", ["numbers"]),
    ("countdown:ops=^", ["ops"]),
    ("countdown:ops=+x", ["ops"]),
    ("countdown:max_number=0", ["max_number"]),
    ("countdown:min_number=10,max_number=5", ["max_number", ">= 10"]),
    ("countdown:max_number=1000000", ["max_number"]),
    ("countdown:max_number=big", ["bad value 'big'", "max_number"]),
    ("countdown:test_size=0", ["test_size"]),
    ("countdown:ask_format=maybe", ["ask_format"]),
    ("countdown:numbrs=2", ["unknown option 'numbrs'", "numbers"]),
    ("countdown:name=x", ["unknown option 'name'"]),
    ("countdown:numbers=2,numbers=3", ["given twice"]),
    ("countdown:numbers", ["not key=value"]),
    ("countdown:numbers=", ["not key=value"]),
    ("countdown:", ["no options"]),
    (":numbers=2", ["empty task name"]),
    ("countdwn:numbers=2", ["unknown task"]),
    ("countdown:numbers=2,hf_dataset=x/y", ["hf_dataset"]),
])
def test_bad_names_are_value_errors(name, words):
    with pytest.raises(ValueError) as info:
        get_task(name)
    for word in words:
        assert word in str(info.value)
    assert not is_task_name(name)


def test_an_option_in_the_name_and_as_a_keyword_is_an_error():
    with pytest.raises(ValueError, match="max_number"):
        get_task("countdown:max_number=20", max_number=30)
    assert get_task("countdown:max_number=20", ops="+").ops == "+"  # distinct options combine


def test_task_lists_keep_options_together():
    assert split_task_list("countdown:numbers=2,ops=+*,boolq, mmlu") == ["countdown:numbers=2,ops=+*", "boolq", "mmlu"]
    # argparse's list converter splits at every comma: EvalConfig joins the pieces again
    assert EvalConfig(tasks=["countdown:numbers=2", "max_number=20", "boolq"]).tasks == [
        "countdown:numbers=2,max_number=20", "boolq"]
    with pytest.raises(ValueError, match="does not follow"):
        split_task_list("numbers=2,boolq")
    with pytest.raises(ValueError, match="does not follow"):
        split_task_list("boolq,numbers=2")
    assert task_options("boolq:max_passage_chars=100", 400) == {}  # the name's own value wins
    assert task_options("boolq", 400) == {"max_passage_chars": 400}


def test_file_stems_are_flat_and_distinct():
    names = ["countdown:ops=+-*/", "countdown:ops=+-*", "countdown:numbers=2,ops=+", "boolq"]
    stems = [task_file_stem(n) for n in names]
    assert len(set(stems)) == len(stems) and not any("/" in s or "*" in s for s in stems)
    assert task_file_stem("boolq") == "boolq" and task_file_stem("countdown:numbers=2,ops=+") == "countdown:numbers=2,ops=+"


def test_spec_accepts_task_names_with_options(tmp_path: Path):
    from esft.experiments import SpecError, load_spec

    text = ("name: t\nkind: single-task\nmodel: smollm2-135m\ntasks: ['countdown:numbers=2,ops=+', boolq]\n"
            "seeds: [1]\nalgorithms:\n  es:\n    preset: cpu\nevaluation:\n  holdout: []\n  limit: 3\n")
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    assert load_spec(path).tasks == ["countdown:numbers=2,ops=+", "boolq"]
    path.write_text(text.replace("tasks: ['countdown:numbers=2,ops=+', boolq]", "tasks: countdown:numbers=2,ops=+, boolq"))
    assert load_spec(path).tasks == ["countdown:numbers=2,ops=+", "boolq"]
    path.write_text(text.replace("numbers=2,ops=+", "numbers=0"))
    with pytest.raises(SpecError, match="numbers"):
        load_spec(path)


# ---- option parsing ------------------------------------------------------------------------------------------
def test_count_range_and_ops_parsing():
    assert parse_count_range("2") == (2, 2) and parse_count_range("2..4") == (2, 4)
    assert parse_count_range(3) == (3, 3) and parse_count_range([2, 3]) == (2, 3)
    for bad in (0, 1, True, "0..2", "4..3", [2], None, 2.5):
        with pytest.raises(ValueError):
            parse_count_range(bad)
    assert parse_ops("*+") == "+*" and parse_ops("/ -") == "-/"
    for bad in ("", "%", "+x", "**x"):
        with pytest.raises(ValueError):
            parse_ops(bad)


# ---- generation ------------------------------------------------------------------------------------------------
def test_generation_is_deterministic_in_the_seed():
    a, b = get_task(SMALL), get_task(SMALL)
    for split in ("train", "test"):
        assert a.load(split) == b.load(split)
    other = get_task(SMALL + ",data_seed=1")
    assert keys(other.load("train")) != keys(a.load("train"))
    # the held-out set does not move with the train size
    assert get_task(SMALL + ",train_size=10").load("test") == a.load("test")
    assert get_task(SMALL + ",test_size=10").load("test") == a.load("test")[:10]


@pytest.mark.parametrize("name", [SMALL, "countdown:numbers=2..3,max_number=30,ops=+-*/",
                                  "countdown:numbers=2..3,max_number=20,ops=+*,data_seed=7",
                                  "countdown:numbers=2,min_number=10,max_number=40,ops=+-"])
def test_train_and_test_are_disjoint_solvable_and_within_the_options(name):
    task = get_task(name)
    train, test = task.load("train"), task.load("test")
    assert train and test
    assert len(set(keys(train))) == len(train) and len(set(keys(test))) == len(test)   # no repeats in a split
    assert not set(keys(train)) & set(keys(test))                                      # disjoint
    assert all(is_heldout(k) for k in keys(test)) and not any(is_heldout(k) for k in keys(train))
    lo, hi = task.numbers
    for ex in train + test:
        assert lo <= len(ex["nums"]) <= hi and all(task.min_number <= x <= task.max_number for x in ex["nums"])
        assert isinstance(ex["target"], int) and ex["target"] >= 1
        assert set(ex["solution"]) <= set(task.ops + "0123456789 ()")
        assert task.score(f"so \\boxed{{{ex['solution']}}}", ex) == 1.0
    assert task.load("test", limit=5) == test[:5]


def test_a_small_puzzle_space_runs_out_and_is_split_whole():
    # 2 numbers in 1..5 with + only: 15 puzzles (one per multiset), each in exactly one split
    task = get_task("countdown:numbers=2,max_number=5,ops=+")
    train, test = task.load("train"), task.load("test")
    assert len(train) + len(test) == 15
    assert set(keys(train)) | set(keys(test)) == {(a + b, (a, b)) for a in range(1, 6) for b in range(a, 6)}


def test_division_variants_have_division_puzzles():
    puzzles = generate_variant(10, "train", numbers=(2, 2), num_range=(1, 20), ops="/", max_misses=2000)
    assert len(puzzles) == 10 and all("/" in p["solution"] for p in puzzles)


def test_generate_variant_rejects_other_splits():
    with pytest.raises(ValueError, match="train and test"):
        generate_variant(3, "generated", numbers=(2, 2), num_range=(1, 9), ops="+")


def test_loaded_examples_are_fresh_copies():
    task = get_task(SMALL)
    task.load("train")[0]["nums"].append(99)
    assert 99 not in task.load("train")[0]["nums"]


# ---- the default task and prompts -------------------------------------------------------------------------------
def test_default_countdown_is_unchanged():
    task = get_task("countdown")
    assert task.splits == ("train", "test", "train_pool", "generated") and not task.ask_format
    ex = task.load("test", 1)[0]
    assert ex["id"] == "test/8001" and ex["nums"] == [96, 7, 37, 74] and ex["target"] == 55
    assert task.prompt(ex)[1]["content"] == (
        "Numbers: [96, 7, 37, 74]\nTarget: 55\nUse each number exactly once with + - * / and parentheses to make "
        "the target. Put the final expression in \\boxed{}.")


def test_ask_format_and_variant_prompts():
    ex = {"nums": [17, 16], "target": 33}
    plain = get_task(SMALL).prompt(ex)
    assert [m["role"] for m in plain] == ["system", "user"]
    assert "with + * and parentheses to make the target" in plain[1]["content"]
    asked = get_task(SMALL + ",ask_format=1").prompt(ex)
    assert [m["role"] for m in asked] == ["system", "user", "assistant", "user"]
    assert asked[0] == plain[0] and asked[3] == plain[1]          # the real puzzle's turns are unchanged
    assert asked[1]["content"].startswith("Numbers: [3, 5]\nTarget: 8\nUse each number exactly once with + *")
    assert asked[2]["content"] == "3 + 5 = 8, so the answer is \\boxed{3 + 5}."
    assert get_task("countdown:numbers=2,ops=+").prompt(ex)[1]["content"].endswith(
        "Use each number exactly once with + to make the target. Put the final expression in \\boxed{}.")
    bundled = get_task("countdown:ask_format=true")
    assert bundled.splits[0] == "train" and "generated" in bundled.splits   # still the bundled data
    assert bundled.prompt(ex)[2]["content"] == "3 + 5 + 2 = 10, so the answer is \\boxed{3 + 5 + 2}."


@pytest.mark.parametrize("ops", ["+", "-", "*", "/", "-/", "*/"])
@pytest.mark.parametrize("count", range(2, MAX_COUNT + 1))
def test_the_worked_puzzle_is_correct_for_every_variant(ops, count):
    nums, target, expr = format_shot(ops, count)
    assert len(nums) == count and target >= 1 and check_expression(expr, nums, target)[0]
    assert ops[0] in expr


def test_fixed_rule_baselines_on_hand_made_puzzles():
    """The operator prior: the accuracy of "always add" / "always multiply" ... on puzzles, in the given order."""
    from esft.tasks.countdown_variants import fixed_rule_baselines, fixed_rule_value, target_operator

    puzzles = [{"nums": [3, 5], "target": 8}, {"nums": [3, 5], "target": 15}, {"nums": [9, 4], "target": 5},
               {"nums": [2, 2], "target": 4}, {"nums": [7, 0], "target": 1}]
    assert fixed_rule_value([7, 0], "/") is None and fixed_rule_value([9, 4], "-") == 5
    assert fixed_rule_baselines(puzzles) == {"+": 0.4, "-": 0.2, "*": 0.4, "/": 0.0}
    # 2 + 2 == 2 * 2: a target two rules reach has no single operator
    assert [target_operator(p) for p in puzzles] == ["+", "*", "-", "other", "other"]
    # the operator is found in any order of the numbers (50 - 26 given [26, 50]), unlike the fixed rules
    assert target_operator({"nums": [26, 50], "target": 24}) == "-" and fixed_rule_value([26, 50], "-") == -24
    assert target_operator({"nums": [2, 8], "target": 4}) == "/"


def test_fixed_rule_baseline_of_the_cpu_study_variant():
    """On the +/* variant the 'always add' rule is the prior the CPU study measures ES against."""
    from esft.tasks.countdown_variants import fixed_rule_baselines

    task = get_task("countdown:numbers=2,max_number=50,ops=+*,ask_format=1")
    rules = fixed_rule_baselines(task.load("test", 200))
    assert rules["+"] == pytest.approx(0.555) and rules["*"] == pytest.approx(0.445)
    assert rules["-"] == 0.0 and rules["/"] == 0.0


def test_shots_show_one_worked_puzzle_per_operator():
    """`shots=2` with ops +* shows an addition and a multiplication; the default shows only the first operator."""
    two = get_task("countdown:numbers=2,max_number=50,ops=+*,ask_format=1,shots=2")
    one = get_task("countdown:numbers=2,max_number=50,ops=+*,ask_format=1")
    example = two.load("test", 1)[0]
    answers = [m["content"] for m in two.prompt(example) if m["role"] == "assistant"]
    assert answers == ["3 + 5 = 8, so the answer is \\boxed{3 + 5}.", "3 * 5 = 15, so the answer is \\boxed{3 * 5}."]
    assert [m["content"] for m in one.prompt(example) if m["role"] == "assistant"] == answers[:1]
    assert two.prompt(example)[-1] == one.prompt(example)[-1]  # the real puzzle comes last, unchanged
    with pytest.raises(ValueError, match="shots"):
        get_task("countdown:numbers=2,ops=+*,ask_format=1,shots=0")
    with pytest.raises(ValueError, match="shots"):
        CountdownTask(ask_format=True, shots=True)   # a bool is no count of puzzles


def test_shots_cycle_through_the_operators_and_use_the_fewest_numbers():
    """More shots than operators start over at the first operator; a worked puzzle has as many numbers as the
    variant's smallest puzzle (2 for numbers=2..3)."""
    task = get_task("countdown:numbers=2..3,max_number=20,ops=+*,ask_format=1,shots=3")
    messages = task.prompt({"nums": [4, 6, 7], "target": 31})
    answers = [m["content"] for m in messages if m["role"] == "assistant"]
    assert answers == ["3 + 5 = 8, so the answer is \\boxed{3 + 5}.", "3 * 5 = 15, so the answer is \\boxed{3 * 5}.",
                       "3 + 5 = 8, so the answer is \\boxed{3 + 5}."]
    assert messages[1]["content"].startswith("Numbers: [3, 5]\nTarget: 8\n")
    assert messages[-1]["content"].startswith("Numbers: [4, 6, 7]\nTarget: 31\n")


def test_operator_breakdown_counts_puzzles_solved_and_boxed_operators():
    from esft.tasks.countdown_variants import operator_breakdown

    examples = [{"nums": [3, 5], "target": 8}, {"nums": [3, 5], "target": 15}, {"nums": [4, 6], "target": 24},
                {"nums": [2, 2], "target": 4}]
    records = [{"index": 0, "score": 1.0, "extracted": "3 + 5"}, {"index": 1, "score": 0.0, "extracted": "3 + 5"},
               {"index": 2, "score": 1.0, "extracted": "4 * 6"}, {"index": 3, "score": 1.0, "extracted": "2 * 2"}]
    assert operator_breakdown(examples, records) == {
        "+": {"puzzles": 1, "solved": 1, "boxed": 2}, "*": {"puzzles": 2, "solved": 1, "boxed": 2},
        "other": {"puzzles": 1, "solved": 1, "boxed": 0}}


CPU_STUDY = Path(__file__).resolve().parents[1] / "docs" / "results" / "cpu-study" / "spec-run" / "base" / "eval"


@pytest.mark.parametrize("ops,slug,others,digest", [
    ("+*", "plustimes", 9, "413eef52c8037510"),
    ("+-", "plus-", 0, "87f069d788bfba9a"),
])
def test_the_cpu_study_held_out_sets_are_the_ones_its_results_were_evaluated_on(ops, slug, others, digest):
    """The balanced held-out sets of the committed CPU study (400 puzzles per task): its base evaluation's constant
    baseline comes back, and the puzzles are pinned. Labels are taken over all four operators, which the scorer
    accepts: on +* the 9 test puzzles x * 1 (also x / 1) are "other" and never drawn. Labels over the variant's own
    operators would call them "*" and replace 61 of the 400 puzzles (constant baseline 0.0225, not 0.02)."""
    import hashlib
    import json
    from collections import Counter

    from esft.evaluation import load_examples
    from esft.tasks.labels import constant_baseline

    task = get_task(f"countdown:numbers=2,max_number=50,ops={ops},ask_format=1,shots=2")
    labels = Counter(task.balance_key(r) for r in task.load("test"))
    assert labels["other"] == others and len(labels) == 2 + bool(others)
    rows = load_examples(task, "test", 400, balanced=True)
    recorded = json.loads((CPU_STUDY / f"countdown.numbers=2.max_number=50.ops={slug}.ask_format=1.shots=2.json")
                          .read_text())["summary"]
    const = constant_baseline([task.gold_key(r) for r in rows])
    assert (const["constant_answer"], const["constant_baseline"]) == \
        (recorded["constant_answer"], recorded["constant_baseline"])
    puzzles = json.dumps([[r["nums"], r["target"]] for r in rows]).encode()
    assert hashlib.sha256(puzzles).hexdigest()[:16] == digest


def test_only_a_variant_with_several_operators_has_labels_to_balance_over():
    """With one operator every solvable puzzle is that operator's or "other": nothing to balance, no label set."""
    assert get_task("countdown:numbers=2,max_number=20,ops=+").label_set() is None
    assert get_task("countdown").label_set() is None
    assert get_task("countdown:numbers=2,max_number=20,ops=*+").label_set() == ("+", "*")


def test_max_misses_counts_the_draws_in_a_row_that_add_nothing():
    """`max_misses=1` stops at the first draw that adds no puzzle: the puzzles drawn before it, the start of the
    unlimited split (same stream)."""
    opts = {"numbers": (2, 2), "num_range": (1, 20), "ops": "+", "seed": 1}
    full = generate_variant(50, "train", **opts)
    first = generate_variant(50, "train", **opts, max_misses=1)
    assert 0 < len(first) < len(full) and first == full[: len(first)]


@pytest.mark.parametrize("op", "+-*/")
def test_every_worked_puzzle_is_a_puzzle_a_variant_could_draw(op):
    """For every operator and count: numbers >= 1 (no variant draws 0), a positive integer target, and the shown
    expression solves it under the scorer's own checker."""
    for count in range(2, MAX_COUNT + 1):
        nums, target, expr = format_shot(op, count)
        assert len(nums) == count and min(nums) >= 1 and isinstance(target, int) and target >= 1, (op, count)
        assert check_expression(expr, nums, target)[0], (op, count, expr)


def test_fixed_rule_baselines_of_no_examples_is_a_clear_error():
    from esft.tasks.countdown_variants import fixed_rule_baselines

    with pytest.raises(ValueError, match="no examples"):
        fixed_rule_baselines([])


def test_a_variant_with_too_few_puzzles_for_a_split_names_the_options_that_decide_it():
    """`countdown:numbers=2,max_number=1` was refused with only "its test split is empty"."""
    from esft.tasks import get_task
    from esft.validation import check_splits

    task = get_task("countdown:numbers=2,max_number=1")
    with pytest.raises(ValueError, match=r"its test split is empty; numbers=2, min_number=1 and max_number=1 allow "
                                         r"too few distinct puzzles for a test split .*widen min_number\.\.max_number"):
        check_splits("tasks", "countdown:numbers=2,max_number=1", task, ("test",))
    assert get_task("countdown").why_empty("test") == ""
