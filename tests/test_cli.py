"""The command line builds only the typed sub-command: `esft --version` and `--help` import no torch, and each
sub-command built alone has exactly the options it has in the full parser."""

import argparse
import subprocess
import sys

import pytest

from esft.cli import SUBCOMMANDS, build_parser


def _options(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], list[str]]:
    """Every (sub-)parser's option strings, keyed by the sub-command path that reaches it."""
    found = {path: sorted(s for a in parser._actions for s in a.option_strings)}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found.update(_options(child, path + (name,)))
    return found


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_a_sub_command_built_alone_has_the_options_of_the_full_parser(command):
    full = {k: v for k, v in _options(build_parser()).items() if k[:1] == (command,)}
    alone = {k: v for k, v in _options(build_parser(command)).items() if k[:1] == (command,)}
    assert alone == full
    assert len(full[(command,)]) > 1 or len(full) > 1  # more than --help: the options were built


def test_the_other_sub_commands_are_listed_but_not_built():
    options = _options(build_parser("export"))
    assert set(k[0] for k in options if k) == set(SUBCOMMANDS)
    assert options[("train",)] == ["--help", "-h"]
    assert "--to" in options[("export",)]


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["train", "es", "--help"], ["export", "--help"],
                                  ["experiment", "--help"]])
def test_version_and_help_load_no_torch(argv):
    code = ("import sys\nfrom esft.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('torch loaded' if 'torch' in sys.modules else 'no torch')")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "no torch", out.stdout + out.stderr


@pytest.mark.parametrize("analysis", ["kl", "landscape", "sparsity"])
def test_analysis_tasks_keep_their_options_whole(analysis):
    """`--tasks` of the analyses takes task names with options as `esft eval` does (split at commas only between
    tasks)."""
    from esft.analysis.commands import COMMANDS
    from esft.cli import _explicit
    from esft.config import build_config

    args = build_parser("analyze").parse_args(["analyze", analysis, "--tasks", "countdown:numbers=2,max_number=20,"
                                               "ops=+*,boolq"])
    cls = COMMANDS[analysis][0]
    config = build_config(cls, None, None, None, _explicit(args, cls))
    assert config.tasks == ["countdown:numbers=2,max_number=20,ops=+*", "boolq"]


def test_an_abbreviated_top_level_option_before_the_sub_command_still_parses():
    from esft.cli import main

    # `--deb` is argparse's prefix of --debug; the sub-command is the first word that is not an option
    assert main(["--deb", "train", "es", "--preset", "no-such-preset"]) == 2


def test_a_reader_that_leaves_is_not_an_error():
    """`esft ... | head`: output into a closed pipe ends quietly (no error line, no traceback), exit 141."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "esft", "env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the child writes (its start-up takes longer than this)
    err = proc.stderr.read().decode()
    assert proc.wait() == 141, err
    assert "Broken pipe" not in err and "Traceback" not in err and "Exception ignored" not in err



def test_another_broken_pipe_is_reported(monkeypatch, capsys):
    """A BrokenPipeError that is not stdout's (a worker's or a tracker's pipe) is a failure like any other: an
    error line and exit 1 (with --debug, the traceback)."""
    import pytest

    import esft.cli as cli

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe (a worker's connection)")

    monkeypatch.setattr(cli, "_env", broken)  # what `esft env` runs
    assert cli.main(["env"]) == 1
    assert "esft: error:" in capsys.readouterr().err
    with pytest.raises(BrokenPipeError):
        cli.main(["env", "--debug"])


def test_sigterm_stops_a_command_as_ctrl_c_does(monkeypatch, capsys):
    """`kill PID` during a compute command ends it through the Ctrl-C path (exit 130, "interrupted"), so runs
    restore their weights and print how to resume."""
    import os
    import signal
    import time

    import esft.cli as cli

    def work(args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # the handler raises KeyboardInterrupt here
        return 0

    monkeypatch.setattr(cli, "_eval", work)  # what `esft eval` runs
    previous = signal.getsignal(signal.SIGTERM)
    try:
        start = time.perf_counter()
        assert cli.main(["eval", "--tasks", "boolq"]) == 130
        assert time.perf_counter() - start < 5 and "interrupted" in capsys.readouterr().err
        # the default comes back with the command's end (main() called from a script or a test)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_esft_warnings_print_as_one_line():
    """Inside a command an esft warning is formatted `esft: warning: ...`, without Python's file:line and source
    line; another library's warning keeps Python's format, --debug keeps it for all, and the format is restored
    after the command."""
    import warnings

    import esft.cli_process

    default = warnings.formatwarning
    with esft.cli_process.plain_warnings(False):
        assert warnings.formatwarning("msg", UserWarning, esft.cli_process.__file__, 12) == "esft: warning: msg\n"
        other = warnings.formatwarning("msg", UserWarning, "/usr/lib/python3/site-packages/torch/x.py", 3)
        assert other.startswith("/usr/lib/python3/site-packages/torch/x.py:3: UserWarning: msg")
    assert warnings.formatwarning is default
    with esft.cli_process.plain_warnings(True):  # --debug: Python's format
        here = esft.cli_process.__file__
        assert warnings.formatwarning("msg", UserWarning, here, 12).startswith(here)
    assert warnings.formatwarning is default


def test_an_esft_warning_of_the_same_text_prints_once_per_command():
    """A reward that scores no gold answer was warned of twice, word for word: once by the check before the model
    loads and once by the run building its task; warnings of other text, and other libraries', all print. In a
    fresh interpreter: pytest records warnings instead of printing them."""
    import subprocess
    import sys

    script = """
