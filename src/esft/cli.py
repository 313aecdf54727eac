"""The `esft` command line.

    esft eval --model smollm2-135m --tasks boolq,countdown --limit 50 --output-dir runs/eval
    esft train es --preset cpu --output-dir runs/es-demo
    esft train es --preset cpu --executor ray --num-workers 2 --output-dir runs/es-ray   (docs/distributed.md)
    esft train grpo --preset cpu --output-dir runs/grpo-demo
    esft analyze weights --base smollm2-135m --tuned runs/es/checkpoints/final,runs/grpo/checkpoints/final
    esft report runs/experiment
    esft export runs/es-demo --to exported/es-demo   (a Hugging Face folder with a model card)
    esft experiment run cpu-mini-sequential        (a shipped spec, or a YAML file; esft experiment list)
    esft env
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from esft.cli_parser import Alias, Parser, aliases_typed
from esft.cli_process import (as_typed, config_words, exit_code, plain_warnings, show_context, silence_stdout,
                              stdout_reader_gone)
from esft.config import build_config, resume_refusal
from esft.config_flags import add_dataclass_arguments
from esft.sigterm import signals_deferred, sigterm_interrupts
from esft.tasks.custom import add_task_flags
from esft.rundir import check_output_dir
from esft.saved_config import no_config_words
from esft.validation import (check_eval_options, check_passage_cut, check_saved_names,
                             check_with_task_flags)


def _eval(args: argparse.Namespace) -> int:
    from esft.evaluation import check_previous_results, format_table, run_eval
    from esft.eval_config import EvalConfig

    from esft.tasks.custom import apply_task_flags

    overrides = _explicit(args, EvalConfig)
    config = build_config(EvalConfig, None, None, args.config, overrides,
                          check=_names_with_task_flags(args, lambda c: c.tasks), flag_names=aliases_typed(args))
    config = apply_task_flags(config, args, config.tasks)  # --prompt-field/--reward ... (data tasks)
    check_passage_cut(config, overrides)
    if config.output_dir:
        check_output_dir(config.output_dir)  # before the evaluation, not after it
        check_previous_results(config)
    results = run_eval(config)  # prints each task's line as it finishes
    if len(results) > 1:  # then all of them together, below the progress bars they were printed between
        print()
        print(format_table(results))
    if config.output_dir:
        per_task = (", one JSONL of completions and one pass@k figure (<task>.passk.png) per task" if config.sampled
                    else " and one JSONL of completions per task")
        print(f"\nwrote {config.output_dir}/summary.json{per_task}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from esft.bench import main as bench_main

    return bench_main(args)


def _env(args: argparse.Namespace) -> int:
    from esft.environment import environment_report

    report = environment_report()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            print(f"{key:<22} {value}")
    return 0


def _train_es(args: argparse.Namespace) -> int:
    from esft.api import train_es
    from esft.es.es_config import PRESETS, ESConfig

    args.resume_dir = _resume_folder(args, args.resume_dir)
    if args.resume_dir:
        # `--resume RUN_DIR`: the run's own config.yaml, plus the few flags a resume may change (e.g. iterations)
        from esft.es.es_config import resume_config

        _refuse_unread_on_resume(args, args.resume_dir, "--iterations")
        config = resume_config(args.resume_dir, _explicit(args, ESConfig))
        check_saved_names(config, args.resume_dir)
    else:
        config = build_config(ESConfig, PRESETS, args.preset, args.config, _explicit(args, ESConfig),
                              check=_names_with_task_flags(args, lambda c: [c.task]), flag_names=aliases_typed(args))
    config = _task_flags(config, args, args.resume_dir)
    check_eval_options(config, _explicit(args, ESConfig))
    _check_run_dir(config.output_dir)
    # Ray itself is imported only when used
    from esft.es.distributed.ray_executor import ReplicaDivergence, WorkersLost

    try:
        result = train_es(config)
    except (WorkersLost, ReplicaDivergence) as exc:
        print(f"esft: error: {exc}", file=sys.stderr)
        return 3
    noun = "iteration" if result.steps == 1 else "iterations"
    print(f"\n{result.steps} {noun} in {result.output_dir}; final checkpoint: {result.final_checkpoint}")
    return 0


def _train_grpo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from esft.api import train_grpo  # as `esft train es`: the run's curve.png is drawn at its end
    from esft.grpo import PRESETS, GRPOConfig

    if isinstance(vars(args).get("resume"), str):  # `--resume RUN_DIR`, as ES takes it
        args.output_dir, args.resume = _resume_folder(args, args.resume), True
    run_dir = getattr(args, "output_dir", None)
    resumed = run_dir if vars(args).get("resume") and run_dir and (Path(run_dir) / "config.yaml").exists() else None
    if resumed:
        # `--resume --output-dir RUN_DIR`: the run's own config.yaml, plus the flags a resume may change
        from esft.grpo.grpo_config import resume_config

        _refuse_unread_on_resume(args, run_dir, "--save-steps, or --max-steps where the LR schedule is constant")
        config = resume_config(run_dir, _explicit(args, GRPOConfig))
        check_saved_names(config, run_dir)
    else:
        config = build_config(GRPOConfig, PRESETS, args.preset, args.config, _explicit(args, GRPOConfig),
                              check=_names_with_task_flags(args, lambda c: [c.task]))
    config = _task_flags(config, args, resumed)
    check_eval_options(config, _explicit(args, GRPOConfig))
    if config.resume and not (Path(config.output_dir) / "config.yaml").is_file():
        # as `esft train es --resume`: a misspelt folder must not start a new run with the default settings.
        # `--resume` alone names no folder: the one it looked in is the default output_dir
        unnamed = run_dir is None and config.output_dir == GRPOConfig.output_dir
        where = " (the default --output-dir; name the run's folder: --resume RUN_DIR)" if unnamed else ""
        raise FileNotFoundError(f"cannot resume {config.output_dir}{where}: {no_config_words(config.output_dir)} "
                                "(start a new run without --resume)")
    _check_run_dir(config.output_dir)
    result = train_grpo(config)  # Ctrl-C: esft.rundir.RunInterrupted, whose resume hint `_run` prints
    noun = "step" if result.steps == 1 else "steps"
    print(f"\n{result.steps} {noun} in {result.output_dir}; final checkpoint: {result.final_checkpoint}")
    return 0


def _resume_folder(args: argparse.Namespace, given: str | bool | None) -> str | None:
    """The run folder of `--resume [RUN_DIR]`: the one named, else --output-dir's; None without --resume. Both
    trainers take both forms (`--resume RUN`, `--resume --output-dir RUN`)."""
    out = vars(args).get("output_dir")
    if given is None or given is False:
        return None
    if given is True:
        if out is None:
            raise ValueError("--resume names no run: give its folder, --resume RUN_DIR")
        return out
    if out is not None and Path(out).resolve() != Path(given).resolve():
        raise ValueError(f"--resume continues {given} in place; --output-dir {out} names another folder")
    return given


def _task_flags(config: Any, args: argparse.Namespace, resumed: str | None) -> Any:
    """`config` with the data-task flags applied (--reward ...); on a resume only ones that change nothing."""
    from esft.tasks.custom import apply_task_flags

    out = apply_task_flags(config, args, [config.task])
    if resumed and out.task_options != config.task_options:
        raise resume_refusal(resumed, {"task_options": (config.task_options, out.task_options)})
    return out


def _refuse_unread_on_resume(args: argparse.Namespace, run_dir: str, example: str) -> None:
    """A resume reads every option from the run's config.yaml: a --preset or --config would be silently ignored.
    `example`: flags of this trainer that a resume may change."""
    for flag, value in (("--preset", args.preset), ("--config", args.config)):
        if value is not None:
            raise ValueError(f"{flag} is not read when resuming: {run_dir} continues with the options of its "
                             f"config.yaml (give only the flags a resume may change, e.g. {example})")


def _names_with_task_flags(args: argparse.Namespace, tasks_of: Callable[[Any], list[str]]) -> Callable[[Any], None]:
    """The names check of a config built from flags, its data-task flags applied (validation.check_with_task_flags)."""
    return lambda config: check_with_task_flags(config, args, tasks_of(config))


def _check_run_dir(path: str) -> None:
    """Before any model loads: the output folder can be written and no other esft process is writing it (the
    trainer itself holds the lock while it runs)."""
    from esft.rundir import check_not_busy

    check_output_dir(path)
    check_not_busy(path)


def _analyze(args: argparse.Namespace) -> int:
    from esft.analysis.command_io import set_threads
    from esft.analysis.commands import COMMANDS

    cls, run, fmt = COMMANDS[args.analysis]
    config = build_config(cls, None, None, args.config, _explicit(args, cls))
    set_threads(config.threads)
    result = run(config)
    print(fmt(result))
    print(f"\nwrote {config.output_dir}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from esft.analysis.report_builder import Report, ReportConfig

    from pathlib import Path

    if not Path(args.dir).is_dir():
        raise FileNotFoundError(f"{args.dir} is not a folder (a run directory or an experiment directory)")
    overrides = _explicit(args, ReportConfig)
    overrides["dir"] = args.dir
    config = build_config(ReportConfig, None, None, args.config, overrides)
    check_output_dir(config.output_dir or Path(args.dir) / "report")
    report = Report(config)
    path = report.build()
    print(f"wrote {path}")
    if report.failed:
        print(f"esft: error: {len(report.failed)} analyses failed ({', '.join(report.failed)}); "
              f"{path} says why", file=sys.stderr)
        return 1
    return 0


def _export(args: argparse.Namespace) -> int:
    from esft.export import export_run

    result = export_run(args.run, args.to, overwrite=args.overwrite)
    print(f"exported {result.checkpoint} to {result.folder}: {', '.join(result.files)}")
    print(f"upload: hf upload ORG/NAME {result.folder} .")
    return 0


def _explicit(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in vars(args).items() if k in names}


def _add_run_options(p: argparse.ArgumentParser, presets: Sequence[str] | None) -> None:
    p.add_argument("--config", default=None, metavar="FILE", help="YAML file of options (flags override it)")
    if presets is not None:
        # checked by build_config (one line naming the presets), not by argparse `choices` (its whole usage)
        p.add_argument("--preset", default=None, metavar="NAME",
                       help=f"named set of options: {', '.join(presets)}")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `esft` parser. With `command` (the sub-command the user typed), only that sub-command's options are
    built: the others are listed with their help line but import nothing, so `esft --version` and `esft --help`
    load no torch. None builds every sub-command (tests, documentation)."""
    parser = Parser(prog="esft", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from esft import __version__

    parser.add_argument("--version", action="version", version=f"esft {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error instead of one `esft: error: ...` line (also accepted "
                             "anywhere after the sub-command)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_line, add_options) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_line)
        if command is None or command == name:
            add_options(p)
    return parser


def _eval_options(p: argparse.ArgumentParser) -> None:
    from esft.eval_config import EvalConfig

    _add_run_options(p, None)
    add_dataclass_arguments(p, EvalConfig)
    # `--task` as in `esft train`: one more task for --tasks (argparse would find the prefix ambiguous otherwise)
    p.add_argument("--task", dest="tasks", type=lambda t: [t], default=argparse.SUPPRESS, metavar="TASK",
                   action=Alias, canonical="--tasks",
                   help="alias of --tasks for one task (a data file, module:Class or a task name)")
    add_task_flags(p)
    p.set_defaults(func=_eval)


def _env_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=_env)


def _bench_options(p: argparse.ArgumentParser) -> None:
    from esft.bench import BenchConfig

    # generation overrides come as --set KEY=VALUE; an unset flag stays unset, so that esft.bench can refuse a
    # typed flag its configuration would ignore
    add_dataclass_arguments(p, BenchConfig, skip=("generation",))
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="GenerationConfig override for the esft engine (lever experiments), e.g. lean=false")
    p.set_defaults(func=_bench)


