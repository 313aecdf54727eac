"""Task objects passed to the Python API (esft.train_es / esft.train_grpo): what config.yaml records for them, and
what a resume from config.yaml (`esft train es --resume`, `esft train grpo --resume`) does with a task object whose
constructor values YAML cannot hold (a function, an array): it refuses before any model loads and says to resume
from the script, instead of building the class with its default values."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import yaml

from esft.api import with_task
from esft.cli import main
from esft.es import ESConfig
from esft.generation import encode_prompts
from esft.grpo import GRPOConfig
from esft.tasks import get_task
from esft.tasks.custom import TaskAdapter, task_record, task_spec


def _save(config, run) -> None:
    run.mkdir(exist_ok=True)
    (run / "config.yaml").write_text(yaml.safe_dump(config.replace(resume=False).to_dict(), sort_keys=False))


def test_plain_constructor_values_rebuild_the_task_exactly(user_tasks):
    task = user_tasks.Weighted(count=9, tags=("a", "b"))
    assert task_spec(task) == ("obj_tasks:Weighted", {"count": 9, "tags": ["a", "b"]})
    name, options = task_spec(task)
    rebuilt = get_task(name, **options)
    assert rebuilt == task  # the tuple field a tuple again, not the list YAML holds
    assert task_spec(user_tasks.NoArgs()) == ("obj_tasks:NoArgs", {})
    # tuple fields known by their annotation rebuild as tuples too (they came back as lists)
    tupled = user_tasks.Tupled(ids=(3, 4), extra=(5,))
    name, options = task_spec(tupled)
    assert options == {"ids": [3, 4], "extra": [5]} and get_task(name, **options) == tupled


def test_values_yaml_cannot_hold_are_recorded_as_not_recorded(user_tasks):
    """An array field made with_task fail (`value != default` of an array has no truth value); a function field
    was left out of config.yaml."""
    task = user_tasks.Weighted(count=9, scorer=lambda c, ex: 1.0, weights=np.arange(3))
    assert task_spec(task) is None
    assert task_record(task) == ("obj_tasks:Weighted", {"count": 9, "scorer": "<not recorded: function>",
                                                         "weights": "<not recorded: numpy.ndarray>"})
    name, options = task_record(task)
    with pytest.raises(ValueError, match=r"cannot hold \(scorer: function, weights: numpy.ndarray\), so only the "
                                         r"script that trained the run can build it"):
        get_task(name, **options)
    # a numpy number is not a YAML number either (yaml.safe_dump refuses it)
    assert task_record(user_tasks.Weighted(count=np.int64(9)))[1] == {"count": "<not recorded: numpy.int64>"}
    # not a dataclass: what its constructor was given is unknown
    assert task_record(user_tasks.Plain(rows=2)) == ("obj_tasks:Plain", {"rows": "<not recorded>"})
    with pytest.raises(ValueError, match=r"\(rows: value unknown\)"):
        get_task("obj_tasks:Plain", rows="<not recorded>")


@pytest.mark.parametrize("trainer", ["es", "grpo"])
def test_cli_resume_refuses_a_task_object_config_yaml_cannot_rebuild(user_tasks, tmp_path, monkeypatch, capsys,
                                                                     trainer):
    """config.yaml recorded `obj_tasks:Weighted` and no options for this object, so `--resume` trained a
    Weighted() with the default count, scorer and weights, without a word."""
    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the task was checked")

    monkeypatch.setattr("esft.models.load_model", no_model)
    task = user_tasks.Weighted(count=9, scorer=lambda completion, example: 1.0)
    run = tmp_path / "run"
    base = ESConfig(output_dir=str(run)) if trainer == "es" else GRPOConfig(output_dir=str(run))
    config, obj = with_task(base, task)
    assert obj is task and config.task_options["count"] == 9
    _save(config, run)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["task_options"] == {"count": 9, "scorer": "<not recorded: function>"}
    args = (["train", "es", "--resume", str(run), "--iterations", "2"] if trainer == "es" else
            ["train", "grpo", "--resume", "--output-dir", str(run)])
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "scorer: function" in err and "passing the same task object again" in err
    # the script resumes it: the same object records the same options, so the run's config matches
    resumed, again = with_task(base.replace(resume=True), task)
    assert again is task and resumed.task == saved["task"] and resumed.task_options == saved["task_options"]


def test_a_ray_run_refuses_a_task_object_its_workers_cannot_rebuild(user_tasks, monkeypatch):
    """Ray workers build the task from the config's task string: they would train Weighted() with its defaults."""
    from esft.api import es_trainer

    def no_ray(config):
        raise AssertionError("Ray was joined before the task was checked")

    monkeypatch.setattr("esft.api.connect", no_ray)
    task = user_tasks.Weighted(scorer=lambda c, ex: 0.0)
    with pytest.raises(ValueError, match="executor 'ray' builds the task on each worker") as info:
        es_trainer(ESConfig(executor="ray", output_dir="unused"), task=task)
    assert "scorer: <not recorded: function>" in str(info.value)  # the value it cannot pass names itself


