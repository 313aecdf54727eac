"""Config values given as flags, YAML text and Python values must give the same config; a resume that repeats a
run's own flags must accept them. Run: `pytest tests/test_config_roundtrip.py -q`."""

from __future__ import annotations

import random

import pytest

from esft.cli import _explicit, build_parser
from esft.config import build_config
from esft.config_flags import converter


def _train_args(*argv: str):
    return build_parser("train").parse_args(["train", *argv])


@pytest.mark.parametrize("flags", [
    ["--generation-options", "fast"],
    ["--generation-options", "{share_prefix: true, prefill_buckets: 4}"],
    ["--task-options", "{numbers: 2, ops: '+*'}"],
    ["--fitness-rule", "dart", "--fitness-options", "{replay_fraction: 0.5}"],
])
def test_es_resume_accepts_the_runs_own_mapping_flags(tmp_path, flags):
    """`esft train es --resume RUN` with a flag the run was started with, unchanged, is accepted (as for
    --sigma): a mapping flag arrives as YAML text (or "fast") and was compared, as text, with the parsed mapping
    config.yaml holds, so the resume was refused with "cannot change ['generation_options']"."""
    from esft.es.es_config import PRESETS, ESConfig, resume_config, save_yaml

    run = str(tmp_path / "run")
    started = build_config(ESConfig, PRESETS, None, None,
                           _explicit(_train_args("es", "--output-dir", run, "--task", "countdown", *flags), ESConfig))
    (tmp_path / "run").mkdir()
    save_yaml(started, tmp_path / "run" / "config.yaml")
    again = _explicit(_train_args("es", "--resume", run, "--task", "countdown", "--iterations", "200", *flags),
                      ESConfig)
    config = resume_config(run, again)
    assert config.iterations == 200 and config.resume
    assert config.replace(iterations=started.iterations, resume=False) == started
    with pytest.raises(ValueError, match="cannot change"):  # a different value is still a change
        resume_config(run, {**again, "generation_options": "{lean: true}"})


def test_es_resume_refusal_names_the_runs_value_and_what_may_change(tmp_path):
    """A resume that changes a fixed option (here population_size) says what the run has, which options a resume
    may change and how to proceed, as GRPO's refusal does; it said only "cannot change ['population_size']"."""
    from esft.es.es_config import ESConfig, resume_config, save_yaml

    run = tmp_path / "run"
    run.mkdir()
    save_yaml(ESConfig(output_dir=str(run), population_size=2), run / "config.yaml")
    with pytest.raises(ValueError) as err:
        resume_config(run, {"population_size": 4})
    message = str(err.value)
    assert "cannot change ['population_size']" in message and "population_size=2" in message
    assert "may change only checkpoint_every" in message and "iterations" in message
    assert "another --output-dir" in message


@pytest.mark.parametrize("noise", ["per-tensor", "table", "shared-seed"])
def test_es_resume_takes_a_rank_only_lowrank_noise_reads_as_no_change(tmp_path, noise):
    """`--rank` is read by lowrank noise only; a resume of a per-tensor (or table) run that passed another rank was
    refused with "cannot change ['rank']" although it could not change the run. A lowrank run's rank still
    counts, and so does every other fixed option."""
    from esft.es.es_config import ESConfig, resume_config, save_yaml
    from esft.es.finished import check_resumable as _check_resumable

    run = tmp_path / "run"
    run.mkdir()
    save_yaml(ESConfig(output_dir=str(run), noise=noise), run / "config.yaml")
    resumed = resume_config(run, {"rank": 4, "iterations": 3})
    assert resumed.rank == 4 and resumed.noise == noise and resumed.resume
    _check_resumable(run, resumed)  # the trainer's own comparison agrees
    with pytest.raises(ValueError, match=r"cannot change \['population_size'\]"):
        resume_config(run, {"rank": 4, "population_size": 2})
    save_yaml(ESConfig(output_dir=str(run), noise="lowrank", rank=2), run / "config.yaml")
    with pytest.raises(ValueError, match=r"cannot change \['rank'\]"):
        resume_config(run, {"rank": 4})
    with pytest.raises(ValueError, match=r"cannot change \['rank'\] .*\(the run has rank=2; this config has rank=4\)"):
        _check_resumable(run, resumed.replace(noise="lowrank"))


@pytest.mark.parametrize("flags", [
    ["--task-options", "{numbers: 2}"],
    ["--trl-args", "{warmup_ratio: 0.1}"],
])
def test_grpo_resume_accepts_the_runs_own_mapping_flags(tmp_path, flags):
    """`esft train grpo --resume --output-dir RUN` repeating the run's --task-options / --trl-args unchanged is
    accepted (GRPO's resume_config promises it); the YAML text was compared with the recorded mapping."""
    from esft.grpo.grpo_config import PRESETS, GRPOConfig, resume_config
    from esft.grpo.run import _write_config

    run = str(tmp_path / "run")
    started = build_config(GRPOConfig, PRESETS, None, None,
                           _explicit(_train_args("grpo", "--output-dir", run, "--task", "countdown", *flags),
                                     GRPOConfig))
    (tmp_path / "run").mkdir()
    _write_config(started, tmp_path / "run" / "config.yaml", False, {"algorithm": "grpo"})
    again = _explicit(_train_args("grpo", "--resume", "--output-dir", run, "--task", "countdown", *flags),
                      GRPOConfig)
    assert resume_config(run, again).replace(resume=False) == started
    with pytest.raises(ValueError, match="cannot change"):
        resume_config(run, {**again, flags[0][2:].replace("-", "_"): "{other: 1}"})


