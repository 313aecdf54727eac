"""What `esft` prints: an interrupted run's resume hint once, `esft eval`'s result line once per task, and
evaluation flags that a run without evaluation would ignore refused before any model loads.

Run: pytest -q tests/test_cli_output.py   (a few seconds; tiny random models, no download)
"""

from __future__ import annotations

import argparse

import os
import signal

import pytest

from es_tiny import one_thread  # noqa: F401  (autouse fixture)
from es_tiny import ToyTask, stub_generate, tiny_llama
from esft.cli import main


def train_es_keeping_sigterm(out, iterations: int) -> int:
    """`esft train es` of the tiny settings into `out` (its train_es replaced by the caller); the CLI's SIGTERM
    handler is put back to this process's afterwards."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
        return main(["train", "es", "--model", "smollm2-135m", "--task", "boolq", "--population-size", "2",
                     "--batch-size", "2", "--iterations", str(iterations), "--eval-every", "0",
                     "--checkpoint-every", "0", "--max-new-tokens", "2", "--output-dir", str(out)])
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("stop_at, logged", [(5, "2 iterations are logged"), (3, "1 iteration is logged")])
def test_an_interrupted_es_run_prints_its_resume_hint_once(tmp_path, monkeypatch, capsys, stop_at, logged):
    """SIGTERM in the middle of `esft train es`: the hint names the logged iterations and the resume command, once,
    and no bare "interrupted" line follows it (the trainer printed its hint, then the command line its own)."""
    import esft.api

    calls = []

    def generate_then_stop(model, tokenizer, prompts, cfg):
        calls.append(len(prompts))
        if len(calls) == stop_at:  # call 5: in iteration 2 (2 members x 2 prompts: one call per member)
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises KeyboardInterrupt here
        return stub_generate(model, tokenizer, prompts, cfg)

    def tiny_train_es(config):  # the config as the command line built it, on a tiny model
        # (the trainer itself: train_es would say to resume a run of this task object from the script, as config.yaml
        # cannot rebuild it, where a command-line run's task is always a string)
        return esft.api.es_trainer(config, model=tiny_llama(), tokenizer=None, task=ToyTask(),
                                   generate_fn=generate_then_stop).train()

    monkeypatch.setattr(esft.api, "train_es", tiny_train_es)
    out = tmp_path / "run"
    assert train_es_keeping_sigterm(out, iterations=4) == 130
    captured = capsys.readouterr()
    printed = (captured.out + captured.err).splitlines()
    hints = [line for line in printed if "esft train es --resume" in line]
    assert hints == [f"interrupted: {logged} in {out}; continue with `esft train es --resume {out}`"]
    assert [line for line in printed if line.strip() == "interrupted"] == []


def test_sigterm_while_the_final_checkpoint_is_written_prints_the_resume_hint(tmp_path, monkeypatch, capsys):
    """`kill` while `esft train es` writes its final checkpoint, after the last iteration is logged: the line says
    how to continue (a resume writes that checkpoint), as a stop during the iterations does, not a bare
    "interrupted"; the checkpoint's staging folder is gone."""
    import esft.api

    def tiny_train_es(config):
        model = tiny_llama()
        save = model.save_pretrained

        def save_then_stop(folder, *args, **kwargs):
            save(folder, *args, **kwargs)
            if os.path.basename(folder) == ".tmp_final":
                os.kill(os.getpid(), signal.SIGTERM)  # the handler raises KeyboardInterrupt here

        model.save_pretrained = save_then_stop
        return esft.api.es_trainer(config, model=model, tokenizer=None, task=ToyTask(),
                                   generate_fn=stub_generate).train()

    monkeypatch.setattr(esft.api, "train_es", tiny_train_es)
    out = tmp_path / "run"
    assert train_es_keeping_sigterm(out, iterations=1) == 130
    printed = capsys.readouterr().err.strip().splitlines()
    assert printed[-1] == f"interrupted: 1 iteration is logged in {out}; continue with `esft train es --resume {out}`"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == []


