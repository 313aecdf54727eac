"""The pure pieces of esft's validation layer, pinned one by one: the range rules (`Rule` and its builders), the
type checks and their words, `check_fields` / `check_value` / `coerce`, the string converters, and the name checks
of esft.validation driven with small fake tasks. Run: `pytest tests/test_validation_rules.py -q`."""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from esft import validation
from esft.tasks.base import Task
from esft.config import ConfigError, ConfigHooks, RunConfig, check_fields, check_value, coerce, type_ok, type_words
from esft.config_flags import converter, parse_bool
from esft.config_rules import at_least, finite, in_range, non_negative, one_of, positive, regexes

HUGE = 10 ** 400  # an integer YAML reads exactly, too large for a float


@pytest.mark.parametrize("rule, good, bad", [
    (at_least(1), [1, 2, 10 ** 9], [0, -1]),
    (positive(), [1e-300, 1, 0.5], [0, 0.0, -1e-9, math.inf, math.nan, HUGE]),
    (non_negative(), [0, 0.0, 3.5], [-1e-9, math.inf, math.nan, HUGE]),
    (finite(), [0, -2.5, 1e300], [math.inf, -math.inf, math.nan, HUGE]),
    (in_range(0, 1), [1e-9, 0.5, 1, 1.0], [0, 0.0, 1.0000001, math.nan, math.inf, HUGE]),
    (in_range(0, 1, low_open=False), [0, 0.0, 1], [-1e-9, 1.5, math.nan]),
    (one_of("a", "b"), ["a", "b"], ["c", "A", ""]),
    (regexes(), [[], ["a.*", r"layers\.[0-9]{1,2}\."]], [["("], ["ok", "[unclosed"]]),
])
def test_rules_accept_and_refuse_at_their_boundaries(rule, good, bad):
    """Each rule builder's inclusive / exclusive ends, and NaN, infinities and an integer too large for a float
    refused by every rule that promises a finite number (as False, not OverflowError)."""
    assert [rule.ok(v) for v in good] == [True] * len(good)
    assert [rule.ok(v) for v in bad] == [False] * len(bad)


def test_a_yaml_integer_too_large_for_a_float_is_a_config_error(tmp_path):
    """`sigma: 1000...0` (400 digits) in a run file is refused as ConfigError at its line, not an OverflowError
    traceback (YAML reads it as an exact int, which passes a float field's type check)."""
    from esft.config import build_config
    from esft.es.es_config import ESConfig

    run = tmp_path / "run.yaml"
    run.write_text(f"max_new_tokens: 8\nsigma: {HUGE}\n")
    with pytest.raises(ConfigError,
                       match=r"run\.yaml:2: sigma = 10{400} is not accepted; expected a finite number > 0$"):
        build_config(ESConfig, None, None, str(run), {})


@pytest.mark.parametrize("patterns", [[0], [None], ["norm", 1], [1.5]])
def test_regexes_refuse_a_pattern_that_is_not_text(patterns):
    """A YAML list of include / exclude patterns holding a number or null is no list of regexes: re.search
    raises TypeError on such an item."""
    assert regexes().ok(patterns) is False


@pytest.mark.parametrize("text", ["exclude: [0, 1]", "include: [null]", "include: [embed, 3]"])
def test_a_run_file_with_a_non_text_pattern_is_a_config_error_at_its_line(tmp_path, text):
    """`exclude: [0, 1]` (layer numbers, say) in a run file is refused at its line as a ConfigError, not a
    TypeError traceback from the config's own checks."""
    run = tmp_path / "run.yaml"
    run.write_text(f"max_new_tokens: 8\n{text}\n")
    key = text.partition(":")[0]
    with pytest.raises(ConfigError, match=rf"run\.yaml:2: {key} = .* is not accepted; expected a list of valid "
                                          r"regular expressions \(text"):
        from esft.config import build_config
        from esft.es.es_config import ESConfig

        build_config(ESConfig, None, None, str(run), {})


