"""results.csv is written with the csv module (a run does not import pandas): pandas reads it
as the table pandas wrote before, and an int column with gaps reads ``16``, not ``16.0``."""
import io
import math

import pandas as pd

from attnbench.store.row_parts import RowCorrectness, RowIdentity, RowProfile, RowRoofline, RowTiming, RowWorkload
from attnbench.store.rows import Row, Status, rows_csv, rows_frame


def _rows() -> list[Row]:
    a = Row(RowIdentity("s", "page_size=16", "sdpa"), reason='a "quoted", reason',
            workload=RowWorkload(params={"page_size": 16, "tree": [[0], [1]]}),
            timing=RowTiming(median_ms=0.125, n=5, timing_method="cpu-thread", cold_l2=False),
            correctness=RowCorrectness(rel_err=3.2e-07), roofline=RowRoofline(flops=12345))
    b = Row(RowIdentity("s", "page_size=16", "flex"), workload=RowWorkload(params={"page_size": 16}),
            timing=RowTiming(median_ms=1.0 / 3, n=1, timing_method="cpu", cold_l2=True),
            profile=RowProfile(kernels_per_call=4), roofline=RowRoofline(tbps=math.inf))
    c = Row(RowIdentity("s", "ctx=1k", "reference"), status=Status.SKIPPED, reason="line one\nline two",
            workload=RowWorkload(params={"ctx": "1k"}))
    return [a, b, c]


def test_rows_csv_holds_the_table_pandas_wrote():
    ours, theirs = rows_csv(_rows()), rows_frame(_rows()).to_csv(index=False)
    pd.testing.assert_frame_equal(pd.read_csv(io.StringIO(ours)), pd.read_csv(io.StringIO(theirs)))
    assert ",16,\"[[0], [1]]\"," in ours and ",16.0," in theirs  # pandas made the gapped column float


def test_rows_csv_reads_back():
    df = pd.read_csv(io.StringIO(rows_csv(_rows())))
    assert list(df.columns[:5]) == ["scenario", "case_id", "page_size", "tree", "ctx"]
    assert df.status.tolist() == ["ok", "ok", "skipped"]
    assert df.median_ms[1] == 1.0 / 3 and math.isnan(df.median_ms[2])
    assert df.x_fastest[0] == 1.0 and df.x_fastest[1] == (1.0 / 3) / 0.125 and math.isnan(df.x_fastest[2])
    assert df.reason.tolist()[::2] == ['a "quoted", reason', "line one\nline two"]
    assert df.tree[0] == "[[0], [1]]"
