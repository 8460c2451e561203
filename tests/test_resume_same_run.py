"""Issue 37 items 7, 8, 9: a resumed run goes on with exactly the run's backends and code, or
says why not. The backend specs are resolved once and recorded (an environment variable that
sets a backend option, set only at the run or only at the resume, used to split a `complete`
run between two specs, 21 rows of 18); a planted row of a backend the run never ran is refused
(it used to be kept: 19 rows of 18); changed code (another commit, other uncommitted edits, an
edited --backend-file) is refused unless --allow-env-change, which records it."""
import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app


cli = CliRunner()
pytestmark = pytest.mark.slow  # real runs and resumes (seconds on a shared CPU)
OPTION_FILE = str(Path(__file__).with_name("option_backends.py"))


def _rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines() if x.strip()]


def _cut(out: Path, keep: int) -> None:
    """The run as a crash leaves it: its first ``keep`` rows, marked incomplete."""
    lines = (out / "rows.jsonl").read_text().splitlines()
    (out / "rows.jsonl").write_text("\n".join(lines[:keep]) + "\n")
    man = json.loads((out / "manifest.json").read_text())
    man["status"] = "incomplete"
    (out / "manifest.json").write_text(json.dumps(man))


@pytest.mark.parametrize("isolate", [[], ["--isolate"]])
@pytest.mark.parametrize("env_at_run, env_at_resume", [({}, {"ATTNBENCH_TEST_FLAVOR": "fancy"}),
                                                       ({"ATTNBENCH_TEST_FLAVOR": "fancy"}, {})])
def test_resume_runs_the_backend_specs_the_run_resolved(tiny, tmp_path, isolate, env_at_run, env_at_resume):
    out = tmp_path / "run"
    args = ["-b", "sdpa-opt", "--backend-file", OPTION_FILE, "-q"]
    r = cli.invoke(app, ["run", str(tiny), "--out", str(out), *args, *isolate],
                   env={"ATTNBENCH_TEST_FLAVOR": "", **env_at_run})
    assert r.exit_code == 0, r.output
    spec = _rows(out)[0]["backend"]
    assert spec == ("sdpa-opt:flavor=fancy" if env_at_run else "sdpa-opt")
    _cut(out, 1)
    r = cli.invoke(app, ["run", "--resume", str(out), "--backend-file", OPTION_FILE, "-q"],
                   env={"ATTNBENCH_TEST_FLAVOR": "", **env_at_resume})
    assert r.exit_code == 0, r.output
    rows = _rows(out)
    assert len(rows) == 2 and {x["backend"] for x in rows} == {spec}, [x["backend"] for x in rows]
    man = json.loads((out / "manifest.json").read_text())
    assert man["status"] == "complete"
    assert man["options"].get("backend_specs") == {spec: {"bias": "0.0", "flavor": "fancy" if env_at_run else "plain"}}


def test_a_run_without_recorded_specs_is_refused_when_they_resolve_otherwise(tiny, tmp_path):
    """A manifest of an attnbench that did not record the specs: resolved again, and refused
    when the environment makes them other specs than the run's."""
    out = tmp_path / "run"
    r = cli.invoke(app, ["run", str(tiny), "--out", str(out), "-b", "sdpa-opt", "--backend-file", OPTION_FILE, "-q"],
                   env={"ATTNBENCH_TEST_FLAVOR": ""})
    assert r.exit_code == 0, r.output
    _cut(out, 1)
    man = json.loads((out / "manifest.json").read_text())
    man["options"].pop("backend_specs", None)
    from attnbench.store.manifest import Manifest

    man["settings_sha256"] = Manifest.from_json(man).settings_hash()  # as an older attnbench wrote it
    (out / "manifest.json").write_text(json.dumps(man))
    before = (out / "rows.jsonl").read_bytes()
    r = cli.invoke(app, ["run", "--resume", str(out), "--backend-file", OPTION_FILE, "-q"],
                   env={"ATTNBENCH_TEST_FLAVOR": "fancy"})
    assert r.exit_code == 2, r.output
    assert "resolve to sdpa-opt:flavor=fancy here, but it ran sdpa-opt" in r.output.replace("\n", "")
    assert (out / "rows.jsonl").read_bytes() == before


