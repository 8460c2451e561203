"""The run command's output flags through the real CLI: -k, --list, --format, strict JSON,
progress lines when stderr is not a terminal, the re-run command of each row, Ctrl-C."""
import csv
import io
import json
import math
import shlex
import textwrap

import pytest
from rich.console import Console
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.store.row_parts import RowIdentity, RowProfile, RowTiming
from attnbench.store.rows import Row
from attnbench.workload.select import SelectError, parse_selector, unique_selector

cli = CliRunner()

SWEEP = textwrap.dedent(
    """
    name: flags
    seed: 1
    device: cpu
    model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32}
    kv_cache: {page_size: 4, layout: shuffled}
    batch:
      - {kind: decode, count: 2, context: 19}
      - {kind: tree, count: 1, context: 7, tree: {choices: [[0], [1], [0, 0]]}}
    sweep:
      kv_cache.page_size: [4, 8]
      seed: [1, 10]
    backends: [reference, sdpa]
    timing: {warmup_ms: 1, measure_ms: 3, min_runs: 3}
    """
)


@pytest.fixture
def sweep(tmp_path):
    p = tmp_path / "flags.yaml"
    p.write_text(SWEEP)
    return p


def strict_loads(text: str):
    """json.loads that refuses NaN/Infinity, as strict parsers (jq, JavaScript) do."""
    def refuse(c):
        raise ValueError(f"non-standard JSON constant {c}")

    return json.loads(text, parse_constant=refuse)


# -- -k expressions -----------------------------------------------------------------------
@pytest.mark.parametrize("expr,picked", [
    ("sdpa", {("page_size=4,seed=1", "sdpa"), ("page_size=4,seed=10", "sdpa"), ("page_size=8,seed=1", "sdpa")}),
    ("seed=10 and not sdpa", {("page_size=4,seed=10", "reference")}),
    ("page_size=8 or (seed=10 and sdpa)", {("page_size=8,seed=1", "sdpa"), ("page_size=8,seed=1", "reference"),
                                           ("page_size=4,seed=10", "sdpa")}),
    ("not not SDPA and PAGE_SIZE=8", {("page_size=8,seed=1", "sdpa")}),
])
def test_selector_picks_like_pytest_k(expr, picked):
    rows = [(c, b) for c in ("page_size=4,seed=1", "page_size=4,seed=10", "page_size=8,seed=1") for b in ("reference", "sdpa")]
    sel = parse_selector(expr)
    assert {(c, b) for c, b in rows if sel(c, b)} == picked


@pytest.mark.parametrize("expr,where", [("", "give words"), ("a and", "ends too early"), ("(a", "missing ')'"),
                                        ("a b", "unexpected 'b'"), ("and a", "unexpected 'and'"), ("a )", "unexpected ')'")])
def test_selector_errors_say_what_is_wrong(expr, where):
    with pytest.raises(SelectError, match=None) as e:
        parse_selector(expr)
    assert where in str(e.value)


def test_unique_selector_excludes_ids_that_contain_the_case():
    ids = ["seed=1", "seed=10", "seed=2"]
    expr = unique_selector("seed=1", ids)
    assert expr == "seed=1"  # swept values match whole (issue 25): seed=1 never picks seed=10
    assert [c for c in ids if parse_selector(expr)(c, "b")] == ["seed=1"]
    ids = ["page_size=16", "page_size=16,variant=tree"]  # an id inside another still gets its clause
    expr = unique_selector("page_size=16", ids)
    assert [c for c in ids if parse_selector(expr)(c, "b")] == ["page_size=16"]


# -- run --list, -k, --format ---------------------------------------------------------------
def test_list_prints_the_cases_and_runs_nothing(sweep, tmp_path):
    r = cli.invoke(app, ["run", str(sweep), "--list", "-k", "seed=10 and not reference", "--results-dir", str(tmp_path / "res")])
    assert r.exit_code == 0, r.output
    lines = r.stdout.strip().splitlines()
    assert lines[0].split()[:2] == ["page_size=4,seed=10", "sdpa"] and "2 decode@19" in lines[0]
    assert lines[-2] == "2 case(s), 2 row(s)" and lines[-1].startswith("CPU-sized, ~")
    assert not (tmp_path / "res").exists()
    r = cli.invoke(app, ["run", str(sweep), "--list", "--format", "json"])
    recs = strict_loads(r.stdout)
    assert [x["case_id"] for x in recs] == ["page_size=4,seed=1", "page_size=4,seed=10", "page_size=8,seed=1", "page_size=8,seed=10"]
    assert recs[0]["backends"] == ["reference", "sdpa"] and recs[0]["params"] == {"kv_cache.page_size": 4, "seed": 1}


