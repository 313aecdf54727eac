"""The constant-answer baseline and label-balanced subsets (esft.tasks.labels), and where they are reported:
`Task.aggregate`, `esft eval`'s example selection and rows, the experiment tables, the ES run report."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from esft.evaluation import format_row, load_examples
from esft.tasks import get_task, wilson_interval
from esft.tasks.labels import balanced_indices, balanced_subset, class_balanced_weights, constant_baseline


# ---- pure functions ----------------------------------------------------------------------------------------------
def test_constant_baseline_of_hand_made_labels():
    out = constant_baseline(["no", "yes", "yes", "yes"])
    assert out["constant_baseline"] == 0.75 and out["constant_answer"] == "yes"
    assert out["constant_answer_count"] == 3 and out["labels"] == 2
    assert out["constant_baseline_ci95"] == list(wilson_interval(3, 4))
    assert constant_baseline(["B", "A", "A", "B", "C"])["constant_answer"] == "B"  # a tie: the first seen
    assert constant_baseline([55, 55, 12])["constant_baseline"] == pytest.approx(2 / 3)
    assert constant_baseline([]) is None


def test_balanced_subset_has_equal_label_counts_and_is_deterministic():
    labels = ["yes"] * 70 + ["no"] * 30
    labels = labels[::2] + labels[1::2]  # interleaved, so order is not the label
    items = list(range(100))
    sub = balanced_subset(items, labels, 40, seed=3)
    assert Counter(labels[i] for i in sub) == {"yes": 20, "no": 20}
    assert sub == sorted(sub)                                     # the split's order is kept
    assert sub == balanced_subset(items, labels, 40, seed=3)      # same seed, same subset
    assert sub != balanced_subset(items, labels, 40, seed=4)
    full = balanced_indices(labels)                               # None: as many as the rarest label allows
    assert Counter(labels[i] for i in full) == {"yes": 30, "no": 30}
    assert len(balanced_indices(labels, 41)) == 40                # rounded down to a multiple of the labels
    with pytest.raises(ValueError, match="rarest label has 30"):
        balanced_indices(labels, 62)
    with pytest.raises(ValueError, match="no example has label 'maybe'"):
        balanced_indices(labels, 10, label_set=("yes", "no", "maybe"))
    with pytest.raises(ValueError, match="labels"):
        balanced_subset(items[:5], labels, 4)
    with pytest.raises(ValueError, match="needs size >= 2"):                 # not an empty subset
        balanced_indices(labels, 1)
    # items outside the label set are never drawn
    assert all(labels[i] != "no" for i in balanced_indices(labels, 10, label_set=("yes",)))


def test_class_balanced_weights_make_each_label_count_the_same():
    labels = ["yes"] * 12 + ["no"] * 4
    w = class_balanced_weights(labels)
    assert sum(w) / len(w) == pytest.approx(1.0)
    always_yes = [1.0 if label == "yes" else 0.0 for label in labels]
    assert sum(wi * r for wi, r in zip(w, always_yes)) / len(w) == pytest.approx(0.5)  # not 0.75
    assert class_balanced_weights(["A", "A"]) == [1.0, 1.0]


def test_wilson_interval_matches_the_textbook_values_and_stays_in_the_unit_range():
    """Interior values of the Wilson interval (5/10 and 3/4, as tabulated), and that its ends never leave [0, 1]
    by a rounding error at 0 or n successes."""
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(3, 4) == pytest.approx((0.3006, 0.9544), abs=1e-4)
    for n in range(1, 300):
        lo, hi = wilson_interval(0, n)[0], wilson_interval(n, n)[1]
        assert 0.0 <= lo < 1e-12 and 1 - 1e-12 < hi <= 1.0


def test_balanced_draw_is_pinned_and_independent_of_the_label_order():
    """The default draw (BALANCE_SEED) is fixed, so balanced evaluations stay comparable across versions, and it
    does not depend on the order `label_set` names the labels in."""
    labels = ["yes"] * 70 + ["no"] * 30
    labels = labels[::2] + labels[1::2]
    assert balanced_indices(labels, 6) == [28, 31, 35, 38, 50, 90]
    assert balanced_indices(labels, 6, label_set=("yes", "no")) == balanced_indices(labels, 6, label_set=("no", "yes"))
    assert balanced_indices(labels, 60) == balanced_indices(labels)     # exactly what the rarest label allows
    assert Counter(labels[i] for i in balanced_indices(labels, 2)) == {"yes": 1, "no": 1}  # size = K: one each
    with pytest.raises(ValueError, match="needs size >= 2, got 0"):       # 0 is a size, not "as many as allowed"
        balanced_indices(labels, 0)
    with pytest.raises(ValueError, match="no labels to balance over"):
        balanced_indices([])


def test_a_repeated_label_in_the_label_set_counts_once():
    """A label named twice in `label_set` (a user's task may list its labels with repeats) is balanced like any
    other: no example drawn twice, every label the same count."""
    labels = ["yes", "no"] * 5
    idx = balanced_indices(labels, None, label_set=["yes", "no", "yes"])
    assert len(idx) == len(set(idx)) == 10 and Counter(labels[i] for i in idx) == {"yes": 5, "no": 5}
    assert balanced_indices(labels, 4, label_set=["yes", "no", "yes"]) == balanced_indices(labels, 4)
    sub = balanced_subset(list("abcdefghij"), labels, 4, label_set=("no", "no"))
    assert len(set(sub)) == 4 and set(sub) <= set("bdfhj")


# ---- Task hooks and aggregate -------------------------------------------------------------------------------------
def test_gold_keys_and_label_sets_of_the_tasks():
    boolq, mmlu, countdown, ifeval = (get_task(n) for n in ("boolq", "mmlu", "countdown", "ifeval"))
    assert boolq.gold_key({"answer": True}) == "yes" and boolq.gold_key({"answer": False}) == "no"
    assert mmlu.gold_key({"answer": "C"}) == "C" and countdown.gold_key({"nums": [1, 2], "target": 3}) == 3
    # MATH: the form its scorer compares, so that golds one constant answer matches are one answer
    math = get_task("math")
    assert math.gold_key({"answer": " \\frac{1}{2} "}) == "1/2" == math.gold_key({"answer": "0.5"})
    assert ifeval.gold_key(ifeval.load("test", 1)[0]) is None
    assert boolq.label_set() == ("yes", "no") and get_task("chemistry").label_set() == ("A", "B", "C", "D")
    assert countdown.label_set() is None and ifeval.label_set() is None


def test_aggregate_reports_the_constant_baseline_of_the_evaluated_examples():
    task = get_task("boolq")
    examples = [{"answer": a} for a in (True, True, True, False)]
    records = [{"index": i, "score": 0.0, "well_formed": False, "example": ex} for i, ex in enumerate(examples)]
    summary = task.aggregate(records)
    assert summary["constant_baseline"] == 0.75 and summary["constant_answer"] == "yes"
    assert summary["constant_baseline_ci95"] == list(wilson_interval(3, 4))
    # several samples per question: each question counts once
    sampled = [dict(r, sample=s) for r in records for s in range(3)]
    assert task.aggregate(sampled)["constant_baseline_ci95"] == list(wilson_interval(3, 4))
    # countdown: the most frequent target
    cd = get_task("countdown")
    recs = [{"score": 1.0, "example": {"nums": [1], "target": t}} for t in (5, 5, 9, 7)]
    assert cd.aggregate(recs)["constant_baseline"] == 0.5 and cd.aggregate(recs)["constant_answer"] == 5
    # which it cannot score: a boxed number alone uses none of the given numbers, so the baseline is a bound
    assert cd.score("\\boxed{5}", recs[0]["example"]) == 0.0
    assert cd.score("\\boxed{5}", {"nums": [5], "target": 5}) == 1.0
    assert cd.aggregate(recs)["constant_baseline_bound"] == "at most"
    assert "const at most 0.500" in format_row("countdown", cd.aggregate(recs))
    assert get_task("countdown:numbers=2,ops=+").aggregate(recs)["constant_baseline_bound"] == "at most"
    assert "constant_baseline_bound" not in task.aggregate(sampled)  # an answer a model can give: the real score
    # no examples in the records, or no gold answer: no baseline
    assert "constant_baseline" not in task.aggregate([{"score": 1.0}])
    ifeval = get_task("ifeval")
    assert "constant_baseline" not in ifeval.aggregate([{"score": 1.0, "example": ifeval.load("test", 1)[0]}])


def test_format_row_shows_the_baseline():
    s = {"n": 4, "accuracy": 0.5, "ci95": [0.1, 0.9], "constant_baseline": 0.75, "constant_baseline_ci95": [0.3, 0.95],
         "constant_answer": "yes", "balanced": True}
    row = format_row("boolq", s)
    assert "acc 0.500" in row and "const 0.750 [0.300, 0.950] (yes)" in row and "balanced" in row


# ---- esft eval's example selection -------------------------------------------------------------------------------
def test_balanced_evaluation_examples():
    task = get_task("boolq")
    first = load_examples(task, "test", 400)
    assert first == task.load("test", 400)
    balanced = load_examples(task, "test", 400, balanced=True, seed=42)
    assert len(balanced) == 400 and Counter(task.gold_key(x) for x in balanced) == {"yes": 200, "no": 200}
    assert balanced == load_examples(task, "test", 400, balanced=True, seed=42)
    assert [x["id"] for x in balanced] != [x["id"] for x in load_examples(task, "test", 400, balanced=True, seed=1)]
    letters = Counter(x["answer"] for x in load_examples(get_task("mmlu"), "test", 400, balanced=True))
    assert letters == {"A": 100, "B": 100, "C": 100, "D": 100}
    cd = get_task("countdown")  # no label set: the option changes nothing
    assert load_examples(cd, "test", 5, balanced=True) == cd.load("test", 5)


def test_countdown_variant_balances_over_the_target_operator():
    from esft.tasks.countdown_variants import fixed_rule_baselines, target_operator

    task = get_task("countdown:numbers=2,max_number=50,ops=+*")
    assert task.label_set() == ("+", "*")
    assert task.balance_key({"nums": [3, 5], "target": 15}) == "*" and task.balance_key({"nums": [3, 5], "target": 8}) == "+"
    assert task.balance_key({"nums": [2, 2], "target": 4}) == "other"  # both rules reach it: never drawn
    rows = load_examples(task, "test", 400, balanced=True)
    assert Counter(target_operator(r) for r in rows) == {"+": 200, "*": 200}
    # on the balanced set the operator prior ("always add") is worth exactly one half
    assert fixed_rule_baselines(rows)["+"] == fixed_rule_baselines(rows)["*"] == 0.5
    assert get_task("countdown:numbers=2,ops=+").label_set() is None  # one operator: nothing to balance


# ---- experiment tables ---------------------------------------------------------------------------------------------
def _summary(acc: float, constant: float | None = None) -> dict:
    # an accuracy's Wilson interval stays in [0, 1]: one leaving it would make the score a mean reward
    out = {"n": 200, "accuracy": acc, "ci95": [max(0.0, acc - 0.05), acc + 0.05]}
    if constant is not None:
        out.update(constant_baseline=constant, constant_baseline_ci95=[0.565, 0.695], constant_answer="yes")
    return out


def _experiment(root: Path, with_constant: bool) -> Path:
    spec = {"name": "s", "kind": "single-task", "model": "m", "tasks": ["boolq"], "seeds": [42],
            "evaluation": {"holdout": [], "limit": 200, "max_new_tokens": 8, "per_task": {}}}
    key = "seed-42/single-task/boolq/es"
    stages = [{"key": "base", "kind": "base", "seed": None, "track": None, "display": "Base", "task": None,
               "index": 0},
              {"key": key, "kind": "train", "seed": 42, "track": "es", "display": "ES", "task": "boolq", "index": 1}]
    constant = 0.635 if with_constant else None
    results = {"base": {"eval": {"boolq": _summary(0.015, constant)}}, key: {"eval": {"boolq": _summary(0.615, constant)}}}
    root.mkdir(parents=True)
    (root / "plan.json").write_text(json.dumps({"spec": spec, "stages": stages}))
    for k, rec in results.items():
        (root / k).mkdir(parents=True, exist_ok=True)
        (root / k / "result.json").write_text(json.dumps(rec))
        (root / k / "status.json").write_text(json.dumps({"status": "done"}))
    return root


def test_tables_show_the_constant_answer(tmp_path):
    from esft.experiments.records import load_experiment, task_name
    from esft.experiments.study_tables import method_tables, results_csv, table1

    exp = load_experiment(_experiment(tmp_path / "a", True))
    md = table1(exp).markdown()
    assert "| Task | Constant answer | Base | ES |" in md and "| BoolQ | 63.5 [56.5, 69.5] | 1.5 [0.0, 6.5] | 61.5 [56.5, 66.5] |" in md
    assert "always giving one gold answer of the evaluated examples (the most frequent one" in md
    methods = method_tables(exp)[0].markdown()
    assert "| Constant answer | 63.5 | [56.5, 69.5] |" in methods
    csv_text = results_csv(exp)
    assert "constant_baseline" in csv_text.splitlines()[0] and ",0.635,0.565,0.695,yes," in csv_text
    plain = table1(load_experiment(_experiment(tmp_path / "b", False))).markdown()
    assert "Constant answer" not in plain and "| Task | Base | ES |" in plain   # older records: layout unchanged
    assert task_name("countdown:numbers=2,ops=+") == "Countdown (numbers=2, ops=+)"


# ---- the ES run report ---------------------------------------------------------------------------------------------
def _run_dir(root: Path, n: int, **eval_extra) -> Path:
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(yaml.safe_dump({"task": "boolq", "eval_limit": n, "max_passage_chars": 400,
                                                      "task_options": {}, "_run": {}}))
    lines = [{"kind": "train", "step": 1, "time": {"total": 1.0}, "fitness": {"mean": 0.1, "min": 0.0, "max": 0.2},
              "format_rate": 0.5, "generated_tokens_per_s": 10.0},
             {"kind": "eval", "step": 1, "test_n": n, "test_accuracy": 0.5, "test_ci95": [0.3, 0.7],
              "test_format_rate": 1.0, **eval_extra}]
    (root / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    return root


def test_es_report_shows_the_heldout_constant_baseline(tmp_path):
    from esft.es.curve import heldout_constant_baseline, plot_run, run_figure, summarize

    task = get_task("boolq")
    expected = constant_baseline([task.gold_key(x) for x in task.load("test", 20)])
    run = _run_dir(tmp_path / "run", 20)
    got = heldout_constant_baseline(run)
    assert got["constant_baseline"] == expected["constant_baseline"]
    assert got["constant_baseline_ci95"] == expected["constant_baseline_ci95"]
    assert summarize(run)["heldout_constant_baseline"] == got
    assert plot_run(run).stat().st_size > 1000
    # a flat accuracy curve must not fill the panel: the held-out axis is held to [0, 1]
    flat = _run_dir(tmp_path / "flat", 20)
    assert run_figure(flat).axes[1].get_ylim() == (0.0, 1.0)
    # a logged count that the recomputed examples do not match: unknown, not a wrong number
    mismatch = _run_dir(tmp_path / "other", 20)
    (mismatch / "metrics.jsonl").write_text((mismatch / "metrics.jsonl").read_text().replace('"test_n": 20',
                                                                                             '"test_n": 21'))
    assert heldout_constant_baseline(mismatch) is None
    # recorded by the evaluation: taken as is
    logged = _run_dir(tmp_path / "logged", 20, test_constant_baseline=0.9, test_constant_baseline_ci95=[0.8, 0.95],
                      test_constant_answer="no")
    assert heldout_constant_baseline(logged) == {"constant_baseline": 0.9, "constant_baseline_ci95": [0.8, 0.95],
                                                 "constant_answer": "no"}


def test_es_and_curve_evaluate_the_balanced_subset_when_asked(tmp_path):
    from es_tiny import stub_generate, tiny_llama
    from esft.es.es_config import ESConfig
    from esft.es.trainer import ESTrainer

    name = "countdown:numbers=2,max_number=50,ops=+*"
    task = get_task(name)

    def test_set(balanced: bool) -> list:
        config = ESConfig(model="tiny", task=name, eval_limit=400, eval_balanced=balanced,
                          output_dir=str(tmp_path / f"run{balanced}"))
        return ESTrainer(config, model=tiny_llama(), task=task, generate_fn=stub_generate, progress=False).test_set

    assert test_set(True) == load_examples(task, "test", 400, balanced=True)
    assert test_set(False) == task.load("test", 400) != test_set(True)


def test_es_evaluation_records_the_constant_baseline_of_its_examples(tmp_path):
    from es_tiny import stub_generate, tiny_llama
    from esft.es.es_config import ESConfig
    from esft.es.trainer import ESTrainer

    from es_tiny import ToyTask
    from esft.tasks.base import Task

    class LabelledToy(ToyTask, Task):  # the toy yes/no task as an esft Task: gold labels "yes" / "no"
        def __init__(self):
            ToyTask.__init__(self)

    task = LabelledToy()
    config = ESConfig(model="tiny", task="toy", eval_limit=12, eval_every=1, iterations=0, batch_size=2,
                      population_size=2, max_new_tokens=2, output_dir=str(tmp_path / "run"))
    rec = ESTrainer(config, model=tiny_llama(), task=task, generate_fn=stub_generate, progress=False).train().last_eval
    expected = constant_baseline([x["answer"] for x in task.load("test", 12)])  # 8 yes, 4 no
    assert rec["test_constant_baseline"] == expected["constant_baseline"] == 8 / 12
    assert rec["test_constant_answer"] == "yes"
    assert rec["test_constant_baseline_ci95"] == list(expected["constant_baseline_ci95"])


def test_wilson_interval_of_no_trials_is_the_whole_range():
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_wilson_interval_at_all_correct_and_all_wrong_by_hand():
    """At p = 1 the formula reduces to (n / (n + z^2), 1), at p = 0 to (0, z^2 / (n + z^2)) (z = 1.96)."""
    z2 = 1.96 ** 2
    for n in (1, 4, 10, 250):
        assert wilson_interval(n, n) == pytest.approx((n / (n + z2), 1.0), abs=1e-12)
        assert wilson_interval(0, n) == pytest.approx((0.0, z2 / (n + z2)), abs=1e-12)
    assert wilson_interval(10, 10)[0] == pytest.approx(0.7225, abs=1e-4)


def test_a_reward_on_another_scale_gets_an_interval_of_its_mean():
    """A reward function may return any number (`reward: module:function`): the held-out record of a training
    evaluation and `esft eval`'s summary give an interval around the mean, mean +- 1.96 s / sqrt(n), where
    Wilson's interval failed on a mean above 1 (`math domain error` stopped a GRPO run at its first evaluation)
    or lay below it; scores in [0, 1] keep Wilson's."""
    import statistics

    from esft.rundir import held_out_fields

    scores = [5.0, 1.9, 3.2]
    mean, half = sum(scores) / 3, 1.96 * statistics.stdev(scores) / 3 ** 0.5
    rec = held_out_fields([{"score": s} for s in scores], 24, None)
    assert rec["test_accuracy"] == pytest.approx(mean)
    assert rec["test_ci95"] == pytest.approx([mean - half, mean + half])
    negative = held_out_fields([{"score": s} for s in (-1.0, 0.0, 1.0)], 24, None)["test_ci95"]
    assert negative == pytest.approx([-1.96 / 3 ** 0.5, 1.96 / 3 ** 0.5])
    summary = get_task("boolq").aggregate([{"score": s} for s in scores])
    assert summary["ci95"] == pytest.approx([mean - half, mean + half])
    assert held_out_fields([{"score": 7.5}], 8, None)["test_ci95"] == [7.5, 7.5]
    assert held_out_fields([{"score": s} for s in (1.0, 0.0, 0.5)], 24, None)["test_ci95"] == list(
        wilson_interval(1.5, 3))


def test_a_string_gold_is_stripped_and_a_blank_one_is_unknown():
    """`Task.gold_key`: " C\\n" and "C" are one constant answer; a blank gold is no answer (None)."""
    mmlu = get_task("mmlu")
    assert mmlu.gold_key({"answer": " C\n"}) == "C" == mmlu.gold_key({"answer": "C"})
    assert mmlu.gold_key({"answer": "  "}) is None


def test_no_constant_baseline_when_one_evaluated_example_has_no_gold_answer():
    """Two examples of gold "A" and one without a gold: the share of the most frequent gold is not known (2/3 would
    count the unknown gold as a wrong constant answer), so the summary has no baseline."""
    mmlu = get_task("mmlu")
    records = [{"index": i, "score": 1.0, "example": ex} for i, ex in enumerate([{"answer": "A"}] * 2 + [{}])]
    assert "constant_baseline" not in mmlu.aggregate(records)
    assert mmlu.aggregate(records[:2])["constant_baseline"] == 1.0


def test_scores_just_above_one_get_the_interval_of_a_mean_not_wilsons():
    """A format bonus lifts a right, well-formed answer to 1.5: scores (1.5, 0.5) are no proportion. Their interval is
    mean +- 1.96 s / sqrt(n) = 1 +- 1.96 * sqrt(0.5) / sqrt(2) = 1 +- 0.98 (Wilson's would read 2 successes of 2)."""
    from esft.tasks.labels import scores_interval

    assert scores_interval([1.5, 0.5]) == pytest.approx((0.02, 1.98))


def test_best_constant_answer_keeps_the_more_frequent_gold_on_a_tie():
    """Candidates are tried most frequent first and a later one must score strictly more to replace the best: with
    every answer scoring 0.5 on each example, the constant answer named is "a" (2 golds), not "b" (1 gold)."""
    from esft.tasks.labels import best_constant_answer

    best = best_constant_answer(["b", "a", "a"], lambda answer: [0.5, 0.5, 0.5])
    assert best["constant_answer"] == "a" and best["constant_baseline"] == 0.5