def test_rule_words_name_the_bounds_and_choices():
    """The `accepted` text names the bound, the open or closed end, and the choices as written in a config."""
    assert at_least(3).accepted == "an integer >= 3"
    assert positive().accepted == "a finite number > 0"
    assert non_negative().accepted == "a finite number >= 0"
    assert finite().accepted == "a finite number"
    assert in_range(0, 1).accepted == "a number in (0, 1]"
    assert in_range(0.5, 2, low_open=False).accepted == "a number in [0.5, 2]"
    assert one_of("mean", "dart").accepted == "one of 'mean', 'dart'"


@pytest.mark.parametrize("value, hint, ok", [
    (3, int, True), (True, int, False), (2.0, int, False),
    (3, float, True), (2.5, float, True), (False, float, False), ("1", float, False),
    (True, bool, True), (1, bool, False),
    ("x", str, True), (1, str, False),
    (None, int | None, True), (None, int, False), (4, int | None, True), ("4", int | None, False),
    (None, type(None), True), (0, type(None), False),
    ([1], list[int], True), ((1,), list, True), ("ab", list[str], False),
    ({}, dict[str, Any], True), ({}, dict, True), ([], dict[str, Any], False),
    (object(), Any, True), (object(), set, True),
])
def test_type_ok(value, hint, ok):
    """ints pass for floats but not floats for ints, bools are not numbers, None only for optionals, a list hint
    takes a list or tuple, a mapping hint a dict, and an unlisted type passes (the config checks it itself)."""
    assert type_ok(value, hint) is ok


@pytest.mark.parametrize("hint, words", [
    (bool, "true or false"), (int, "an integer"), (float, "a number"), (str, "text"),
    (int | None, "an integer or null"), (list[str], "a list"), (tuple, "a list"), (dict[str, Any], "a mapping"),
    (dict | None, "a mapping or null"),
])
def test_type_words(hint, words):
    """The error message's words for each field type."""
    assert type_words(hint) == words


@dataclass
class Demo(RunConfig):
    rate: float = 0.5
    count: int = 2
    limit: int | None = None
    name: str = "a"
    flag: bool = False
    items: list[str] = field(default_factory=list)
    rules: ClassVar[dict] = {"rate": in_range(0, 1), "count": at_least(1), "limit": at_least(1)}


def test_check_fields_names_key_value_and_accepted():
    """check_fields refuses a wrong type with the type's words and a value out of range with the rule's words;
    None passes an optional field's rule, and without `rules` only types are checked."""
    check_fields(Demo(limit=None), Demo.rules)
    check_fields(Demo(count=0))  # no rules given: only types
    with pytest.raises(ConfigError, match=r"^count = 2\.5 is not accepted; expected an integer$"):
        check_fields(Demo(count=2.5), Demo.rules)
    with pytest.raises(ConfigError, match=r"^count = 0 is not accepted; expected an integer >= 1$"):
        check_fields(Demo(count=0), Demo.rules)
    with pytest.raises(ConfigError, match=r"^flag = 1 is not accepted; expected true or false$"):
        check_fields(Demo(flag=1), Demo.rules)
    with pytest.raises(ConfigError, match=r"rate = 10{400} is not accepted; expected a number in \(0, 1\]"):
        check_fields(Demo(rate=HUGE), Demo.rules)


def test_check_value_checks_type_then_rule_and_passes_none():
    """check_value, for one option of an experiment spec: the type's words, the rule's words, None for an
    optional field passing its rule."""
    check_value(Demo, "limit", None)
    check_value(Demo, "rate", 1)
    with pytest.raises(ConfigError, match=r"^limit = 'x' is not accepted; expected an integer or null$"):
        check_value(Demo, "limit", "x")
    with pytest.raises(ConfigError, match=r"^limit = 0 is not accepted; expected an integer >= 1$"):
        check_value(Demo, "limit", 0)
    with pytest.raises(ConfigError, match=r"^rate = 0 is not accepted; expected a number in \(0, 1\]$"):
        check_value(Demo, "rate", 0)