def test_k_that_picks_nothing_is_a_usage_error(sweep, tmp_path):
    r = cli.invoke(app, ["run", str(sweep), "-k", "flex", "--results-dir", str(tmp_path / "res")])
    assert r.exit_code == 2 and "picks no row" in r.stderr and "--list" in r.stderr
    assert not (tmp_path / "res").exists()
    r = cli.invoke(app, ["run", str(sweep), "-k", "sdpa and (", "--results-dir", str(tmp_path / "res")])
    assert r.exit_code == 2 and "ends too early" in r.stderr


def test_json_on_stdout_progress_lines_on_stderr(sweep, tmp_path):
    out = tmp_path / "run"
    r = cli.invoke(app, ["run", str(sweep), "-k", "page_size=4", "--format", "json", "--out", str(out)])
    assert r.exit_code == 0, r.output
    recs = strict_loads(r.stdout)  # stdout is nothing but the JSON document
    assert {(x["case_id"], x["backend"]) for x in recs} == {
        (c, b) for c in ("page_size=4,seed=1", "page_size=4,seed=10") for b in ("reference", "sdpa")}
    assert all(x["status"] == "ok" and x["median_ms"] > 0 for x in recs)
    assert any(x["kernel_sum_ms"] is None for x in recs)  # NaN became null
    # not a terminal: one line per finished case, with done/total, elapsed and ETA
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("[")]
    assert [ln.split("]")[0] for ln in lines] == ["[1/2", "[2/2"]
    assert all("elapsed" in ln and "ETA" in ln for ln in lines)
    assert "page_size=4,seed=1: reference ok, sdpa ok" in lines[0]
    assert f"run folder: {out}" in r.stderr.replace("\n", "")
    # rows.jsonl is strict JSON too, and reads back with NaN where it was null
    text = (out / "rows.jsonl").read_text()
    rows = [Row.from_json(strict_loads(x)) for x in text.splitlines()]
    assert len(rows) == 4 and math.isnan(rows[0].profile.kernel_sum_ms)
    # readers also accept the NaN of older run folders
    legacy = json.loads(json.dumps(rows[0].to_json() | {"kernel_sum_ms": float("nan")}))
    assert math.isnan(Row.from_json(legacy).profile.kernel_sum_ms)


@pytest.mark.parametrize("fmt", ["csv", "markdown"])
def test_csv_and_markdown_results(sweep, tmp_path, fmt):
    r = cli.invoke(app, ["run", str(sweep), "-k", "page_size=8 and seed=10 and sdpa", "--format", fmt, "--out", str(tmp_path / fmt)])
    assert r.exit_code == 0, r.output
    if fmt == "csv":
        recs = list(csv.DictReader(io.StringIO(r.stdout)))
        assert [(x["case_id"], x["backend"], x["status"]) for x in recs] == [("page_size=8,seed=10", "sdpa", "ok")]
        assert recs[0]["seed"] == "10" and float(recs[0]["median_ms"]) > 0
        assert "run folder" not in r.stdout
    else:
        assert "| page_size=8,seed=10 | sdpa | ok |" in r.stdout


def test_each_row_carries_the_command_that_reruns_it(sweep, tmp_path):
    r = cli.invoke(app, ["run", str(sweep), "--set", "model.head_dim=32", "--measure-ms", "2", "-q",
                         "--out", str(tmp_path / "all"), "--format", "json"])
    assert r.exit_code == 0, r.output
    recs = strict_loads(r.stdout)
    target = next(x for x in recs if x["case_id"] == "page_size=4,seed=1" and x["backend"] == "sdpa")
    argv = shlex.split(target["repro"])
    assert argv[:3] == ["attnbench", "run", str(sweep)]
    assert "--set" in argv and "model.head_dim=32" in argv and "--measure-ms" in argv
    # seed=1 is a substring of seed=10: the command must still pick that one row
    r = cli.invoke(app, [*argv[1:], "--out", str(tmp_path / "one"), "-q", "--format", "json"])
    assert r.exit_code == 0, r.output
    again = strict_loads(r.stdout)
    assert [(x["case_id"], x["backend"], x["status"]) for x in again] == [("page_size=4,seed=1", "sdpa", "ok")]


INTERRUPTING = '''
import os, signal

from attnbench.backend import Backend

class Interrupting(Backend):
    name = "interrupting"
    def plan(self, batch):  # Ctrl-C while it plans: a real SIGINT (a bare KeyboardInterrupt is its error row)
        os.kill(os.getpid(), signal.SIGINT)
        raise KeyboardInterrupt
    def run(self, plan):
        return None
'''


def test_ctrl_c_says_how_to_resume(sweep, tmp_path):
    bf = tmp_path / "interrupting.py"
    bf.write_text(INTERRUPTING)
    out = tmp_path / "run"
    r = cli.invoke(app, ["run", str(sweep), "-b", "sdpa", "-b", "interrupting", "--backend-file", str(bf), "--out", str(out)])
    assert r.exit_code == 130
    assert f"attnbench run --resume {out}" in r.stderr.replace("\n", "")
    assert json.loads((out / "manifest.json").read_text())["status"] == "incomplete"


