"""Number formats and table rendering of esft.tables, pinned cell by cell against hand-computed text.

Run: PYTHONPATH=src pytest -q tests/test_tables_audit.py   (< 1 s)
"""

from __future__ import annotations

import math

from esft.tables import Cell, Table, csv_number, csv_text, fmt, grid, iqr, pct, r2, sci, short, signed


def test_fmt_significant_digits_and_the_scientific_range():
    assert fmt(None) == "n/a" and fmt(float("nan")) == "n/a"
    assert fmt(True) == "yes" and fmt(False) == "no"  # before int: bool is an int
    assert fmt(7) == "7" and fmt("es|grpo") == "es|grpo"
    assert fmt(0.0) == "0"  # zero is not "outside" the range
    assert fmt(0.123456) == "0.1235" and fmt(0.123456, digits=2) == "0.12"
    assert fmt(1e-3) == "0.001"  # the range's lower end is inside it
    assert fmt(0.00099) == "9.900e-04" and fmt(-2e-4) == "-2.000e-04"
    assert fmt(1.234567e-5) == "1.235e-05"  # digits significant digits: one before the point, digits-1 after
    assert fmt(1.234567e-5, digits=1) == "1.2e-05"
    assert fmt(1234.56) == "1235"
    # inside the range but past `digits` digits: plain, where the `g` format alone would write 1.234e+04
    assert fmt(12345.0) == "12345" and fmt(-9999.7) == "-10000" and fmt(123.4, digits=2) == "123"
    assert fmt(1e5) == "1.000e+05"  # the upper end is outside
    assert fmt(-1e6) == "-1.000e+06" and fmt(math.inf) == "inf"


def test_percent_short_r2_iqr_signed_sci():
    assert pct(0.123) == "12.3%" and pct(1) == "100.0%" and pct(0.12345) == "12.3%" and pct(None) == "n/a"
    assert short(9.87654) == "9.8765" and short(-9.87654) == "-9.8765"
    assert short(10.0) == "10" and short(-20.0) == "-20" and short(123456.0) == "1.23e+05" and short(None) == "n/a"
    assert r2(0.99987654) == "0.999877" and r2(None) == "n/a"
    assert iqr({"median": 0.5, "q1": 0.25, "q3": 0.75}) == "0.5 [0.25, 0.75]"
    assert iqr({}) == "n/a" and iqr({"median": None, "q1": 0.0, "q3": 1.0}) == "n/a"
    assert signed(0.0, 2, True) == "+0.00"  # zero carries the plus sign
    assert signed(-1.26, 1, True) == "−1.3" and signed(-1.26, 2, False) == "-1.26" and signed(2, 2, True) == "+2.00"
    assert sci(12345.678) == "1.235e+04" and sci(None) == "—"


def test_csv_number_has_at_most_four_decimals_and_no_trailing_zeros():
    assert csv_number(None) == "" and csv_number(0) == "0" and csv_number(0.0) == "0"
    assert csv_number(0.5) == "0.5" and csv_number(2.0) == "2" and csv_number(100.0) == "100"
    assert csv_number(1 / 3) == "0.3333" and csv_number(0.12346) == "0.1235" and csv_number(-0.25) == "-0.25"
    assert csv_number(-1e-5) == "0" and csv_number(-0.0) == "0" and csv_number(-0.00006) == "-0.0001"


def test_grid_formats_non_strings_and_escapes_pipes():
    assert grid(["a", "b|c"], [[1.5, None], ["x|y", True]]) == (
        "| a | b\\|c |\n|---|---|\n| 1.5 | n/a |\n| x\\|y | yes |")


def test_cell_text_mean_std_missing_seeds_intervals_and_bold():
    two = Cell({1: 50.0, 2: 60.0})
    assert two.mean == 55.0 and math.isclose(two.std, math.sqrt(50.0))  # sample std (n - 1)
    assert two.text() == "55.00 ± 7.07"
    assert Cell({1: 50.0, 2: None}).text() == "50.00 (n=1)"  # several seeds, one value: no std, the count shown
    assert Cell({1: None, 2: None}).text() == "—" and Cell({1: None}).text() == "—"
    assert Cell({1: 42.123}, ci={1: (40.0, 44.26)}).text() == "42.1 [40.0, 44.3]"  # one seed: its interval
    assert Cell({1: 1.0}, bold=True).text() == "**1.0**"
    assert Cell({1: -1.26, 2: -1.24}).text(with_sign=True) == "−1.25 ± 0.01"
    seeds = Cell({1: 50.0, 2: None, 3: 61.26}, ci={3: (55.0, 66.0)})
    assert seeds.seeds_text() == "50.0 / — / 61.3 [55.0, 66.0]"
    assert Cell({1: 1.0, 2: -1.0}).seeds_text(with_sign=True) == "+1.0 / −1.0"


def test_cell_std_of_three_seeds_divides_by_n_minus_one():
    """With two seeds n - 1 is 1, so only three or more show whether the squares are divided by n - 1."""
    three = Cell({1: 50.0, 2: 60.0, 3: 70.0})
    assert three.std == 10.0  # (100 + 0 + 100) / 2, square-rooted
    assert three.text() == "60.00 ± 10.00"


def study_table(seeds):
    rows = [("es", [Cell({s: 50.0 + 10 * i for i, s in enumerate(seeds)}), "ok"]),
            ("diff", [Cell({s: (-1.0) ** (i + 1) for i, s in enumerate(seeds)}), "x"]),
            ("base", ["12.0", "-"])]
    return Table(name="t", title="T", columns=["method", "acc", "note"], rows=rows, notes=["N1"],
                 signed_rows={"diff"}, seeds=list(seeds))


def test_table_markdown_with_signed_rows_and_the_per_seed_table():
    assert study_table([1, 2]).markdown() == (
        "### T\n\n| method | acc | note |\n| --- | --- | --- |\n"
        "| es | 55.00 ± 7.07 | ok |\n| diff | +0.00 ± 1.41 | x |\n| base | 12.0 | - |\n\n"
        "Per seed (1 / 2):\n\n| method | acc | note |\n| --- | --- | --- |\n"
        "| es | 50.0 / 60.0 | ok |\n| diff | −1.0 / +1.0 | x |\n| base | 12.0 | - |\n\nN1\n")
    # one seed: no per-seed table (it would repeat the first)
    assert study_table([1]).markdown() == (
        "### T\n\n| method | acc | note |\n| --- | --- | --- |\n"
        "| es | 50.0 | ok |\n| diff | −1.0 | x |\n| base | 12.0 | - |\n\nN1\n")


def test_table_csv_columns_align_under_cells_strings_and_missing_seeds():
    assert study_table([1, 2]).csv() == (
        "method,acc,acc std,acc seed 1,acc seed 2,note\n"
        "es,55,7.0711,50,60,ok\ndiff,0,1.4142,-1,1,x\nbase,12.0,,,,-\n")
    # a cell without a value of seed 1 leaves that column empty, the seed-2 value stays under seed 2
    table = Table(name="t", title="T", columns=["m", "acc"], rows=[("a", [Cell({2: 70.0})])], seeds=[1, 2])
    assert table.csv() == "m,acc,acc std,acc seed 1,acc seed 2\na,70,,,70\n"


def test_csv_text_quotes_cells():
    assert csv_text(["a", "b"], [[1, "x,y"], [None, 0.5]]) == 'a,b\n1,"x,y"\n,0.5\n'