def test_an_interrupted_run_of_such_a_task_object_says_to_resume_from_the_script(tmp_path):
    """The interrupted run's message said `esft train es --resume RUN`, which refuses this task."""
    from es_tiny import ToyTask, stub_generate, tiny_llama
    from esft.api import train_es
    from esft.rundir import RunInterrupted

    calls = []

    def generate_then_stop(model, tokenizer, prompts, cfg):
        calls.append(1)
        if len(calls) == 5:  # in iteration 2
            raise KeyboardInterrupt
        return stub_generate(model, tokenizer, prompts, cfg)

    config = ESConfig(model="tiny", population_size=2, batch_size=2, iterations=4, max_new_tokens=2, eval_every=0,
                      checkpoint_every=0, output_dir=str(tmp_path / "run"))
    with pytest.raises(RunInterrupted) as info:  # ToyTask is not a dataclass: its constructor values are unknown
        train_es(config, model=tiny_llama(), tokenizer=None, task=ToyTask(n_train=8), generate_fn=generate_then_stop,
                 progress=False)
    message = str(info.value)
    assert message.startswith("interrupted: 2 iterations are logged in") and "esft train es" not in message
    assert "`esft.train_es(config.replace(resume=True), task=...)` from this script" in message


@pytest.mark.parametrize("trainer", ["es", "grpo"])
def test_a_run_an_older_esft_recorded_without_options_resumes_from_the_script(user_tasks, tmp_path, trainer):
    """Before `<not recorded: TYPE>`, config.yaml held the class and no options for such an object (a function
    field, or a class that is not a dataclass): its script resumed it by passing the object again, and must still,
    instead of "config differs from the original run in task_options"."""
    if trainer == "es":
        from esft.es.finished import check_resumable as _check_resumable
    else:
        from esft.grpo.run import _check_resumable

    for name, task in [("Weighted", user_tasks.Weighted(count=9, scorer=lambda c, ex: 1.0)),
                       ("Plain", user_tasks.Plain(rows=2))]:
        run = tmp_path / f"{trainer}-{name}"
        base = ESConfig(output_dir=str(run)) if trainer == "es" else GRPOConfig(output_dir=str(run))
        _save(base.replace(task=f"obj_tasks:{name}", task_options={}), run)  # what the older esft wrote
        resumed, again = with_task(base.replace(resume=True), task)
        # the script's object is the one trained: itself, or (not an esft Task) behind the TaskAdapter get_task makes
        assert (again.obj if isinstance(again, TaskAdapter) else again) is task and resumed.task_options == {}
        assert isinstance(again, TaskAdapter) == (name == "Plain")
        _check_resumable(run, resumed)
    # a run this esft recorded keeps comparing what it recorded: another count is another task
    run = tmp_path / f"{trainer}-new"
    base = ESConfig(output_dir=str(run)) if trainer == "es" else GRPOConfig(output_dir=str(run))
    _save(with_task(base, user_tasks.Weighted(count=9, scorer=lambda c, ex: 1.0))[0], run)
    resumed, _ = with_task(base.replace(resume=True), user_tasks.Weighted(count=8, scorer=lambda c, ex: 1.0))
    with pytest.raises(ValueError, match=r"^cannot change \['task_options'\] when resuming .*'count': 9.*; "
                                         r"this config has task_options=.*'count': 8.*: drop the change"):
        _check_resumable(run, resumed)


