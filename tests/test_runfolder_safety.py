"""Issue 13, run folders: one run per folder (refused when taken, locked while written),
readers that skip broken lines loudly, resumes that check before they write, and places that
cannot be written reported as messages."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.store.runfolder import RunFolder, atomic_write


cli = CliRunner()
BAD_FILE = str(Path(__file__).with_name("misbehaving_backends.py"))
ONE_CASE = ["--set", "sweep={}", "-q"]


def _run(tiny, out, *extra):
    return cli.invoke(app, ["run", str(tiny), "--out", str(out), "-q", *extra])


def _files(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != ".lock"}


def test_an_existing_run_folder_is_refused_and_left_alone(tiny, tmp_path):
    out = tmp_path / "run"
    assert _run(tiny, out).exit_code == 0
    before = _files(out)
    r = _run(tiny, out)
    assert r.exit_code == 2 and "already a run folder" in r.output and f"--resume {out}" in r.output, r.output
    assert _files(out) == before  # nothing appended, manifest not overwritten
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    r = _run(tiny, tmp_path / "busy")
    assert r.exit_code == 2 and "not empty" in r.output


def test_out_naming_a_file_or_a_dangling_link_is_a_message(tiny, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = _run(tiny, f)
    assert r.exit_code == 2 and "a file, not a folder" in r.output and "Traceback" not in r.output
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    r = _run(tiny, link)
    assert r.exit_code == 2 and "symbolic link" in r.output and "does not exist" in r.output, r.output


def test_an_unwritable_output_folder_is_a_message(tiny, tmp_path):
    # /sys refuses new entries even to root (chmod cannot make a folder read-only for root)
    r = _run(tiny, Path("/sys/attnbench-test-out"))
    assert r.exit_code == 2 and "/sys/attnbench-test-out" in r.output and "Traceback" not in r.output, r.output
    r = _run(tiny, tmp_path / "o", "--save-tensors", "/sys/attnbench-test-tensors", "--isolate")
    assert r.exit_code == 2 and "--save-tensors /sys/attnbench-test-tensors: cannot write there" in r.output, r.output
    assert not (tmp_path / "o").exists()  # refused before any work
    r = _run(tiny, tmp_path / "o", "--save-tensors", str(tiny))
    assert r.exit_code == 2 and "--save-tensors" in r.output and "a file, not a folder" in r.output


def _hold_lock(folder: Path):
    code = ("import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
            "f.write('4242'); f.flush(); print('locked', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, str(folder / ".lock")], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "locked"
    return p


@pytest.mark.slow
def test_a_folder_another_process_writes_is_refused(tiny, tmp_path):
    out = tmp_path / "run"
    assert _run(tiny, out).exit_code == 0
    man = json.loads((out / "manifest.json").read_text())
    man["status"] = "incomplete"
    (out / "manifest.json").write_text(json.dumps(man))
    before = _files(out)
    holder = _hold_lock(out)
    try:
        r = cli.invoke(app, ["run", "--resume", str(out), "-q"])
        assert r.exit_code == 2 and "another attnbench process" in r.output, r.output
        empty = tmp_path / "empty"
        empty.mkdir()
        h2 = _hold_lock(empty)
        try:
            r = _run(tiny, empty)
            assert r.exit_code == 2 and "another attnbench process" in r.output, r.output
        finally:
            h2.kill()
    finally:
        holder.kill()
        holder.wait()
    assert _files(out) == before


@pytest.mark.slow
def test_concurrent_runs_on_one_folder_one_wins(tiny, tmp_path):
    out = tmp_path / "race"
    cmd = [sys.executable, "-m", "attnbench", "run", str(tiny), "--out", str(out), *ONE_CASE]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 2, 2], results
    assert all("another attnbench process" in e or "already a run folder" in e for rc, e in results if rc == 2)
    rf = RunFolder.load(out)
    assert len(rf.rows) == 2 and rf.manifest.status == "complete"  # one run's rows, once
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_atomic_write_uses_its_own_temporary_file(tmp_path, monkeypatch):
    other = tmp_path / ".results.csv.tmp"  # another writer's file of the old, shared name
    other.write_text("theirs")
    atomic_write(tmp_path / "results.csv", "mine")
    assert (tmp_path / "results.csv").read_text() == "mine" and other.read_text() == "theirs"

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as e:
        atomic_write(tmp_path / "results.csv", "new")
    assert e.value.filename == str(tmp_path / "results.csv")  # the message names the file (issue 25)
    assert (tmp_path / "results.csv").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".results.csv.tmp", "results.csv"]


def _break_line(folder: Path, n: int, text: str = '{"scenario": "tiny", "case_id": "page_si') -> None:
    lines = (folder / "rows.jsonl").read_text().splitlines()
    lines[n - 1] = text
    (folder / "rows.jsonl").write_text("\n".join(lines) + "\n")


def test_readers_skip_a_broken_line_loudly_and_keep_the_rows_after_it(tiny, tmp_path):
    out = tmp_path / "run"
    assert _run(tiny, out).exit_code == 0
    _break_line(out, 2)
    lines = (out / "rows.jsonl").read_text().splitlines()
    lines[3] = lines[3].replace('"n": ', '"n": "many", "x": ')  # a hand edit with a wrong type
    (out / "rows.jsonl").write_text("\n".join(lines) + "\n")
    base = tmp_path / "b.json"
    r = cli.invoke(app, ["baseline", str(out), "--to", str(base)])  # a baseline `check` would refuse (issue 25)
    assert r.exit_code == 2 and "not rows (line 2, 4)" in r.output and not base.exists(), r.output
    assert "skipped 2 line(s)" in r.output and "line 2, 4" in r.output and "the other 2 rows" in r.output
    r = cli.invoke(app, ["compare", "runs", str(out), str(out)])
    assert r.exit_code == 0 and "skipped 2 line(s)" in r.output, r.output
    assert len(RunFolder.load(out).rows) == 2  # rows 1 and 3: none after line 2 dropped


def test_baseline_to_a_folder_is_a_message_and_leaves_nothing(tiny, tmp_path):
    out = tmp_path / "run"
    assert _run(tiny, out).exit_code == 0
    d = tmp_path / "baselines"
    d.mkdir()
    r = cli.invoke(app, ["baseline", str(out), "--to", str(d)])
    assert r.exit_code == 2 and "a folder; name the baseline file" in r.output, r.output
    assert list(d.iterdir()) == [] and not list(tmp_path.glob(".*.tmp"))


def test_hand_edited_baselines_and_manifests_are_messages(tiny, tmp_path):
    out = tmp_path / "run"
    assert _run(tiny, out).exit_code == 0
    base = tmp_path / "b.json"
    assert cli.invoke(app, ["baseline", str(out), "--to", str(base), "--allow-few-rounds"]).exit_code == 0
    doc = json.loads(base.read_text())
    for edit, words in [
        (lambda d: d["rows"].__setitem__(0, [1, 2]), "rows[0]: list, expected an object"),
        (lambda d: d.update(attnbench_baseline="1"), "attnbench_baseline: '1', expected the format number"),
        (lambda d: d.update(fingerprint="an H100"), "fingerprint: str, expected an object"),
    ]:
        bad = json.loads(json.dumps(doc))
        edit(bad)
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        r = cli.invoke(app, ["compare", "runs", str(tmp_path / "bad.json"), str(out)])
        assert r.exit_code == 2 and words in r.output.replace("\n", ""), r.output
    man = json.loads((out / "manifest.json").read_text())
    man["environment"] = "an H100"  # fingerprints fall back to the rows
    (out / "manifest.json").write_text(json.dumps(man))
    r = cli.invoke(app, ["compare", "runs", str(base), str(out)])
    assert r.exit_code == 0, r.output
    man.update(status="incomplete", options={"backends": "sdpa"})
    (out / "manifest.json").write_text(json.dumps(man))
    r = cli.invoke(app, ["run", "--resume", str(out), "-q"])
    assert r.exit_code == 2 and "options.backends: 'sdpa' is not a list of names" in r.output, r.output
    (out / "manifest.json").write_text("[1, 2]")
    r = cli.invoke(app, ["compare", "runs", str(base), str(out)])
    assert r.exit_code == 0 and "not an object; ignored" in r.output, r.output


def _incomplete(tiny, tmp_path, *extra) -> Path:
    """A run folder of 4 rows cut after 2, with a line a crash cut short."""
    out = tmp_path / "cut"
    assert _run(tiny, out, *extra).exit_code in (0, 1)
    lines = (out / "rows.jsonl").read_text().splitlines()
    (out / "rows.jsonl").write_text("\n".join(lines[:2]) + '\n{"scenario": "tiny", "case_')
    man = json.loads((out / "manifest.json").read_text())
    man["status"] = "incomplete"
    (out / "manifest.json").write_text(json.dumps(man))
    return out


def test_a_refused_resume_changes_nothing(tiny, tmp_path):
    out = _incomplete(tiny, tmp_path)
    man = json.loads((out / "manifest.json").read_text())
    man["environment"].update(torch="1.0.0", device="NVIDIA H100 80GB HBM3")
    man["attnbench"] = "0.0.1"
    (out / "manifest.json").write_text(json.dumps(man))
    before = _files(out)
    r = cli.invoke(app, ["run", "--resume", str(out), "-q"])
    assert r.exit_code == 2, r.output
    for words in ("made elsewhere", "torch 1.0.0 then", "device NVIDIA H100 80GB HBM3 then", "attnbench 0.0.1 then",
                  "--allow-env-change"):
        assert words in r.output.replace("\n", ""), (words, r.output)
    assert _files(out) == before  # rows.jsonl (broken line included) untouched
    r = cli.invoke(app, ["run", "--resume", str(out), "--allow-env-change", "-q"])
    assert r.exit_code == 0, r.output
    assert "moved to" in r.output and (out / "rows.broken.jsonl").read_text().startswith('{"scenario": "tiny", "case_')
    rf = RunFolder.load(out)
    assert len(rf.rows) == 4 and not rf.broken_lines and rf.manifest.status == "complete"
    assert "torch 1.0.0 then" in rf.manifest.resumed[-1]["environment_changes"][1]


@pytest.mark.slow
@pytest.mark.parametrize("flags, named", [
    (["-b", "sdpa"], "-b/--backend"), (["--device", "cpu"], "--device"), (["--measure-ms", "3"], "--measure-ms"),
    (["--save-tensors", "t"], "--save-tensors"), (["--timeout", "9"], "--timeout"), (["--out", "x"], "--out"),
])
def test_resume_refuses_flags_that_would_change_the_run(tiny, tmp_path, flags, named):
    out = _incomplete(tiny, tmp_path)
    before = _files(out)
    r = cli.invoke(app, ["run", "--resume", str(out), *flags, "-q"])
    assert r.exit_code == 2, r.output
    text = r.output.replace("\n", "")
    assert f"drop {named}" in text and "run's own settings" in text and "backends" in text and "timing" in text, text
    assert _files(out) == before


@pytest.mark.slow
def test_resume_keeps_isolate_from_the_manifest(tiny, tmp_path):
    args = ["--set", "sweep={}", "--backend-file", BAD_FILE, "-b", "sdpa", "-b", "segfault", "-b", "reference", "--isolate",
            "--timeout", "60"]
    out = tmp_path / "iso"
    assert _run(tiny, out, *args).exit_code == 1
    lines = (out / "rows.jsonl").read_text().splitlines()
    (out / "rows.jsonl").write_text(lines[0] + "\n")  # only sdpa's row: the segfault comes again
    man = json.loads((out / "manifest.json").read_text())
    man["status"] = "incomplete"
    (out / "manifest.json").write_text(json.dumps(man))
    # in a process of its own: were --isolate dropped, the segfault would kill it (rc 139)
    p = subprocess.run([sys.executable, "-m", "attnbench", "run", "--resume", str(out), "--backend-file", BAD_FILE, "-q"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr
    assert "--isolate with --timeout 60 s" in p.stderr
    rows = {r.id.backend: r for r in RunFolder.load(out).rows}
    assert rows["segfault"].status == "error" and "SIGSEGV" in rows["segfault"].reason and rows["reference"].status == "ok"


@pytest.mark.slow
def test_a_compare_backends_folder_resumes_with_its_options(tiny, tmp_path):
    """compare backends records its options as run does: --resume keeps --warmup-ms, --measure-ms,
    --device and --warm-l2 (they were dropped when the folder recorded no options)."""
    out = tmp_path / "cmp"
    r = cli.invoke(app, ["compare", "backends", str(tiny), "-b", "sdpa", "-b", "reference", "--device", "cpu",
                         "--warmup-ms", "0.5", "--measure-ms", "2", "--warm-l2", "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    opts = json.loads((out / "manifest.json").read_text())["options"]
    assert opts["device"] == "cpu" and opts["warm_l2"] is True, opts
    assert opts["timing_overrides"] == {"warmup_ms": 0.5, "measure_ms": 2.0}, opts
    lines = (out / "rows.jsonl").read_text().splitlines()
    (out / "rows.jsonl").write_text("\n".join(lines[:1]) + "\n")
    man = json.loads((out / "manifest.json").read_text())
    man["status"] = "incomplete"
    (out / "manifest.json").write_text(json.dumps(man))
    r = cli.invoke(app, ["run", "--resume", str(out), "-q"])
    assert r.exit_code == 0, r.output
    text = r.output.replace("\n", "")
    assert "device cpu" in text and "timing warmup_ms 0.5, measure_ms 2" in text, text
    rf = RunFolder.load(out)
    assert len(rf.rows) == 4 and rf.manifest.status == "complete"
    for row in rf.rows:  # each row's re-run command has the options, the resumed ones too
        assert "--device cpu --warmup-ms 0.5 --measure-ms 2 --warm-l2" in row.id.repro, row.id.repro


def test_manifest_round_trip_keeps_unknown_keys_and_names_wrong_types():
    from attnbench.store.manifest import Manifest
    from attnbench.store.options import RunOptions

    man = Manifest(scenario="s", overrides=["a=1"], options=RunOptions(backends=["sdpa"], timing_overrides={"warmup_ms": 2}))
    man.update(status="complete", added_later={"x": 1})
    back = Manifest.from_json(json.loads(json.dumps(man.to_json())))
    assert back == man and back.extra == {"added_later": {"x": 1}} and back.options.backends == ["sdpa"]
    bad = Manifest.from_json({"overrides": "a=1", "cases": "2", "options": {"warm_l2": "yes"}, "scenario": "s"})
    assert bad.scenario == "s" and bad.overrides == [] and bad.cases is None and bad.options is None
    assert bad.problem("overrides").startswith("overrides: 'a=1' is not a list") and bad.problem("cases")
    assert "options.warm_l2" in bad.problem("options") and bad.problem("seed") is None
    assert Manifest.from_json([1, 2]) == Manifest() and Manifest.from_json({}).to_json()["status"] is None


def test_complete_folder_files_share_one_mode_and_drop_the_lock(tmp_path):
    """results.csv and manifest.json get the mode rows.jsonl gets (the umask's), not mkstemp's
    0600; a complete folder keeps no .lock, an incomplete one does (resume takes it)."""
    import os
    import stat

    from attnbench.store.row_parts import RowIdentity, RowTiming
    from attnbench.store.rows import Row
    from attnbench.store.runfolder import RunFolder

    for complete in (True, False):
        rf = RunFolder.create(tmp_path, "s", tmp_path / f"run-{complete}")
        rf.start({"scenario": "s"})
        rf.add(Row(RowIdentity("s", "c", "sdpa"), timing=RowTiming(median_ms=1.0, n=1, timing_method="cpu")))
        rf.finish(complete)
        modes = {p.name: stat.S_IMODE(os.stat(p).st_mode) for p in rf.path.iterdir() if p.name != ".lock"}
        assert set(modes) >= {"rows.jsonl", "results.csv", "manifest.json"}
        assert len(set(modes.values())) == 1, modes
        assert (rf.path / ".lock").exists() is not complete
