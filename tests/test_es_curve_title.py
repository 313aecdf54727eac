"""The run figure's title and fitness names (esft.es.curve.run_figure): built from the run's config.yaml, with
the keys the ES and GRPO trainers write there (docs/results/*/config.yaml), so a curve says which algorithm,
variant, task and model produced it, and a DART-ES or class-balanced curve says which fitness it plots.
A run without a readable config.yaml is still drawn, untitled.

Run: PYTHONPATH=src pytest -q tests/test_es_curve_title.py   (seconds)
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from esft.es import curve

ES_LINES = [{"kind": "train", "step": s, "fitness": {"mean": 0.2 * s, "min": 0.0, "max": 1.0}} for s in (1, 2)]
GRPO_LINES = [{"kind": "train", "step": s, "reward": {"mean": 0.2 * s, "min": 0.0, "max": 1.0}} for s in (1, 2)]
# an evaluation without a recorded constant baseline: the figure then reads config.yaml for it as well
EVAL = {"kind": "eval", "step": 2, "test_n": 20, "test_accuracy": 0.5, "test_ci95": [0.3, 0.7]}
# the keys an ES run writes (docs/results/es-cpu-demo/config.yaml), a subset
ES_CONFIG = {"model": "smollm2-135m", "task": "boolq", "population_size": 8, "sigma": 0.003, "alpha": 0.0015,
             "noise": "table", "rank": 1, "fitness_rule": "mean", "fitness_options": {}, "format_bonus": 0.1}
# the keys a GRPO run writes (docs/results/cpu-study/spec-run/.../grpo/.../config.yaml), a subset
GRPO_CONFIG = {"model": "HuggingFaceTB/SmolLM2-135M-Instruct",
               "task": "countdown:numbers=2,max_number=50,ops=+*,ask_format=1,shots=2", "num_generations": 8,
               "learning_rate": 2.0e-5, "class_balanced": False, "_run": {"algorithm": "grpo"}}


def _run(root: Path, lines: list[dict], config: dict | None = None) -> Path:
    root.mkdir(parents=True)
    (root / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    if config is not None:
        (root / "config.yaml").write_text(yaml.safe_dump(config))
    return root


def _train_names(fig) -> tuple[str, str]:
    train_ax = fig.axes[0]
    return train_ax.get_lines()[0].get_label(), train_ax.get_ylabel()


def test_title_of_a_plain_es_run_names_task_model_population_and_sigma(tmp_path):
    fig = curve.run_figure(_run(tmp_path / "es", ES_LINES + [EVAL], ES_CONFIG))
    assert fig.get_suptitle() == "ES | task boolq | model smollm2-135m | N=8, sigma=0.003"
    assert _train_names(fig) == ("fitness mean", "fitness (mean reward)")


def test_title_of_a_dart_low_rank_run_names_the_variant_and_its_fitness(tmp_path):
    config = dict(ES_CONFIG, fitness_rule="dart", noise="lowrank", rank=4, population_size=16, sigma=0.0015,
                  model="/tmp/study/runs/es-stage1/checkpoints/final", task="/tmp/study/count.jsonl")
    fig = curve.run_figure(_run(tmp_path / "dart", ES_LINES, config))
    assert fig.get_suptitle() == ("ES (DART-ES, low-rank noise rank 4) | task count.jsonl | "
                                  "model es-stage1/checkpoints/final | N=16, sigma=0.0015")
    # DART's fitness is a difficulty-weighted score (up to ~1.9), not an accuracy: the panel says so
    assert _train_names(fig) == ("DART-ES fitness mean (difficulty-weighted)", "DART-ES weighted fitness")
    balanced = curve.run_figure(_run(tmp_path / "balanced", ES_LINES, dict(ES_CONFIG, fitness_rule="balanced")))
    assert balanced.get_suptitle().startswith("ES (class-balanced fitness) | task boolq")
    assert _train_names(balanced) == ("class-balanced fitness mean", "class-balanced fitness")


def test_title_of_a_grpo_run_names_grpo_and_the_short_model(tmp_path):
    fig = curve.run_figure(_run(tmp_path / "grpo", GRPO_LINES, GRPO_CONFIG))
    assert fig.get_suptitle() == ("GRPO | task countdown:numbers=2,max_number=50,ops=+*,ask_format=1,shots=2 | "
                                  "model SmolLM2-135M-Instruct")
    assert _train_names(fig) == ("reward mean", "reward")
    balanced = curve.run_figure(_run(tmp_path / "balanced", GRPO_LINES, dict(GRPO_CONFIG, class_balanced=True)))
    assert balanced.get_suptitle().startswith("GRPO (class-balanced reward) | task countdown:")
    assert _train_names(balanced) == ("class-balanced reward mean", "reward (class-balanced)")


def test_a_run_without_a_readable_config_is_drawn_untitled(tmp_path):
    missing = curve.run_figure(_run(tmp_path / "missing", ES_LINES + [EVAL]))
    assert missing.get_suptitle() == "" and _train_names(missing) == ("fitness mean", "fitness")
    for name, text in (("bad-yaml", b"task: [boolq\n"), ("not-utf8", b"task: \xff\xfe\n"), ("a-list", b"- 1\n")):
        run = _run(tmp_path / name, ES_LINES + [EVAL])
        (run / "config.yaml").write_bytes(text)
        fig = curve.run_figure(run)
        assert fig.get_suptitle() == "", name
        assert list(fig.axes[0].get_lines()[0].get_ydata()) == [0.2, 0.4], name
        assert curve.heldout_constant_baseline(run) is None, name


def test_names_in_the_title_are_shortened_only_where_that_loses_nothing():
    """A path by its last part (a checkpoint with its run folder), a hub id by its name; a task's data file by its
    file name, its options kept whole, since an option's value may hold a "/" (it was cut to the text after the
    last one)."""
    names = {"task": "data/a.jsonl:prompt_field=q,system_prompt=a/b", "model": "runs/es/checkpoints/final"}
    title = curve.run_title({"population_size": 4, **names})
    assert "task a.jsonl:prompt_field=q,system_prompt=a/b |" in title and "model es/checkpoints/final" in title
    assert "model SmolLM2-135M" in curve.run_title({"population_size": 4, "model": "HuggingFaceTB/SmolLM2-135M"})
    assert "task sums.jsonl" in curve.run_title({"population_size": 4, "task": "/home/me/data/sums.jsonl"})


def test_a_stage_checkpoint_of_an_experiment_is_named_by_its_stage():
    """Every run folder of an experiment is called `run`: a stage trained from the one before read
    "model run/checkpoints/final" whatever stage that was."""
    model = "/x/exp/seed-42/sequential/grpo/1-countdown/run/checkpoints/final"
    assert "model 1-countdown/run/checkpoints/final" in curve.run_title({"model": model}, es=False)


def test_title_numbers_read_as_set_and_a_low_rank_run_without_a_rank_has_rank_one():
    """A sigma computed in a script (3 * 0.003 is 0.009000000000000001 in floating point) reads as the value it
    stands for; a config without `rank` ran the ES default, rank 1; a float population prints without ".0"."""
    title = curve.run_title({"noise": "lowrank", "population_size": 8.0, "sigma": 3 * 0.003})
    assert title == "ES (low-rank noise rank 1) | N=8, sigma=0.009"


def test_a_relative_checkpoint_path_of_three_parts_keeps_its_run_folder():
    assert curve.run_title({"model": "es/checkpoints/final"}, es=False) == "GRPO | model es/checkpoints/final"
    assert curve.run_title({"model": "es/final"}, es=False) == "GRPO | model final"
