"""Tables: analyses build rows, this module renders them, as Markdown and CSV, with the number formats they print.

Two shapes of table, one renderer:

* `grid(header, rows)`: a plain Markdown grid (the report, esft.analysis.report_builder): each cell a string, or
  a value printed by `fmt`; pipes inside cells are escaped.
* `Table`: a titled table of the study (the experiment tables, esft.experiments.study_tables) whose cells are strings
  or `Cell`s (one value per seed), with notes under it; `markdown()` prints mean ± std and a per-seed table,
  `csv()` numeric mean / std / per-seed columns.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

DASH = "—"
NA = "n/a"


# ---- number formats ------------------------------------------------------------------------------------------------

def se_text(value: float | None, se: float | None, spread: str = "") -> str:
    """`0.0123 ± 0.0045`: a value as `fmt` prints it (then `spread`, such as a range over seeds) ± its standard
    error to two significant digits; the value alone where no standard error is known."""
    return fmt(value) + spread + ("" if se is None or value is None else f" ± {se:.2g}")


def fmt(x: Any, digits: int = 4) -> str:
    """A value as the report prints it: `digits` significant digits, scientific outside [1e-3, 1e5), n/a for
    None or NaN, yes/no for booleans, anything else as str()."""
    if x is None:
        return NA
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if math.isnan(x):
            return NA
        if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
            return f"{x:.{max(1, digits - 1)}e}"
        text = f"{x:.{digits}g}"
        # `g` turns to an exponent from 10**digits on (1.234e+04), inside the range promised plain
        return f"{x:.0f}" if "e" in text else text
    return str(x)


def pct(x: float | None) -> str:
    """A fraction as a percentage with one decimal: 0.123 -> 12.3%."""
    return NA if x is None else f"{100 * x:.1f}%"


def short(x: float | None) -> str:
    """Four decimals below 10, three significant digits above (figure labels)."""
    if x is None:
        return NA
    return f"{x:.4f}" if abs(x) < 10 else f"{x:.3g}"


def r2(x: float | None) -> str:
    """R^2 with six decimals: near 1 is the point (the study resolves the top 2e-4 of its range)."""
    return NA if x is None else f"{x:.6f}"


def iqr(q: dict[str, Any]) -> str:
    """`median [q1, q3]` of a quartile summary, or n/a."""
    if not q or q.get("median") is None:
        return NA
    return f"{fmt(q['median'])} [{fmt(q['q1'])}, {fmt(q['q3'])}]"


def signed(x: float, digits: int, with_sign: bool) -> str:
    """`digits` decimals; with a sign, + or the study's minus sign (−)."""
    if not with_sign:
        return f"{x:.{digits}f}"
    return f"+{x:.{digits}f}" if x >= 0 else f"−{abs(x):.{digits}f}"


def sci(x: float | None) -> str:
    """Scientific notation with three decimals, or a dash."""
    return DASH if x is None else f"{x:.3e}"


def csv_number(x: float | None) -> str:
    """A number for a CSV cell: at most four decimals, no trailing zeros; empty for None."""
    if x is None:
        return ""
    text = f"{x:.4f}".rstrip("0").rstrip(".")
    return "0" if text in ("0", "-0", "") else text  # a value that rounds to zero has no sign


# ---- Markdown ----------------------------------------------------------------------------------------------------

