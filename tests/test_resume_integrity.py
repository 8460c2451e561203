"""Issue 25, nothing mixed: --resume refuses rows that cannot be the run's (another scenario,
a case it does not have, a second copy), a manifest whose settings were edited (overrides,
options, isolate: covered by settings_sha256) or that lacks its scenario_sha256, and hand
edits of the wrong type, each with one message; --resume --list lists what is left, -k is
refused; the note, repro commands and check say what is true."""
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.store.runfolder import RunFolder

from .test_cli import TINY

cli = CliRunner()
BAD_FILE = str(Path(__file__).with_name("misbehaving_backends.py"))


def _files(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != ".lock"}


def _cut(tiny, tmp_path, *extra) -> Path:
    """A run folder of 4 rows cut to its first 2, marked incomplete."""
    out = tmp_path / "cut"
    r = cli.invoke(app, ["run", str(tiny), "--out", str(out), "-q", *extra])
    assert r.exit_code in (0, 1), r.output
    lines = (out / "rows.jsonl").read_text().splitlines()
    (out / "rows.jsonl").write_text("\n".join(lines[:2]) + "\n")
    _edit(out, lambda m: m.update(status="incomplete"))
    return out


def _edit(out: Path, change) -> None:
    man = json.loads((out / "manifest.json").read_text())
    change(man)
    (out / "manifest.json").write_text(json.dumps(man))


def _refused(out: Path, *words, extra=()):
    before = _files(out)
    r = cli.invoke(app, ["run", "--resume", str(out), "-q", *extra])
    assert r.exit_code == 2, r.output
    text = r.output.replace("\n", "")
    for w in words:
        assert w in text, text
    assert "Traceback" not in r.output and _files(out) == before
    return text


def _add_line(out: Path, change) -> None:
    first = json.loads((out / "rows.jsonl").read_text().splitlines()[0])
    change(first)
    with open(out / "rows.jsonl", "a") as f:
        f.write(json.dumps(first) + "\n")


def test_resume_refuses_rows_of_another_scenario(tiny, tmp_path):
    out = _cut(tiny, tmp_path)
    _add_line(out, lambda r: r.update(scenario="other", case_id="page_size=8"))
    _refused(out, "row 3", "is of scenario 'other'")


def test_resume_refuses_a_duplicate_row(tiny, tmp_path):
    out = _cut(tiny, tmp_path)
    _add_line(out, lambda r: None)
    _refused(out, "row 3", "repeats an earlier row")


def test_resume_refuses_a_row_of_a_case_the_scenario_does_not_have(tiny, tmp_path):
    out = _cut(tiny, tmp_path)
    _add_line(out, lambda r: r.update(case_id="page_size=99"))
    _refused(out, "row 3", "a case the scenario does not have")


def test_resume_refuses_edited_overrides_and_a_missing_scenario_hash(tiny, tmp_path):
    out = _cut(tiny, tmp_path)
    _edit(out, lambda m: m.update(overrides=["batch.0.count=7"]))
    _refused(out, "settings_sha256", "edited by hand")
    (tmp_path / "second").mkdir()
    out2 = _cut(tiny, tmp_path / "second")
    _edit(out2, lambda m: m.pop("scenario_sha256"))
    _refused(out2, "without its scenario_sha256")


@pytest.mark.slow
@pytest.mark.parametrize("change, words", [
    (lambda m: m["options"].update(select=["a", "b"]), ["options.select"]),
    (lambda m: m["options"].update(threads=-3), ["options.threads", "from 1 to 4096"]),
    (lambda m: m["options"]["timing_overrides"].update(wobble_ms=3), ["options.timing_overrides"]),
    (lambda m: m["options"].update(rtol=-1), ["options.rtol"]),
    (lambda m: m.update(isolate="yes"), ["isolate", "true or false"]),
    (lambda m: m.update(timeout="soon"), ["timeout"]),
    (lambda m: m["options"].update(rtol=0.5), ["settings_sha256"]),  # the right type, but edited
])
def test_hand_edited_manifest_values_are_one_clear_message(tiny, tmp_path, change, words):
    out = _cut(tiny, tmp_path)
    _edit(out, change)
    _refused(out, *words)


