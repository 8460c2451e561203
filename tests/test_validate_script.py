"""The two GPU front doors on the CPU (their --dry-run): scripts/gpu/validate.sh runs its lanes
side by side and leaves validate.log, summary.md and details.tgz; a lane it does not know is
refused with exit 2 naming the lanes; lanes spread over the GPUs one each; scripts/gpu/bench.sh
leaves bench.log, runs.tgz and the plan table, and refuses a scenario that is not shipped."""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from .scripts import ROOT, load_script

GPU = ROOT / "scripts" / "gpu"


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TRITON_INTERPRET", None)
    env.pop("OUT", None)
    return env


@pytest.mark.slow
def test_validate_dry_run_runs_every_lane_and_leaves_three_files(tmp_path):
    out = tmp_path / "out"
    res = subprocess.run(["bash", str(GPU / "validate.sh"), "--dry-run", "--out", str(out), "--work",
                          str(tmp_path / "work"), "--lanes", "tests=harness scenarios=sdpa draws=sdpa", "--draws", "2",
                          "--test-workers", "1", "--budget-s", "600"],
                         capture_output=True, text=True, env=_env(), timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-3000:]
    assert {p.name for p in out.iterdir()} == {"validate.log", "summary.md", "details.tgz"}
    summary = (out / "summary.md").read_text()
    assert "## tests-harness (harness): ok" in summary and "skipped 4x: needs CUDA" in summary, summary
    assert "## scenarios-sdpa (sdpa): ok" in summary and "## draws-sdpa (sdpa): ok" in summary, summary
    assert "saved outputs rechecked by check_saved.py: 4 ok, 0 off" in summary, summary
    with tarfile.open(out / "details.tgz") as tar:
        names = tar.getnames()
    assert "details/tests-harness/pytest_gpu.xml" in names
    assert "details/scenarios-sdpa/verify_table.md" in names and "details/draws-sdpa/verify_table.md" in names
    assert any(n.startswith("details/draws-sdpa/scenarios/random-1-") for n in names)
    assert not any(n.endswith(".pt") for n in names)


def test_validate_refuses_a_lane_it_does_not_know(tmp_path):
    res = subprocess.run([sys.executable, str(GPU / "validate.py"), "--dry-run", "--out", str(tmp_path / "o"),
                          "--work", str(tmp_path / "w"), "--lanes", "tests decodes"],
                         capture_output=True, text=True, env=_env(), timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "validate: lane 'decodes': no such lane; the lanes are tests, scenarios, draws, timer" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "o").exists()


def test_lanes_spread_over_the_gpus_and_read_a_lanes_file(tmp_path):
    v = load_script("scripts/gpu/validate.py", "validate_under_test", register=True)
    f = tmp_path / "lanes"
    f.write_text("# two halves of the suite\ntests=not flashinfer\ntests=flashinfer\n\nscenarios=flashinfer\n")
    a = v.parse(["--lanes-file", str(f), "--lane", "draws", "--work", str(tmp_path)])
    lanes = v.make_lanes(a, gpus=2)
    assert [(l.name, l.arg, l.gpu) for l in lanes] == [
        ("tests", "not flashinfer", "0"), ("tests", "flashinfer", "1"), ("scenarios", "flashinfer", "0"),
        ("draws", "", "1")]
    assert [l.folder.name for l in lanes] == ["tests-not_flashinfer", "tests-flashinfer", "scenarios-flashinfer",
                                              "draws"]
    assert [l.gpu for l in v.make_lanes(v.parse(["--work", str(tmp_path)]), gpus=0)] == ["", "", ""]
    twice = v.make_lanes(v.parse(["--lanes", "draws draws", "--work", str(tmp_path)]), gpus=1)
    assert [l.folder.name for l in twice] == ["draws", "draws+"]  # each lane its own folder


@pytest.mark.slow
def test_bench_dry_run_leaves_the_runs_and_the_plan_table(tmp_path):
    out = tmp_path / "out"
    res = subprocess.run(["bash", str(GPU / "bench.sh"), "--dry-run", "--scenarios", "quickstart", "--backends", "sdpa",
                          "--timing", "--warmup-ms 1 --measure-ms 2", "--out", str(out), "--work", str(tmp_path / "w")],
                         capture_output=True, text=True, env=_env(), timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-3000:]
    assert {p.name for p in out.iterdir()} == {"bench.log", "runs.tgz", "plan.txt", "plan.json"}
    with tarfile.open(out / "runs.tgz") as tar:
        assert "./quickstart/rows.jsonl" in tar.getnames()
    assert "2 cases; slowest: quickstart/page_size=" in (out / "plan.txt").read_text()


def test_bench_refuses_a_scenario_that_is_not_shipped(tmp_path):
    res = subprocess.run(["bash", str(GPU / "bench.sh"), "--dry-run", "--scenarios", "decode-llama3-8b nope",
                          "--out", str(tmp_path / "o")], capture_output=True, text=True, env=_env(), timeout=60)
    assert res.returncode == 2
    assert "bench.sh: --scenarios: no shipped scenario 'nope'" in res.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("script", sorted(p.name for p in GPU.glob("*.sh")))
def test_front_door_shell_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(GPU / script)]).returncode == 0


def test_the_scenarios_lane_takes_every_gpu_scenario_and_leaves_the_cpu_ones(tmp_path):
    v = load_script("scripts/gpu/validate.py", "validate_under_test_shipped", register=True)
    names = {p.rsplit("/", 1)[1] for p in v.shipped(v.parse(["--work", str(tmp_path)]))}
    assert "cpu-sweep.yaml" not in names  # device: cpu
    assert {"tree-verify-llama3-8b.yaml", "tree-shapes.yaml", "triton-mla-16k.yaml"} <= names


@pytest.mark.slow
def test_resume_finds_a_lane_by_its_name_in_another_lane_list(tmp_path):
    """--resume on the same machine finishes what an earlier call left, whatever the lanes' order: the
    scenarios lane's finished jobs are kept, not run again."""
    base = ["bash", str(GPU / "validate.sh"), "--dry-run", "--work", str(tmp_path / "work"), "--budget-s", "600"]
    first = subprocess.run(base + ["--out", str(tmp_path / "o1"), "--lanes", "scenarios=sdpa"],
                           capture_output=True, text=True, env=_env(), timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    again = subprocess.run(base + ["--out", str(tmp_path / "o2"), "--lanes", "tests=harness scenarios=sdpa", "--resume",
                                   "--test-workers", "1"], capture_output=True, text=True, env=_env(), timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    table = (tmp_path / "work" / "scenarios-sdpa" / "verify_table.md").read_text()
    assert table.count("finished in an earlier call") == 2, table  # quickstart and mla-tiny