def test_coerce_converts_strings_and_names_where():
    """coerce turns YAML strings into the field's type (a str field's text left as is), reads dashes as
    underscores, and names the origin and the close option names in errors."""
    out = coerce(Demo, {"rate": "0.25", "count": "3", "limit": "null", "flag": "off", "items": "a, b",
                        "name": "7"}, "src")
    assert out == {"rate": 0.25, "count": 3, "limit": None, "flag": False, "items": ["a", "b"], "name": "7"}
    assert coerce(Demo, {"rate": 1}, "src") == {"rate": 1}
    with pytest.raises(ConfigError, match=r"^run\.yaml:4: count = 'two' is not accepted; expected an integer$"):
        coerce(Demo, {"count": "two"}, "src", lambda key: "run.yaml:4")
    with pytest.raises(ConfigError, match=r"^src: flag = 'maybe' is not accepted"):
        coerce(Demo, {"flag": "maybe"}, "src")
    with pytest.raises(ValueError, match=r"^src: unknown option 'cont' \(did you mean count\?\)$"):
        coerce(Demo, {"cont": 1}, "src")


def test_coerce_reads_dashed_keys():
    """A key typed with dashes (`max-steps`, as on the command line) names the same field."""
    @dataclass
    class Dashed(ConfigHooks):
        max_steps: int = 1

    assert coerce(Dashed, {"max-steps": "4"}, "src") == {"max_steps": 4}


def test_config_error_text_and_location():
    """The message reads `where: key = value is not accepted; expected ...`; located() adds an origin only to an
    error that has none."""
    err = ConfigError("sigma", -1, "a finite number > 0")
    assert str(err) == "sigma = -1 is not accepted; expected a finite number > 0"
    assert err.located(None) is err
    moved = err.located("--sigma")
    assert str(moved) == "--sigma: sigma = -1 is not accepted; expected a finite number > 0"
    assert moved.located("run.yaml:3") is moved


def test_converters_and_parse_bool():
    """The string converters: optional fields read none / null / empty as None, lists split on commas and convert
    their items, booleans take the usual words and refuse anything else."""
    assert converter(int | None)("") is None
    assert converter(int | None)("NULL") is None
    assert converter(int | None)("5") == 5
    assert converter(list[int])("1, 2") == [1, 2]
    assert converter(float)("2") == 2.0 and isinstance(converter(float)("2"), float)
    assert [parse_bool(t) for t in ("1", "true", "Yes", "on")] == [True] * 4
    assert [parse_bool(t) for t in ("0", "false", "No", "OFF")] == [False] * 4
    with pytest.raises(argparse.ArgumentTypeError, match="expected a boolean, got 'maybe'"):
        parse_bool("maybe")


# ---- esft.validation, with small fake tasks ---------------------------------------------------------------------

class FakeTask(Task):
    """A Task subclass of the user's: its splits, rows, prompt and score set per test."""

    name = "fake"

    def __init__(self, splits=("train", "test"), rows=None, prompt=None, score=0.0):
        self.splits, self._rows = splits, {"train": [{"q": 1}], "test": [{"q": 2}]} if rows is None else rows
        self._prompt = [{"role": "user", "content": "hi"}] if prompt is None else prompt
        self._score = score

    def load(self, split, limit=None):
        rows = self._rows[split]
        if isinstance(rows, Exception):
            raise rows
        return rows[:limit] if limit is not None else rows

    def prompt(self, example):
        return self._prompt

    def score(self, completion, example):
        if isinstance(self._score, Exception):
            raise self._score
        return self._score


