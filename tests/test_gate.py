"""`attnbench check` never passes on nothing, refuses broken baselines, and `calibrate`
counts false alarms and catches; on real runs of attnbench/scenarios/ci-gate.yaml (short budgets)."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from attnbench.analyze import calibration as calib
from attnbench.analyze.compare import Thresholds
from attnbench.cli.app import app
from attnbench.store.baselines import load_rows

ROOT = Path(__file__).resolve().parents[1]
GATE = ROOT / "attnbench" / "scenarios" / "ci-gate.yaml"
# short budgets, enough rounds for a 99% interval to exist (5 per side)
QUICK = ["--set", "timing.measure_ms=30", "--set", "timing.rounds=6", "--set", "timing.min_runs=6"]
cli = CliRunner()


def _run(scenario: Path, out: Path, *extra: str) -> Path:
    r = cli.invoke(app, ["run", str(scenario), "--device", "cpu", "-q", "--out", str(out), *QUICK, *extra])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """One real run of the gate scenario and its baseline file."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("gate")
    run = _run(GATE, tmp / "base-run")
    bl = tmp / "baseline.json"
    r = cli.invoke(app, ["baseline", str(run), "--to", str(bl)])
    assert r.exit_code == 0, r.output
    yield tmp, run, bl
    torch.set_num_threads(threads)


def _check(run, bl, *extra):
    return cli.invoke(app, ["check", str(run), "--baseline", str(bl), *extra])


