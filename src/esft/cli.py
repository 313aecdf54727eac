"""The `esft` command line.

    esft eval --model smollm2-135m --tasks boolq,countdown --limit 50 --output-dir runs/eval
    esft train es --preset cpu --output-dir runs/es-demo
    esft env
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Sequence

from esft.config import add_dataclass_arguments, build_config


def _eval(args: argparse.Namespace) -> int:
    from esft.evaluation import EvalConfig, format_table, run_eval

    overrides = _explicit(args, EvalConfig)
    config = build_config(EvalConfig, None, None, args.config, overrides)
    results = run_eval(config)
    print()
    print(format_table(results))
    if config.output_dir:
        print(f"\nwrote {config.output_dir}/summary.json and one JSONL of completions per task")
    return 0


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
    from esft.es.trainer import PRESETS, ESConfig, train_es

    config = build_config(ESConfig, PRESETS, args.preset, args.config, _explicit(args, ESConfig))
    train_es(config)
    return 0


def _explicit(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in vars(args).items() if k in names}


def _add_run_options(p: argparse.ArgumentParser, presets: Sequence[str] | None) -> None:
    p.add_argument("--config", default=None, metavar="FILE", help="YAML file of options (flags override it)")
    if presets is not None:
        p.add_argument("--preset", default=None, choices=list(presets), help="named set of options")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="esft", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    from esft import __version__

    parser.add_argument("--version", action="version", version=f"esft {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    from esft.evaluation import EvalConfig

    p = sub.add_parser("eval", help="evaluate a model on tasks (accuracy with 95%% CI, completions as JSONL)")
    _add_run_options(p, None)
    add_dataclass_arguments(p, EvalConfig)
    p.set_defaults(func=_eval)

    p = sub.add_parser("env", help="print versions, device and threads (paste into bug reports)")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=_env)

    train = sub.add_parser("train", help="fine-tune with ES or GRPO")
    algos = train.add_subparsers(dest="algorithm", required=True)
    try:
        from esft.es.trainer import PRESETS, ESConfig
    except ImportError:  # pragma: no cover - during development
        ESConfig = None  # type: ignore[assignment]
    if ESConfig is not None:
        p = algos.add_parser("es", help="Evolution Strategies (full-parameter, gradient-free)")
        _add_run_options(p, PRESETS)
        add_dataclass_arguments(p, ESConfig)
        p.set_defaults(func=_train_es)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as exc:
        print(f"esft: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
