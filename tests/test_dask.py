"""--executor dask (issue 15): cases on Dask workers, one run folder, the same rows.

On this CPU machine: a local cluster of 2 CPU workers gives the same (case, backend) keys and
statuses as the local executor on the shipped CPU scenarios; a worker that dies mid-case
(os._exit, SIGKILL) loses no finished row and leaves error rows naming it; --resume queues
only what is unfinished; without dask, --executor dask says how to install it.
"""
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

pytest.importorskip("distributed")

from attnbench.backend import registry  # noqa: E402
from attnbench.cli.app import app  # noqa: E402
from attnbench.execute.cases import default_backends  # noqa: E402
from attnbench.execute import dask_driver  # noqa: E402
from attnbench.execute.case_book import MAX_ATTEMPTS, Attempt, CaseBook  # noqa: E402
from attnbench.execute import events  # noqa: E402
from attnbench.execute.dask_cluster import plan_local_workers, start_local  # noqa: E402
from attnbench.store.row_parts import RowIdentity, RowTiming
from attnbench.store.rows import Row  # noqa: E402
from attnbench.workload.scenario import load_text  # noqa: E402

from .test_cli import TINY  # noqa: E402

cli = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
DYING = str(Path(__file__).with_name("dying_backends.py"))
FAST = ["--set", "timing.min_runs=1", "--set", "timing.max_runs=3", "--warmup-ms", "0.5", "--measure-ms", "2", "-q"]


@pytest.fixture(scope="module")
def cluster():
    """One local cluster of 2 CPU workers (1 torch thread each) for the tests of this module."""
    c = start_local(plan_local_workers("cpu", 2), {})
    yield c
    c.close()


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines() if line.strip()]


def _keys_statuses(folder: Path) -> dict:
    return {(r["case_id"], r["backend"]): r["status"] for r in _rows(folder)}


