"""esft.evaluation beyond the baseline tests: what run_eval hands the generator and writes, the record and stats
helpers by hand, `limit` and `balanced` selection, the row text, and the EvalConfig limits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esft import evaluation
from esft.evaluation import completion_record, constant_text, format_row, generation_stats, run_eval
from esft.eval_config import EvalConfig, task_options
from esft.generation import Generation
from esft.tasks import get_task


class LabelTask:
    """Eight questions with gold yes/no (6 yes, 2 no); answers 'yes' always; has a label set."""

    name = "lab"

    def __init__(self):
        golds = ["yes", "yes", "no", "yes", "yes", "no", "yes", "yes"]
        self.rows = [{"id": i, "gold": g} for i, g in enumerate(golds)]

    def load(self, split="test", limit=None):
        return self.rows if limit is None else self.rows[:limit]

    def label_set(self):
        return ("yes", "no")

    def balance_key(self, ex):
        return ex["gold"]

    def prompt(self, ex):
        return [{"role": "user", "content": str(ex["id"])}]

    def score(self, text, ex):
        return float(text == ex["gold"])

    def is_well_formed(self, text, ex):
        return text in ("yes", "no")

    def details(self, text, ex):
        return {"extracted": text}

    def aggregate(self, records):
        n = len(records)
        return {"n": n, "accuracy": sum(r["score"] for r in records) / n, "ci95": [0.0, 1.0],
                "ids": [r["example"]["id"] for r in records]}


def _patch(monkeypatch, task, seen):
    def fake_generate(model, tokenizer, prompts, cfg, progress=False):
        seen.append(cfg)
        return [Generation(text="yes", completion_ids=[1, 2, 3], prompt_tokens=5, finished=i % 2 == 0)
                for i, _ in enumerate(prompts)]

    monkeypatch.setattr(evaluation, "get_task", lambda name, **kw: task)
    monkeypatch.setattr(evaluation, "generate", fake_generate)


def test_run_eval_passes_the_generation_settings_and_the_limit(monkeypatch, tmp_path):
    seen: list = []
    _patch(monkeypatch, LabelTask(), seen)
    cfg = EvalConfig(tasks=["lab/el"], limit=3, max_new_tokens=7, temperature=0.5, top_p=0.9, batch_size=2, seed=11,
                     output_dir=str(tmp_path))
    res = run_eval(cfg, model=object(), tokenizer=object(), progress=False)["lab/el"]
    g = seen[0]
    assert (g.max_new_tokens, g.temperature, g.top_p, g.batch_size, g.seed) == (7, 0.5, 0.9, 2, 11)
    assert res["ids"] == [0, 1, 2] and "balanced" not in res       # the first `limit`, in split order
    # 3 completions: 15 prompt tokens, 9 completion tokens, the middle one unfinished
    assert res["prompt_tokens"] == 15 and res["completion_tokens"] == 9
    assert res["truncated_rate"] == pytest.approx(1 / 3)
    rows = [json.loads(x) for x in (tmp_path / "lab%2Fel.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2] and [r["score"] for r in rows] == [1.0, 1.0, 0.0]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["limit"] == 3 and summary["results"]["lab/el"]["ids"] == [0, 1, 2]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd")
def test_a_failure_while_summary_json_is_written_leaves_the_earlier_one_whole(monkeypatch, tmp_path):
    # a full disk (or a kill) while the summary is written: the earlier evaluation's summary, whole, not a cut file
    import os

    _patch(monkeypatch, LabelTask(), [])
    cfg = EvalConfig(tasks=["lab/el"], limit=3, max_new_tokens=7, output_dir=str(tmp_path))
    run_eval(cfg, model=object(), tokenizer=object(), progress=False)
    before = (tmp_path / "summary.json").read_bytes()

    fsync = os.fsync

    def disk_full_at_the_summary(fd):
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(".summary.json"):
            raise OSError(28, "No space left on device")
        fsync(fd)

    monkeypatch.setattr(os, "fsync", disk_full_at_the_summary)
    with pytest.raises(OSError, match="No space left"):
        run_eval(cfg, model=object(), tokenizer=object(), progress=False)
    assert (tmp_path / "summary.json").read_bytes() == before


def test_run_eval_balanced_draws_equal_labels_and_says_so(monkeypatch):
    _patch(monkeypatch, LabelTask(), [])
    res = run_eval(EvalConfig(tasks=["lab"], limit=4, balanced=True), model=object(), tokenizer=object(),
                   progress=False)["lab"]
    golds = [LabelTask().rows[i]["gold"] for i in res["ids"]]
    assert sorted(golds) == ["no", "no", "yes", "yes"] and res["ids"] == sorted(res["ids"])
    assert res["balanced"] is True
    # no limit: as many as the rarest label (2 'no') allows, 2 per label
    res = run_eval(EvalConfig(tasks=["lab"], balanced=True), model=object(), tokenizer=object(),
                   progress=False)["lab"]
    assert len(res["ids"]) == 4 and {2, 5} <= set(res["ids"])


def test_a_balanced_subset_rounded_down_to_equal_counts_is_warned(monkeypatch, recwarn):
    """`esft eval --balanced --limit 3` on a two-label task evaluates 2 examples: the row's n=2 was all that said
    so. A limit the labels divide is not warned."""
    _patch(monkeypatch, LabelTask(), [])
    res = run_eval(EvalConfig(tasks=["lab"], limit=3, balanced=True), model=object(), tokenizer=object(),
                   progress=False)["lab"]
    assert len(res["ids"]) == 2
    assert [str(w.message) for w in recwarn] == ["lab: the balanced subset holds 2 examples, not 3: 1 of each of "
                                                 "its 2 labels"]
    recwarn.clear()
    run_eval(EvalConfig(tasks=["lab"], limit=4, balanced=True), model=object(), tokenizer=object(), progress=False)
    assert not [w for w in recwarn if "balanced subset" in str(w.message)]


def test_run_eval_balanced_on_a_task_without_labels_takes_the_first_examples(monkeypatch):
    task = LabelTask()
    task.label_set = lambda: None
    _patch(monkeypatch, task, [])
    res = run_eval(EvalConfig(tasks=["lab"], limit=3, balanced=True), model=object(), tokenizer=object(),
                   progress=False)["lab"]
    assert res["ids"] == [0, 1, 2] and res["balanced"] is False


def test_evaluate_task_hands_its_records_out(monkeypatch):
    _patch(monkeypatch, LabelTask(), [])
    task, out = LabelTask(), []
    summary = evaluation.evaluate_task(None, None, task, task.rows[:2], evaluation.GenerationConfig(),
                                       progress=False, records_out=out)
    assert summary["n"] == 2 and [r["index"] for r in out] == [0, 1] and out[0]["example"] == task.rows[0]


def test_generation_stats_by_hand():
    gens = [Generation("a", [1], 2, True), Generation("b", [1, 2, 3, 4], 6, False),
            Generation("c", [], 1, False), Generation("d", [5, 6], 3, True)]
    assert generation_stats(gens, 1.23456) == {"generation_s": 1.235, "prompt_tokens": 12, "completion_tokens": 7,
                                               "truncated_rate": 0.5}
    assert generation_stats([], 0.0)["truncated_rate"] == 0.0


def test_completion_record_fields_and_given_score():
    task = LabelTask()
    g = Generation("no", [4, 5], 9, False)
    rec = completion_record(task, task.rows[2], g, {"index": 7})
    assert list(rec)[:2] == ["index", "score"]
    assert rec["score"] == 1.0 and rec["extracted"] == "no" and rec["finished"] is False
    assert rec["prompt_tokens"] == 9 and rec["completion_tokens"] == 2 and rec["completion"] == "no"
    given = completion_record(task, task.rows[2], g, {"index": 7}, details={"extracted": "X"}, score=0.25)
    assert given["score"] == 0.25 and given["extracted"] == "X"
    # a given score of 0.0 is used, not recomputed
    assert completion_record(task, task.rows[2], g, {}, score=0.0)["score"] == 0.0


def test_sample_seeds_differ_by_sample_and_by_seed():
    s = evaluation.sample_seed
    assert s(0, 1) == s(0, 1) and len({s(0, 0), s(0, 1), s(1, 0), s(1, 1)}) == 4
    assert s(2, 5) != s(5, 2)                                      # (seed, sample) is ordered
    # pinned: summary.json records these seeds, so a sampled evaluation reruns the same streams across versions
    assert (s(0, 0), s(0, 1), s(7, 3)) == (2968811710, 3964924996, 3466196061)


def test_constant_text_by_hand():
    assert constant_text({"accuracy": 0.5}) == ""
    assert constant_text({"constant_baseline": None}) == ""
    s = {"constant_baseline": 0.5, "constant_baseline_ci95": [0.25, 0.75], "constant_answer": "x" * 12}
    assert constant_text(s) == "  const 0.500 [0.250, 0.750] (xxxxxxxxxxxx)"
    s.update(constant_answer="y" * 13, balanced=True)
    assert constant_text(s) == "  const 0.500 [0.250, 0.750] (yyyyyyyyyyyy...)  balanced"
    assert constant_text({"constant_baseline": 0.0, "constant_answer": 3}) == "  const 0.000 (3)"  # no interval
    bound = {"constant_baseline": 0.02, "constant_baseline_ci95": [0.01, 0.039], "constant_answer": 24,
             "constant_baseline_bound": "at most"}
    assert constant_text(bound) == "  const at most 0.020 [0.010, 0.039] (24)"


def test_format_row_greedy_and_ifeval_levels():
    s = {"n": 3, "accuracy": 2 / 3, "ci95": [0.2, 0.9], "format_rate": 1.0}
    assert format_row("t", s) == "t          n=3     acc 0.667  95% CI [0.200, 0.900]  format 1.000"
    s = {"n": 2, "accuracy": 0.5, "ci95": [0.1, 0.9], "prompt_strict": 0.5, "prompt_loose": 1.0,
         "instruction_strict": 0.25, "instruction_loose": 0.75}
    assert format_row("ifeval", s).endswith("prompt strict/loose 0.500/1.000  instr strict/loose 0.250/0.750")


@pytest.mark.parametrize("kw, match", [
    ({"limit": 0}, "limit"), ({"batch_size": 0}, "batch_size"), ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"top_p": 1.5}, "top_p"), ({"temperature": -0.1}, "temperature"), ({"tasks": []}, "tasks"),
    ({"samples": 0}, "samples"), ({"dtype": "int8"}, "dtype"), ({"model": ""}, "model"),
    ({"k": [2]}, "k"), ({"task_options": {"prompt_field": "q"}}, "task_options"),
])
def test_eval_config_refuses(kw, match):
    with pytest.raises(ValueError, match=match):
        EvalConfig(**kw)


def test_eval_config_accepts_the_edges():
    cfg = EvalConfig(limit=1, top_p=1.0, temperature=0.0, samples=1, k=[1], batch_size=1, max_new_tokens=1)
    assert cfg.limit == 1 and cfg.sampled                          # k asked for: the pass@k protocol
    assert not EvalConfig().sampled and EvalConfig(samples=2, temperature=0.5).sampled
    assert EvalConfig(limit=None).limit is None


def test_task_checks_give_each_task_its_options():
    cfg = EvalConfig(tasks=["boolq", "countdown"], max_passage_chars=50)
    checks = cfg.task_checks()
    assert [c[:2] for c in checks] == [("tasks", "boolq"), ("tasks", "countdown")]
    assert checks[0][2] == task_options("boolq", 50) and checks[1][2] == {}


def test_check_task_fit_refuses_an_impossible_balanced_subset():
    cfg = EvalConfig(tasks=["boolq"], split="test", limit=10 ** 6, balanced=True)
    with pytest.raises(ValueError):
        cfg.check_task_fit(get_task("boolq"))
    EvalConfig(tasks=["boolq"], split="test", limit=10 ** 6).check_task_fit(get_task("boolq"))  # first limit: fine


def test_run_eval_draws_the_balanced_subset_with_its_balance_seed(monkeypatch):
    _patch(monkeypatch, LabelTask(), [])
    draws = {}
    for seed in range(6):
        res = run_eval(EvalConfig(tasks=["lab"], limit=4, balanced=True, balance_seed=seed), model=object(),
                       tokenizer=object(), progress=False)["lab"]
        expected = evaluation.load_examples(LabelTask(), "test", 4, True, seed)
        assert res["ids"] == [x["id"] for x in expected]
        draws[seed] = tuple(res["ids"])
    assert len(set(draws.values())) > 1                            # the seed chooses among the 'yes' rows


def test_task_options_go_to_the_data_tasks_only(tmp_path):
    data = str(tmp_path / "qa.jsonl")
    cfg = EvalConfig(tasks=["boolq", data], task_options={"prompt_field": "q"})  # one data task: accepted
    checks = dict((name, options) for _, name, options in cfg.task_checks())
    assert checks[data] == {"prompt_field": "q"} and "prompt_field" not in checks["boolq"]


def test_sampled_eval_votes_only_where_the_task_extracts_answers(monkeypatch):
    task = LabelTask()
    task.details = lambda text, ex: {}                              # nothing to vote on (as IFEval)
    _patch(monkeypatch, task, [])
    res = evaluation.evaluate_task_sampled(None, None, task, task.rows[:3], evaluation.GenerationConfig(
        temperature=1.0), 2, [1, 2], progress=False)
    assert "maj@k" not in res and set(res["pass@k"]) == {"1", "2"} and res["completions"] == 6
