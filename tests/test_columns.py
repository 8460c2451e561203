"""Issue 34: one column registry (store/columns.py) read by the terminal table, the Markdown
table, the HTML report, results.csv and JSON; one formatter family, so a time reads the same
in every output."""
import csv
import io

import pytest
from rich.console import Console

from attnbench.analyze.compare_tables import backend_records, backend_columns, render
from attnbench.analyze.compare import compare_backends
from attnbench.analyze.report import RunData, run_table_section
from attnbench.analyze.run_formats import markdown_lines, row_records
from attnbench.analyze.run_table import results_table
from attnbench.store import columns
from attnbench.store.manifest import Manifest
from attnbench.store.row_parts import RowIdentity, RowTiming, RowWorkload
from attnbench.store.rows import Row, rows_csv


def _rows():
    out = []
    for case in ("ctx=1", "ctx=2"):
        for b, t in (("sdpa", 0.0673), ("flex", 1.25)):
            samples = [t * f for f in (0.98, 1.0, 1.01, 1.03, 1.2)]
            out.append(Row(RowIdentity("s", case, b), workload=RowWorkload(params={"ctx": int(case[-1])}),
                           timing=RowTiming(median_ms=t, n=5, samples_ms=samples, round_medians_ms=samples,
                                            timing_method="cpu", plan_ms=0.002, iqr_rel=0.03)))
    return out


@pytest.fixture
def slowest():
    """A new column, as a contributor would add one: its entry in the registry, nothing else."""
    col = columns.Column("slowest_ms", "slowest", "ms", lambda r, c: columns.fmt_time(max(r.timing.samples_ms)), 8,
                         "slowest: the slowest timed call", derived=lambda r, c: max(r.timing.samples_ms))
    columns.COLUMNS.append(col)
    yield col
    columns.COLUMNS.remove(col)


def test_a_new_column_reaches_every_output(slowest):
    rows = _rows()
    table, _, legend, _ = results_table(rows, width=None)
    assert "slowest" in [c.header for c in table.columns] and "slowest: the slowest timed call" in legend
    md = "\n".join(markdown_lines(rows))
    assert "| slowest |" in md.splitlines()[0].replace(" | notes |", " |") and "1.5 ms" in md
    table_csv = list(csv.DictReader(io.StringIO(rows_csv(rows))))
    assert float(table_csv[1]["slowest_ms"]) == pytest.approx(1.5)
    assert row_records(rows)[1]["slowest_ms"] == pytest.approx(1.5)
    html = run_table_section([RunData("run", Manifest(), rows)])
    assert 'data-col="slowest_ms">slowest</th>' in html and 'data-v="1.5"' in html


def test_a_time_reads_the_same_in_every_output():
    """The run table wrote ``67.3µs``, the Markdown table and compare tables ``67.3 µs``."""
    rows = _rows()
    con = Console(width=200, record=True)
    con.print(results_table(rows, width=200)[0])
    terminal = con.export_text()
    md = "\n".join(markdown_lines(rows))
    con = Console(width=200, record=True)
    render(backend_records(compare_backends(rows)), backend_columns(0.95), "table", con, "t")
    compared = con.export_text()
    html = run_table_section([RunData("run", Manifest(), rows)])
    for text in (terminal, md, compared, html):
        assert "67.3 µs" in text and "1.25 ms" in text and "67.3µs" not in text
