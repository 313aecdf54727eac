"""Experiments of the study from one YAML spec: single-task and sequential (continual-learning) runs of ES and
GRPO over seeds, evaluation after the base model and after every stage (trained tasks and holdouts), and the
study's Tables 1, 2, 5-8 and 18 from the measured run records.

spec            YAML spec -> validated Spec (every error names its line; nothing runs before it passes)
spec_checks     the checks spec parsing applies to each value, naming its line
algorithms      the trainers behind one interface (ES, GRPO; `register_algorithm` for more) and their accounting
plan            Spec -> ordered stages (folders, start weights, budgets, shared ES runs, chains)
runner          run_experiment: skip finished stages, resume interrupted ones, record failures, write tables
stage_eval      per-stage evaluation, one JSON per task
checkpoint_eval evaluation of a stage's intermediate checkpoints (evaluation.checkpoints), <stage>/eval/steps/
records         an experiment folder's stage records, as the tables read them
study_tables    Tables 1, 2, 5-8 and the method comparison (rows; esft.tables renders Markdown + CSV)
compute_tables  Table 18 (compute per task)
method_figures  the pass@k figure of each task, beside its methods table (tables/passk_<task>.png)
forgetting_figures  accuracy of every task over a sequential chain's checkpoints (tables/forgetting_<track>_...)
hybrid          one training budget split between the stages of a chain
experiment_cli  `esft experiment run | tables | list | status`

Shipped specs live in `specs/` and are referenced by name: `esft experiment run cpu-mini-sequential`.
"""

from esft.experiments.spec import Spec, load_spec, parse_spec, shipped_specs
from esft.experiments.yamlines import SpecError

__all__ = ["Spec", "SpecError", "load_spec", "parse_spec", "shipped_specs", "run_experiment", "write_all_tables"]


def run_experiment(spec, output_dir=None, hooks=None, write_tables=True):
    """See esft.experiments.runner.run_experiment (imported lazily: it pulls in the trainers)."""
    from esft.experiments.runner import run_experiment as _run

    return _run(spec, output_dir, hooks, write_tables)


def write_all_tables(root):
    from esft.experiments.study_tables import write_all_tables as _write

    return _write(root)
