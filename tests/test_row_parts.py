"""Issue 34: a row is its outcome (status, reason) plus typed parts (identity, workload, timing,
correctness, roofline, profile), and its on-disk form did not change: a rows.jsonl line written before the
parts existed loads into them and is written back byte for byte, and results.csv keeps its columns."""
import dataclasses
import json
import math

import pytest

from attnbench.store.row_parts import PARTS, RowIdentity, RowTiming
from attnbench.store.rows import CSV_FIELDS, Row, RowError, rows_csv, typed_row
from attnbench.store.runfolder import RunFolder

# one rows.jsonl line as attnbench wrote it when Row was 48 flat fields (made by that code)
OLD_LINE = (
    '{"scenario": "decode", "case_id": "context=4096,page_size=16", "backend": "flashinfer:fa3", "status": "ok", '
    '"reason": "", "backend_version": "0.2.5", "mode": "fa3 (bf16 tol)", "device": "NVIDIA H200", '
    '"device_id": "GPU-1234", "dtype": "bfloat16", "page_size": 16, "layout": "paged", "batch": "32 decode@4k", '
    '"num_requests": 32, "num_tokens": 32, "plan_ms": 0.0125, "convert_ms": 0.0, "median_ms": 0.0466, '
    '"p20_ms": 0.0461, "p80_ms": 0.0472, "min_ms": 0.0458, "iqr_rel": 0.021, "n": 5, "step_ms": 0.0591, '
    '"timing_method": "cuda-graph", "threads": 0, "cold_l2": true, "flush": "l2-flush", "timing_note": "", '
    '"rel_err": 0.0031, "max_abs_err": 0.0078125, "tolerance": 0.02, "flops": 1073741824, "bytes": 268435456, '
    '"tflops": 23.04, "tbps": 5.76, "floor_ms": 0.0559, "bound": "memory", "pct_of_ceiling": null, '
    '"kernels_per_call": 2, "kernel_sum_ms": 0.0449, "trace": "", '
    '"repro": "attnbench run decode.yaml -k x -b flashinfer:fa3", '
    '"params": {"batch.0.context": 4096, "kv_cache.page_size": 16}, '
    '"samples_ms": [0.0458, 0.0461, 0.0466, 0.0472, 0.0475], "round_medians_ms": [0.0466], '
    '"plan_samples_ms": [0.0125, 0.0126], "convert_samples_ms": []}'
)

# the keys of that line, in its order: every row the new code writes has exactly these
OLD_KEYS = [
    "scenario", "case_id", "backend", "status", "reason", "backend_version", "mode", "device", "device_id", "dtype",
    "page_size", "layout", "batch", "num_requests", "num_tokens", "plan_ms", "convert_ms", "median_ms", "p20_ms",
    "p80_ms", "min_ms", "iqr_rel", "n", "step_ms", "timing_method", "threads", "cold_l2", "flush", "timing_note",
    "rel_err", "max_abs_err", "tolerance", "flops", "bytes", "tflops", "tbps", "floor_ms", "bound", "pct_of_ceiling",
    "kernels_per_call", "kernel_sum_ms", "trace", "repro", "params", "samples_ms", "round_medians_ms",
    "plan_samples_ms", "convert_samples_ms",
]

# the CSV header that code wrote for the row above (sweep values after case_id, x_fastest last)
OLD_CSV = (
    "scenario,case_id,batch.0.context,kv_cache.page_size,backend,status,reason,backend_version,mode,device,device_id,"
    "dtype,page_size,layout,batch,num_requests,num_tokens,plan_ms,convert_ms,median_ms,p20_ms,p80_ms,min_ms,iqr_rel,n,"
    "step_ms,timing_method,threads,cold_l2,flush,timing_note,rel_err,max_abs_err,tolerance,flops,bytes,tflops,tbps,"
    "floor_ms,bound,pct_of_ceiling,kernels_per_call,kernel_sum_ms,trace,repro,x_fastest\n"
    'decode,"context=4096,page_size=16",4096,16,flashinfer:fa3,ok,,0.2.5,fa3 (bf16 tol),NVIDIA H200,GPU-1234,'
    "bfloat16,16,paged,32 decode@4k,32,32,0.0125,0.0,0.0466,0.0461,0.0472,0.0458,0.021,5,0.0591,cuda-graph,0,True,"
    "l2-flush,,0.0031,0.0078125,0.02,1073741824,268435456,23.04,5.76,0.0559,memory,,2,0.0449,,"
    "attnbench run decode.yaml -k x -b flashinfer:fa3,1.0\n"
)


def _line(row: Row) -> str:
    return json.dumps(row.to_json(), default=str, allow_nan=False)  # as RunFolder.add writes it