def test_resume_refuses_a_planted_row_of_a_backend_the_run_never_ran(tiny, tmp_path):
    out = tmp_path / "run"
    r = cli.invoke(app, ["run", str(tiny), "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    _cut(out, 2)
    planted = dict(_rows(out)[0], backend="flex")
    with open(out / "rows.jsonl", "a") as f:
        f.write(json.dumps(planted) + "\n")
    before = (out / "rows.jsonl").read_bytes()
    r = cli.invoke(app, ["run", "--resume", str(out), "-q"])
    assert r.exit_code == 2, r.output
    text = r.output.replace("\n", "")
    assert "row 3 (page_size=4 · flex) is of backend 'flex', which the run never ran (its backends: reference, sdpa)" in text
    assert "Traceback" not in r.output and (out / "rows.jsonl").read_bytes() == before


def _edit_env(out: Path, **env) -> None:
    man = json.loads((out / "manifest.json").read_text())
    man["environment"].update(env)
    (out / "manifest.json").write_text(json.dumps(man))


@pytest.mark.parametrize("change, words", [
    ("backend file", "edited since the run (sha256"),
    ("commit", "attnbench commit 000000000000 then"),
    ("edits", "uncommitted edits of the attnbench package differ (diff sha256 abababababab then"),
])
def test_resume_refuses_changed_code_unless_allowed_and_then_records_it(tiny, tmp_path, change, words):
    plugin = tmp_path / "my_backend.py"
    plugin.write_text(Path(OPTION_FILE).read_text())
    out = tmp_path / "run"
    args = ["--backend-file", str(plugin), "-q"]
    r = cli.invoke(app, ["run", str(tiny), "--out", str(out), "-b", "sdpa-opt", *args])
    assert r.exit_code == 0, r.output
    sha = hashlib.sha256(plugin.read_bytes()).hexdigest()
    _cut(out, 1)
    if change == "backend file":
        plugin.write_text(plugin.read_text() + "\n# edited between the run and the resume\n")
    elif change == "commit":
        _edit_env(out, git_commit="0" * 40)
    else:
        _edit_env(out, code_diff_sha256="ab" * 32)
    before = (out / "rows.jsonl").read_bytes()
    r = cli.invoke(app, ["run", "--resume", str(out), *args])
    text = r.output.replace("\n", "")
    assert r.exit_code == 2 and words in text and "--allow-env-change" in text, r.output
    assert (out / "rows.jsonl").read_bytes() == before
    r = cli.invoke(app, ["run", "--resume", str(out), *args, "--allow-env-change"])
    assert r.exit_code == 0, r.output
    entry = json.loads((out / "manifest.json").read_text())["resumed"][-1]
    assert any(words in c for c in entry["environment_changes"]), entry
    assert {"git_commit", "git_dirty", "code_diff_sha256", "backend_files_sha256"} <= set(entry["code"])
    assert len(_rows(out)) == 2
    recorded = json.loads((out / "manifest.json").read_text())
    assert recorded["backend_files_sha256"] == {str(plugin.resolve()): sha}
    assert "code_diff_sha256" in recorded["environment"]


def test_history_add_refuses_an_incomplete_run_and_stores_it_once_resumed(tiny, tmp_path):
    """Item 3: a history point is a whole run (an incomplete run's rows were stored, and after
    --resume completed it `history add` said "already stored as point 1; kept": 1 row of 4 for good)."""
    out, db = tmp_path / "run", tmp_path / "h.sqlite"
    r = cli.invoke(app, ["run", str(tiny), "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    _cut(out, 1)
    r = cli.invoke(app, ["history", "add", str(out), "--db", str(db)])
    assert r.exit_code == 2, r.output
    assert "not complete" in r.output and f"attnbench run --resume {out}" in r.output.replace("\n", "")
    assert not db.exists()
    assert cli.invoke(app, ["run", "--resume", str(out), "-q"]).exit_code == 0
    r = cli.invoke(app, ["history", "add", str(out), "--db", str(db)])
    assert r.exit_code == 0 and "stored 4 rows as point 1" in r.output, r.output
