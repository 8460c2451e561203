"""The run table fits the terminal: at 80 and 120 columns every line fits, no header or value
is cut, columns are dropped least important first and named under the table; a sweep's
values (typed, ``Row.params``) become one column per swept value."""
import pytest
from rich.console import Console

from attnbench.analyze.run_table import print_results, results_table
from attnbench.store.columns import fmt_err, fmt_rate, fmt_time
from attnbench.store.row_parts import RowCorrectness, RowIdentity, RowRoofline, RowTiming, RowWorkload
from attnbench.store.rows import Row
from attnbench.workload.sweeps import case_id_for


def _rows(n_seeds=5):
    out = []
    for ctx in (128, 1024):
        for page in (1, 256):
            for seed in range(n_seeds):
                for b, t in (("reference", 2.34), ("sdpa", 1.56), ("flex", 17.4)):
                    params = {"batch.0.context": ctx, "kv_cache.page_size": page, "seed": seed}
                    out.append(Row(RowIdentity("cpu-sweep", case_id_for(params), b),
                                   workload=RowWorkload(params=params),
                                   timing=RowTiming(median_ms=t, plan_ms=0.000126 if b != "flex" else 19.6,
                                                    convert_ms=0.0 if b == "reference" else 0.47, n=5, iqr_rel=0.15,
                                                    samples_ms=[t] * 5, timing_method="cpu-thread", threads=1),
                                   correctness=RowCorrectness(rel_err=3.2e-7),
                                   roofline=RowRoofline(tbps=0.000578, pct_of_ceiling=2.4, bound="memory")))
    out[4].status, out[4].reason = "mismatch", "relative error 0.03 exceeds tolerance 0.0001"
    return out


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("n_seeds", [1, 5])  # 12 rows: full table; 60: compact
def test_table_fits_the_terminal(width, n_seeds):
    rows = _rows(n_seeds)
    con = Console(width=width, record=True, force_terminal=False)
    print_results(rows, con, title="cpu-sweep on cpu x86_64 (2 threads), rows timed on 1 thread")
    text = con.export_text()
    lines = text.splitlines()
    table = lines[:lines.index(next(ln for ln in lines if ln.startswith("batch")))]
    assert all(len(ln.rstrip()) <= width for ln in table), [ln for ln in table if len(ln.rstrip()) > width]
    assert "…" not in "\n".join(table)  # nothing cut
    header = next(ln for ln in table if "backend" in ln).split()
    assert header[:5] == ["context", "page_size", "seed", "backend", "status"] if n_seeds > 1 else \
        header[:4] == ["context", "page_size", "backend", "status"]
    flat = " ".join(text.split())  # notes wrap at the console width
    assert "kernel" in header and "17.4 ms" in text
    assert "126 ns" in text if "plan" in header else "not shown at 80 columns: plan" in flat
    if width == 80:
        assert "not shown at 80 columns:" in flat and "(all in results.csv)" in flat
    else:
        assert "roofline" in header and "2% mem" in text
    assert "[1] sdpa: relative error 0.03" in flat


def test_columns_go_least_important_first():
    rows = _rows(1)
    shown = {}
    for width in (200, 100, 80, 70, 60):
        table, _, _, left_out = results_table(rows, width=width)
        shown[width] = [c.header for c in table.columns]
        assert not set(left_out) & set(shown[width])
    assert {"rel err", "bandwidth", "roofline", "plan", "convert"} <= set(shown[200])
    order = ["bandwidth", "rel err", "roofline", "convert", "plan", "IQR", "vs best"]  # dropped in this order
    for wide, narrow in ((200, 100), (100, 80), (80, 70)):
        gone = [h for h in order if h in shown[wide] and h not in shown[narrow]]
        kept = [h for h in order if h in shown[narrow]]
        assert all(order.index(g) < order.index(k) for g in gone for k in kept), (wide, narrow, gone, kept)
    assert {"backend", "status", "kernel"} <= set(shown[60])
    # a narrower column that still fits is taken after a wider, more important one is dropped
    assert "IQR" in shown[60] and "vs best" not in shown[60]


def test_fixed_sweep_values_go_to_the_title():
    rows = [r for r in _rows(1) if r.id.case_id.startswith("context=1k")]
    table, _, _, _ = results_table(rows, title="t", width=120)
    assert str(table.title) == "t (context=1k, seed=0)"
    assert [c.header for c in table.columns][:2] == ["page_size", "backend"]


def test_one_formatter_family():
    """Issue 34: the run table said ``67.3µs``, compare tables and Markdown ``67.3 µs``; one
    family now, a number and its unit with a space, rounding up into the next unit."""
    assert [fmt_time(x) for x in (0.0000945, 0.0673, 0.99971, 1.25, 129.4, 999.97, 2100.0, float("nan"))] == \
        ["94.5 ns", "67.3 µs", "1 ms", "1.25 ms", "129 ms", "1 s", "2.1 s", "-"]
    assert [fmt_rate(x) for x in (2.04, 0.578, 0.0000581)] == ["2.04 TB/s", "578 GB/s", "58.1 MB/s"]
    assert [fmt_err(x) for x in (3.2e-7, 0.0, 0.031, float("nan"))] == ["3e-7", "0", "3e-2", "-"]


def test_a_single_timed_call_shows_no_spread():
    rows = _rows(1)
    rows[2].timing.n, rows[2].timing.iqr_rel = 1, 0.0
    table, _, legend, _ = results_table(rows, width=120)
    iqr = next(c for c in table.columns if c.header == "IQR")
    assert list(iqr.cells)[2] == "n=1" and list(iqr.cells)[1] == "15%"
    assert any("n=1: one timed call" in x for x in legend)


def test_legend_wraps_at_a_reading_width_in_a_wide_log():
    """Issue 35 item 6: on a log's 160 columns (COLUMNS unset) the legend was 5 lines of 160."""
    con = Console(width=160, record=True, force_terminal=False)
    print_results(_rows(1), con, title="t")
    lines = con.export_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(("plan:", "kernel:")))
    legend = lines[start:next(i for i, ln in enumerate(lines) if i > start and ln.startswith("["))]
    assert len(legend) > 1 and all(len(ln.rstrip()) <= 100 for ln in legend), legend
    assert any(len(ln.rstrip()) > 100 for ln in lines[:start])  # the table still takes the width