def _train_options(train: argparse.ArgumentParser) -> None:
    algos = train.add_subparsers(dest="algorithm", required=True)
    from esft.es.es_config import PRESETS, ESConfig

    p = algos.add_parser("es", help="Evolution Strategies (full-parameter, gradient-free)")
    _add_run_options(p, PRESETS)
    add_dataclass_arguments(p, ESConfig, skip=("resume",))
    add_task_flags(p)
    p.add_argument("--resume", dest="resume_dir", metavar="RUN_DIR", nargs="?", const=True, default=None,
                   help="continue RUN_DIR (or the --output-dir given) from its latest checkpoint and seed log (ends "
                        "bit-identical to an uninterrupted run); flags may only change e.g. --iterations")
    # short alias of --fitness-rule (an exact flag: argparse would reject the ambiguous prefix otherwise)
    p.add_argument("--fitness", dest="fitness_rule", metavar="RULE", default=argparse.SUPPRESS, action=Alias,
                   canonical="--fitness-rule",
                   help="alias of --fitness-rule: mean (paper), dart (DART-ES) or balanced (class-balanced reward; "
                        "see --fitness-rule)")
    p.set_defaults(func=_train_es)

    # GRPOConfig itself imports nothing heavy; TRL is imported only when training starts.
    from esft.grpo.grpo_config import PRESETS as GRPO_PRESETS, GRPOConfig

    p = algos.add_parser("grpo", help="GRPO baseline (TRL GRPOTrainer; needs `pip install esft[grpo]`)")
    _add_run_options(p, GRPO_PRESETS)
    add_dataclass_arguments(p, GRPOConfig, skip=("resume",))
    add_task_flags(p)
    # as ES's: the run folder after --resume, or given as --output-dir
    p.add_argument("--resume", dest="resume", metavar="RUN_DIR", nargs="?", const=True, default=argparse.SUPPRESS,
                   help="continue RUN_DIR (or the --output-dir given) from its latest checkpoint; flags may only "
                        "change e.g. --max-steps")
    p.set_defaults(func=_train_grpo)