def test_check_splits_accepts_a_complete_task():
    """A task with both splits, each with a promptable, scorable first example, passes, and is told each split's
    number of examples (what grpo_config reads instead of loading the split again)."""
    task = FakeTask(rows={"train": [{"q": 1}, {"q": 2}, {"q": 3}], "test": [{"q": 4}]})
    assert validation.check_splits("task", "fake", task, ("train", "test")) == {"train": 3, "test": 1}
    assert validation.check_splits("task", "fake", task, ("test",)) == {"test": 1}  # only the splits asked for


@pytest.mark.parametrize("task, message", [
    (FakeTask(splits=("train",)), r"a task with the split\(s\) test \(task 'fake' has train\)"),
    (FakeTask(splits=()), r"the split\(s\) train, test \(task 'fake' has none\)"),
    (FakeTask(rows={"train": [{"q": 1}], "test": []}), r"a task with test examples .*its test split is empty"),
    (FakeTask(rows={"train": KeyError("gone"), "test": []}), r"train split loads \(task 'fake': KeyError"),
    (FakeTask(prompt="hi"), r"prompt\(example\) returns chat messages.*returned str 'hi'"),
    (FakeTask(prompt=[]), r"returns chat messages"),
    (FakeTask(prompt=[{"role": "user"}]), r"returns chat messages"),
    (FakeTask(prompt=[{"content": "x"}]), r"returns chat messages"),
    (FakeTask(prompt=[{"role": "system", "content": "x"}, {"role": "User", "content": "x"}]),
     r"chat messages with the roles system, user, assistant, tool \(task 'fake' gave the role 'User'\)"),
    (FakeTask(score=KeyError("answer")), r"can score its first train example .*score raised KeyError"),
    (FakeTask(score=math.nan), r"returns a finite number .*scored an empty completion float nan"),
    (FakeTask(score="1"), r"returns a finite number .*scored an empty completion str '1'"),
])
def test_check_splits_refuses_a_broken_task(task, message):
    """A missing split, an empty split, a load, prompt or score that fails, a prompt that is not chat messages and
    a score that is not a finite number each fail as ConfigError naming the task and what is wrong."""
    with pytest.raises(ConfigError, match=message):
        validation.check_splits("task", "fake", task, ("train", "test"))


@pytest.mark.parametrize("name, named", [("named", "named"), ("", "typed")])
def test_check_splits_names_the_task_and_gives_its_why_empty_hint(name, named):
    """The refusal names the task by its own name (by the value typed when it has none) and adds the task's
    `why_empty` hint (a data task names the options that would fill the split)."""
    class Hinted(FakeTask):
        def why_empty(self, split):
            return f"more rows for {split}"

    task = Hinted(rows={"train": [{"q": 1}], "test": []})
    task.name = name
    with pytest.raises(ConfigError, match=rf"^task = 'typed' is not accepted; expected a task with test examples "
                                          rf"\(task '{named}': its test split is empty; more rows for test\)$"):
        validation.check_splits("task", "typed", task, ("train", "test"))


def test_check_first_example_and_evals_task_fit_name_the_task_by_its_own_name():
    """A prompt that is not chat messages is refused naming the task's own name; `esft eval` on its default split
    puts that name under `tasks`."""
    from esft.eval_config import EvalConfig

    task = FakeTask(prompt="hi")
    task.name = "named"
    with pytest.raises(ConfigError, match=r"^task = 'typed' .*\(task 'named' returned str 'hi'\)$"):
        validation.check_first_example("task", "typed", task, "train")
    empty = FakeTask(rows={"train": [{"q": 1}], "test": []})
    empty.name = "named"
    with pytest.raises(ConfigError, match=r"^tasks = 'named' is not accepted; expected a task with test examples"):
        EvalConfig(tasks=["boolq"]).check_task_fit(empty)


def test_brief_cuts_long_values():
    """Values in messages are cut at 60 characters with an ellipsis."""
    assert validation._brief("x" * 10) == "str " + repr("x" * 10)
    assert validation._brief("x" * 100) == "str " + repr("x" * 100)[:60] + "..."