def test_a_task_object_without_is_well_formed_trains_with_no_format_rate(tmp_path):
    """train_es wraps a task object in a TaskAdapter, and `is_well_formed` is optional for one
    (docs/custom-tasks.md): such an object checks no format, so the format bonus is said to have no effect (naming
    the object's class, as TaskAdapter names it) and the run reports no format rate. It used to count as checking
    one and stop at the first member with AttributeError: no is_well_formed."""
    import json

    from es_tiny import ToyTask, stub_generate, tiny_llama
    from esft.api import train_es
    from esft.tasks.custom import as_task

    toy = ToyTask(n_train=4, n_test=2)

    class Unformatted:  # load / prompt / score only, and no name
        splits = ("train", "test")
        load, prompt, score = toy.load, toy.prompt, toy.score

    # a task object's own is_well_formed, or none
    assert as_task(toy).checks_format and not as_task(Unformatted()).checks_format
    config = ESConfig(model="tiny", population_size=2, batch_size=2, iterations=1, max_new_tokens=2, eval_every=0,
                      checkpoint_every=0, format_bonus=0.1, output_dir=str(tmp_path / "run"))
    with pytest.warns(UserWarning, match=r"format bonus 0\.1 has no effect: task 'Unformatted' checks no answer"):
        result = train_es(config, model=tiny_llama(), tokenizer=None, task=Unformatted(), generate_fn=stub_generate,
                          progress=False)
    assert result.steps == 1
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["format_rate"] for r in rows if r["kind"] == "train"] == [None]


# ---- a task object that is not an esft Task is trained as get_task builds it ------------------------------------

SAID = '''
from dataclasses import dataclass


@dataclass
class Said:
    """load / prompt / score only; the prompt is text and the gold answers are labels (even / odd)."""
    count: int = 4

    def load(self, split):
        return [{"q": f"Is {i} even?", "answer": "odd" if i % 3 == 1 else "even"} for i in range(self.count)]

    def prompt(self, example):
        return example["q"]

    def score(self, completion, example):
        return float(example["answer"] in completion)
'''


@pytest.fixture()
def said(tmp_path, monkeypatch):
    from conftest import importable_module

    importable_module(tmp_path, monkeypatch, "said_task", SAID)
    import said_task

    return said_task


def test_an_api_run_of_a_text_prompt_object_resumes_from_the_cli_with_the_same_prompts(said, tmp_path, tokenizer):
    """train_es encoded the object's text prompt as plain text, while `esft train es --resume` (like Ray workers,
    `esft eval` and `esft report`) built the task from config.yaml through get_task, whose TaskAdapter makes the
    text a chat turn: the resumed iteration generated from other prompt tokens than the uninterrupted run."""
    import json

    from conftest import make_tiny_model
    from esft.api import train_es

    model_dir = tmp_path / "tiny"
    make_tiny_model().save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    config = ESConfig(model=str(model_dir), population_size=2, batch_size=2, max_new_tokens=3, eval_every=0,
                      checkpoint_every=1, samples_per_iteration=2, generation_batch_size=4, device="cpu",
                      dtype="float32")
    full, half = tmp_path / "full", tmp_path / "half"
    train_es(config.replace(output_dir=str(full), iterations=2), task=said.Said(), progress=False)
    train_es(config.replace(output_dir=str(half), iterations=1), task=said.Said(), progress=False)
    assert yaml.safe_load((half / "config.yaml").read_text())["task"] == "said_task:Said"
    assert main(["train", "es", "--resume", str(half), "--iterations", "2"]) == 0

    def second(run):
        row = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][1]
        samples = (run / "samples" / "iter_000001.jsonl").read_text()
        return row["iteration"], row["prompt_tokens"], row["fitness"], samples

    assert second(half) == second(full)
    # the prompts are chat turns, as get_task builds the task: more tokens than the bare text
    example = said.Said().load("train")[0]
    chat = encode_prompts(tokenizer, [get_task("said_task:Said").prompt(example)])[0]
    assert len(chat) > len(encode_prompts(tokenizer, [example["q"]])[0])


