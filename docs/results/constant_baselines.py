"""Best constant-answer baselines of the test examples that docs/results evaluated.

Run from the repository root: `python docs/results/constant_baselines.py > docs/results/constant_baselines.md`.
Reads only the datasets bundled in the package (`esft.tasks.get_task(name).load("test", n)`, the first n test
examples, as `esft eval`, the ES trainer's held-out evaluation and `esft experiment run` use them). For each
(task, n) it prints how often each answer is the gold one, so an accuracy can be read beside the score of always
giving one answer (always "yes" on BoolQ, always one letter on the 4-choice tasks). Passage cuts
(`max_passage_chars`) change prompts, not labels, so they do not enter here.
"""

from __future__ import annotations

from collections import Counter

from esft.tasks import get_task

# (task, n, where those n test examples were evaluated)
SETS = [
    ("boolq", 200, "es-cpu-demo: held-out evaluation of `esft train es --preset cpu` (eval_limit 200)"),
    ("boolq", 50, "es-vs-grpo-boolq/report.md evaluations (first 50) and cpu-compare (limit 50)"),
    ("boolq", 40, "cpu-mini-sequential (limit 40)"),
    ("chemistry", 40, "cpu-mini-sequential (limit 40)"),
    ("mmlu", 40, "cpu-mini-sequential holdout (limit 40)"),
    ("mmlu", 50, "es-vs-grpo-boolq/report.md holdout evaluations (first 50)"),
]


def answer_key(task: str, example: dict) -> str:
    if task == "boolq":
        return "yes" if str(example["answer"]).strip().lower() in ("true", "yes", "1") else "no"
    return str(example["answer"])


def main() -> None:
    from esft.tasks.labels import wilson_interval

    print("# Constant-answer baselines of the evaluated test examples")
    print()
    print("Written by `python docs/results/constant_baselines.py` (this folder) from the package's bundled data.")
    print("Each row: the first n test examples of the task; the share of each gold answer; the best constant")
    print("answer and its accuracy (what a model that always gives that answer, well formed, would score).")
    print()
    print("| task | first n | gold answers | best constant answer | its accuracy [95% CI] | evaluated in |")
    print("|---|---|---|---|---|---|")
    for task, n, where in SETS:
        examples = get_task(task).load("test", n)
        assert len(examples) == n, (task, n, len(examples))
        counts = Counter(answer_key(task, e) for e in examples)
        keys = ("yes", "no") if task == "boolq" else ("A", "B", "C", "D")
        best = max(keys, key=lambda k: counts[k])
        shares = ", ".join(f"{k} {counts[k]}" for k in keys)
        lo, hi = wilson_interval(counts[best], n)
        print(f"| {task} | {n} | {shares} | {best} | {100 * counts[best] / n:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] "
              f"| {where} |")


# (Countdown variant, n, balanced over the target operator, where evaluated)
COUNTDOWN_SETS = [
    ("countdown:numbers=2,max_number=50,ops=+*,ask_format=1", 200, False, "cpu-study sweep runs A-E (eval_limit 200)"),
    ("countdown:numbers=2,max_number=50,ops=+*,ask_format=1,shots=2", 400, True,
     "cpu-study/main-job (`--preset cpu-countdown`) and the cpu-study spec's task 1"),
    ("countdown:numbers=2,max_number=50,ops=+-,ask_format=1,shots=2", 400, True, "the cpu-study spec's task 2"),
    ("countdown:numbers=2,max_number=50,ops=+*,ask_format=1,shots=2", 128, True,
     "bench/eval-lanes-2026-12-02 (128 puzzles) and bench/vocab-rows-2026-12-02 `evalmem/` (eval_limit 128)"),
    # (..., first): the first `first` of the n examples
    ("countdown:numbers=2,max_number=50,ops=+*,ask_format=1,shots=2", 400, True, "eval-speed (its first 80)", 80),
]


def countdown_table() -> None:
    from esft.evaluation import load_examples
    from esft.tasks.countdown_variants import fixed_rule_baselines
    from esft.tasks.labels import constant_baseline, wilson_interval

    print()
    print("Countdown variants: the best constant answer is the most frequent target (a boxed number uses none of the")
    print("given numbers, so it scores 0: the row is an upper bound); the fixed-operator rules (numbers in the given")
    print("order) are the stronger prior.")
    print()
    print("| task | n | balanced over the operator | best constant answer [95% CI] | fixed rules | evaluated in |")
    print("|---|---|---|---|---|---|")
    for name, n, balanced, where, *first in COUNTDOWN_SETS:
        task = get_task(name)
        examples = load_examples(task, "test", n, balanced=balanced)
        assert len(examples) == n, (name, n, len(examples))
        shown, how = f"{n}", "yes" if balanced else "no (first n)"
        if first:
            examples = examples[: first[0]]
            shown, how = f"{first[0]}", f"no: the first {first[0]} of the balanced {n}"
        c = constant_baseline([task.gold_key(e) for e in examples])
        lo, hi = wilson_interval(c["constant_answer_count"], len(examples))
        rules = ", ".join(f"{op} {100 * v:.1f}%" for op, v in fixed_rule_baselines(examples).items() if v)
        print(f"| `{name}` | {shown} | {how} | {c['constant_answer']}: "
              f"{100 * c['constant_baseline']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] | {rules} | {where} |")


if __name__ == "__main__":
    main()
    countdown_table()
