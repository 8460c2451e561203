"""Fingerprints that tell hosts apart (issue 31, part 2): two CPU hosts with the same device
name (``cpu x86_64 (2 threads)``) timed sdpa 1.5x apart and ``check`` compared them. The host
fields (CPU model, cores, caches, torch build; GPU memory, driver, clocks) are recorded in the
manifest and the baseline, a baseline from another host is refused field by field unless
--allow-cross-device, and runs and baselines made before (the committed ci-cpu.json) still load
and are compared on what both sides have, with a note saying so."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from typer.testing import CliRunner

from attnbench.analyze.history_trends import trends
from attnbench.cli.app import app
from attnbench.measure.host import cache_sizes, cpu_fields, host_fingerprint, torch_build
from attnbench.store.baselines import load_rows
from attnbench.store.fingerprint import compare_fingerprints, fingerprint
from attnbench.store.history import add_run, points
from attnbench.store.runfolder import RunFolder
from tests.test_compare import _folder, _row

ROOT = Path(__file__).resolve().parents[1]
cli = CliRunner()

HOST = {"kind": "cpu", "cpu_model": "AMD EPYC", "cpu_id": "AuthenticAMD family 25 model 1 stepping 1",
        "cpu_cores": 2, "cpu_threads": 2, "l1d_cache": "32K", "l2_cache": "512K", "l3_cache": "32M",
        "cpu_isa": "AVX2", "torch_build": "2.13.0+cpu (cuda none, git cf30153c4c13)"}
CPUINFO = "".join(
    f"processor\t: {p}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
    f"model name\t: Intel(R) Xeon(R) Platinum 8480+\nstepping\t: 8\nphysical id\t: 0\ncore id\t\t: {p // 2}\n\n"
    for p in range(4))  # 2 cores, 2 threads each


def _sysfs(root: Path) -> Path:
    for i, (level, kind, size) in enumerate([("1", "Data", "48K"), ("1", "Instruction", "32K"),
                                             ("2", "Unified", "2048K"), ("3", "Unified", "107520K")]):
        d = root / "cpu0" / "cache" / f"index{i}"
        d.mkdir(parents=True)
        for name, text in (("level", level), ("type", kind), ("size", size)):
            (d / name).write_text(text + "\n")
    (root / "cpu0" / "cpufreq").mkdir(parents=True)
    (root / "cpu0" / "cpufreq" / "cpuinfo_max_freq").write_text("3800000\n")
    return root


def _env(host: dict | None, device: str = "cpu test") -> dict:
    env = {"device": device, "torch": torch.__version__, "backends": {}}
    return {**env, "host": host} if host is not None else env


def _runs(tmp_path: Path, base_host, run_host, device: str = "cpu test") -> tuple[str, str]:
    base = _folder(tmp_path / "base", [_row("ctx=1", "a", 1.0, seed=1), _row("ctx=2", "a", 1.0, seed=2)],
                   environment=_env(base_host, device))
    run = _folder(tmp_path / "run", [_row("ctx=1", "a", 1.0, seed=3), _row("ctx=2", "a", 1.0, seed=4)],
                  environment=_env(run_host, device))
    return str(run), str(base)


# ---------------------------------------------------------------------------- what is recorded
def test_cpu_fields_read_cpuinfo_and_sysfs(tmp_path):
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    got = cpu_fields(tmp_path / "cpuinfo", _sysfs(tmp_path / "sys"))
    assert got["cpu_model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert got["cpu_id"] == "GenuineIntel family 6 model 143 stepping 8"
    assert got["cpu_cores"] == 2 and got["cpu_threads"] == 4  # hyper-threads are not cores
    assert (got["l1d_cache"], got["l1i_cache"], got["l2_cache"], got["l3_cache"]) == ("48K", "32K", "2M", "105M")
    assert got["cpu_max_mhz"] == 3800


def test_cpu_fields_without_proc_or_sysfs_leave_fields_out(tmp_path):
    got = cpu_fields(tmp_path / "no-cpuinfo", tmp_path / "no-sys")
    assert got["cpu_model"]  # platform.processor() or machine()
    assert not any(k.endswith("_cache") for k in got) and "cpu_max_mhz" not in got and "cpu_id" not in got
    assert cache_sizes(tmp_path / "no-sys") == {}


def test_this_machine_records_its_host_and_the_torch_build():
    host = host_fingerprint(torch.device("cpu"))
    assert host["kind"] == "cpu" and host["cpu_model"] and host["cpu_threads"] >= 1
    assert host["torch_build"] == torch_build() and host["torch_build"].startswith(torch.__version__)
    assert ("cuda none" in host["torch_build"]) == (torch.version.cuda is None and torch.version.hip is None)
    json.dumps(host)  # goes into manifest.json as it is


def test_a_run_records_the_host_in_its_manifest_and_its_baseline(tmp_path):
    r = cli.invoke(app, ["run", "ci-gate", "--device", "cpu", "-q", "--out", str(tmp_path / "run"), "-k", "context=64",
                         "--set", "timing.measure_ms=5", "--set", "timing.rounds=5", "--set", "timing.min_runs=5"])
    assert r.exit_code == 0, r.output
    env = json.loads((tmp_path / "run" / "manifest.json").read_text())["environment"]
    assert env["host"] == host_fingerprint(torch.device("cpu"))
    r = cli.invoke(app, ["baseline", str(tmp_path / "run"), "--to", str(tmp_path / "b.json")])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["fingerprint"]["host"] == env["host"]
    assert load_rows(tmp_path / "b.json").fingerprint["host"] == env["host"]


# ---------------------------------------------------------------------------- what check does with it
def test_another_host_of_the_same_device_name_is_refused_field_by_field(tmp_path):
    other = {**HOST, "cpu_model": "Intel Xeon", "l3_cache": "105M", "cpu_cores": 56}
    run, base = _runs(tmp_path, HOST, other)
    r = cli.invoke(app, ["check", run, "--baseline", base])
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "different devices" in text and "--allow-cross-device" in text
    for field in ("cpu_model: AMD EPYC (baseline) vs Intel Xeon", "l3_cache: 32M (baseline) vs 105M",
                  "cpu_cores: 2 (baseline) vs 56"):
        assert field in text, (field, text)
    assert "device:" not in text  # the device name is the same: not listed
    r = cli.invoke(app, ["check", run, "--baseline", base, "--allow-cross-device"])
    assert r.exit_code == 0, r.output
    assert "fingerprints differ: cpu_model: AMD EPYC (baseline) vs Intel Xeon" in " ".join(r.output.split())
    r = cli.invoke(app, ["compare", "runs", base, run])
    assert r.exit_code == 2 and "cpu_model" in r.output


def test_the_same_host_with_another_torch_build_is_only_a_note(tmp_path):
    run, base = _runs(tmp_path, HOST, {**HOST, "torch_build": "2.13.0+cu128 (cuda 12.8, git cf30153c4c13)"})
    r = cli.invoke(app, ["check", run, "--baseline", base])
    assert r.exit_code == 0, r.output
    assert "fingerprints differ: torch_build:" in r.output and "PASS" in r.output


def test_gpu_fields_refuse_another_card_and_note_another_driver():
    h100 = {"kind": "cuda", "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_memory_mib": 81559, "gpu_sm_count": 132,
            "gpu_capability": "9.0", "gpu_driver": "570.86.15", "gpu_max_sm_mhz": 1980}
    dev = "NVIDIA H100 80GB HBM3"
    fp = {"device": dev, "torch": "2.13.0", "backends": {}, "host": h100}
    d = compare_fingerprints({**fp, "host": {**h100, "gpu_driver": "580.1"}}, fp)
    assert d.same_device and d.versions == ["gpu_driver: 570.86.15 (baseline) vs 580.1"]
    d = compare_fingerprints({**fp, "host": {**h100, "gpu_max_sm_mhz": 1755, "gpu_sm_count": 114}}, fp)
    assert not d.same_device and d.device == ["gpu_sm_count: 132 (baseline) vs 114", "gpu_max_sm_mhz: 1980 (baseline) vs 1755"]


def test_fields_on_one_side_only_are_not_compared(tmp_path):
    fewer = {k: v for k, v in HOST.items() if k not in ("l3_cache", "cpu_isa")}
    d = compare_fingerprints({"device": "x", "host": {**fewer, "cpu_max_mhz": 3000}}, {"device": "x", "host": HOST})
    assert d.same_device and not d.versions
    assert d.notes == ["host fields recorded on one side only, not compared: cpu_isa, cpu_max_mhz, l3_cache"]


def test_a_baseline_that_predates_host_fingerprints_is_compared_on_the_device_name(tmp_path):
    run, base = _runs(tmp_path, None, HOST)
    r = cli.invoke(app, ["check", run, "--baseline", base])
    assert r.exit_code == 0, r.output
    assert "the baseline predates host fingerprints" in " ".join(r.output.split())
    run2, base2 = _runs(tmp_path / "other", None, HOST, device="cpu x86_64 (2 threads)")
    r = cli.invoke(app, ["check", run2, "--baseline", run])  # another device name is still refused
    assert r.exit_code == 2 and "device: cpu test (baseline) vs cpu x86_64 (2 threads)" in " ".join(r.output.split())


def test_a_baseline_made_before_host_fingerprints_still_loads_and_checks(tmp_path):
    # the project's CI baseline as committed before host fingerprints (results/baselines/ci-cpu.json
    # at 6a62850; CI now compares commits instead, docs/ci.md)
    committed = ROOT / "tests" / "data" / "baseline-before-host-fingerprints.json"
    loaded = load_rows(committed, need_rounds=True)
    assert loaded.fingerprint["device"] == "cpu x86_64 (2 threads)" and loaded.fingerprint["host"] == {}
    doc = json.loads(committed.read_text())
    doc["fingerprint"]["host"] = HOST  # the same run as a baseline made today would say it
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps(doc))
    r = cli.invoke(app, ["check", str(newer), "--baseline", str(committed)])
    assert r.exit_code == 0, r.output
    assert "the baseline predates host fingerprints" in " ".join(r.output.split())
    doc["fingerprint"]["host"] = {**HOST, "cpu_model": "Intel Xeon"}
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    r = cli.invoke(app, ["check", str(other), "--baseline", str(newer)])
    assert r.exit_code == 2 and "cpu_model: AMD EPYC (baseline) vs Intel Xeon" in " ".join(r.output.split())


def test_a_hand_edited_host_keeps_only_texts_and_numbers(tmp_path):
    run, base = _runs(tmp_path, {"cpu_model": "AMD EPYC", "cpu_cores": True, "l3_cache": ["32M"]}, HOST)
    fp = fingerprint(RunFolder.load(Path(base)).manifest)
    assert fp["host"] == {"cpu_model": "AMD EPYC"}
    r = cli.invoke(app, ["check", run, "--baseline", base])
    assert r.exit_code == 0, r.output


# ---------------------------------------------------------------------------- history
def test_history_stores_the_host_and_does_not_compare_across_hosts(tmp_path):
    run, base = _runs(tmp_path, HOST, HOST)
    moved = Path(shutil.copytree(run, tmp_path / "moved"))
    m = json.loads((moved / "manifest.json").read_text())
    m["environment"]["host"]["cpu_model"] = "Intel Xeon"
    m["start_time"] = "2999-01-01T00:00:00+00:00"  # the latest night
    (moved / "manifest.json").write_text(json.dumps(m))
    old = Path(shutil.copytree(run, tmp_path / "old"))  # a run made before host fingerprints
    m = json.loads((old / "manifest.json").read_text())
    del m["environment"]["host"]
    m["start_time"] = "2000-01-01T00:00:00+00:00"  # the first night
    (old / "manifest.json").write_text(json.dumps(m))
    db = tmp_path / "h.sqlite"
    for p in (base, run, old, moved):
        rf = RunFolder.load(Path(p))
        add_run(db, Path(p), rf.manifest, rf.rows, None)
    pts = points(db)
    hosts = [p.run.fingerprint["host"] for p in pts[::2]]  # two rows per run, oldest run first
    assert hosts == [{}, HOST, HOST, {**HOST, "cpu_model": "Intel Xeon"}]
    steps = trends(pts)[("s", "ctx=1", "a")]
    assert [s.result is not None for s in steps] == [False, True, True, False]  # old vs base: on the device name
    assert steps[-1].note == "host changed (cpu_model: AMD EPYC -> Intel Xeon): not compared"