import warnings
import esft.cli_process as cp
here = cp.__file__
warnings.simplefilter("always")
for _ in range(2):  # two commands in one process: each prints its warnings
    with cp.plain_warnings(False):
        for text, where, line in (("no row scored", here, 1), ("no row scored", here, 2), ("1 of 1", here, 3),
                                  ("2 of 2", here, 3), ("lib", "/site-packages/torch/x.py", 4),
                                  ("lib", "/site-packages/torch/x.py", 5)):
            warnings.warn_explicit(text, UserWarning, where, line)
"""
    err = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stderr
    assert err.count("esft: warning: no row scored") == 2 and err.count("esft: warning: 1 of 1") == 2
    assert err.count("esft: warning: 2 of 2") == 2 and err.count("UserWarning: lib") == 4


@pytest.mark.parametrize("source, command", [
    ("docs/results/cpu-study/grpo-lr5e-6", ["train", "es", "--resume", "{dir}"]),
    ("docs/results/cpu-study/main-job-2026-12-03", ["train", "grpo", "--resume", "--output-dir", "{dir}"]),
])
def test_resume_names_the_other_algorithms_run_and_its_command(tmp_path, capsys, source, command):
    """The ES trainer's resume of a GRPO run folder (and the reverse) said "unknown option 'max_steps'"; it now
    says which run the folder holds and how to continue it, before any model loads. Committed runs' configs."""
    import shutil
    from pathlib import Path

    from esft.cli import main

    repo = Path(__file__).resolve().parents[1]
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(repo / source / "config.yaml", run / "config.yaml")
    assert main([a.format(dir=run) for a in command]) != 0
    err = capsys.readouterr().err.strip().splitlines()[-1]
    other = "grpo --resume --output-dir" if "grpo" in source else "es --resume"
    assert "holds a" in err and f"esft train {other} {run}" in err, err


@pytest.mark.parametrize("source, command", [
    ("docs/results/cpu-study/main-job-2026-12-03", ["train", "es", "--resume", "{dir}"]),
    ("docs/results/cpu-study/grpo-lr5e-6", ["train", "grpo", "--resume", "--output-dir", "{dir}"]),
])
@pytest.mark.parametrize("extra", [["--preset", "cpu"], ["--config", "{dir}/other.yaml"]])
def test_resume_refuses_a_preset_or_config_file_it_would_not_read(tmp_path, capsys, monkeypatch, source, command,
                                                                   extra):
    """A resume takes every option from the run's config.yaml: `--preset` and `--config` were accepted and silently
    ignored (the run went on with its own settings, a misspelt YAML key unnoticed). Refused before any model loads."""
    import shutil
    from pathlib import Path

    import esft.api
    from esft.cli import main

    def trained(*args, **kwargs):
        raise AssertionError("the resume started training")

    monkeypatch.setattr(esft.api, "train_es", trained)
    monkeypatch.setattr(esft.api, "train_grpo", trained)
    repo = Path(__file__).resolve().parents[1]
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(repo / source / "config.yaml", run / "config.yaml")
    (run / "other.yaml").write_text("populaton_size: 4\n")
    assert main([a.format(dir=run) for a in command + extra]) == 2
    err = capsys.readouterr().err
    assert f"{extra[0]} is not read when resuming" in err and "config.yaml" in err, err
    # the example names a flag of the run's own trainer: GRPO has no --iterations
    example = "e.g. --save-steps, or --max-steps where the LR schedule is constant)" if "grpo" in command else \
        "e.g. --iterations)"
    assert example in err and ("--iterations" not in err or "grpo" not in command), err


