"""Issue 25, data loss: every path a run writes is fixed at its start, a stopped and resumed
--save-tensors run keeps every backend's outputs, one line rule for rows.jsonl, a baseline
never overwrites its run, a failed write counts no half row, file names and case ids never
collide, and -k matches swept values whole."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.store.runfolder import RunFolder
from attnbench.store.tensors import case_tensor_path
from attnbench.workload.scenario import load_text
from attnbench.workload.select import parse_selector, unique_selector

from .test_cli import TINY

cli = CliRunner()
HOSTILE = str(Path(__file__).with_name("hostile_backends.py"))
CMD = [sys.executable, "-m", "attnbench"]


def test_a_backend_that_changes_directory_cannot_redirect_the_run(tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "run").mkdir(parents=True)
    (elsewhere / "run" / "keep.txt").write_text("not yours")
    monkeypatch.setenv("ATTNBENCH_TEST_CHDIR", str(elsewhere))
    r = cli.invoke(app, ["run", str(tiny), "--out", "run", "--save-tensors", "tensors", "--backend-file", HOSTILE,
                         "-b", "chdir", "-b", "sdpa", "-q"])
    assert r.exit_code == 0, r.output
    rf = RunFolder.load(tmp_path / "run")
    assert len(rf.rows) == 4 and rf.manifest.status == "complete"
    assert len(list((tmp_path / "tensors").glob("*.pt"))) == 2
    assert sorted(p.name for p in (elsewhere / "run").iterdir()) == ["keep.txt"]
    assert not (elsewhere / "tensors").exists()


@pytest.mark.slow
def test_save_tensors_sigterm_mid_case_then_resume_keeps_every_output(tiny, tmp_path):
    out, tensors = tmp_path / "run", tmp_path / "tensors"
    env = {**__import__("os").environ, "ATTNBENCH_TEST_MARK": str(tmp_path / "mark")}
    args = ["--backend-file", HOSTILE, "-q"]
    p = subprocess.run([*CMD, "run", str(tiny), "--out", str(out), "--save-tensors", str(tensors), "--set", "sweep={}",
                        "-b", "reference", "-b", "sdpa", "-b", "term_once", *args], capture_output=True, text=True,
                       env=env, timeout=300)
    assert p.returncode == 143, p.stderr
    p = subprocess.run([*CMD, "run", "--resume", str(out), *args], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    [f] = list(tensors.glob("*.pt"))
    blob = torch.load(f, weights_only=True)
    assert sorted(blob["outputs"]) == ["reference", "sdpa", "term_once"]
    for name, o in blob["outputs"].items():
        assert torch.allclose(o, blob["outputs"]["reference"], rtol=1e-4, atol=1e-5), name
    assert not [x for x in tensors.iterdir() if x.name.endswith(".tmp")]


def test_a_lone_carriage_return_is_one_broken_line_for_reader_and_rewriter(tiny, tmp_path):
    out = tmp_path / "run"
    r = cli.invoke(app, ["run", str(tiny), "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    good = (out / "rows.jsonl").read_bytes().split(b"\n")[:-1]
    assert len(good) == 4
    garbage = b'{"scenario": "tiny", "cut\rhere'
    (out / "rows.jsonl").write_bytes(b"\n".join(good[:2] + [garbage] + good[2:]) + b"\n")
    man = json.loads((out / "manifest.json").read_text())
    man["status"] = "incomplete"
    (out / "manifest.json").write_text(json.dumps(man))
    r = cli.invoke(app, ["run", "--resume", str(out), "-q"])
    assert r.exit_code == 0, r.output
    assert (out / "rows.broken.jsonl").read_bytes() == garbage + b"\n"
    assert (out / "rows.jsonl").read_bytes().split(b"\n")[:-1] == good


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rows.jsonl", "manifest.json", "results.csv"])
def test_baseline_refuses_to_overwrite_its_own_run(tiny, tmp_path, name):
    out = tmp_path / "run"
    assert cli.invoke(app, ["run", str(tiny), "--out", str(out), "-q"]).exit_code == 0
    before = (out / name).read_bytes()
    r = cli.invoke(app, ["baseline", str(out), "--to", str(out / name)])
    assert r.exit_code == 2 and "of the run folder" in r.output, r.output
    assert (out / name).read_bytes() == before
    r = cli.invoke(app, ["baseline", str(out), "--to", str(out / "baseline.json"), "--allow-few-rounds"])  # beside them: fine
    assert r.exit_code == 0, r.output


ADD_TWO_ROWS = """
import sys
from attnbench.store.row_parts import RowIdentity
from attnbench.store.rows import Row
from attnbench.store.runfolder import RunFolder
rf = RunFolder(sys.argv[1])
rf.add(Row(RowIdentity("s", "c", "a"), status="skipped", reason="x"))
try:
    rf.add(Row(RowIdentity("s", "c", "b"), status="skipped", reason="y" * 20000))