def test_a_bare_ctrl_c_still_says_interrupted(monkeypatch, capsys):
    import esft.cli as cli

    def stop(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_env", stop)
    assert cli.main(["env"]) == 130
    assert capsys.readouterr().err.splitlines() == ["", "interrupted"]


@pytest.fixture()
def tiny_eval_model(monkeypatch, tokenizer):
    """`esft eval --model smollm2-135m` on a tiny random Llama with the real tokenizer (no conversion, no load)."""
    import esft.models
    from conftest import make_tiny_model

    monkeypatch.setattr(esft.models, "load_model", lambda *a, **k: (make_tiny_model(), tokenizer))


def _eval_lines(capsys, tasks: str) -> list[str]:
    assert main(["eval", "--model", "smollm2-135m", "--tasks", tasks, "--limit", "1", "--max-new-tokens", "2"]) == 0
    return [line for line in capsys.readouterr().out.splitlines() if line.strip()]


def test_eval_of_one_task_prints_its_result_once(tiny_eval_model, capsys):
    """The line printed as the task finished was printed again as a one-row table."""
    lines = _eval_lines(capsys, "boolq")
    assert len(lines) == 1 and lines[0].startswith("boolq ") and "acc " in lines[0]


def test_eval_of_several_tasks_ends_with_them_all_together(tiny_eval_model, capsys):
    """Each task's line as it finishes (between the progress bars), then all of them together."""
    lines = _eval_lines(capsys, "boolq,countdown")
    assert [line.split()[0] for line in lines] == ["boolq", "countdown", "boolq", "countdown"]
    assert lines[:2] == lines[2:]


@pytest.mark.parametrize("algorithm, flags", [
    ("es", ["--eval-every", "0", "--eval-limit", "50"]),
    ("es", ["--eval-every", "0", "--eval-balanced"]),
    ("grpo", ["--eval-limit", "50"]),  # the GRPO default is eval_every 0
    ("grpo", ["--preset", "cpu", "--eval-max-new-tokens", "64"]),
])
def test_evaluation_flags_without_evaluation_are_refused(algorithm, flags, tmp_path, monkeypatch, capsys):
    """--eval-limit (or another evaluation option) with eval_every 0 was ignored without a word: the run trained
    and never evaluated. Refused (exit 2) naming the flag and the fix, before any model loads."""
    import esft.models

    def no_load(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr(esft.models, "load_model", no_load)
    out = tmp_path / "run"
    assert main(["train", algorithm, "--model", "smollm2-135m", "--task", "boolq", *flags,
                 "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    flag = next(f for f in flags if f.startswith("--eval-") and f != "--eval-every")
    assert err.startswith(f"esft: error: command line ({flag}):") and "eval_every is 0" in err
    assert "--eval-every 10" in err and not out.exists()


def test_an_unknown_option_is_reported_by_its_sub_command_with_the_closest_option(capsys):
    """argparse printed the top-level usage (which lists none of `esft train es`'s options) and no suggestion."""
    with pytest.raises(SystemExit) as stop:
        main(["train", "es", "--eval-limt", "3"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "esft train es: error: unrecognized arguments: --eval-limt 3; did you mean --eval-limit? "
        "(`esft train es --help` lists the options)"]


def test_both_trainers_take_both_resume_forms(monkeypatch, capsys):
    """`esft train grpo --resume RUN` (ES's form) was refused ("unrecognized arguments: RUN"), and `esft train es
    --resume --output-dir RUN` (GRPO's) too ("expected one argument"): each trainer takes both now, and a folder
    named twice must be the same one."""
    import esft.api

    seen = []
    monkeypatch.setattr(esft.api, "train_es", lambda config: seen.append(config) or pytest.fail("stop"))
    for argv in (["train", "es", "--resume", "runs/e"], ["train", "es", "--resume", "--output-dir", "runs/e"],
                 ["train", "grpo", "--resume", "runs/e"], ["train", "grpo", "--resume", "--output-dir", "runs/e"]):
        assert main(argv) == 2  # no such run: refused naming the folder, from either form
        assert "esft: error: cannot resume runs/e: no such folder" in capsys.readouterr().err
    from esft.cli import _resume_folder

    ns = argparse.Namespace
    assert _resume_folder(ns(output_dir=None), "runs/e") == "runs/e"
    assert _resume_folder(ns(output_dir="runs/e"), True) == "runs/e"
    assert _resume_folder(ns(output_dir="runs/e/"), "runs/e") == "runs/e"
    assert _resume_folder(ns(output_dir=None), None) is None
    with pytest.raises(ValueError, match=r"--resume names no run: give its folder, --resume RUN_DIR"):
        _resume_folder(ns(output_dir=None), True)
    with pytest.raises(ValueError, match=r"--resume continues runs/e in place; --output-dir runs/f names another"):
        _resume_folder(ns(output_dir="runs/f"), "runs/e")
    assert seen == []


@pytest.mark.parametrize("argv, line", [
    (["train", "es", "--sigma", "abc"], "esft train es: error: argument --sigma: invalid float value: 'abc'"),
    (["eval", "--limit", "all"], "esft eval: error: argument --limit: invalid int value: 'all'; --limit takes a "
                                 "number or none"),
    (["eval", "--tasks", "boolq", "--task", "math"], "esft eval: error: --tasks boolq and --task math name the same "
                                                     "option with different values: give one of them"),
])
def test_a_refused_value_is_one_line_without_the_usage(argv, line, capsys):
    """argparse printed its usage (30+ lines of options) before the one line that says what is wrong."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    prog = line.split(": error")[0]
    assert capsys.readouterr().err.splitlines() == [f"{line} (`{prog} --help` lists the options)"]


def test_a_negative_number_in_scientific_notation_is_a_value():
    """`--alpha -1e-3` was read as an option: "argument --alpha: expected one argument", though `--sigma -0.1`
    reached the value's own check."""
    from esft.cli import build_parser

    args = build_parser("train").parse_args(["train", "es", "--alpha", "-1e-3", "--format-bonus", "-.5E+1"])
    assert (args.alpha, args.format_bonus) == (-1e-3, -5.0)
    assert build_parser("train").parse_args(["train", "grpo", "--learning-rate", "-1e-5"]).learning_rate == -1e-5


@pytest.mark.parametrize("argv, choices", [([], "eval, env, bench, train, analyze, export, report, experiment"),
                                           (["train"], "es, grpo"), (["experiment"], "run, tables, status, list")])
def test_a_missing_sub_command_is_named_with_its_choices(argv, choices, capsys):
    """argparse said "the following arguments are required: command" (or algorithm, experiment_command): names
    that appear nowhere in the usage."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == f"{' '.join(['esft', *argv])}: error: a sub-command is required: {choices} " \
                   f"(`{' '.join(['esft', *argv])} --help` describes them)"


def test_a_misspelt_task_lists_the_tasks_once_and_suggests_the_closest(capsys):
    assert main(["eval", "--tasks", "boolqq", "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("countdown") == 1 and err.rstrip().endswith("did you mean 'boolq'?")
    assert main(["eval", "--tasks", "boolq:bogus=1", "--limit", "1"]) == 2
    err = capsys.readouterr().err  # the name is fine: the option is what is wrong
    assert "unknown option 'bogus'" in err and "countdown" not in err


@pytest.mark.parametrize("argv, line", [
    (["evl"], "esft: error: unknown sub-command 'evl' (did you mean eval, env?); choose from eval, env, bench, train, "
              "analyze, export, report, experiment (`esft --help` lists the options)"),
    (["train", "gpro"], "esft train: error: unknown sub-command 'gpro' (did you mean grpo?); choose from es, grpo "
                        "(`esft train --help` lists the options)"),
])
def test_a_misspelt_sub_command_is_named_with_the_closest(argv, line, capsys):
    """argparse said "argument command: invalid choice", naming the sub-command by a dest no usage shows."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and capsys.readouterr().err.splitlines() == [line]


def test_a_misspelt_preset_names_the_closest(tmp_path, capsys):
    assert main(["train", "es", "--preset", "cpu-count", "--output-dir", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip() == ("esft: error: unknown preset 'cpu-count' (did you mean cpu-countdown?); "
                                               "available: paper, cpu, cpu-countdown")


def test_top_p_with_greedy_decoding_is_named_in_a_warning(recwarn):
    """`esft eval --top-p 0.5` at temperature 0 took the top token as ever, without a word."""
    from esft.eval_config import EvalConfig

    with pytest.warns(UserWarning, match=r"top_p 0.5 has no effect with greedy decoding \(temperature 0\)"):
        EvalConfig(top_p=0.5)
    EvalConfig(top_p=0.5, temperature=0.7)
    EvalConfig()
    assert not recwarn.list
