"""Config plumbing: dataclass -> flags, presets, YAML. Run: `pytest tests/test_config.py -q`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from esft.config import ConfigHooks, build_config
from esft.config_flags import add_dataclass_arguments, field_docs


@dataclass
class Demo(ConfigHooks):
    lr: float = 0.1
    """Step size."""
    steps: int = 3
    """How many steps."""
    tasks: list[str] = field(default_factory=lambda: ["a"])
    """Task names."""
    limit: int | None = None
    """Optional cap."""
    fast: bool = False
    """Go fast."""


PRESETS = {"big": {"steps": 100, "lr": 0.5}}


def test_field_docs_read_from_source():
    docs = field_docs(Demo)
    assert docs["lr"] == "Step size."
    assert docs["limit"] == "Optional cap."


def test_priority_defaults_preset_file_flags(tmp_path):
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("steps: 7\ntasks: [x, y]\n")
    cfg = build_config(Demo, PRESETS, "big", str(cfg_file), {"lr": 0.25})
    assert (cfg.lr, cfg.steps, cfg.tasks, cfg.limit) == (0.25, 7, ["x", "y"], None)


def test_preset_named_inside_yaml(tmp_path):
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("preset: big\nsteps: 9\n")
    cfg = build_config(Demo, PRESETS, None, str(cfg_file), {})
    assert (cfg.lr, cfg.steps) == (0.5, 9)


def test_an_abbreviated_yaml_key_is_answered_with_the_option_it_begins(tmp_path):
    """`temp` is too far from `temperature` for difflib's cutoff (ratio 0.53): the options it begins are named."""
    @dataclass
    class Sampling(ConfigHooks):
        temperature: float = 1.0
        """Softmax temperature."""

    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("temp: 0.7\n")
    with pytest.raises(ValueError, match=r"unknown option 'temp' \(did you mean temperature\?\)"):
        build_config(Sampling, {}, None, str(cfg_file), {})


def test_unknown_yaml_key_is_named(tmp_path):
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("step: 7\n")
    with pytest.raises(ValueError, match=r"unknown option 'step'.*steps"):
        build_config(Demo, PRESETS, None, str(cfg_file), {})


@pytest.mark.parametrize("line, hint", [
    ("bf16: true", "(TRL's option; esft sets it from precision)"),
    ("gradient_accumulation_steps: 4", "(TRL's option; esft sets it from prompts_per_step and "
                                       "per_device_train_batch_size)"),
    ("disable_dropout: true", "(TRL's option, which esft sets itself)"),
    ("num_train_epochs: 1", "(did you mean num_iterations? another option of TRL's GRPOConfig goes under trl_args: "
                            "{num_train_epochs: ...})"),
])
def test_a_trl_key_in_a_grpo_config_file_says_where_it_goes(tmp_path, line, hint):
    """A TRL user's config file: TRL's keys that esft sets from its own options name them, and the rest of TRL's
    options are pointed to trl_args (it said only "unknown option")."""
    from esft.grpo import GRPOConfig

    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(line + "\n")
    with pytest.raises(ValueError) as refused:
        build_config(GRPOConfig, {}, None, str(cfg_file), {})
    assert str(refused.value) == f"{cfg_file}:1: unknown option {line.split(':')[0]!r} {hint}"


@pytest.mark.parametrize("trainer, line, hint", [
    ("es", "max_steps: 3", "(an option of `esft train grpo`, not of `esft train es`)"),
    ("es", "num_generations: 4", "(an option of `esft train grpo`, not of `esft train es`)"),
    ("grpo", "population_size: 8", "(an option of `esft train es`, not of `esft train grpo`)"),
    ("grpo", "sigma: 0.001", "(an option of `esft train es`, not of `esft train grpo`)"),
])
def test_the_other_trainers_key_names_its_command(tmp_path, trainer, line, hint):
    """A GRPO config file given to `esft train es` (or the reverse) says whose option the refused key is (it said
    only "unknown option", or offered a near name of the wrong trainer)."""
    from esft.es import ESConfig
    from esft.grpo import GRPOConfig

    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(f"task: countdown\n{line}\n")
    with pytest.raises(ValueError) as refused:
        build_config(ESConfig if trainer == "es" else GRPOConfig, {}, None, str(cfg_file), {})
    assert str(refused.value) == f"{cfg_file}:2: unknown option {line.split(':')[0]!r} {hint}"


def test_a_config_without_a_command_is_not_named_as_another_trainers(tmp_path):
    """Only trainers (a `command`) are named: a key of ESConfig given to a plain config class keeps the near-name
    hint, and ESConfig's own keys never point at ESConfig."""
    from esft.config import other_command_words
    from esft.es import ESConfig

    assert other_command_words(Demo, "sigma") == ""
    assert other_command_words(ESConfig, "sigma") == ""
    assert other_command_words(ESConfig, "no_such_key") == ""


