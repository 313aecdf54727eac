"""`esft experiment ...` sub-commands (registered by esft.cli):

    esft experiment run SPEC [--output-dir D] [--dry-run]    SPEC: a YAML file or a shipped spec name
    esft experiment tables DIR                                 rewrite DIR/tables from the stage records
    esft experiment status DIR                                 one line per stage
    esft experiment list                                       the shipped specs
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path


def _run(args: argparse.Namespace) -> int:
    from esft.experiments.runner import output_dir_for, plan_text, run_experiment
    from esft.experiments.spec import check_spec_model, load_spec

    spec = load_spec(args.spec)  # validation: fails here, before any compute, naming the line
    check_spec_model(spec)
    out = output_dir_for(spec, args.output_dir)
    from esft.rundir import check_output_dir

    check_output_dir(out)  # a file there is refused here, also by --dry-run, not as an OSError once running
    if args.dry_run:
        text = plan_text(spec, out)  # the folder's finished stages must match the spec, as in a real run
        print(f"spec {spec.path} is valid; output folder {out}\n")
        print(text)
        return 0
    from esft.experiments.invocation import ExperimentBusy
    from esft.experiments.spec_checks import check_spec_devices

    check_spec_devices(spec)  # this machine's devices: not by --dry-run, which may check a spec for another machine
    try:
        result = run_experiment(spec, out)
    except ExperimentBusy as exc:
        print(f"esft: error: {exc}", file=sys.stderr)
        return 2
    # wall_s is this call's: stages finished by earlier calls were skipped (each call's time: invocations.jsonl)
    print(f"\n{len(result.statuses) - len(result.failed)} of {len(result.statuses)} stages done; this call took "
          f"{result.wall_s:,.0f} s; tables in {out / 'tables'}")
    for key in result.failed:
        print(f"  {key}: {result.statuses[key]} (see {out / key / 'status.json'})")
    return 0 if result.ok else 1


def _tables(args: argparse.Namespace) -> int:
    from esft.experiments.study_tables import write_all_tables

    path = write_all_tables(args.dir)
    print(path.read_text())
    print(f"wrote {path.parent}")
    return 0


def _status(args: argparse.Namespace) -> int:
    from esft.experiments.records import read_plan
    from esft.rundir import lock_held

    root = Path(args.dir)
    plan = read_plan(root)
    active = lock_held(root)  # a runner working here now (its lock); else a "running" stage was interrupted
    for stage in plan["stages"]:
        path = root / stage["key"] / "status.json"
        try:
            status = json.loads(path.read_text()) if path.exists() else {"status": "pending"}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            status = {"status": "?", "error": f"unreadable {path} ({exc})"}
        state = status.get("status", "?")
        error = f"  {status['error']}" if status.get("error") else ""
        if state == "stopped" or state == "running" and not active:
            state, error = "stopped", "  interrupted or killed: `esft experiment run` resumes it"
        print(f"{stage['key']:<52} {state:<8}{error}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from esft.experiments.spec import shipped_specs

    for name, path in shipped_specs().items():
        print(textwrap.fill(spec_summary(path.read_text()), width=116, initial_indent=f"{name:<24} ",
                            subsequent_indent=" " * 25))
    return 0


def spec_summary(text: str) -> str:
    """A spec's description: the first paragraph of its leading comment (its first line alone can stop
    mid-sentence), on one line."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#") or not line[1:].strip():
            break
        lines.append(line[1:].strip())
    return " ".join(lines)


def add_experiment_commands(exp: argparse.ArgumentParser) -> None:
    """`esft experiment`'s sub-commands, added to its parser."""
    cmds = exp.add_subparsers(dest="experiment_command", required=True)
    p = cmds.add_parser("run", help="run (or continue) an experiment; finished stages are skipped")
    p.add_argument("spec", metavar="SPEC", help="YAML spec file, or the name of a shipped spec (esft experiment list)")
    p.add_argument("--output-dir", default=None, metavar="DIR",
                   help="experiment folder (default: the spec's output_dir, else runs/experiments/<name>)")
    p.add_argument("--dry-run", action="store_true", help="validate the spec and print the stages; run nothing")
    p.set_defaults(func=_run)
    p = cmds.add_parser("tables", help="write Tables 1, 2, 5-8, 18 (Markdown + CSV) from an experiment folder")
    p.add_argument("dir", metavar="DIR", help="an experiment folder (`esft experiment run`'s --output-dir); its "
                   "tables/ is rewritten")
    p.set_defaults(func=_tables)
    p = cmds.add_parser("status", help="status of every stage of an experiment folder")
    p.add_argument("dir", metavar="DIR", help="an experiment folder (`esft experiment run`'s --output-dir)")
    p.set_defaults(func=_status)
    p = cmds.add_parser("list", help="the specs shipped with esft")
    p.set_defaults(func=_list)