def test_the_es_trainer_prompts_a_task_object_as_get_task_builds_it(said, tmp_path):
    """ESTrainer itself (not only esft.train_es) wraps the object as get_task does, so its executor generates
    from the chat prompts a resume, a Ray worker or `esft eval` builds, not from the bare text."""
    from es_tiny import tiny_llama
    from esft.es.trainer import ESTrainer
    from esft.generation import Generation

    seen = []

    def record(model, tokenizer, prompts, cfg, **kwargs):
        seen.extend(prompts)
        return [Generation(text="even") for _ in prompts]

    task = said.Said()
    config = ESConfig(model="tiny", population_size=2, batch_size=2, max_new_tokens=2, eval_every=0,
                      output_dir=str(tmp_path / "run"))
    trainer = ESTrainer(config, model=tiny_llama(hidden=16, layers=1), task=task, generate_fn=record, progress=False)
    assert isinstance(trainer.task, TaskAdapter) and trainer.task.obj is task
    batch = task.load("train")
    result = trainer.executor.evaluate_center(batch)
    built = get_task("said_task:Said")
    assert seen == [built.prompt(ex) for ex in batch] and seen[0] == [{"role": "user", "content": "Is 0 even?"}]
    assert result.scores.tolist() == [[built.score("even", ex) for ex in batch]]


def test_es_evaluation_of_a_task_object_reports_the_constant_answer_baseline(said, tmp_path):
    """ESTrainer left the baseline out for an object that is not an esft Task (`esft eval` and `esft report`, which
    build it through get_task, report it), and read the test split with load(split, limit=...), which the
    documented load(split) of such an object does not take."""
    from es_tiny import stub_generate, tiny_llama
    from esft.es.trainer import ESTrainer
    from esft.tasks.labels import constant_baseline

    class Tokens(said.Said):  # the stub generator reads token ids
        def prompt(self, example):
            return [3 + len(example["q"]), 5, 7]

    task = Tokens(count=6)
    config = ESConfig(model="tiny", eval_limit=6, eval_every=1, iterations=0, batch_size=2, population_size=2,
                      max_new_tokens=2, output_dir=str(tmp_path / "run"))
    rec = ESTrainer(config, model=tiny_llama(), task=task, generate_fn=stub_generate, progress=False).train().last_eval
    expected = constant_baseline([ex["answer"] for ex in task.load("test")])  # 4 even, 2 odd
    assert rec["test_n"] == 6 and rec["test_constant_answer"] == "even"
    assert rec["test_constant_baseline"] == expected["constant_baseline"] == 4 / 6


def test_grpo_trains_and_evaluates_a_task_object(said, tmp_path, tokenizer):
    """GRPO took the object as it is and stopped with AttributeError: its reward (Task.reward_function) and its
    held-out evaluation (Task.aggregate) need an esft Task."""
    pytest.importorskip("trl")
    from conftest import make_tiny_model
    from esft.grpo.run import train_grpo
    from grpo_tiny import tiny_config

    result = train_grpo(tiny_config(tmp_path / "run", task="said_task:Said", max_steps=2, eval_every=2,
                                    save_steps=0, eval_limit=4, format_bonus=0.0),
                        model=make_tiny_model(), tokenizer=tokenizer, task=said.Said(), progress=False)
    assert result.steps == 2 and result.last_eval["test_n"] == 4
    assert result.last_eval["test_constant_answer"] == "even" and result.last_eval["test_constant_baseline"] == 0.75
