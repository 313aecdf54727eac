"""The study's reference cells as the report prints them (esft.paper): the KL cell of each table for the right
algorithm and kind, the stage labels, Table 1's row. Known values read off the tables in esft.paper.

Run: PYTHONPATH=src pytest -q tests/test_paper_mutmutmisc.py   (< 1 s)
"""

from __future__ import annotations

from esft import paper


def test_kl_reference_reads_the_table_of_its_algorithm_and_kind():
    # Table 12 (GRPO, incremental): eval task math after the first stage (countdown): (0.050, 0.048, 0.056)
    assert paper.kl_reference("grpo", "incremental", "math", "countdown") == ("0.05 [0.048, 0.056]", "median")
    # Table 14 (GRPO, cumulative): after chemistry (stage 2), eval task boolq (column 3): (1.904, 3.140)
    assert paper.kl_reference("grpo", "cumulative", "boolq", "chemistry") == ("1.904 +- 3.14", "mean")
    # Table 13 (ES, cumulative): after math (stage 1), eval task chemistry: (0.755, 0.477)
    assert paper.kl_reference("es", "cumulative", "chemistry", "math") == ("0.755 +- 0.477", "mean")
    # ES incremental: Table 11 has no values, except after the first stage where incremental == cumulative
    assert paper.kl_reference("es", "incremental", "math", "math") is None
    assert paper.kl_reference("es", "incremental", "countdown", "countdown") == ("0.206 +- 0.023", "mean")
    assert paper.kl_reference("es", "cumulative", "mmlu", "math") is None  # a task the study did not train
    assert paper.kl_reference("grpo->es", "cumulative", "boolq", "boolq") is None  # a chain the study did not run


def test_the_es_budget_note_names_budgets_other_than_the_studys_100_iterations():
    assert paper.es_budget_note([100, 100, None]) == "" and paper.es_budget_note([]) == ""
    assert paper.es_budget_note([300, 100, 30, 300]) == ("The study's ES values are of 100 iterations per stage; "
                                                         "these ES stages ran 30, 300.")


def test_stage_labels_name_the_studys_four_stages_and_only_those():
    assert [paper.stage_label(i) for i in range(4)] == ["T0 Countdown", "T1 Math", "T2 Chemistry", "T3 Boolq"]
    assert paper.stage_label(4) == "T4" and paper.stage_label(-1) == "T-1"
    assert paper.stage_index("countdown") == 0 and paper.stage_index("mmlu") is None


def test_accuracy_reference_is_table_1s_row_or_n_a():
    assert paper.accuracy_reference("countdown") == "base 20.5, ES(100) 75.1, ES(300) 78.6, GRPO 74.5"
    assert paper.accuracy_reference(None) == "n/a" and paper.accuracy_reference("mmlu") == "n/a"