# -- flags ------------------------------------------------------------------------------------
def test_without_dask_the_dask_executor_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    r = cli.invoke(app, ["run", str(ROOT / "attnbench/scenarios/ci-gate.yaml"), "--executor", "dask", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2, r.output
    assert "pip install 'attnbench[dask]'" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "x").exists()  # refused before anything started


@pytest.mark.parametrize("args, words", [
    (["--workers", "2"], "goes with --executor dask"),
    (["--executor", "dask", "--workers", "2", "--scheduler", "tcp://127.0.0.1:1"], "give one of them"),
    (["--executor", "dask", "--isolate"], "drop --isolate"),
    (["--executor", "dask", "--workers", "0"], "must be >= 1"),
    (["--executor", "ray"], "choose one of local, dask"),
    (["--executor", "dask", "--resource", "=2"], "NAME=AMOUNT"),
])
def test_executor_flags_that_do_not_go_together_exit_2(tmp_path, args, words):
    r = cli.invoke(app, ["run", str(ROOT / "attnbench/scenarios/ci-gate.yaml"), "--out", str(tmp_path / "x"), "-q", *args])
    assert r.exit_code == 2, r.output
    assert words in r.output and "Traceback" not in r.output


# -- the driver's book (no cluster) ---------------------------------------------------------
def _case():
    return load_text(TINY, "tiny.yaml").cases[0]


def _row_event(case, backend, status="ok"):
    row = Row(RowIdentity(scenario="tiny", case_id=case.case_id, backend=backend), status=status,
              reason="" if status == "ok" else "x", timing=RowTiming(median_ms=1.0, n=3, timing_method="events"))
    return events.row_event(row)


def test_book_blames_the_running_backend_and_requeues_the_rest():
    case = _case()
    book = CaseBook("tiny")
    a = Attempt(case, ["sdpa", "bad", "reference"], 1, "t")
    for ev in (events.event(events.READY, name="cpu1", address="tcp://w:1", host="h", pid=7),
               events.event(events.SETUP, backends=a.backends), events.event(events.START, backend="sdpa"),
               _row_event(case, "sdpa"), events.event(events.START, backend="bad")):
        book.on_event(a, ev)
    rows, again = book.lost(a)
    assert [(r.id.backend, r.status) for r in rows] == [("bad", "error")]
    assert "worker 'cpu1' (tcp://w:1, pid 7 on h)" in rows[0].reason and "while running this backend" in rows[0].reason
    assert again == ["reference"]
    assert book.on_event(a, _row_event(case, "sdpa")) is None  # a row is recorded once


def test_book_gives_up_a_case_after_max_attempts():
    case = _case()
    book = CaseBook("tiny")
    for n in range(1, MAX_ATTEMPTS + 1):  # the worker died each time before the task began
        rows, again = book.lost(Attempt(case, ["sdpa", "reference"], n, "t"), "tcp://w:1")
        if n < MAX_ATTEMPTS:
            assert rows == [] and again == ["sdpa", "reference"]
    assert again == [] and [r.status for r in rows] == ["error", "error"]
    assert "before it started" in rows[0].reason and "tcp://w:1" in rows[0].reason


def test_book_setup_death_fails_every_backend_and_a_rounds_death_the_running_one():
    case = _case()
    book = CaseBook("tiny")
    a = Attempt(case, ["sdpa", "reference"], 1, "t")
    book.on_event(a, events.event(events.READY, name="w"))
    book.on_event(a, events.event(events.SETUP, backends=a.backends))
    rows, again = book.lost(a)
    assert again == [] and all("building the case's batch" in r.reason for r in rows) and len(rows) == 2
    book = CaseBook("tiny")
    a = Attempt(case, ["sdpa", "reference"], 1, "t")
    book.on_event(a, events.event(events.READY, name="w"))
    for b in ("sdpa", "reference", "sdpa"):  # timing.rounds: the backends take turns, one step each
        book.on_event(a, events.event(events.START, backend=b))
        if b == "reference":
            book.on_event(a, events.event(events.END, backend=b))
    rows, again = book.lost(a)  # died in sdpa's second round: sdpa is blamed, reference goes on elsewhere
    assert [(r.id.backend, r.status) for r in rows] == [("sdpa", "error")] and again == ["reference"]


# -- a real local cluster ---------------------------------------------------------------------
@pytest.mark.slow
def test_local_cluster_of_two_workers_matches_the_local_executor_on_quickstart(tmp_path):
    scen = str(ROOT / "attnbench/scenarios/quickstart.yaml")
    local, dask = tmp_path / "local", tmp_path / "dask"
    # the quickstart's default: every built-in backend available here (plugins that other tests
    # loaded into this process are not: the workers are fresh processes)
    names = [a for n in default_backends() if n in registry.BUILTIN for a in ("-b", n)]
    r = cli.invoke(app, ["run", scen, "--out", str(local), *names, *FAST])
    assert r.exit_code == 0, r.output
    r = cli.invoke(app, ["run", scen, "--out", str(dask), "--executor", "dask", "--workers", "2", *names, *FAST])
    assert r.exit_code == 0, r.output
    assert _keys_statuses(dask) == _keys_statuses(local)
    man = json.loads((dask / "manifest.json").read_text())
    assert man["status"] == "complete" and man["executor"]["kind"] == "dask"
    workers = man["environment"]["workers"]
    assert sorted(w["name"] for w in workers) == ["cpu0", "cpu1"] and len({w["pid"] for w in workers}) == 2
    for row in _rows(dask):  # every row names its device, as the local run's do
        assert row["device"] == _rows(local)[0]["device"] and row["device_id"].endswith(":cpu")


@pytest.mark.slow
def test_dask_matches_local_on_the_ci_gate_scenario(cluster, tmp_path):
    scen = str(ROOT / "attnbench/scenarios/ci-gate.yaml")
    local, dask = tmp_path / "local", tmp_path / "dask"
    assert cli.invoke(app, ["run", scen, "--out", str(local), "-q"]).exit_code == 0
    r = cli.invoke(app, ["run", scen, "--out", str(dask), "-q", "--executor", "dask", "--scheduler", cluster.client.scheduler.address])
    assert r.exit_code == 0, r.output
    assert _keys_statuses(dask) == _keys_statuses(local) and len(_rows(dask)) == 2
    assert {r["device_id"] for r in _rows(dask)} == {r["device_id"] for r in _rows(local)}
    # the gate's comparison works on a dask run folder as on a local one
    r = cli.invoke(app, ["check", str(dask), "--baseline", str(local), "--max-slowdown", "500%", "--min-delta-us", "1000"])
    assert r.exit_code == 0, r.output


@pytest.mark.slow
def test_a_worker_that_dies_mid_case_loses_no_finished_row(cluster, tmp_path):
    """sdpa finishes, `exits` os._exit()s its worker, `sigkills` SIGKILLs the next one,
    reference runs on a third task: four rows, two errors naming the dead workers."""
    scen = tmp_path / "tiny.yaml"
    scen.write_text(TINY)
    out = tmp_path / "run"
    args = ["run", str(scen), "--out", str(out), "--set", "sweep={}", "-q", "--backend-file", DYING,
            "--executor", "dask", "--scheduler", cluster.client.scheduler.address]
    for b in ("sdpa", "exits", "sigkills", "reference"):
        args += ["-b", b]
    r = cli.invoke(app, args)
    assert r.exit_code == 1, r.output  # error rows: exit 1, and the run went on to the end
    rows = _rows(out)
    assert [r["backend"] for r in rows] == ["sdpa", "exits", "sigkills", "reference"]
    by = {r["backend"]: r for r in rows}
    assert by["sdpa"]["status"] == "ok" and by["sdpa"]["n"] >= 1 and by["sdpa"]["rel_err"] < 1e-5
    assert by["reference"]["status"] == "ok"
    for bad in ("exits", "sigkills"):
        reason = by[bad]["reason"]
        assert by[bad]["status"] == "error" and "died while running this backend" in reason, reason
        assert "worker 'cpu" in reason and "tcp://127.0.0.1:" in reason and "pid " in reason
    assert by["exits"]["reason"] != by["sigkills"]["reason"]  # two workers (or restarts) died
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
    # the nannies brought the workers back: the cluster still has 2
    cluster.client.wait_for_workers(2, timeout=120)


@pytest.mark.slow
def test_resume_on_dask_queues_only_unfinished_cases(cluster, tmp_path, monkeypatch):
    scen = tmp_path / "tiny.yaml"
    scen.write_text(TINY.replace("kv_cache.page_size: [4, 8]", "kv_cache.page_size: [4, 8, 16]"))
    out = tmp_path / "run"
    assert cli.invoke(app, ["run", str(scen), "--out", str(out), "-q"]).exit_code == 0
    lines = (out / "rows.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) == 6
    kept = lines[:3]  # case page_size=4 complete, page_size=8 half done, page_size=16 not started
    (out / "rows.jsonl").write_text("".join(kept))
    man = json.loads((out / "manifest.json").read_text())
    man["status"] = "incomplete"
    (out / "manifest.json").write_text(json.dumps(man))
    submitted = []
    real = dask_driver.DaskRunner._submit
    monkeypatch.setattr(dask_driver.DaskRunner, "_submit",
                        lambda self, a, *rest: (submitted.append((a.case.case_id, list(a.backends))), real(self, a, *rest))[1])
    r = cli.invoke(app, ["run", "--resume", str(out), "-q", "--executor", "dask", "--scheduler", cluster.client.scheduler.address])
    assert r.exit_code == 0, r.output
    done = [(json.loads(x)["case_id"], json.loads(x)["backend"]) for x in kept]
    expected = sorted((c, b) for c in ("page_size=4", "page_size=8", "page_size=16") for b in ("reference", "sdpa")
                      if (c, b) not in done)
    assert sorted((c, b) for c, bs in submitted for b in bs) == expected
    assert len(submitted) == 2  # the two unfinished cases, the complete one not at all
    after = (out / "rows.jsonl").read_text().splitlines(keepends=True)
    assert after[:3] == kept and len(after) == 6
    assert len({(json.loads(x)["case_id"], json.loads(x)["backend"]) for x in after}) == 6
    man = json.loads((out / "manifest.json").read_text())
    assert man["status"] == "complete" and man["resumed"][-1]["executor"]["kind"] == "dask"
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 6 and set(df.status) == {"ok"}


@pytest.mark.slow
def test_compare_refuses_a_case_measured_on_another_device_in_each_run():
    """Two runs over the same two GPU models, but case a on the H100 in one and the H200 in the
    other: the device sets agree, the rows do not."""
    from attnbench.analyze.compare import CompareError, ensure_rows_same_device

    def rows(devs):
        return [Row(RowIdentity(scenario="s", case_id=c, backend="sdpa", device=d),
                    timing=RowTiming(median_ms=1.0, n=1, timing_method="events"))
                for c, d in zip("ab", devs)]

    before, after = rows(["H100", "H200"]), rows(["H200", "H100"])
    with pytest.raises(CompareError, match="2 row.s. were measured on different devices.*--allow-cross-device"):
        ensure_rows_same_device(after, before, allow_cross_device=False)
    ensure_rows_same_device(after, before, allow_cross_device=True)
    ensure_rows_same_device(before, rows(["H100", "H200"]), allow_cross_device=False)