@pytest.mark.parametrize("argv, flag, first, second", [
    (["train", "es", "--task", "boolq", "--iterations", "2", "--task", "countdown"], "--task", "'boolq'",
     "'countdown'"),
    (["train", "grpo", "--task", "boolq", "--task=mmlu"], "--task", "'boolq'", "'mmlu'"),
    (["eval", "--tasks", "boolq", "--tasks", "mmlu"], "--tasks", "['boolq']", "['mmlu']")])
def test_a_task_flag_given_twice_is_refused_not_overwritten(argv, flag, first, second, capsys):
    """argparse keeps a repeated flag's last value: `--task boolq --task countdown` trained on Countdown alone
    without a word. Refused, naming both values, before anything loads."""
    from esft.cli import build_parser

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    assert f"argument {flag}: given twice ({first}, then {second}); give it once" in capsys.readouterr().err


def test_a_parser_parses_again_after_a_flag_was_given_once():
    """The check is per parse: one parser object reads a second command line that gives the flag once."""
    from esft.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["train", "es", "--task", "boolq"]).task == "boolq"
    assert parser.parse_args(["train", "es", "--task", "countdown"]).task == "countdown"
    assert parser.parse_args(["train", "es", "--task", "boolq", "--task", "boolq"]).task == "boolq"
    # other flags keep the last value: a script overrides its base command line so
    assert parser.parse_args(["train", "es", "--iterations", "2", "--iterations", "3"]).iterations == 3


@pytest.mark.parametrize("argv, words", [
    (["train", "es", "--fitness", "dart", "--fitness-rule", "mean"], "--fitness dart and --fitness-rule mean"),
    (["train", "es", "--fitness-rule", "mean", "--fitness=dart"], "--fitness-rule mean and --fitness dart"),
    (["eval", "--task", "boolq", "--tasks", "countdown,mmlu"], "--task boolq and --tasks countdown,mmlu"),
    (["eval", "--tasks", "countdown", "--task", "boolq"], "--tasks countdown and --task boolq"),
    (["train", "es", "--fitness", "dart", "--fitness-rule", "mean", "--fitness", "dart"],
     "--fitness-rule mean and --fitness dart"),
    # the task alias repeated with another value: the last one used to win
    (["eval", "--task", "boolq", "--task", "mmlu"], "--task boolq and --task mmlu")])
def test_an_alias_and_its_option_given_different_values_are_refused_in_either_order(argv, words, capsys):
    """`--fitness` is `--fitness-rule` and `--task` one task of `--tasks`: given both, the last one used to win
    without a word, so a run could train with a rule the user had also typed otherwise."""
    from esft.cli import build_parser

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    assert f"{words} name the same option with different values: give one of them" in capsys.readouterr().err


@pytest.mark.parametrize("argv, dest, value", [
    (["train", "es", "--fitness", "dart"], "fitness_rule", "dart"),
    (["train", "es", "--fitness", "dart", "--fitness-rule", "dart"], "fitness_rule", "dart"),
    (["train", "es", "--fitness-rule", "balanced", "--fitness", "balanced"], "fitness_rule", "balanced"),
    (["eval", "--task", "boolq", "--tasks", "boolq"], "tasks", ["boolq"]),
    (["eval", "--task", "boolq"], "tasks", ["boolq"]),
    # the alias repeated: the last one wins, as for most repeated options (not a task: test_a_task_flag_...)
    (["train", "es", "--fitness", "dart", "--fitness", "mean"], "fitness_rule", "mean"),
    (["eval", "--task", "boolq", "--task", "boolq"], "tasks", ["boolq"])])
