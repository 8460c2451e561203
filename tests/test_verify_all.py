"""The GPU verification scripts, exercised on the CPU (issue 32): scripts/gpu/gpulib.py (route
specs, the batch shrinking of the FlashInfer warm-up, the status table), flashinfer_warmup.py's
worker protocol and budget, verify_all.py end to end (a wrong backend, a slow one cut by the
budget and finished by --resume, check_saved.py on what was saved, --pick), and the
--save-tensors writes a row without an output no longer makes. The front door that runs them,
scripts/gpu/validate.sh: tests/test_validate_script.py."""
import json
import re
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.workload.batch import materialize
from attnbench.workload.scenario import load

from .test_cli import TINY

ROOT = Path(__file__).resolve().parent.parent
GPU = ROOT / "scripts" / "gpu"
sys.path.insert(0, str(GPU))
import gpulib  # noqa: E402


def _env(**kw) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TRITON_INTERPRET", None)
    env.update(kw)
    return env


def test_route_specs_cover_every_route_option():
    from attnbench.backends.flashinfer_routes import ROUTES

    fi = gpulib.route_specs("flashinfer")
    assert fi[0] == "flashinfer" and "flashinfer:cascade=off" in fi
    assert {f"flashinfer:route={r}" for r in ROUTES if r != "auto"} <= set(fi)
    assert gpulib.route_specs("flex") == ["flex", "flex:mask=dense", "flex:kernel=flash"]
    assert gpulib.route_specs("flash-attn4") == ["flash-attn4", "flash-attn4:trees=split"]
    assert gpulib.route_specs("sdpa") == ["sdpa"]
    # triton: one spec per route it declares (each forced route runs, or skips with its reasons)
    from attnbench.backend import get_backend_class

    opt = get_backend_class("triton").options.get("route")
    routes = {f"triton:route={r}" for r in (opt.choices if opt else ()) if r != opt.declared_default()}
    assert gpulib.route_specs("triton")[0] == "triton" and set(gpulib.route_specs("triton")[1:]) == routes


@pytest.mark.slow
def test_shrink_keeps_what_decides_the_kernels():
    """Every GPU scenario's cases shrink to a few pages per request with the same signature, and
    FlashInfer takes the same route (every route's reasons and auto's choice) on the small batch."""
    from attnbench.backends.flashinfer_routes import ROUTES, auto_route, facts_of, route_reasons

    checked = 0
    for path in gpulib.shipped_scenarios():
        if gpulib.pinned_to_cpu(path):
            continue
        for case in load(path).cases:
            spec = case.scenario.batch_spec()
            small = gpulib.shrink(spec)
            assert gpulib.kernel_signature("x", small) == gpulib.kernel_signature("x", spec), (path.stem, case.case_id)
            assert small.memory_bytes() <= min(spec.memory_bytes(), 128 << 20), (path.stem, case.case_id)
            assert gpulib.spec_from_json(json.loads(json.dumps(gpulib.spec_to_json(small)))) == small
            if spec.memory_bytes() > 40 << 20 or spec.attention == "mla":
                continue
            f, g = facts_of(materialize(spec, 0)), facts_of(materialize(small, 0))
            assert auto_route(f) == auto_route(g), (path.stem, case.case_id)
            for r in ROUTES[1:]:
                assert bool(route_reasons(r, f)) == bool(route_reasons(r, g)), (path.stem, case.case_id, r)
            checked += 1
    assert checked >= 10


def test_status_table_counts_and_reasons():
    from attnbench.store.row_parts import RowIdentity
    from attnbench.store.rows import Row, Status

    rows = [Row(RowIdentity("s1", "a", "sdpa")), Row(RowIdentity("s1", "b", "sdpa"), Status.SKIPPED, "page size"),
            Row(RowIdentity("s1", "a", "flex"), Status.MISMATCH,
                "rel err 0.3"), Row(RowIdentity("s2", "a", "flex"), Status.SKIPPED, "page size")]
    cells = gpulib.cells_of(rows, [{"scenario": "s1", "backend": "flex", "ok": False}])
    lines, ids = gpulib.status_table(cells)
    assert ids == {"page size": "R1"}
    text = "\n".join(lines)
    assert "| flex | s1 | 1 | 0 | **1** | 0 | 0 | 0 ok, **1 off** |" in text
    assert "| sdpa | s1 | 2 | 1 | 0 | 0 | 1 (R1×1) |" in text
    assert gpulib.legend(ids) == ["- R1: page size"]
    assert gpulib.failed_rows(rows) == ["s1 | a | flex: mismatch: rel err 0.3"]