except OSError as e:
    print(len(rf.rows), e.filename, e.strerror)
"""


def test_a_failed_row_write_names_the_file_and_counts_no_half_row(tmp_path):
    """RLIMIT_FSIZE: the second row's write fails the way a full disk does."""
    import resource
    import signal

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 13, 1 << 13))

    p = subprocess.run([sys.executable, "-c", ADD_TWO_ROWS, str(tmp_path)], capture_output=True, text=True,
                       preexec_fn=limit, timeout=120)
    assert p.returncode == 0, p.stderr
    kept, path, why = p.stdout.split(" ", 2)
    assert kept == "1" and path == str(tmp_path / "rows.jsonl") and why.strip(), p.stdout
    assert len(RunFolder.load(tmp_path).rows) == 1
    assert (tmp_path / "rows.jsonl").read_bytes().count(b"\n") == 1  # no half line left behind


def test_tensor_files_of_long_case_ids_never_collide(tmp_path):
    a, b = "x=" + "a" * 100 + "1", "x=" + "a" * 100 + "2"
    pa, pb = case_tensor_path(tmp_path, a), case_tensor_path(tmp_path, b)
    assert pa != pb and len(pa.name) <= 124
    assert case_tensor_path(tmp_path, "a/b") != case_tensor_path(tmp_path, "a-b")  # slugged alike
    assert case_tensor_path(tmp_path, "page_size=4").name == "page_size=4.pt"


def test_swept_values_are_not_cut_into_misleading_or_equal_ids():
    models = [{"num_q_heads": 32, "num_kv_heads": 8, "head_dim": d, "dtype": "float32"} for d in (64, 128)]
    text = TINY.replace("sweep:\n  kv_cache.page_size: [4, 8]", "sweep:\n  model: " + json.dumps(models))
    ids = [c.case_id for c in load_text(text, "t.yaml").cases]
    assert len(set(ids)) == 2 and "head-dim-128" in ids[1] and "head-dim-64" in ids[0], ids
    long = [{"num_q_heads": 4, "num_kv_heads": 2, "head_dim": 16, "scale": 0.125 + i * 1e-9, "dtype": "float32"}
            for i in range(2)]
    text = TINY.replace("sweep:\n  kv_cache.page_size: [4, 8]", "sweep:\n  model: " + json.dumps(long))
    ids = [c.case_id for c in load_text(text, "t.yaml").cases]
    assert len(set(ids)) == 2 and not ids[0].startswith("000-"), ids


def test_k_matches_swept_values_whole():
    pick = parse_selector("count=1")
    assert pick("count=1,context=4k", "sdpa") and not pick("count=16,context=4k", "sdpa")
    assert pick("batch.0.count=1", "sdpa") and not pick("batch.0.count=10", "sdpa")
    assert parse_selector("sdp")("count=1", "sdpa")  # a word without '=' is still a substring
    assert parse_selector("count=1 and not flex")("count=1", "sdpa")
    assert unique_selector("seed=1", ["seed=1", "seed=10"]) == "seed=1"


def test_k_count_1_runs_only_count_1(tiny, tmp_path):
    text = TINY.replace("kv_cache.page_size: [4, 8]", "batch.0.count: [1, 16]")
    p = tmp_path / "counts.yaml"
    p.write_text(text)
    r = cli.invoke(app, ["run", str(p), "--list", "-k", "count=1", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert "count=16" not in r.output and "count=1" in r.output


def test_a_new_run_into_the_same_tensors_folder_keeps_no_output_of_the_old_run(tiny, tmp_path):
    # while the old run's folder exists its case files are its own: refused (issue 37); once it
    # is gone, a new run's files replace its orphans and never merge with them
    import shutil

    tensors = tmp_path / "tensors"
    for out, backends, code in (("one", ["reference", "sdpa"], 0), ("two", ["reference"], 2), ("two", ["reference"], 0)):
        if out == "two" and code == 0:
            shutil.rmtree(tmp_path / "one")
        args = ["run", str(tiny), "--out", str(tmp_path / out), "--save-tensors", str(tensors), "--set", "sweep={}", "-q"]
        r = cli.invoke(app, args + [x for b in backends for x in ("-b", b)])
        assert r.exit_code == code, r.output
        if code == 2:
            assert "holds the case files of the run" in r.output, r.output
            [f] = list(tensors.glob("*.pt"))
            assert sorted(torch.load(f, weights_only=True)["outputs"]) == ["reference", "sdpa"]
    [f] = list(tensors.glob("*.pt"))
    blob = torch.load(f, weights_only=True)
    assert sorted(blob["outputs"]) == ["reference"] and blob["run"] == str(tmp_path / "two")