def _analyze_options(analyze: argparse.ArgumentParser) -> None:
    from esft.analysis.commands import COMMANDS

    kinds = analyze.add_subparsers(dest="analysis", required=True)
    for name, (cls, _, _) in COMMANDS.items():
        # the docstring's whole first paragraph: its first line alone can stop mid-sentence
        summary = " ".join((cls.__doc__ or "").split("\n\n")[0].split())
        p = kinds.add_parser(name, help=summary)
        _add_run_options(p, None)
        add_dataclass_arguments(p, cls)
        p.set_defaults(func=_analyze)


def _export_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="a run directory (its checkpoints/final, else its latest "
                   "iter_XXXXXX) or a checkpoint folder")
    p.add_argument("--to", required=True, metavar="DIR", help="the folder to write (then: hf upload)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in --to: the whole "
                   "folder, so one holding anything an export does not write (a clone's .git, other files) is refused")
    p.set_defaults(func=_export)


def _report_options(p: argparse.ArgumentParser) -> None:
    from esft.analysis.report_builder import ReportConfig

    p.add_argument("dir", metavar="DIR", help="a run directory or an experiment directory holding several runs")
    _add_run_options(p, None)
    add_dataclass_arguments(p, ReportConfig, skip=("dir",))
    p.set_defaults(func=_report)


