"""`attnbench compare commits`: two checkouts of attnbench measured in turns, judged round by round.

The end-to-end test builds a throwaway git repository holding this checkout's attnbench/ (commit
1) and the same code with sdpa made 3x slower by spinning on its own thread (commit 2), then runs
the gate of commit 1 against itself (must pass) and of commit 2 against commit 1 (must fail).
"""
from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.analyze.compare import Thresholds, check
from attnbench.cli.app import app
from attnbench.execute.checkouts import CheckoutError, export, repo_root, working_tree
from attnbench.execute.interleave import order
from attnbench.store.merge import MergeError, merge_rows
from attnbench.store.row_parts import RowIdentity, RowTiming
from attnbench.store.rows import Row

ROOT = Path(__file__).resolve().parents[1]
cli = CliRunner()


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout


def _row(case: str, rounds: list[float], backend: str = "sdpa", status: str = "ok") -> Row:
    return Row(RowIdentity(scenario="s", case_id=case, backend=backend), status=status,
               reason="" if status == "ok" else "boom",
               timing=RowTiming(median_ms=sorted(rounds)[len(rounds) // 2], n=len(rounds), timing_method="cpu-thread",
                                samples_ms=list(rounds), round_medians_ms=list(rounds), min_ms=min(rounds)))


def test_turns_alternate_so_neither_side_always_goes_first():
    assert order(3) == [(0, 0), (0, 1), (1, 1), (1, 0), (2, 0), (2, 1)]
    firsts = [s for b, s in order(20)[::2]]
    assert firsts.count(0) == firsts.count(1) == 10


def test_merge_concatenates_rounds_in_run_order_and_keeps_a_broken_run():
    a = [_row("c1", [1.0, 1.1]), _row("c2", [2.0])]
    b = [_row("c2", [2.2]), _row("c1", [0.9])]
    merged = merge_rows([a, b], ["run a", "run b"])
    assert [r.id.case_id for r in merged] == ["c1", "c2"]
    assert merged[0].timing.round_medians_ms == [1.0, 1.1, 0.9] and merged[0].timing.n == 3
    assert math.isclose(merged[0].timing.median_ms, 1.0) and merged[0].timing.min_ms == 0.9
    broken = [_row("c1", [1.0], status="error"), _row("c2", [2.0])]
    assert merge_rows([a, broken], ["a", "b"])[0].status == "error"
    with pytest.raises(MergeError, match="run b has no row for c2"):
        merge_rows([a, b[1:]], ["run a", "run b"])


def test_paired_rounds_see_through_a_drift_that_hides_a_slowdown_between_samples():
    # the machine slows down steadily over the rounds; head is 1.3x base in every round
    base = [1.0 * (1 + 0.2 * k) for k in range(20)]
    head = [1.3 * x for x in base]
    th = Thresholds(max_slowdown=0.2, min_delta_ms=0.0)
    unpaired = check([_row("c", head)], [_row("c", base)], th)
    paired = check([_row("c", head)], [_row("c", base)], th, paired=True)
    assert unpaired.cases[0].verdict != "regressed"  # the drift swamps it as two samples
    assert paired.cases[0].verdict == "regressed" and paired.failed
    assert paired.cases[0].ratio.rounds == "20 paired" and math.isclose(paired.cases[0].ratio.ratio, 1.3)
    # the same drift with no slowdown is not a regression
    same = check([_row("c", base)], [_row("c", list(base))], th, paired=True)
    assert not same.failed


def test_paired_rounds_of_unequal_count_are_not_compared_and_fail_the_gate():
    res = check([_row("c", [1.0] * 12)], [_row("c", [1.0] * 10)], Thresholds(), paired=True)
    assert res.cases[0].verdict == "unnormalized" and res.failed and "12 rounds against 10" in res.cases[0].note


def test_checkout_errors_name_the_repository_and_the_fix(tmp_path):
    with pytest.raises(CheckoutError, match="not inside a git repository"):
        repo_root(tmp_path)
    (tmp_path / "r").mkdir()
    _git(tmp_path / "r", "init", "-q")
    with pytest.raises(CheckoutError, match="without attnbench/__init__.py"):
        repo_root(tmp_path / "r")
    with pytest.raises(CheckoutError, match="no-such-rev: no such commit"):
        export(ROOT, "no-such-rev", tmp_path / "x", "base")


@pytest.mark.slow
def test_a_shallow_clone_is_named_with_the_fix(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT / "attnbench", src / "attnbench", ignore=shutil.ignore_patterns("__pycache__"))
    _git(src, "init", "-q")
    for k in range(2):
        (src / "f").write_text(str(k))
        _git(src, "add", "-A")
        _git(src, "commit", "-qm", f"c{k}")
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{src}", str(shallow)], check=True)
    with pytest.raises(CheckoutError, match="shallow"):
        export(shallow, "HEAD~1", tmp_path / "x", "base")
    co = export(src, "HEAD~1", tmp_path / "y", "base")
    assert (co.root / "attnbench" / "__init__.py").is_file() and co.label.startswith("HEAD~1 (")
    wt = working_tree(src)
    assert not wt.dirty
    (src / "f").write_text("edited")
    assert working_tree(src).dirty and "uncommitted" in working_tree(src).label


@pytest.mark.slow
def test_too_few_rounds_and_a_used_out_folder_are_usage_errors(tmp_path):
    r = cli.invoke(app, ["compare", "commits", "ci-gate", "--repo", str(ROOT), "--base", "HEAD", "--rounds", "3"])
    assert r.exit_code == 2 and "at least 8 rounds" in r.output and "--rounds 20" in r.output
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    r = cli.invoke(app, ["compare", "commits", "ci-gate", "--repo", str(ROOT), "--out", str(tmp_path / "used")])
    assert r.exit_code == 2 and "not empty" in r.output
    r = cli.invoke(app, ["compare", "commits", "no-such-scenario", "--repo", str(ROOT), "--base", "HEAD"])
    assert r.exit_code == 2 and "no such scenario" in r.output


SLOWER = '''
import time as _t
_real_run = SdpaBackend.run
def _slow_run(self, p):
    t0 = _t.thread_time()
    out = _real_run(self, p)
    stop = t0 + 3.0 * (_t.thread_time() - t0)
    while _t.thread_time() < stop:
        pass
    return out
SdpaBackend.run = _slow_run
'''


@pytest.mark.slow
def test_the_gate_passes_unchanged_code_and_catches_a_slowed_commit(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "attnbench", repo / "attnbench", ignore=shutil.ignore_patterns("__pycache__"))
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    sdpa = repo / "attnbench" / "backends" / "sdpa.py"
    sdpa.write_text(sdpa.read_text() + SLOWER)
    _git(repo, "commit", "-qam", "sdpa 3x slower")
    # few, short rounds (this is a behaviour test, not the calibrated gate): 6 rounds, 3 per turn
    quick = ["--rounds", "6", "--rounds-per-turn", "3", "--workers", "1", "--confidence", "90%", "--max-slowdown", "50%", "--device", "cpu",
             "--set", "timing.measure_ms=20", "--set", "timing.min_runs=5", "--repo", str(repo), "--all"]
    same = cli.invoke(app, ["compare", "commits", "ci-gate", "--base", "HEAD~1", "--head", "HEAD~1", *quick])
    assert same.exit_code == 0, same.output
    assert "PASS" in same.output and "6 paired" in same.output
    slow = cli.invoke(app, ["compare", "commits", "ci-gate", "--base", "HEAD~1", "--head", "HEAD", *quick,
                            "--out", str(tmp_path / "kept")])
    assert slow.exit_code == 1, slow.output
    assert slow.output.count("regressed") >= 2 and "FAIL" in slow.output
    # --out keeps each side's run folders, one per process, in turns
    assert sorted(p.name for p in (tmp_path / "kept" / "runs" / "head").iterdir()) == ["turn-01", "turn-02"]