@pytest.mark.parametrize("text, value", [
    ("{replay_fraction: 1e-3}", {"replay_fraction": 0.001}),
    ("{format_coef: 5E-2, ema_decay: 5e-1}", {"format_coef": 0.05, "ema_decay": 0.5}),
    ("{cooldown: '3', weight_floor: '1.5'}", {"cooldown": 3, "weight_floor": 1.5}),
])
def test_dart_options_in_exponent_form_are_numbers(tmp_path, text, value):
    """YAML 1.1 (PyYAML) reads `1e-3` as text; `sigma: 1e-3` was accepted (top-level fields are converted by
    their type) but `--fitness-options '{replay_fraction: 1e-3}'` and the same line in a --config file were
    refused ("replay_fraction = '1e-3' is not accepted"). The text is read as a number of the option's type, and
    config.yaml records the number."""
    from esft.es.es_config import PRESETS, ESConfig, read_run_config, save_yaml

    flags = _explicit(_train_args("es", "--fitness", "dart", "--fitness-options", text), ESConfig)
    from_flags = build_config(ESConfig, PRESETS, None, None, flags)
    assert from_flags.fitness_options == value
    assert all(type(from_flags.fitness_options[k]) is type(v) for k, v in value.items())
    file = tmp_path / "run.yaml"
    file.write_text(f"fitness_rule: dart\nfitness_options: {text}\n")
    assert build_config(ESConfig, PRESETS, None, str(file), {}) == from_flags
    save_yaml(from_flags, tmp_path / "config.yaml")
    assert read_run_config(tmp_path)[0] == from_flags


def test_dart_options_text_that_is_no_number_is_still_refused():
    from esft.config import ConfigError
    from esft.es.es_config import ESConfig

    for options in ({"cooldown": "1.5"}, {"replay_fraction": "lots"}, {"ema_decay": "nan"}):
        with pytest.raises(ConfigError, match=next(iter(options))):
            ESConfig(fitness_rule="dart", fitness_options=options)


@pytest.mark.parametrize("options, field, value", [
    ({"ask_format": "false"}, "ask_format", False),
    ({"ask_format": "no", "numbers": 2}, "ask_format", False),
    ({"hf_dataset": "none"}, "hf_dataset", None),
])
def test_task_options_given_as_text_are_read_by_the_options_type(options, field, value):
    """Task options given as text (a quoted YAML value in task_options, an experiment spec) are converted by the
    option's type, as `countdown:ask_format=false` in the name is: `{ask_format: "false"}` reached the task as the
    text "false", which is true, and the task showed the worked puzzle the user turned off."""
    from esft.tasks import get_task

    task = get_task("countdown", **options)
    assert getattr(task, field) == value and type(getattr(task, field)) is type(value)
    named = get_task("countdown:" + ",".join(f"{k}={v}" for k, v in options.items()))
    assert named == task


def test_task_option_text_of_a_wrong_type_is_refused():
    from esft.tasks import get_task

    with pytest.raises(ValueError, match="ask_format"):
        get_task("countdown", ask_format="maybe")


@pytest.mark.parametrize("text, items", [
    (r"layers\.[0-9]{1,2}\.mlp", [r"layers\.[0-9]{1,2}\.mlp"]),
    (r"norm,layers\.[0-9]{1,2}\.", ["norm", r"layers\.[0-9]{1,2}\."]),
    (r"(q|k)_proj,[,;]x", ["(q|k)_proj", "[,;]x"]),
    (r"a\,b,c", [r"a\,b", "c"]),
])
def test_regex_list_flags_keep_commas_inside_a_pattern(text, items):
    """`--include` / `--exclude` take a comma list of regexes; a comma inside a quantifier `{1,2}`, a class `[...]`
    or a group, or after a backslash, belongs to the pattern: `--exclude 'layers\\.[0-9]{1,2}\\.'` was split into
    'layers\\.[0-9]{1' and '2}\\.', which compile (as literals) and match nothing, so the layers were perturbed."""
    from esft.es.es_config import PRESETS, ESConfig

    assert converter(list[str])(text) == items
    flags = _explicit(_train_args("es", "--exclude", text), ESConfig)
    assert build_config(ESConfig, PRESETS, None, None, flags).exclude == items


def test_plain_comma_lists_split_as_before():
    rng = random.Random(0)
    words = ["boolq", "countdown:numbers=2", "ops=+*", "runs/a", "x.jsonl:reward=math", "es", "grpo"]
    for _ in range(200):
        chosen = rng.sample(words, rng.randint(1, 5))
        assert converter(list[str])(",".join(chosen)) == chosen
    assert converter(list[str])("norm, mlp,") == ["norm", "mlp"]