def test_check_model_accepts_names_folders_and_hub_ids(tmp_path):
    """An embedded model (any case), a folder with config.json and weights, `~`-paths, and an org/name hub id
    pass."""
    from esft.models import known_model_names

    validation.check_model("model", known_model_names()[0].upper())
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")  # present is enough: the weights are not opened here
    validation.check_model("model", str(tmp_path))
    validation.check_model("model", "org/name")


@pytest.mark.parametrize("name", ["a/b/c", "./org/x", "./x", "~nobody/x", "org/", "plainword", "/no/such/folder"])
def test_check_model_refuses_what_is_neither(name):
    """A name that is no embedded model, no existing folder and no org/name id is refused."""
    with pytest.raises(ConfigError, match=r"expected an embedded model .* or a hub id org/name$"):
        validation.check_model("model", name)


def test_check_model_points_a_run_directory_at_its_checkpoint(tmp_path):
    """A folder without config.json is refused; a run directory (checkpoints/ and config.yaml) gets the hint of
    its final checkpoint, a plain folder only that it lacks config.json."""
    with pytest.raises(ConfigError, match="has no config.json"):
        validation.check_model("model", str(tmp_path))
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ConfigError, match="has no config.json"):
        validation.check_model("model", str(tmp_path))
    (tmp_path / "config.yaml").write_text("{}")
    with pytest.raises(ConfigError, match=r"is a run directory: its model is a checkpoint folder, e\.g\. .*final"):
        validation.check_model("model", str(tmp_path))


