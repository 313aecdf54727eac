"""Table 18's notes (esft.experiments.compute_tables): P is named with its value when the runs recorded it.
Run: `pytest tests/test_compute_tables_mutmutcli.py -q`."""

from __future__ import annotations

from test_study_tables_audit import compute_experiment

from esft.experiments.compute_tables import table18


def test_table18_names_the_parameter_count_and_l_only_when_the_runs_recorded_p():
    notes = table18(compute_experiment())[0].notes
    assert notes[0] == ("Per task: mean over the single-task stages of each method (every task and seed). "
                        "P = 1,000 parameters; L = mean tokens per generated sequence (prompt + completion), "
                        "measured.")
    exp = compute_experiment()
    for rec in exp.results.values():
        for s in rec.get("steps", []):
            s.pop("num_params", None)
    assert table18(exp)[0].notes[0] == "Per task: mean over the single-task stages of each method."


def test_a_method_with_no_finished_training_stage_is_a_row_of_dashes_one_per_column():
    from esft.tables import DASH

    exp = compute_experiment()
    for key in [k for k in exp.results if "/grpo->es/" in k]:
        del exp.results[key]
    main = table18(exp)[0]
    assert dict(main.rows)["GRPO->ES"] == [DASH] * (len(main.columns) - 1)
    assert all(len(cells) == len(main.columns) - 1 for _, cells in main.rows)
