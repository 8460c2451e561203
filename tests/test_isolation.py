"""Crash isolation, resumable runs, output checks and memory skips (issue 6).

A sweep with good backends and backends that misbehave on purpose runs under --isolate:
every good row is kept and correct, every bad one is a row that says what happened. A run
killed mid-way (Ctrl-C in process, SIGKILL of a child process) and resumed gives the same
rows as a run straight through.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from attnbench.execute import runner as runner_mod
from attnbench.cli.app import app
from attnbench.store.runfolder import RunFolder
from attnbench.workload.units import safe_name
from attnbench.execute.runner import RunOptions, Runner, check_output
from attnbench.workload.scenario import load_text

from .conftest import make_batch
from .test_cli import TINY

cli = CliRunner()
BAD_FILE = str(Path(__file__).with_name("misbehaving_backends.py"))

# what each misbehaving backend must produce: (status, words the reason must hold)
EXPECTED = {
    "explodes": ("error", ["RuntimeError", "kernel exploded"]),
    "segfault": ("error", ["SIGSEGV", "Fatal Python error"]),
    "aborts": ("error", ["SIGABRT", "misbehaving_backends.py"]),
    "nan": ("mismatch", ["1 NaN/Inf"]),
    "shape": ("mismatch", ["wrong shape"]),
    "dtype": ("mismatch", ["wrong dtype", "float64"]),
    "sleeps": ("error", ["timed out", "--timeout", "sleeps"]),
    "unwritten": ("mismatch", ["never written"]),
}


def _frame(path):
    return pd.read_csv(path / "results.csv", keep_default_na=False)


@pytest.mark.slow
def test_isolate_keeps_good_rows_and_says_what_each_bad_one_did(tiny, tmp_path):
    out = tmp_path / "iso"
    names = ["sdpa", "explodes", "segfault", "aborts", "nan", "shape", "dtype", "sleeps", "unwritten", "reference"]
    args = ["run", str(tiny), "--out", str(out), "--set", "sweep={}", "--isolate", "--timeout", "4", "--backend-file", BAD_FILE, "-q"]
    for b in names:
        args += ["-b", b]
    r = cli.invoke(app, args)
    assert r.exit_code == 1, r.output
    df = _frame(out)
    assert list(df.backend) == names  # nothing lost, in order, once each
    by = {row.backend: row for row in df.itertuples()}
    for good in ("sdpa", "reference"):
        assert by[good].status == "ok" and float(by[good].rel_err) < 1e-5 and float(by[good].median_ms) > 0
    for bad, (status, words) in EXPECTED.items():
        assert by[bad].status == status, (bad, by[bad].reason)
        for w in words:
            assert w in by[bad].reason, (bad, by[bad].reason)
    man = json.loads((out / "manifest.json").read_text())
    assert man["status"] == "complete" and man["isolate"] is True
    # the good rows equal an in-process run's (same batch rebuilt from the seed in the child)
    straight = tmp_path / "straight"
    r = cli.invoke(app, ["run", str(tiny), "--out", str(straight), "--set", "sweep={}", "-b", "sdpa", "-b", "reference", "-q"])
    assert r.exit_code == 0, r.output
    ref = _frame(straight).set_index("backend")
    for good in ("sdpa", "reference"):
        assert float(by[good].rel_err) == pytest.approx(float(ref.loc[good, "rel_err"]), rel=1e-6, abs=1e-12)


def _rows(path):
    return {(r.id.case_id, r.id.backend): (r.status, r.correctness.rel_err) for r in RunFolder.load(path).rows}


def _same_rows(a, b):
    assert set(a) == set(b)
    for k in a:
        assert a[k][0] == b[k][0], k
        if a[k][1] == a[k][1]:  # not NaN
            assert a[k][1] == pytest.approx(b[k][1], rel=1e-6, abs=1e-12), k


SWEEP3 = ["--set", "sweep={kv_cache.page_size: [4, 8, 16]}"]


def test_ctrl_c_then_resume_gives_the_same_rows(tiny, tmp_path, monkeypatch):
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    r = cli.invoke(app, ["run", str(tiny), "--out", str(straight), *SWEEP3, "-q"])
    assert r.exit_code == 0, r.output
    real_add = RunFolder.add

    def add_then_interrupt(self, row):
        real_add(self, row)
        if len(self.rows) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(RunFolder, "add", add_then_interrupt)
    r = cli.invoke(app, ["run", str(tiny), "--out", str(cut), *SWEEP3, "-q"])
    assert r.exit_code == 130, r.output
    assert json.loads((cut / "manifest.json").read_text())["status"] == "incomplete"
    assert len(RunFolder.load(cut).rows) == 3
    monkeypatch.setattr(RunFolder, "add", real_add)
    (tiny).unlink()  # the scenario file may be gone: the manifest holds its text
    r = cli.invoke(app, ["run", "--resume", str(cut), "-q"])
    assert r.exit_code == 0, r.output
    man = json.loads((cut / "manifest.json").read_text())
    assert man["status"] == "complete" and man["resumed"][0]["rows_before"] == 3
    _same_rows(_rows(cut), _rows(straight))
    assert len(_frame(cut)) == 6
    # resuming a complete folder runs nothing and changes nothing
    r = cli.invoke(app, ["run", "--resume", str(cut), "-q"])
    assert r.exit_code == 0 and len(RunFolder.load(cut).rows) == 6


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_gives_the_same_rows(tiny, tmp_path, monkeypatch):
    killed, straight = tmp_path / "killed", tmp_path / "straight"
    common = [*SWEEP3, "--backend-file", BAD_FILE, "-b", "reference", "-b", "sdpa", "-b", "sleepy", "-q"]
    cmd = [sys.executable, "-c", "from attnbench.cli.app import app; app()", "run", str(tiny), "--out", str(killed), *common]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:
            f = killed / "rows.jsonl"
            if f.is_file() and len(f.read_text().splitlines()) >= 4:
                break
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    n_before = len(RunFolder.load(killed).rows)
    assert 4 <= n_before < 9
    assert json.loads((killed / "manifest.json").read_text())["status"] == "incomplete"
    with open(killed / "rows.jsonl", "a") as f:  # a line cut short by the kill
        f.write('{"scenario": "tiny", "case_id": "page_si')
    # the backend file must be named again: it runs code
    from attnbench.backend import registry

    monkeypatch.delitem(registry._EXTRA, "sleepy", raising=False)  # as in a fresh process
    r = cli.invoke(app, ["run", "--resume", str(killed), "-q"])
    assert r.exit_code == 2 and "--backend-file" in r.output and "sleepy" in r.output
    r = cli.invoke(app, ["run", "--resume", str(killed), "--backend-file", BAD_FILE, "-q"])
    assert r.exit_code == 0, r.output
    r = cli.invoke(app, ["run", str(tiny), "--out", str(straight), *common])
    assert r.exit_code == 0, r.output
    _same_rows(_rows(killed), _rows(straight))
    assert len(_rows(killed)) == 9 and len(RunFolder.load(killed).rows) == 9  # no duplicates, none lost


def test_resume_usage_errors(tiny, tmp_path):
    r = cli.invoke(app, ["run", "--resume", str(tmp_path / "nope"), "-q"])
    assert r.exit_code == 2 and "no such run folder" in r.output
    r = cli.invoke(app, ["run", str(tiny), "--resume", str(tmp_path), "-q"])
    assert r.exit_code == 2 and "give neither" in r.output
    r = cli.invoke(app, ["run", "-q"])
    assert r.exit_code == 2 and "--resume" in r.output
    r = cli.invoke(app, ["run", str(tiny), "--timeout", "0", "-q"])
    assert r.exit_code == 2 and "--timeout" in r.output


# -- output checks ------------------------------------------------------------------------------
def test_check_output_says_which():
    from attnbench.measure.poison import poison_fill
    from attnbench.workload.batch import Request

    b = make_batch([Request("decode", 1, 9), Request("prefill", 3, 2)])
    ref = torch.randn(b.q.shape)
    good = ref.clone()
    assert check_output(good, ref, b, 1e-5)[0] == "ok"
    assert "wrong shape" in check_output(good[:-1], ref, b, 1e-5)[1]
    assert "wrong dtype" in check_output(good.half(), ref, b, 1e-5)[1]
    assert "not a tensor" in check_output(None, ref, b, 1e-5)[1]
    nan = good.clone()
    nan[1, 2, 3] = float("inf")
    st, why, _, _ = check_output(nan, ref, b, 1e-5)
    assert st == "mismatch" and "1 NaN/Inf" in why and "never written" not in why
    part = good.clone()
    poison_fill(part[0])
    st, why, _, _ = check_output(part, ref, b, 1e-5)
    assert st == "mismatch" and "never written" in why and f"{part[0].numel()} of" in why
    st, why, _, _ = check_output(torch.zeros_like(good), ref, b, 1e-5)
    assert st == "mismatch" and "never written" in why and "0" in why
    for dt in (torch.float16, torch.bfloat16):
        t = torch.empty(5, dtype=dt)
        poison_fill(t)
        assert torch.isnan(t).all()
        from attnbench.measure.poison import count_poison

        assert count_poison(t) == 5 and count_poison(torch.full((5,), float("nan"), dtype=dt)) == 0


# -- memory estimate ---------------------------------------------------------------------------
def test_case_that_cannot_fit_is_skipped_with_estimate_and_available(monkeypatch):
    sf = load_text(TINY)
    monkeypatch.setattr(runner_mod, "_memory_available", lambda device: 1000)
    rows = list(Runner(sf, RunOptions(measure_ceilings=False)).rows())
    assert len(rows) == 4 and {r.status for r in rows} == {"skipped"}
    need = 3 * sf.cases[0].scenario.batch_spec().memory_bytes()
    assert need > 1000
    for r in rows:
        assert "needs about" in r.reason and "KiB" in r.reason and "1000 B available" in r.reason
    monkeypatch.setattr(runner_mod, "_memory_available", lambda device: 1 << 40)
    rows = list(Runner(sf, RunOptions(measure_ceilings=False, backends=["sdpa"])).rows())
    assert {r.status for r in rows} == {"ok"}


# -- file names from scenario names --------------------------------------------------------------
@pytest.mark.parametrize("name", ["../../etc/passwd", "/abs/path", "a\x00b", "..", ".", "", "a/../../b", "\\..\\x", "~/x", "con:x"])
def test_names_cannot_leave_the_run_folder(tmp_path, name):
    s = safe_name(name)
    assert s and "/" not in s and "\\" not in s and "\x00" not in s and ".." not in s and s not in (".", "..")
    root = tmp_path / "results"
    rf = RunFolder.create(root, name)
    assert rf.path.resolve().parent == root.resolve()


def test_no_unsafe_yaml_load_anywhere():
    import re

    pkg = Path(__file__).resolve().parent.parent
    for f in list((pkg / "attnbench").rglob("*.py")) + list((pkg / "backends").rglob("*.py")):
        text = f.read_text()
        assert not re.search(r"yaml\.(load|unsafe_load|full_load|load_all)\(", text), f
        assert "eval(" not in text.replace("model.eval(", "").replace(".eval()", ""), f


@pytest.mark.slow
@pytest.mark.parametrize("isolate", [False, True])
def test_malformed_rows_become_errors_saying_what_was_missing(tiny, tmp_path, isolate):
    """A backend that skips without a reason makes a malformed row: it is recorded as an
    error naming the missing field, in process and through the isolation parent alike."""
    out = tmp_path / "blank"
    args = ["run", str(tiny), "--out", str(out), "--set", "sweep={}", "--backend-file", BAD_FILE,
            "-b", "sdpa", "-b", "blank", "-q"] + (["--isolate"] if isolate else [])
    r = cli.invoke(app, args)
    assert r.exit_code == 1, r.output
    by = {row.backend: row for row in _frame(out).itertuples()}
    assert by["sdpa"].status == "ok"
    assert by["blank"].status == "error"
    assert by["blank"].reason == "malformed skipped row: a skipped row needs a reason"


def test_checked_passes_good_rows_and_fixes_bad_ones():
    from attnbench.store.row_parts import RowIdentity, RowTiming
    from attnbench.store.rows import Row, Status, checked

    good = Row(RowIdentity("s", "c", "b"), timing=RowTiming(median_ms=1.0, n=3, timing_method="cpu"))
    assert checked(good) is good and good.status is Status.OK
    for bad, words in [
        (Row(RowIdentity("s", "c", "b")), ["malformed ok row", "finite median_ms", "timing_method"]),
        (Row(RowIdentity("s", "c", "b"), status="mismatch"), ["malformed mismatch row", "needs a reason"]),
        (Row(RowIdentity("s", "c", "b"), timing=RowTiming(median_ms=float("nan"), n=4, timing_method="cpu")),
         ["finite median_ms"]),
    ]:
        row = checked(bad)
        assert row.status is Status.ERROR and row.problems() == []
        for w in words:
            assert w in row.reason, row.reason
    row = Row(RowIdentity("s", "c", "b"))
    row.status = "skipped"  # a plain string is turned into the member
    assert row.status is Status.SKIPPED


@pytest.mark.slow
def test_isolate_with_rounds_blames_the_backend_that_crashed(tiny, tmp_path):
    """timing.rounds > 1: a case's rows come out together, but the child reports each step, so a
    crash of the second backend is its own error row and the others are measured in a new child."""
    out = tmp_path / "rounds"
    names = ["sdpa", "segfault", "reference"]
    args = ["run", str(tiny), "--out", str(out), "--set", "sweep={}", "--set", "timing.rounds=2",
            "--isolate", "--backend-file", BAD_FILE, "-q"]
    for b in names:
        args += ["-b", b]
    r = cli.invoke(app, args)
    assert r.exit_code == 1, r.output
    df = _frame(out)
    assert sorted(df.backend) == sorted(names)
    by = {row.backend: row for row in df.itertuples()}
    assert by["segfault"].status == "error" and "SIGSEGV" in by["segfault"].reason, by["segfault"].reason
    for good in ("sdpa", "reference"):
        assert by[good].status == "ok", (good, by[good].reason)
        assert float(by[good].rel_err) < 1e-5 and int(by[good].n) >= 2