# -- the table ------------------------------------------------------------------------------
def _row(case, backend, median, samples, **kw):
    return Row(RowIdentity("s", case, backend), **kw,
               timing=RowTiming(median_ms=median, samples_ms=samples, n=len(samples), iqr_rel=0.1, timing_method="cpu"))


def test_table_marks_overlapping_rows_and_sums_up_per_backend():
    from attnbench.analyze.summary import backend_summary
    from attnbench.analyze.tables import fastest_by_case, vs_best

    rows = [
        _row("c1", "sdpa", 2.0, [1.9, 2.0, 2.1, 2.2]),
        _row("c1", "fast", 1.0, [0.9, 1.0, 1.1, 1.05]),
        _row("c2", "sdpa", 2.0, [1.9, 2.0, 2.1]),
        _row("c2", "fast", 1.9, [1.8, 1.9, 2.0]),  # overlaps sdpa's middle half
        _row("c3", "sdpa", 1.0, [1.0, 1.0, 1.0]),
        Row(RowIdentity("s", "c3", "fast", repro="attnbench run s.yaml -k c3 -b fast"), status="error", reason="boom"),
    ]
    best = fastest_by_case(rows)
    assert [vs_best(r, best) for r in rows] == ["2.00×", "best", "1.05× ≈", "best", "best", "-"]
    lines = backend_summary(rows)
    assert lines[1].strip() == "sdpa fastest in 1 of 3 cases"
    assert lines[2].strip() == "fast fastest in 2 of 3 cases (ok in 2), geo-mean 1.45× faster than sdpa"


def test_compact_table_is_one_line_per_row_and_failed_rows_show_their_rerun_command():
    from attnbench.analyze.run_table import print_results

    rows = [_row(f"context={c},page_size={p},seed={s}", b, 1.0 + (b == "flex"), [1.0, 1.0, 1.0])
            for c in (128, 256) for p in (1, 16) for s in range(4) for b in ("sdpa", "flex")]
    rows.append(Row(RowIdentity("s", "context=128,page_size=1,seed=0", "bad",
                                repro="attnbench run s.yaml -k context=128,page_size=1,seed=0 -b bad"),
                    status="mismatch", reason="relative error 1 exceeds"))
    con = Console(width=120, record=True, force_terminal=False)
    print_results(rows, con, title="t")  # 33 rows: compact by size
    text = con.export_text()
    lines = text.splitlines()
    table = lines[:next(i for i, ln in enumerate(lines) if ln.startswith("batch"))]
    body = [ln for ln in table if any(f" {b} " in f" {ln} " for b in ("sdpa", "flex", "bad"))]
    assert len(body) == len(rows) and len(table) == len(rows) + 3  # title, header, rule; one line a row
    assert "re-run context=128,page_size=1,seed=0 · bad: attnbench run s.yaml -k" in text
    flat = " ".join(text.split())  # the legend wraps at the console width
    assert "mem = memory-bound" in flat and "com = compute-bound" in flat
    assert "flex fastest in 0 of 16 cases, geo-mean 2.00× slower than sdpa" in text
    assert "IQR is" not in text  # one spread figure: no spread footnotes


def test_profile_note_on_cpu():
    from attnbench.analyze.tables import print_profiles

    con = Console(width=200, record=True)
    print_profiles([Row(RowIdentity("s", "c", "sdpa"), timing=RowTiming(median_ms=1.0, timing_method="cpu"),
                        profile=RowProfile(kernel_sum_ms=3.0, kernels_per_call=4,
                                           trace="/nonexistent/c__sdpa.trace.json"))], con)
    assert "can exceed the timed median" in con.export_text()


def test_k_on_check_and_compare_runs(sweep, tmp_path):
    out = tmp_path / "run"
    r = cli.invoke(app, ["run", str(sweep), "-k", "page_size=4", "-q", "--out", str(out), "--format", "csv",
                         "--set", "timing.rounds=5"])
    assert r.exit_code == 0, r.output
    r = cli.invoke(app, ["check", str(out), "--baseline", str(out), "-k", "sdpa and seed=10", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert [(x["case"], x["backend"]) for x in strict_loads(r.stdout)["cases"]] == [("page_size=4,seed=10", "sdpa")]
    r = cli.invoke(app, ["compare", "runs", str(out), str(out), "-k", "not sdpa", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert {x["backend"] for x in strict_loads(r.stdout)} == {"reference"}
    r = cli.invoke(app, ["check", str(out), "--baseline", str(out), "-k", "sdpa or"])
    assert r.exit_code == 2 and "ends too early" in r.stderr