@pytest.mark.slow
def test_warmup_worker_protocol_and_budget(tmp_path):
    """The warm-up's workers on the CPU (sdpa stands in for FlashInfer): every distinct item ok;
    with no time, every item is cut and the workers are gone."""
    cmd = [sys.executable, str(GPU / "flashinfer_warmup.py"), "--scenarios", "quickstart", "variants-cpu",
           "--specs", "sdpa,flex", "--device", "cpu", "--procs", "2", "--log", str(tmp_path / "w.log")]
    res = subprocess.run(cmd + ["--budget-s", "240", "--jsonl", str(tmp_path / "w.jsonl")], capture_output=True,
                         text=True, env=_env(), timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    recs = [json.loads(x) for x in (tmp_path / "w.jsonl").read_text().splitlines()]
    assert recs and {r["status"] for r in recs} == {"ok"}, recs
    assert {r["spec"] for r in recs} == {"sdpa", "flex"}
    assert len(recs) < 2 * 6  # quickstart's two page sizes and variants-cpu's four cases, deduplicated
    res = subprocess.run(cmd + ["--budget-s", "0.01"], capture_output=True, text=True, env=_env(), timeout=300)
    assert res.returncode == 0 and "cut" in res.stdout, res.stdout + res.stderr



@pytest.mark.slow
def test_warmup_of_the_tests_batches_reads_every_spec_they_name(tmp_path):
    """--tests brings specs of the tests' own (flashinfer:route=auto) beside --specs' routes: each
    is asked whether it can run (on the GPU machine the lookup failed with a KeyError and nothing
    was warmed in two test jobs); here FlashInfer is not installed, so nothing is built."""
    res = subprocess.run([sys.executable, str(GPU / "flashinfer_warmup.py"), "--tests", "--log", str(tmp_path / "w.log")],
                         capture_output=True, text=True, env=_env(), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "distinct kernel sets" in res.stdout and "nothing to build" in res.stdout

WRONG_AND_SLOW = textwrap.dedent('''
    import os, time
    from attnbench.backend import Backend

    class _Good(Backend):
        name = "_verify_good_base"
        def plan(self, batch):
            from attnbench.workload.reference import reference_attention
            self.out = reference_attention(batch)[0].to(batch.dtype)
            return batch
        def run(self, batch):
            return self.out.clone()

    class Wrong(_Good):
        name = "wrong"
        def run(self, batch):
            return self.out * 1.5

    class Slow(_Good):
        name = "slow"
        def plan(self, batch):
            time.sleep(float(os.environ.get("SLOW_S", "0")))
            return super().plan(batch)
''')


@pytest.mark.slow
def test_verify_all_cuts_a_slow_job_and_resume_finishes_it(tmp_path):
    """quickstart through sdpa, a wrong backend and a slow one: the wrong one is a mismatch row
    and its saved outputs are off (check_saved.py); the slow job is cut at --job-max-s, keeping
    the rows it finished; --resume finishes it; the table counts all of it."""
    bf = tmp_path / "wrong_slow.py"
    bf.write_text(WRONG_AND_SLOW)
    work, out = tmp_path / "work", tmp_path / "out"
    base = [sys.executable, str(GPU / "verify_all.py"), "--out", str(out), "--work", str(work), "--device", "cpu",
            "--save-root", str(tmp_path / "tensors"), "--scenarios", str(ROOT / "attnbench/scenarios/quickstart.yaml"),
            "--specs", "sdpa,wrong,slow", "--backend-file", str(bf), "--workers", "1", "--budget-s", "500"]
    res = subprocess.run(base + ["--job-max-s", "40"], capture_output=True, text=True, env=_env(SLOW_S="300"), timeout=900)
    table = (out / "verify_table.md").read_text()
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]  # the mismatch outranks the cut
    cut = "quickstart — cut at 40 s (the job limit)"
    assert f"| wrong | {cut} | 1/2 | 0 | **1** | 0 | 0 | 0 ok, **1 off** |" in table, table
    assert f"| sdpa | {cut} | 1/2 | 1 | 0 | 0 | 0 | 1 ok |" in table, table
    assert f"| slow | {cut} | 0/2 | 0 | 0 | 0 | 0 | - |" in table, table
    assert "- quickstart--main: cut at 40 s (the job limit)" in table
    assert not list((tmp_path / "tensors").rglob("*.pt"))  # checked, then deleted

    res = subprocess.run(base + ["--job-max-s", "300", "--resume"], capture_output=True, text=True, env=_env(SLOW_S="0"),
                         timeout=900)
    table = (out / "verify_table.md").read_text()
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert "| slow | quickstart | 2 | 2 | 0 | 0 | 0 |" in table, table
    assert "| sdpa | quickstart | 2 | 2 | 0 | 0 | 0 |" in table, table
    assert "| wrong | quickstart | 2 | 0 | **2** |" in table, table
    rows = (out / "verify_rows.csv").read_text().splitlines()
    assert len(rows) == 1 + 6


@pytest.mark.slow
def test_verify_all_names_a_scenario_that_is_not_there_without_a_traceback(tmp_path):
    """A --scenarios path that does not exist (an unexpanded glob, say) ends the run with exit 2 and the
    loader's message naming the path, not a traceback."""
    missing = tmp_path / "rand" / "*.yaml"
    res = subprocess.run([sys.executable, str(GPU / "verify_all.py"), "--out", str(tmp_path / "out"), "--work",
                          str(tmp_path / "work"), "--device", "cpu", "--scenarios", str(missing), "--specs", "sdpa"],
                         capture_output=True, text=True, env=_env(), timeout=300)
    assert res.returncode == 2, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"verify_all: {missing}: no such scenario file" in res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr


@pytest.mark.slow
def test_verify_all_pick_runs_only_the_cases_it_matches(tmp_path):
    """--pick (attnbench run -k) finishes a cut job on a fresh machine: only the matched cases run,
    and the table counts those (1 of 1, not 1 of 2 as a cut job would read)."""
    res = subprocess.run([sys.executable, str(GPU / "verify_all.py"), "--out", str(tmp_path / "out"), "--work",
                          str(tmp_path / "work"), "--device", "cpu", "--workers", "2", "--pick", "page_size=16",
                          "--specs", "sdpa", "--save-root", str(tmp_path / "t"), "--scenarios",
                          str(ROOT / "attnbench/scenarios/quickstart.yaml"), str(ROOT / "attnbench/scenarios/mla-tiny.yaml")],
                         capture_output=True, text=True, env=_env(), timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-3000:]
    table = (tmp_path / "out" / "verify_table.md").read_text()
    assert "| sdpa | quickstart | 1 | 1 | 0 | 0 | 0 | 1 ok |" in table, table
    assert "| sdpa | mla-tiny | 1 | 1 | 0 | 0 | 0 | 1 ok |" in table, table
    rows = (tmp_path / "out" / "verify_rows.csv").read_text()
    assert "page_size=64" not in rows and "page_size=1," not in rows, rows


def test_save_tensors_skip_rewrites_for_rows_without_output(tmp_path, monkeypatch):
    """A skipped row adds no output: the case's file is not written again for it."""
    import attnbench.execute.runner as runner

    calls = []
    real = runner.save_case_tensors
    monkeypatch.setattr(runner, "save_case_tensors", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    s = tmp_path / "t.yaml"
    s.write_text(TINY)
    r = CliRunner().invoke(app, ["run", str(s), "--out", str(tmp_path / "run"), "-b", "sdpa", "-b", "flash-attn", "-b", "reference",
                                 "--save-tensors", str(tmp_path / "saved"), "-q", "--set", "sweep={}"])
    assert r.exit_code == 0, r.output
    assert len(calls) == 2  # sdpa, reference; flash-attn's skipped row wrote nothing
    import torch

    blob = torch.load(next((tmp_path / "saved").glob("*.pt")), weights_only=True)
    assert set(blob["outputs"]) == {"sdpa", "reference"}


@pytest.mark.slow
def test_flashinfer_jobs_go_last_and_the_warmup_command_parses(tmp_path, monkeypatch):
    """verify_all.py's pool runs FlashInfer's jobs after every other (the warm-up builds their
    kernels meanwhile); the warm-up command it builds parses (run here with --list)."""
    import argparse
    import time as _time

    import verify_all as va

    args = argparse.Namespace(t0=_time.time(), work=tmp_path, warm_s=300, warm_procs=3, set=[], workers=2)
    st = va.State(args, _time.time() + 600, [])
    started, popen = [], subprocess.Popen
    monkeypatch.setattr(va.subprocess, "Popen", lambda cmd, **kw: started.append(cmd) or popen(["true"]))
    (tmp_path / "logs").mkdir()
    (tmp_path / "checks").mkdir()
    va.start_warmup(st, [ROOT / "attnbench/scenarios/decode-llama3-8b.yaml"], gpulib.route_specs("flashinfer"))
    monkeypatch.undo()
    res = subprocess.run(started[0] + ["--list"], capture_output=True, text=True, env=_env(), timeout=300)
    assert res.returncode == 0 and "flashinfer:route=xqa" in res.stdout, res.stdout + res.stderr

    order = []
    monkeypatch.setattr(va, "run_job", lambda st_, job: order.append(job.key))
    st.jobs = [va.Job(Path("a.yaml"), "a", lane, ["x"], n, True, key=f"{n}--{lane}")
               for lane, n in (("flashinfer", 9), ("main", 1), ("flex", 2), ("main", 3))]
    st.jobs.sort(key=lambda j: (j.lane == "flashinfer", -j.weight))  # as plan_jobs orders them
    va.pool(st)
    assert order == ["2--flex", "3--main", "1--main", "9--flashinfer"]
    assert {j.status for j in st.jobs} == {"running"}  # run_job (stubbed here) sets the end status


def test_junit_summary_names_a_module_skipped_whole(tmp_path):
    """A module skipped at collection (an optional library missing on the GPU machine) is listed
    with its reason, not as a bare "collection skipped"."""
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<testsuites><testsuite><testcase classname="" name="tests.test_dask"><skipped message="collection skipped">'
        "('/r/tests/test_dask.py', 16, \"Skipped: could not import 'distributed': No module named 'distributed'\")"
        '</skipped></testcase><testcase classname="tests.t" name="test_a"/>'
        '<testcase classname="tests.t" name="test_b"><skipped message="flex: no window here"/></testcase>'
        "</testsuite></testsuites>")
    got = gpulib.junit_summary(xml)
    assert got[0] == "pytest -m gpu: passed 1, failure 0, error 0, skipped 2"
    assert ("skipped 1x: tests.test_dask (the whole module): could not import 'distributed': "
            "No module named 'distributed'") in got
    assert "skipped 1x: flex: no window here" in got


def test_junit_summary_counts_tests_cut_mid_run_as_unfinished(tmp_path):
    """validate.py's tests lane cuts pytest at its budget; xdist then writes a nameless <testcase/> for each
    test a worker was running (seen on an H200, 2026-11-27): those did not pass."""
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="tests.t" name="test_a" time="1"/>'
                   '<testcase time="0.001" /><testcase time="0.001" /></testsuite></testsuites>')
    got = gpulib.junit_summary(xml)
    assert got[0] == ("pytest -m gpu: passed 1, failure 0, error 0, skipped 0, "
                      "unfinished 2 (the run was cut while they ran)")


def test_warmup_pick_keeps_only_the_picked_rows():
    """--pick (verify_all.py's, passed on to the warm-up) builds only the modules of the rows
    the job will run: a job that finishes cut rows on a fresh machine does not compile every case."""
    sys.path.insert(0, str(GPU))
    import flashinfer_warmup

    scen = ["quickstart", "variants-cpu"]
    every = flashinfer_warmup.scenario_items(scen, ["sdpa", "flex"], [])
    picked = flashinfer_warmup.scenario_items(scen, ["sdpa", "flex"], [], "flex")
    assert every and picked
    assert {s for s, _b, _l in picked} == {"flex"}
    assert len(picked) == len(every) // 2
    assert flashinfer_warmup.scenario_items(scen, ["sdpa"], [], "flex") == []