def md_row(cells: Iterable[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _grid_cell(c: Any) -> str:
    text = c if isinstance(c, str) else fmt(c)
    return text.replace("|", "\\|")  # a bare pipe would end the Markdown cell (||dtheta||, "es|grpo")


def grid(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown grid: strings as they are, other values through `fmt`, pipes escaped."""
    out = [md_row(_grid_cell(h) for h in header), "|" + "|".join("---" for _ in header) + "|"]
    out += [md_row(_grid_cell(c) for c in r) for r in rows]
    return "\n".join(out)


# ---- the study's tables ---------------------------------------------------------------------------------------------

@dataclass
class Cell:
    """Values of one table cell across seeds (None = missing for that seed)."""

    per_seed: dict[int, float | None]
    bold: bool = False
    ci: dict[int, tuple[float, float] | None] = field(default_factory=dict)
    """per seed, the 95% interval of that seed's value where its evaluation gave one (shown beside the value)"""
    digits: int = 1
    """decimals of a value and its interval; a mean ± std has one more"""
    shared: bool = False
    """one value measured once for every seed (the base model's): the CSV gives it in every seed's column"""

    def _interval(self, seed: int) -> str:
        ci = self.ci.get(seed)
        return f" [{ci[0]:.{self.digits}f}, {ci[1]:.{self.digits}f}]" if ci else ""

    @property
    def values(self) -> list[float]:
        return [v for v in self.per_seed.values() if v is not None]

    @property
    def mean(self) -> float | None:
        v = self.values
        return sum(v) / len(v) if v else None

    @property
    def std(self) -> float | None:
        v = self.values
        if len(v) < 2:
            return None
        m = sum(v) / len(v)
        return math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))

    def text(self, with_sign: bool = False) -> str:
        m = self.mean
        if m is None:
            return DASH
        if len(self.per_seed) > 1:
            d = self.digits + 1
            s = f"{signed(m, d, with_sign)} ± {self.std:.{d}f}" if self.std is not None else signed(m, d, with_sign)
        else:
            s = signed(m, self.digits, with_sign) + "".join(self._interval(seed) for seed in self.per_seed)
        if len(self.values) < len(self.per_seed):
            s += f" (n={len(self.values)})"
        return f"**{s}**" if self.bold else s

    def seeds_text(self, with_sign: bool = False) -> str:
        return " / ".join(DASH if v is None else signed(v, self.digits, with_sign) + self._interval(seed)
                          for seed, v in self.per_seed.items())


Row = tuple[str, list[Cell | str]]


@dataclass
class Table:
    name: str
    """file stem, e.g. table1_single_task"""
    title: str
    columns: list[str]
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    signed_rows: set[str] = field(default_factory=set)
    """labels of the rows printed with a sign (differences)"""
    seeds: list[int] = field(default_factory=list)

    def _lines(self, text: Any) -> list[str]:
        return [md_row([label] + [c if isinstance(c, str) else text(c, label in self.signed_rows) for c in cells])
                for label, cells in self.rows]

    def markdown(self) -> str:
        rule = md_row(["---"] * len(self.columns))
        out = [f"### {self.title}", "", md_row(self.columns), rule] + self._lines(Cell.text)
        if len(self.seeds) > 1 and any(isinstance(c, Cell) for _, cells in self.rows for c in cells):
            out += ["", f"Per seed ({' / '.join(map(str, self.seeds))}):", "", md_row(self.columns), rule]
            out += self._lines(Cell.seeds_text)
        out += [""] + [f"{n}" for n in self.notes] + ([""] if self.notes else [])
        return "\n".join(out).rstrip() + "\n"

    def csv(self) -> str:
        """Same rows and columns; a Cell becomes `<col>`, `<col> std`, and `<col> seed S` numeric columns."""
        header = [self.columns[0]]
        cell_cols = [i for i in range(1, len(self.columns))
                     if any(isinstance(cells[i - 1], Cell) for _, cells in self.rows)]
        for i in range(1, len(self.columns)):
            col = self.columns[i]
            header.append(col)
            if i in cell_cols:
                header.append(f"{col} std")
                header += [f"{col} seed {s}" for s in self.seeds]
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(header)
        for label, cells in self.rows:
            row: list[Any] = [label]
            for i, c in enumerate(cells, start=1):
                if isinstance(c, Cell):
                    row += [csv_number(c.mean), csv_number(c.std)] + [
                        csv_number(c.mean if c.shared else c.per_seed.get(s)) for s in self.seeds]
                else:
                    row.append(c)
                    if i in cell_cols:
                        row += [""] * (1 + len(self.seeds))
            w.writerow(row)
        return buf.getvalue()


def csv_text(header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> str:
    """Rows as CSV text (long-format files such as results.csv)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for r in rows:
        w.writerow(r)
    return buf.getvalue()