def _copy_run(src: Path, dst: Path, keep_rows: int | None = None, status: str | None = None) -> Path:
    shutil.copytree(src, dst)
    lines = (dst / "rows.jsonl").read_text().splitlines(keepends=True)
    if keep_rows is not None:
        (dst / "rows.jsonl").write_text("".join(lines[:keep_rows]))
    if status is not None:
        m = json.loads((dst / "manifest.json").read_text())
        m["status"] = status
        (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def test_a_run_checked_against_its_own_baseline_passes(real):
    tmp, run, bl = real
    r = _check(run, bl, "--all")
    assert r.exit_code == 0, r.output
    assert "PASS" in r.output and "2 cases compared" in r.output
    doc = json.loads(bl.read_text())
    assert all(len(row["round_medians_ms"]) == 6 for row in doc["rows"])  # the baseline keeps the rounds
    assert doc["manifest"]["cases"] == 2 and doc["manifest"]["backends_requested"] == ["sdpa"]


def test_renamed_scenario_fails(real):
    tmp, run, bl = real
    renamed = tmp / "renamed.yaml"
    renamed.write_text(GATE.read_text().replace("name: ci-gate", "name: ci-gate-renamed"))
    r = _check(_run(renamed, tmp / "renamed-run"), bl)
    assert r.exit_code == 1, r.output
    assert "no case of the run" in r.output and "scenario text differs" in r.output
    assert "PASS" not in r.output


def test_empty_rows_fails(real):
    tmp, run, bl = real
    r = _check(_copy_run(run, tmp / "empty", keep_rows=0), bl)
    assert r.exit_code == 1, r.output
    assert "no case of the run (0 rows" in r.output


@pytest.mark.parametrize("status", ["incomplete", "complete"])
def test_interrupted_run_with_one_row_fails(real, status):
    tmp, run, bl = real
    r = _check(_copy_run(run, tmp / f"cut-{status}", keep_rows=1, status=status), bl)
    assert r.exit_code == 1, r.output
    assert "vanished" in r.output
    assert ("is incomplete" if status == "incomplete" else "has 1 rows of the 2 cases x 1 backends") in r.output


def test_changed_sweep_values_fail(real):
    tmp, run, bl = real
    changed = _run(GATE, tmp / "sweep-run", "--set", "sweep={batch.0.context: [64, 512]}")
    r = _check(changed, bl)
    assert r.exit_code == 1, r.output
    assert "overrides" in r.output and "vanished" in r.output and "new" in r.output
    r = _check(changed, bl, "--allow-scenario-change")
    assert r.exit_code == 1, r.output  # context=256 is still not measured
    assert "context=256 · sdpa" in r.output


def test_scenario_text_change_fails_unless_allowed(real):
    tmp, run, bl = real
    edited = _copy_run(run, tmp / "edited")
    m = json.loads((edited / "manifest.json").read_text())
    m["scenario_sha256"] = "0" * 64  # the same cases, from another scenario text
    (edited / "manifest.json").write_text(json.dumps(m))
    r = _check(edited, bl)
    assert r.exit_code == 1 and "scenario text differs" in r.output and "--allow-scenario-change" in r.output
    r = _check(edited, bl, "--allow-scenario-change")
    assert r.exit_code == 0, r.output


def test_strict_fails_new_cases(real):
    tmp, run, bl = real
    doc = json.loads(bl.read_text())
    doc["rows"] = [row for row in doc["rows"] if row["case_id"] != "context=256"]
    doc["manifest"]["cases"] = 1
    smaller = tmp / "smaller.json"
    smaller.write_text(json.dumps(doc))
    r = _check(run, smaller)
    assert r.exit_code == 0, r.output  # new cases are listed
    assert "new (only in this run): context=256 · sdpa" in r.output
    r = _check(run, smaller, "--strict")
    assert r.exit_code == 1, r.output


def _edited_baseline(bl: Path, tmp: Path, name: str, edit) -> Path:
    doc = json.loads(bl.read_text())
    edit(doc["rows"][1])
    out = tmp / f"{name}.json"
    out.write_text(json.dumps(doc))  # NaN and Infinity are written as JSON's NaN / Infinity
    return out


@pytest.mark.parametrize("name,edit,field", [
    ("empty", lambda r: r.update(samples_ms=[]), "samples_ms: empty"),
    ("nan", lambda r: r["samples_ms"].__setitem__(3, math.nan), "samples_ms[3] = nan"),
    ("negative", lambda r: r["samples_ms"].__setitem__(0, -0.5), "samples_ms[0] = -0.5"),
    ("inf", lambda r: r["samples_ms"].__setitem__(2, math.inf), "samples_ms[2] = inf"),
    ("string", lambda r: r.update(samples_ms="0.1 0.2"), "samples_ms: str"),
    ("string-item", lambda r: r["samples_ms"].__setitem__(1, "0.1"), "samples_ms[1] = '0.1'"),
    ("round-nan", lambda r: r["round_medians_ms"].__setitem__(0, math.nan), "round_medians_ms[0] = nan"),
    ("no-rounds", lambda r: r.pop("round_medians_ms"), "round_medians_ms: empty"),
    ("median", lambda r: r.update(median_ms=None), "median_ms = nan"),  # strict JSON: null reads back as NaN
    ("status", lambda r: r.update(status="fine"), "rows[1]: 'fine' is not a valid Status"),
    ("backend", lambda r: r.update(backend=7), "backend: 7"),
])
def test_hand_edited_baseline_is_refused_naming_the_field(real, name, edit, field):
    tmp, run, bl = real
    r = _check(run, _edited_baseline(bl, tmp, name, edit))
    assert r.exit_code == 2, r.output
    assert field in r.output and "rows[1]" in r.output and "attnbench baseline RUN --to" in r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output


def test_too_few_rounds_is_refused(real):
    tmp, run, bl = real
    one = _run(GATE, tmp / "one-round", "--set", "timing.rounds=1")
    r = cli.invoke(app, ["check", str(one), "--baseline", str(one), "--allow-scenario-change"])
    assert r.exit_code == 2, r.output
    assert "timing.rounds" in r.output and "1 timing round(s)" in r.output


def _steady(rows):
    """The rows with steady round times (each round within 0.5% of the row's median): what the
    calibration counts must not hang on the load while ``real`` ran (two test files at a time in
    scripts/ci/tests_alone.sh, a 3x slowdown of one noisy run read as regressed in 6 of 12 cases)."""
    import dataclasses

    out = []
    for r in rows:
        t, m = r.timing, r.timing.median_ms
        steady = [m * (1 + 0.005 * (k % 3 - 1)) for k in range(len(t.round_medians_ms))]
        out.append(dataclasses.replace(r, timing=dataclasses.replace(t, round_medians_ms=steady)) if steady else r)
    return out


def test_calibration_counts_false_alarms_and_catches(real):
    """Scaled A/B checks: a run checked against itself never fails; scaled by 3x it fails in
    every case; unscaled pairs of distinct runs are A/A checks. (The normalizer's rows are not
    scaled: ``scaled``'s ``keep``.)"""
    tmp, run, bl = real
    rows = _steady(load_rows(run, need_rounds=True).rows)
    cal = calib.calibrate([rows, rows, rows], Thresholds(max_slowdown=0.1), None, [3.0])
    assert cal.runs == 3 and cal.aa.checks == 6 and cal.aa.checks_failed == 0 and cal.aa.cases == 12
    assert cal.ab[3.0].checks_failed == 6 and cal.ab[3.0].cases_failed == 12
    slowed = calib.scaled(rows, 2.0, None)
    kept = calib.scaled(rows, 2.0, "sdpa")
    for a, b, k in zip(rows, slowed, kept):
        assert b.timing.round_medians_ms == [x * 2.0 for x in a.timing.round_medians_ms] and b.timing.median_ms == a.timing.median_ms * 2.0
        assert k.timing.round_medians_ms == a.timing.round_medians_ms
    recs = calib.summary_records(cal)
    assert [r["slowdown"] for r in recs] == ["none (A/A)", "3×"] and recs[1]["case_rate"] == 1.0


def test_calibrate_command_reuses_runs_and_prints_rates(real):
    tmp, run, bl = real
    out = tmp / "cal"
    for k in (1, 2):
        shutil.copytree(run, out / f"run-{k:03d}")
    r = cli.invoke(app, ["calibrate", str(GATE), "--runs", "2", "--out", str(out), *QUICK,
                         "--slowdown", "4", "--format", "json"])
    assert r.exit_code == 0, r.output
    first = json.loads(r.stdout[: r.stdout.index("]") + 1])
    assert first[0]["slowdown"] == "none (A/A)" and first[0]["checks"] == 2 and first[0]["checks_failed"] == 0
    assert first[1]["slowdown"] == "4×" and first[1]["checks_failed"] == 2
    r = cli.invoke(app, ["calibrate", str(GATE), "--runs", "2", "--out", str(out), "--slowdown", "0.9"])
    assert r.exit_code == 2 and "--slowdown 0.9" in r.output
    r = cli.invoke(app, ["calibrate", str(GATE), "--runs", "2", "--out", str(out)])  # other overrides than the runs'
    assert r.exit_code == 2 and "another scenario text or other --set overrides" in r.output