def test_a_user_subclass_of_a_trainers_config_does_not_speak_for_its_command():
    """A user's subclass of ESConfig adds fields `esft train es` does not take: they are not named as its options;
    a plain (non-dataclass) ConfigHooks class with a command leaves an unknown key a ValueError."""
    from esft.config import other_command_words
    from esft.es import ESConfig
    from esft.grpo import GRPOConfig

    @dataclass
    class MyES(ESConfig):
        my_knob: int = 1

    class Tool(ConfigHooks):
        command = "mytool run"

    assert other_command_words(GRPOConfig, "my_knob") == ""
    assert other_command_words(GRPOConfig, "sigma") == " (an option of `esft train es`, not of `esft train grpo`)"
    with pytest.raises(ValueError, match="unknown option 'nope'"):
        build_config(ESConfig, overrides={"nope": 1})
    assert MyES.command == ESConfig.command and Tool.command  # both alive until here (__subclasses__ is weak)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        build_config(Demo, PRESETS, "huge")


def test_flags_parse_types_and_leave_unset_flags_out():
    p = argparse.ArgumentParser()
    add_dataclass_arguments(p, Demo)
    ns = vars(p.parse_args(["--tasks", "a,b", "--limit", "none", "--fast", "--lr", "1e-3"]))
    assert ns == {"tasks": ["a", "b"], "limit": None, "fast": True, "lr": 1e-3}
    assert vars(p.parse_args(["--limit", "5"])) == {"limit": 5}


@dataclass
class _Percent:
    speedup: float = 0.25
    """~25% faster (a literal percent sign in a field docstring)"""


def test_percent_sign_in_field_docstring_does_not_break_help():
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, _Percent)
    assert "~25% faster" in parser.format_help()


def test_passage_cut_reaches_boolq_only_and_never_twice():
    from esft.config import passage_cut

    assert passage_cut("boolq", 400) == {"max_passage_chars": 400}
    assert passage_cut("BoolQ", 400) == {"max_passage_chars": 400}
    assert passage_cut("countdown:numbers=2", 400) == {} and passage_cut("mmlu", 400) == {}
    assert passage_cut("boolq", None) == {}
    assert passage_cut("boolq:max_passage_chars=100", 400) == {}  # the name's own cut wins, no clash


@pytest.mark.parametrize("text, hint", [("{replay_fraction:0.2}", "{replay_fraction: 0.2}"),
                                        ("{prompt_field:question}", "{prompt_field: question}")])
def test_a_mapping_without_a_space_after_the_colon_is_refused_with_the_fix(text, hint):
    """YAML reads `{a:0.2}` as the key 'a:0.2' with no value: a flag given that way was ignored or refused as
    an unknown option, without saying why."""
    from esft.config import parse_mapping

    with pytest.raises(ValueError, match="without a value: YAML needs a space after the colon") as info:
        parse_mapping("fitness_options", text)
    assert hint in str(info.value)
    assert parse_mapping("fitness_options", "{replay_fraction: 0.2}") == {"replay_fraction": 0.2}
    assert parse_mapping("task_options", {"reward": "regex:(\\d+)"}) == {"reward": "regex:(\\d+)"}


@pytest.mark.parametrize("value, words", [("[1,2]", "task_options '[1,2]' reads as list [1, 2]"),
                                          ("7", "task_options '7' reads as int 7"),
                                          ([1], "task_options [1]")])
def test_a_mapping_field_that_is_not_a_mapping_names_the_field_what_was_typed_and_the_form_expected(value, words):
    from esft.config import parse_mapping

    with pytest.raises(ValueError) as info:
        parse_mapping("task_options", value)
    assert str(info.value).startswith(words) and str(info.value).endswith("it must be a mapping such as {key: value}")
    assert parse_mapping("task_options", "") == {}  # an empty flag: no options


@pytest.mark.parametrize("argv", [
    ["eval", "--tasks", "countdown", "--limit", "1", "--max-new-tokens", "1", "--task-options", "{numbers:2}"],
    ["train", "es", "--fitness", "dart", "--fitness-options", "{replay_fraction:0.2}"]])