def test_resume_list_shows_what_is_left_and_runs_nothing(tiny, tmp_path):
    out = _cut(tiny, tmp_path)
    before = _files(out)
    r = cli.invoke(app, ["run", "--resume", str(out), "--list", "--format", "json"])
    assert r.exit_code == 0, r.output
    left = json.loads(r.stdout)
    done = {(x.id.case_id, x.id.backend) for x in RunFolder.load(out).rows}
    assert sum(len(c["backends"]) for c in left) == 2
    assert not any((c["case_id"], b) in done for c in left for b in c["backends"])
    assert _files(out) == before


def test_resume_refuses_k(tiny, tmp_path):
    out = _cut(tiny, tmp_path)
    _refused(out, "drop -k", extra=["-k", "sdpa"])


@pytest.mark.slow
def test_resume_note_says_isolate_when_isolate_is_given(tiny, tmp_path):
    out = _cut(tiny, tmp_path)
    r = cli.invoke(app, ["run", "--resume", str(out), "--isolate", "-q"])
    assert r.exit_code == 0, r.output
    text = r.output.replace("\n", "")
    assert "--isolate with --timeout" in text and "add --isolate" not in text, text


@pytest.mark.slow
def test_repro_of_an_isolated_run_keeps_its_timeout(tiny, tmp_path):
    out = tmp_path / "run"
    r = cli.invoke(app, ["run", str(tiny), "--out", str(out), "--isolate", "--timeout", "7", "-q"])
    assert r.exit_code == 0, r.output
    for row in RunFolder.load(out).rows:
        assert "--isolate --timeout 7 " in row.id.repro, row.id.repro


def test_check_with_k_picking_nothing_fails_and_an_empty_run_is_no_device_mismatch(tiny, tmp_path):
    out = tmp_path / "run"
    assert cli.invoke(app, ["run", str(tiny), "--out", str(out), "-q"]).exit_code == 0
    r = cli.invoke(app, ["check", str(out), "--baseline", str(out), "-k", "nosuchword"])
    assert r.exit_code == 1 and "picks no row" in r.output and "PASS" not in r.output, r.output
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "rows.jsonl").write_text("")
    (empty / "manifest.json").write_text((out / "manifest.json").read_text())
    r = cli.invoke(app, ["check", str(empty), "--baseline", str(out)])
    assert r.exit_code == 1 and "different devices" not in r.output and "nothing was compared" in r.output, r.output


def test_an_unknown_check_reference_fails_validate_and_run(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(TINY + "check: {reference: nosuch}\n")
    r = cli.invoke(app, ["validate", str(f)])
    assert r.exit_code == 2 and "check.reference" in r.output and "nosuch" in r.output, r.output
    r = cli.invoke(app, ["run", str(f), "--out", str(tmp_path / "o"), "-q"])
    assert r.exit_code == 2 and "check.reference" in r.output and not (tmp_path / "o").exists(), r.output


def test_dask_workers_are_bounded_by_cores_unless_oversubscribed(tiny, tmp_path):
    pytest.importorskip("distributed")
    import os

    n = (os.cpu_count() or 1) + 1
    r = cli.invoke(app, ["run", str(tiny), "--executor", "dask", "--workers", str(n), "--device", "cpu",
                         "--out", str(tmp_path / "o"), "-q"])
    assert r.exit_code == 2 and "--oversubscribe" in r.output and "core" in r.output, r.output
    r = cli.invoke(app, ["run", str(tiny), "--oversubscribe", "-q"])
    assert r.exit_code == 2 and "--oversubscribe goes with --executor dask" in r.output, r.output


def test_dask_default_backends_are_the_local_ones(tiny):
    from attnbench.execute.case_task import make_job, preflight
    from attnbench.execute.cases import default_backends
    from attnbench.store.options import RunOptions
    from attnbench.workload.scenario import load

    sf = load(tiny)
    job = make_job(sf, RunOptions(device="cpu"), scenario_path=str(tiny), overrides=[], backend_files=[])
    assert preflight(job.to_json())["available"] == default_backends("cpu")