def test_an_alias_alone_or_repeating_its_options_value_is_that_value_and_leaves_no_trace(argv, dest, value):
    from esft.cli import _explicit, build_parser
    from esft.es.es_config import ESConfig
    from esft.eval_config import EvalConfig

    args = build_parser().parse_args(argv)
    assert vars(args)[dest] == value
    # the parse's own bookkeeping does not reach the config: left is only the record of the flag typed
    assert [k for k in vars(args) if "alias" in k] == ["aliases typed"] and args.__dict__["aliases typed"]
    assert _explicit(args, ESConfig if argv[0] == "train" else EvalConfig) == {dest: value}


@pytest.mark.parametrize("argv, flag", [
    (["train", "es", "--fitness", "bogus"], "--fitness"),
    (["train", "es", "--fitness-rule", "bogus"], "--fitness-rule"),
    (["eval", "--task", "bogus"], "--task"),
    (["eval", "--tasks", "bogus"], "--tasks")])
def test_a_refused_value_names_the_flag_typed_alias_or_not(argv, flag, capsys):
    """`--fitness bogus` was refused as `command line (--fitness-rule)`, a flag the user had not typed."""
    from esft.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"command line ({flag}): " in err and "'bogus' is not accepted" in err, err


@pytest.mark.parametrize("algorithm, steps, line", [("es", 1, "1 iteration in"), ("es", 3, "3 iterations in"),
                                                    ("grpo", 1, "1 step in"), ("grpo", 2, "2 steps in")])
def test_a_finished_run_counts_its_steps_in_words_that_agree(algorithm, steps, line, tmp_path, monkeypatch, capsys):
    """The closing line of `esft train`: GRPO printed "1 steps"."""
    import types

    import esft.api
    from esft.cli import main

    done = types.SimpleNamespace(steps=steps, output_dir=str(tmp_path / "run"), final_checkpoint="ckpt")
    monkeypatch.setattr(esft.api, f"train_{algorithm}", lambda config: done)
    assert main(["train", algorithm, "--task", "boolq", "--output-dir", str(tmp_path / "run")]) == 0
    assert f"\n{line} {tmp_path / 'run'}; final checkpoint: ckpt\n" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["eval", "--tasks", "countdown,mmlu"], ["train", "es", "--task", "countdown"],
                                  ["train", "grpo", "--task", "countdown"]])
def test_a_typed_passage_cut_no_task_reads_is_refused_before_the_model_loads(argv, capsys, monkeypatch):
    """`esft eval` checks the passage cut only (it has no periodic evaluation); the trainers check it with their
    evaluation options (esft.validation.check_passage_cut, check_eval_options)."""
    import esft.evaluation
    from esft.cli import main

    monkeypatch.setattr(esft.evaluation, "run_eval", lambda config: pytest.fail("the evaluation ran"))
    assert main(argv + ["--max-passage-chars", "400"]) == 2
    err = capsys.readouterr().err
    assert "command line (--max-passage-chars): max_passage_chars = 400 is not accepted; expected a BoolQ task " \
           f"among {argv[-1].replace(',', ', ')}: it cuts BoolQ passages only" in err, err


def test_a_grpo_resume_without_a_folder_says_it_looked_in_the_default_one(tmp_path, capsys, monkeypatch):
    """`esft train grpo --resume` (naming no folder) said "cannot resume runs/grpo: it holds no
    config.yaml", a folder the user never named; it now says that is the default --output-dir and how to name
    the run's folder. A folder the user named is reported as before; one that does not exist is called so, for ES
    as for GRPO (it "held no config.yaml")."""
    from esft.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["train", "grpo", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("esft: error: cannot resume runs/grpo (the default --output-dir; name the run's folder: --resume "
                   "RUN_DIR): no such folder (start a new run without --resume)")
    (tmp_path / "empty").mkdir()
    (tmp_path / "afile").write_text("")
    for named, what in (("runs/grpo", "no such folder"), ("elsewhere", "no such folder"),
                        ("empty", "it holds no config.yaml"), ("afile", "not a folder")):
        for form in (["--resume", "--output-dir", named], ["--resume", named]):  # GRPO takes ES's form too
            assert main(["train", "grpo", *form]) == 2
            err = capsys.readouterr().err.strip().splitlines()[-1]
            assert err == f"esft: error: cannot resume {named}: {what} (start a new run without --resume)"
        assert main(["train", "es", "--resume", named]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err == (f"esft: error: cannot resume {named}: {what} (start a new run without --resume, or restore "
                       "the run's config.yaml)")
    assert not (tmp_path / "runs").exists() and not any((tmp_path / "empty").iterdir())