def test_an_old_flat_line_loads_into_the_parts():
    row = typed_row(json.loads(OLD_LINE))
    assert row.key == ("decode", "context=4096,page_size=16", "flashinfer:fa3") and row.status == "ok"
    assert row.id == RowIdentity("decode", "context=4096,page_size=16", "flashinfer:fa3", backend_version="0.2.5",
                                 mode="fa3 (bf16 tol)", device="NVIDIA H200", device_id="GPU-1234",
                                 repro="attnbench run decode.yaml -k x -b flashinfer:fa3")
    assert row.workload.batch == "32 decode@4k" and row.workload.params == {"batch.0.context": 4096,
                                                                             "kv_cache.page_size": 16}
    assert row.timing.median_ms == 0.0466 and row.timing.n == 5 and row.timing.plan_samples_ms == [0.0125, 0.0126]
    assert row.timing.cold_l2 is True and row.timing.timing_method == "cuda-graph"
    assert row.correctness.tolerance == 0.02 and row.correctness.max_abs_err == 0.0078125
    assert row.roofline.bytes == 268435456 and row.roofline.bound == "memory"
    assert math.isnan(row.roofline.pct_of_ceiling)  # null on disk, NaN in the part
    assert row.profile.kernels_per_call == 2 and row.profile.kernel_sum_ms == 0.0449
    assert Row.from_json(json.loads(OLD_LINE)) == row  # the lenient reader (events, baselines) agrees


def test_an_old_run_folder_round_trips_byte_for_byte(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir(), new.mkdir()
    (old / "rows.jsonl").write_text(OLD_LINE + "\n")
    rows = RunFolder.load(old).rows
    assert len(rows) == 1 and rows[0].timing.round_medians_ms == [0.0466]
    rf = RunFolder(new)
    rf.add(rows[0])
    assert (new / "rows.jsonl").read_text() == OLD_LINE + "\n"
    assert rows_csv(rows) == OLD_CSV


def test_the_new_rows_write_the_old_keys_in_the_old_order():
    blank = Row(RowIdentity("s", "c", "b"))
    full = typed_row(json.loads(OLD_LINE))
    assert list(blank.to_json()) == OLD_KEYS and list(full.to_json()) == OLD_KEYS
    assert CSV_FIELDS == [k for k in OLD_KEYS if k not in ("params", "samples_ms", "round_medians_ms",
                                                            "plan_samples_ms", "convert_samples_ms")]
    assert json.loads(_line(full)) == json.loads(OLD_LINE)


def test_every_flat_field_has_one_home():
    """Field names are unique over the row and its parts: the flat record names each once."""
    names = [f.name for f in dataclasses.fields(Row) if f.name not in PARTS]
    for part in PARTS.values():
        names += [f.name for f in dataclasses.fields(part)]
    assert sorted(names) == sorted(OLD_KEYS) and len(names) == len(set(names))


def test_a_part_field_of_the_wrong_type_is_named():
    d = json.loads(OLD_LINE)
    d["median_ms"] = "fast"
    with pytest.raises(RowError, match="median_ms"):
        typed_row(d)


def test_parts_are_the_rows_own():
    """Two rows never share a part (defaults are made per row), so filling one leaves the other."""
    a, b = Row(RowIdentity("s", "c", "x")), Row(RowIdentity("s", "c", "y"))
    a.timing.samples_ms.append(1.0)
    a.workload.params["k"] = 1
    assert b.timing == RowTiming() and b.workload.params == {}


def test_the_runner_fills_each_part_and_writes_the_old_keys():
    """A row measured by the runner (CPU, sdpa) carries every part, made where its facts are
    known, and is written under the old flat keys."""
    from attnbench.execute.runner import RunOptions, Runner
    from attnbench.workload.scenario import load_text

    from .test_cli import TINY

    sf = load_text(TINY.replace("[4, 8]", "[4]"))
    (row,) = list(Runner(sf, RunOptions(measure_ceilings=False, backends=["sdpa"])).rows())
    assert row.status == "ok", row.reason
    assert row.id.scenario == "tiny" and row.id.backend == "sdpa" and row.id.backend_version and row.id.device
    assert row.workload.num_requests == 4 and row.workload.params == {"kv_cache.page_size": 4}
    t = row.timing
    assert t.n == len(t.samples_ms) >= 1 and min(t.samples_ms) <= t.median_ms and t.timing_method.startswith("cpu")
    assert t.plan_samples_ms and t.step_ms == pytest.approx(t.plan_ms + t.median_ms) and t.threads == 1
    assert row.correctness.rel_err < row.correctness.tolerance
    assert row.roofline.flops > 0 and row.roofline.bytes > 0 and row.roofline.tbps > 0
    assert row.profile.kernels_per_call is None  # no --profile
    assert list(json.loads(_line(row))) == OLD_KEYS


def test_every_column_reads_a_field_its_part_holds():
    """A column names the part that holds its field; a wrong part would read None silently
    (getattr with a default), so every registry entry is checked against the parts' fields."""
    import dataclasses

    from attnbench.store import columns, rows

    types = {f.name: f.type for f in dataclasses.fields(rows.Row)}
    for c in columns.COLUMNS:
        if c.derived:
            continue
        held = types if not c.part else {
            f.name for f in dataclasses.fields(getattr(rows, types[c.part]) if isinstance(types[c.part], str)
                                               else types[c.part])}
        assert c.name in held, (c.part, c.name)