def _experiment_options(p: argparse.ArgumentParser) -> None:
    from esft.experiments.experiment_cli import add_experiment_commands

    add_experiment_commands(p)


# sub-command -> (its line in `esft --help`, the function adding its options, which does the heavy imports)
SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "eval": ("evaluate a model on tasks (accuracy with 95%% CI, completions as JSONL)", _eval_options),
    "env": ("print versions, device and threads (paste into bug reports)", _env_options),
    "bench": ("ES iteration speed vs this machine's matmul roofline and vs naive ES code", _bench_options),
    "train": ("fine-tune with ES or GRPO", _train_options),
    "analyze": ("one weight-space / behaviour analysis (JSON + PNG)", _analyze_options),
    "export": ("a run's final model as a clean Hugging Face folder with a model card", _export_options),
    "report": ("report.md with every table and figure the runs in DIR support", _report_options),
    "experiment": ("run a study experiment from a YAML spec; write its tables", _experiment_options),
}


COMPUTE_COMMANDS = ("train", "eval", "bench", "experiment", "report", "analyze")
#: commands that SIGTERM stops as Ctrl-C does (each cleans up what it was writing: export its staging folder)
INTERRUPTIBLE = COMPUTE_COMMANDS + ("export",)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM before the command runs (building a sub-command's options imports torch: a second or
        # more), or a second one while the first one's message prints: one line, not a traceback
        print("\ninterrupted", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None) -> int:
    import contextlib
    import os

    args_list = list(sys.argv[1:] if argv is None else argv)
    command = args_list[0] if args_list else ""
    with sigterm_interrupts() if command in INTERRUPTIBLE else contextlib.nullcontext():
        if command in INTERRUPTIBLE:  # numpy before torch: torch's C start-up imports numpy and drops any error
            with signals_deferred():  # of that import, a Ctrl-C included (the command then ran half-imported)
                import numpy  # noqa: F401
        if command in COMPUTE_COMMANDS:  # before torch loads (a sub-command's options import it)
            from esft.environment import prepare_compute_environment

            prepare_compute_environment(os.environ)
        debug = "--debug" in args_list
        args_list = [a for a in args_list if a != "--debug"]
        # only the typed sub-command's options are built (see build_parser); "" for `esft --help`, `--version`
        # (the top-level options take no value: the first word that is not an option names the sub-command)
        parser = build_parser(next((a for a in args_list if not a.startswith("-")), ""))
        with plain_warnings(debug):
            return _run(parser, args_list, debug)


def _run(parser: argparse.ArgumentParser, args_list: list[str], debug: bool) -> int:
    try:
        args = parser.parse_args(args_list)
        func: Callable[[argparse.Namespace], int] = args.func
        code = func(args)
        sys.stdout.flush()  # here, where a reader that left is handled, not at the interpreter's exit
        return code
    except BrokenPipeError as exc:
        if not stdout_reader_gone():  # another pipe broke (a worker, a tracker): a failure like any other
            if debug:
                raise
            print(f"esft: error: {exc}", file=sys.stderr)
            return exit_code(exc)
        # the reader of the output left (`esft ... | head`): nothing to report. stdout goes to /dev/null so that
        # the interpreter's last flush does not fail again (what the Python docs advise for SIGPIPE)
        silence_stdout()
        return 141  # 128 + SIGPIPE, as a shell reports a writer whose reader left
    except KeyboardInterrupt as exc:
        # a run's RunInterrupted says what was saved and how to continue; a bare Ctrl-C says nothing more
        print(f"\n{str(exc) or 'interrupted'}", file=sys.stderr)
        return 130
    except (ValueError, OSError, RuntimeError) as exc:
        if debug:
            show_context(exc)
            raise
        print(f"esft: error: {as_typed(str(exc), args_list + config_words(args_list))}", file=sys.stderr)
        return exit_code(exc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