def test_the_cli_refuses_a_glued_mapping_in_one_line(argv, tmp_path, capsys):
    """`esft eval` gave built-in tasks' --task-options no check at all, so this one ran as if it were absent."""
    from esft.cli import main

    out = tmp_path / "out"
    assert main([*argv, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "YAML needs a space after the colon" in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_eval_refuses_task_options_that_no_evaluated_task_takes(tmp_path, capsys):
    """Built-in tasks take their options in the name; `--task-options` on them alone ran as if it were absent."""
    from esft.cli import main

    out = tmp_path / "out"
    argv = ["eval", "--tasks", "countdown,boolq", "--limit", "1", "--max-new-tokens", "1", "--task-options",
            "{numbers: 2}", "--output-dir", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "built-in tasks take theirs in the name (countdown:numbers=2)" in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_es_include_exclude_refuse_a_yaml_list_given_as_one_flag_value():
    """The --exclude help read `e.g. ["norm"]`: typed as a flag, that is one regex, a character class matching
    almost every parameter name (`--include '[mlp, attn]'` perturbed every tensor without a word). A pattern that
    looks like a YAML list is refused with the comma-list form; a real character class passes."""
    from esft.cli import _explicit, build_parser
    from esft.config import ConfigError
    from esft.es.es_config import PRESETS, ESConfig

    def build(*argv):
        args = build_parser("train").parse_args(["train", "es", *argv])
        return build_config(ESConfig, PRESETS, None, None, _explicit(args, ESConfig), overrides_source="command line")

    assert build("--exclude", "norm,embed").exclude == ["norm", "embed"]
    assert build("--include", "[qk]_proj").include == ["[qk]_proj"]
    for flag, text in (("--exclude", '["norm"]'), ("--include", "[mlp, attn]"), ("--exclude", "['norm']")):
        with pytest.raises(ConfigError, match=r"reads as one character class.* comma list"):
            build(flag, text)
    assert "e.g. norm" in field_docs(ESConfig)["exclude"]


@pytest.mark.parametrize("text, line, words", [
    ("max_new_tokens: 8\ntask_options: 5\n", 2, "task_options = 5 is not accepted; expected a mapping such as "
                                                "{key: value}"),
    ("task_options: '[1, 2]'\n", 1, "task_options = '[1, 2]' is not accepted; expected a mapping such as {key: value} "
                                    "(the text reads as list [1, 2])"),
    ("fitness_rule: dart\nfitness_options: '{replay_fraction:0.2}'\n", 2,
     "(the key 'replay_fraction:0.2' has no value: YAML needs a space after the colon ({replay_fraction: 0.2}))"),
    ("executor_options: '{a: [1'\n", 1, "(the text is not a YAML / JSON mapping at column 7: "),
])
def test_a_mapping_option_that_is_no_mapping_is_refused_at_its_line(tmp_path, text, line, words):
    """A run file's mapping option (task_options, fitness_options, executor_options, trl_args) that is no mapping
    is a ConfigError naming the file and line, as every other bad value is (it named neither)."""
    from esft.config import ConfigError, build_config
    from esft.es.es_config import ESConfig

    run = tmp_path / "run.yaml"
    run.write_text(text)
    with pytest.raises(ConfigError) as info:
        build_config(ESConfig, None, None, str(run), {})
    assert str(info.value).startswith(f"{run}:{line}: ") and words in str(info.value), str(info.value)


def test_a_grpo_trl_args_flag_that_is_no_mapping_names_the_flag():
    from esft.config import ConfigError, build_config
    from esft.grpo.grpo_config import GRPOConfig

    with pytest.raises(ConfigError, match=r"^command line \(--trl-args\): trl_args = '7' is not accepted; expected a "
                                          r"mapping such as \{key: value\} \(the text reads as int 7\)$"):
        build_config(GRPOConfig, overrides={"trl_args": "7"})


@pytest.mark.parametrize("trainer", ["es", "grpo"])
def test_a_runs_tracker_name_is_its_run_name_else_its_folders(trainer):
    from esft.es import ESConfig
    from esft.grpo import GRPOConfig

    cls = ESConfig if trainer == "es" else GRPOConfig
    assert cls(output_dir="runs/sums-es/").tracking_name() == "sums-es"
    assert cls(output_dir="runs/sums-es", run_name="first try").tracking_name() == "first try"
    # a folder given as `.` or through `..` is named by the folder it stands for, not '' or '..'
    assert cls(output_dir=".").tracking_name() == Path.cwd().name
    assert cls(output_dir="runs/sums-es/..").tracking_name() == "runs"


def test_locked_changes_names_what_a_resume_may_not_change():
    """ES's and GRPO's resume refusals compare the run's config with the new one through one function."""
    from esft.config import locked_changes
    from esft.es.es_config import ESConfig

    old = ESConfig(sigma=0.001, iterations=5)
    assert locked_changes(old, old.replace(iterations=9), {"iterations"}) == {}
    assert locked_changes(old, old.replace(sigma=0.002, iterations=9), {"iterations"}) == {"sigma": (0.001, 0.002)}
    assert locked_changes(old, old.replace(iterations=9), set()) == {"iterations": (5, 9)}