def test_check_device(monkeypatch):
    """None and cpu pass; a malformed or unknown device is refused; CUDA is refused without CUDA, and an index at
    or past the device count is refused with it."""
    import torch

    validation.check_device("device", None)
    validation.check_device("device", "cpu")
    for bad in ("gpu", "meta"):
        with pytest.raises(ConfigError, match=r"expected a torch device: cpu, cuda, cuda:N or mps"):
            validation.check_device("device", bad)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="sees no CUDA device"):
        validation.check_device("device", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    validation.check_device("device", "cuda:1")
    with pytest.raises(ConfigError, match=r"this machine has 2 CUDA device\(s\)"):
        validation.check_device("device", "cuda:2")


def test_check_device_name_asks_torch_not_the_machine(monkeypatch):
    """A name torch knows of type cpu, cuda or mps passes as its torch.device whether or not this machine has that
    device (a spec names cuda and is read on a laptop); any other name is refused under the key given."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    for name, kind, index in (("cpu", "cpu", None), ("cuda", "cuda", None), ("cuda:7", "cuda", 7),
                              ("mps", "mps", None)):
        device = validation.check_device_name("device", name)
        assert isinstance(device, torch.device) and (device.type, device.index) == (kind, index)
    for bad in ("gpu", "meta", "cdua", "cuda:x", ""):
        with pytest.raises(ConfigError, match=r"^evaluation.device = .* is not accepted; expected a torch device: "
                                              r"cpu, cuda, cuda:N or mps"):
            validation.check_device_name("evaluation.device", bad)


def test_check_eval_options():
    """With eval_every = 0 a given, truthy evaluation option is refused naming its flag; a zero value, or a run
    that evaluates, passes."""
    from esft.es import ESConfig
    from esft.grpo.grpo_config import GRPOConfig

    for cls in (ESConfig, GRPOConfig):
        validation.check_eval_options(cls(eval_every=5), {"eval_limit": 10})
        validation.check_eval_options(cls(eval_every=0), {"eval_limit": 0, "eval_balanced": False})
        with pytest.raises(ConfigError, match=r"^command line \(--eval-limit\): eval_limit = 10 is not accepted; "
                                              r"expected a run that evaluates: eval_every is 0.*--eval-limit"):
            validation.check_eval_options(cls(eval_every=0), {"eval_limit": 10})


def test_check_task_hints_a_close_name():
    """A misspelt task is refused with the closest registered name, also when options follow it."""
    with pytest.raises(ConfigError, match=r"a known task name .*did you mean 'boolq'\?"):
        validation.check_task("task", "boolk")
    with pytest.raises(ConfigError, match=r"did you mean 'countdown'\?"):
        validation.check_task("task", "countdwn:ops=+-,numbers=4,target_max=99")
    with pytest.raises(ConfigError, match=r"did you mean 'countdown'\?"):  # an abbreviation: difflib's ratio is 0.5
        validation.check_task("task", "cou")


def test_check_task_names_bad_options():
    """A known task given an option it does not take is refused as `a task with valid options`."""
    with pytest.raises(ConfigError, match=r"^task = 'boolq' is not accepted; expected a task with valid options"):
        validation.check_task("task", "boolq", {"no_such_option": 1})


def test_check_names_blames_task_options_not_the_task():
    """A good task name with bad options is refused under `task_options`, naming the task."""
    @dataclass
    class Cfg:
        model: str = "org/name"
        device: str | None = None

        def task_checks(self):
            return [("task", "boolq", {"no_such_option": 1})]

        def check_task_fit(self, task, name=None):
            raise AssertionError("not reached")

        def generation_limits(self):
            return {}

    with pytest.raises(ConfigError, match=r"^task_options = \{'no_such_option': 1\} is not accepted; "
                                          r"expected options of task 'boolq'"):
        validation.check_names(Cfg())


def test_require_labels_and_task_labels():
    """A task without labels has none, and a rule that needs labels refuses it."""
    assert validation.task_labels(FakeTask()) is None
    with pytest.raises(ConfigError, match=r"^fitness_rule = 'balanced' is not accepted; expected balanced for "
                                          r"this task: it needs a task with labels \(boolq, chemistry, mmlu, a "
                                          r"Countdown variant with several operators, a data task scored by mcq, a "
                                          r"task class whose label_set names its labels\)$"):
        validation.require_labels("fitness_rule", "balanced", "balanced", FakeTask())


def test_check_device_refuses_mps_where_it_is_missing(monkeypatch):
    """mps is refused on a machine whose torch has no MPS backend."""
    import torch

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="MPS is not available here"):
        validation.check_device("device", "mps")


@dataclass
class NamesConfig:
    """The fields and hooks esft.validation.check_names reads, with a record of the tasks it fitted."""

    model: str = "org/name"
    device: str | None = None
    tasks: tuple = (("task", "boolq", {}),)
    fitted: list = field(default_factory=list)

    def task_checks(self):
        return list(self.tasks)

    def check_task_fit(self, task, name=None):
        self.fitted.append((task.name, name))

    def generation_limits(self):
        return {}


def test_check_names_checks_model_device_and_fits_each_task():
    """check_names refuses a bad model and a bad device under their keys, and hands every built task to
    check_task_fit."""
    with pytest.raises(ConfigError, match=r"^model = 'plainword' is not accepted"):
        validation.check_names(NamesConfig(model="plainword"))
    with pytest.raises(ConfigError, match=r"^device = 'gpu' is not accepted"):
        validation.check_names(NamesConfig(device="gpu"))
    config = NamesConfig(tasks=(("task", "boolq", {}), ("eval_task", "countdown", {})))
    validation.check_names(config)
    assert config.fitted == [("boolq", "boolq"), ("countdown", "countdown")]  # with each name as given


def test_unwrap_optional_only_unwraps_x_or_none():
    """`X | None` is optional X; a union of two real types is neither unwrapped nor optional."""
    from esft.config_flags import unwrap_optional

    assert unwrap_optional(int | None) == (int, True)
    assert unwrap_optional(int | str) == (int | str, False)
    assert unwrap_optional(int) == (int, False)


def test_check_model_expands_the_home_folder(tmp_path, monkeypatch):
    """`~/model` names a folder under the user's home, found there."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "m" / "pytorch_model.bin").write_bytes(b"")
    validation.check_model("model", "~/m")


def test_check_task_reports_what_is_wrong_with_a_data_file(tmp_path):
    """A data-file task that cannot be built is refused with the file's problem, not as an unknown task name."""
    data = tmp_path / "rows.jsonl"
    data.write_text('{"question": "q", "answer": "a"}\n')
    with pytest.raises(ConfigError, match=r"expected a task esft can build from it: .*no field 'nope'") as refused:
        validation.check_task("task", str(data), {"prompt_field": "nope"})
    assert refused.value.key == "task"
    # an option the task does not take is the options' fault
    with pytest.raises(ConfigError, match=r"expected options of task .*unknown option 'no_such_option'") as refused:
        validation.check_task("task", str(data), {"no_such_option": 1})
    assert refused.value.key == "task_options"


def test_check_balanced_set_needs_labels_and_a_limit():
    """Nothing is checked for a task without labels, whatever the limit."""
    assert validation.check_balanced_set(FakeTask(), 5) is None


@dataclass
class LabelledTask(Task):
    """A labelled task (labels A and B) whose train split is balanced and whose test split has no B."""

    name: str = "labelled"
    rows: dict = field(default_factory=lambda: {"train": [{"answer": "A"}, {"answer": "B"}] * 3,
                                                "test": [{"answer": "A"}] * 6})

    def _load(self, split):
        return list(self.rows[split])

    def prompt(self, example):
        return [{"role": "user", "content": "?"}]

    def score(self, completion, example):
        return 0.0

    def label_set(self):
        return ("A", "B")


def test_check_balanced_set_skips_limit_zero_but_not_an_unset_limit():
    """Limit 0 evaluates nothing, so no balanced set is needed even where none exists; an unset limit (None: as
    many as the rarest label allows) still needs every label, as does any positive limit."""
    task = LabelledTask()
    assert validation.check_balanced_set(task, 0) is None
    for limit in (None, 1, 2, 4):
        with pytest.raises(ConfigError, match=r"no example has label 'B'"):
            validation.check_balanced_set(task, limit)


def test_check_balanced_set_reads_the_split_it_is_given_and_names_it():
    """The held-out wording is the test split's; another split is named as such, under the key given, with the
    reason balanced_indices gives."""
    task = LabelledTask()
    with pytest.raises(ConfigError, match=r"^eval_limit = 4 is not accepted; expected a balanced held-out set that "
                                          r"exists \(cannot balance: no example has label 'B'\)$"):
        validation.check_balanced_set(task, 4)
    validation.check_balanced_set(task, 6, split="train")  # 3 of each label there
    with pytest.raises(ConfigError, match=r"^limit = 8 is not accepted; expected a balanced set of split 'train' "
                                          r"that exists \(a balanced subset of 8 needs 4 examples per label, but the "
                                          r"rarest label has 3 \(at most 6 in all\)\)$"):
        validation.check_balanced_set(task, 8, split="train", key="limit")


def test_check_eval_options_refuses_a_passage_cut_no_task_reads():
    """`--max-passage-chars` cuts BoolQ passages only: typed for a run or evaluation without BoolQ it was accepted
    and ignored. A preset's cut (not typed) and a cut given with BoolQ among the tasks pass."""
    from esft.es import ESConfig
    from esft.eval_config import EvalConfig

    validation.check_eval_options(ESConfig(task="boolq", eval_every=10), {"max_passage_chars": 400})
    validation.check_eval_options(ESConfig(task="countdown"), {})  # e.g. `--preset cpu --task countdown`
    validation.check_passage_cut(EvalConfig(tasks=["countdown", "BoolQ"]), {"max_passage_chars": 400})
    for check, config, among in ((validation.check_eval_options, ESConfig(task="countdown", eval_every=10), ""),
                                 (validation.check_passage_cut, EvalConfig(tasks=["countdown", "mmlu"]), ", mmlu")):
        with pytest.raises(ConfigError, match=r"^command line \(--max-passage-chars\): max_passage_chars = 400 is "
                                              rf"not accepted; expected a BoolQ task among countdown{among}: "):
            check(config, {"max_passage_chars": 400})


def test_a_typed_passage_cut_that_every_boolq_name_overrides_is_refused():
    """A BoolQ task whose name sets its own cut keeps it (esft.config.passage_cut): a typed --max-passage-chars
    beside it was ignored without a word. It passes where one BoolQ task takes it."""
    from esft.es import ESConfig
    from esft.eval_config import EvalConfig

    named = "boolq:max_passage_chars=100"
    validation.check_passage_cut(EvalConfig(tasks=[named, "boolq"]), {"max_passage_chars": 400})
    validation.check_passage_cut(ESConfig(task=named), {})  # a preset's cut beside it is not typed
    for config in (ESConfig(task=named, eval_every=10), EvalConfig(tasks=[named, "countdown"])):
        with pytest.raises(ConfigError, match=r"^command line \(--max-passage-chars\): max_passage_chars = 400 is "
                                              rf"not accepted; expected a BoolQ task without a cut of its own "
                                              rf"\({named} sets max_passage_chars, which wins\)"):
            validation.check_passage_cut(config, {"max_passage_chars": 400})
    with pytest.raises(ConfigError, match=rf"\({named}, {named} set max_passage_chars, which wins\)"):
        validation.check_passage_cut(EvalConfig(tasks=[named, named]), {"max_passage_chars": 400})
    # a trainer's task_options may set the cut too (they come after the flag's in the task's options)
    with pytest.raises(ConfigError, match=r"\(task_options sets max_passage_chars, which wins\)"):
        validation.check_passage_cut(ESConfig(task="boolq", task_options={"max_passage_chars": 300}),
                                     {"max_passage_chars": 400})


@pytest.mark.parametrize("algorithm", ["es", "grpo"])
def test_a_run_that_never_evaluates_does_not_need_its_presets_held_out_set(algorithm):
    """eval_every 0 reads no evaluation option, so a preset's balanced eval_limit (cpu-countdown: 400) that the
    task's test split cannot balance, or a task without a test split, must not refuse the run: `--preset
    cpu-countdown --task countdown:...,max_number=20` was refused for a set it would never evaluate. With eval_every
    > 0 the same set is still refused."""
    from esft.es import ESConfig
    from esft.grpo import GRPOConfig

    # (GRPO: a step of 2 prompts, which the 2 train rows below can fill)
    step = {} if algorithm == "es" else {"prompts_per_step": 2}
    config = (ESConfig if algorithm == "es" else GRPOConfig)(task="labelled", eval_every=0, eval_limit=4,
                                                            eval_balanced=True, **step)
    config.check_task_fit(LabelledTask())  # the test split has no 'B': no balanced set of 4 exists
    config.check_task_fit(LabelledTask(rows={"train": [{"answer": "A"}, {"answer": "B"}], "test": []}))
    with pytest.raises(ConfigError, match=r"eval_limit = 4 .* no example has label 'B'"):
        config.replace(eval_every=1).check_task_fit(LabelledTask())


@pytest.mark.parametrize("key, shown, line", [("1", "1", ":2"), ("0.5", "0.5", ":2"), ("yes", "True", ":?")])
def test_a_run_file_key_that_yaml_reads_as_a_number_or_bool_is_an_unknown_option(tmp_path, key, shown, line):
    """`1: 2` or `yes: 3` (YAML 1.1 reads `yes` as true) in a run file is an unknown option naming the file (and the
    line where the key's text is the option's name), not an AttributeError traceback from the key's type."""
    from esft.config import build_config
    from esft.es.es_config import ESConfig

    run = tmp_path / "run.yaml"
    run.write_text(f"sigma: 0.01\n{key}: 2\n")
    with pytest.raises(ValueError, match=rf"^{run}{re.escape(line)}: unknown option {shown}$"):
        build_config(ESConfig, None, None, str(run), {})
