"""The GPU validation: lanes of work side by side, one GPU per lane where there are several, all
inside one budget, one summary. scripts/gpu/validate.sh sets the machine up and runs this.

Lanes (``--lanes "tests scenarios draws"``, the default; ``NAME=ARG`` gives a lane its argument):

- ``tests[=EXPR]``: ``pytest -m gpu tests`` (``-k EXPR``), with pytest-xdist workers and a
  per-test timeout where those plugins are installed, every skip reason listed; FlashInfer's JIT
  modules for the tests' batches are built first in the background (flashinfer_warmup.py) and
  FlashInfer's tests go last.
- ``scenarios[=SPECS]``: every shipped scenario that is not pinned to the CPU
  (attnbench/scenarios/, attnbench/scenarios/gpu/, scripts/gpu/scenarios/) through every installed
  backend and every route option (``SPECS``: backend specs, comma-separated), with
  ``--save-tensors``, each saved output recomputed by check_saved.py (verify_all.py does this).
- ``draws[=SPECS]``: ``--draws`` seeded random scenarios (random_scenarios.py ``--seed``, a third as
  many FP8 decode draws at seed + 100000, and as many for the narrow triton routes, ``--profile
  routes``, at seed + 200000) through the same check: batches nobody wrote.
- ``timer``: the timer's own checks (gpu_checks.py); run it on a GPU of its own, it times.

A multi-GPU machine runs lane i on GPU i modulo the GPUs; more lanes than GPUs share them
(statuses, not times). The same lane may appear twice with different arguments, e.g. ``--lane
"tests=not flashinfer" --lane "tests=flashinfer"`` (``--lane`` takes one lane, spaces and all;
``--lanes-file FILE``: one lane a line, ``#`` comments).

Budget: everything ends by ``--budget-s`` seconds after the start (the setup's included): a lane
still running near the end is interrupted and keeps what it finished (a run folder marked
incomplete, a junit file of the tests that ran). ``--resume`` on the same machine (same ``--work``)
finishes the scenarios and draws lanes' cut jobs; the tests lane runs again whole.

Writes into ``--out``: validate.log (everything said), summary.md (one section a lane) and
details.tgz (every lane's folder: run folders, logs, the junit xml, check records); with
``--save-flashinfer`` also the FlashInfer modules built here (fijit-*.tar, for .fijit/). Exit: 0 all
ok; 1 a failed test, a wrong row or a saved output off; 3 nothing failed but work was cut or not
run; 2 bad flags.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))  # gpulib (scripts/gpu is no package), imported where used
LANE_NAMES = ("tests", "scenarios", "draws", "timer")
DEFAULT_LANES = "tests scenarios draws"
END_MARGIN_S = 20  # the summary and the tarball are written in the last seconds
GRACE_S = 20  # what an interrupted command gets to write what it finished, before it is killed
SAVE_FLASHINFER_S = 60  # --save-flashinfer's packing, after the lanes (flashinfer_cache.py --max-s)
DRY_SCENARIOS = ("attnbench/scenarios/quickstart.yaml", "attnbench/scenarios/mla-tiny.yaml")


@dataclass
class Lane:
    name: str
    arg: str
    index: int
    folder: Path
    gpu: str = ""
    rc: int = 0  # 0 ok, 1 failed, 3 cut or not run
    summary: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        return self.folder.name + (f" ({self.arg})" if self.arg else "")


class Say:
    """Print and keep a line (validate.log), with the seconds since the start."""

    def __init__(self, t0: float, log: Path):
        self.t0, self.log, self.lock = t0, log, threading.Lock()

    def __call__(self, msg: str) -> None:
        line = f"[t+{time.time() - self.t0:.0f}s] {msg}"
        with self.lock:
            print(line, flush=True)
            with open(self.log, "a") as fh:
                fh.write(line + "\n")


def lane_texts(a) -> list[str]:
    """The lanes in order: --lanes, then --lanes-file's, then each --lane."""
    texts = a.lanes.split() if a.lanes is not None else []
    if a.lanes_file is not None:
        if not a.lanes_file.is_file():
            raise SystemExit(_bad(f"--lanes-file {a.lanes_file}: no such file"))
        texts += [t.strip() for t in a.lanes_file.read_text().splitlines() if t.strip() and not t.startswith("#")]
    return texts + list(a.lane) or DEFAULT_LANES.split()


def _bad(msg: str) -> int:
    print(f"validate: {msg}", file=sys.stderr)
    return 2


def make_lanes(a, gpus: int) -> list[Lane]:
    lanes, taken = [], set()
    for i, text in enumerate(lane_texts(a)):
        name, _, arg = text.partition("=")
        if name not in LANE_NAMES:
            raise SystemExit(_bad(f"lane '{text}': no such lane; the lanes are {', '.join(LANE_NAMES)} "
                                  "(NAME or NAME=ARG)"))
        # the folder is named by the lane, not its place, so that --resume finds it in any lane list
        folder = name + ("-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", arg).strip("_")[:40] if arg else "")
        while folder in taken:
            folder += "+"
        taken.add(folder)
        lane = Lane(name, arg, i, a.work / folder)
        lane.gpu = str(i % gpus) if gpus else ""
        lanes.append(lane)
    return lanes


def gpu_count(a) -> int:
    if a.gpus is not None:
        return a.gpus
    if a.dry_run:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


def lane_env(lane: Lane) -> dict:
    env = dict(os.environ)
    if lane.gpu:
        env["CUDA_VISIBLE_DEVICES"] = lane.gpu
    return env


def bounded(cmd: list[str], log: Path, env: dict, seconds: float) -> tuple[int, bool]:
    """``cmd`` with its output in ``log``, interrupted (SIGINT, then killed) after ``seconds``:
    (exit code, cut)."""
    with open(log, "a") as fh:
        fh.write(" ".join(cmd) + "\n")
        fh.flush()
        p = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
        try:
            return p.wait(timeout=max(1.0, seconds)), False
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGINT)  # attnbench and pytest keep what they finished
            try:
                rc = p.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                rc = None
            try:  # and whatever it left behind (a JIT build's ninja and nvcc) goes with it
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return (p.wait() if rc is None else rc), True


def run_tests(lane: Lane, a, end: float, say) -> None:
    import gpulib

    env, xml = lane_env(lane), lane.folder / "pytest_gpu.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-rs", "-q", "-p", "no:cacheprovider", "--junitxml", str(xml)]
    if _has("xdist"):
        cmd += ["-n", str(a.test_workers)]
    if _has("pytest_timeout"):
        cmd += ["--timeout", str(a.test_timeout_s)]
    else:
        say(f"{lane.title}: pytest-timeout is not installed: no per-test timeout (carry its wheel in .whl/)")
    if lane.arg:
        cmd += ["-k", lane.arg]
    warm = None
    if not a.dry_run and _has("flashinfer"):
        env["ATTNBENCH_FLASHINFER_LAST"] = "1"
        warm = subprocess.Popen([sys.executable, str(HERE / "flashinfer_warmup.py"), "--tests", "--procs", "4",
                                 "--budget-s", str(int(max(30, end - time.time() - 120))),
                                 "--log", str(lane.folder / "warmup_builds.log")],
                                stdout=open(lane.folder / "warmup.log", "a"), stderr=subprocess.STDOUT, env=env,
                                cwd=ROOT, start_new_session=True)
    rc, cut = bounded(cmd + ["tests"], lane.folder / "pytest.log", env, end - time.time())
    if warm is not None and warm.poll() is None:
        warm.terminate()
        warm.wait()
    lane.summary = gpulib.junit_summary(xml) if xml.is_file() else ["no junit xml: pytest did not reach its summary"]
    counts = re.search(r"failure (\d+), error (\d+)", lane.summary[0])
    failed = rc == 1 or (not cut and rc not in (0, 5)) or bool(counts and (int(counts[1]) or int(counts[2])))
    lane.rc = 1 if failed else 3 if cut else 0  # 5: no test selected (an -k that matches none)
    if cut:
        lane.summary.insert(0, "cut at the budget: the tests still running are counted unfinished")


def _has(module: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


def run_verify(lane: Lane, a, end: float, scenarios: list[str]) -> None:
    """verify_all.py over ``scenarios`` with the lane's specs; its table is the lane's summary."""
    save_root = Path("/dev/shm") / f"attnbench-validate-{lane.index}" if _roomy_shm() else lane.folder / "tensors"
    cmd = [sys.executable, str(HERE / "verify_all.py"), "--out", str(lane.folder), "--work", str(lane.folder / "work"),
           "--save-root", str(save_root), "--t0", str(time.time()), "--budget-s", str(end - time.time()),
           "--workers", str(a.workers), "--scenarios", *scenarios]
    if lane.arg:
        cmd += ["--specs", lane.arg]
    if a.resume:
        cmd.append("--resume")
    if a.dry_run:
        cmd += ["--device", "cpu"]
    rc, cut = bounded(cmd, lane.folder / "verify.log", lane_env(lane), end - time.time() + 10)
    shutil.rmtree(save_root, ignore_errors=True)
    table = lane.folder / "verify_table.md"
    lane.summary = _verify_summary(table.read_text()) if table.is_file() else ["no table: verify_all.py did not end"]
    lane.rc = 1 if rc in (1, 2) else 3 if cut or rc else 0
    if rc == 2:
        lane.summary.append("a scenario did not load (verify.log names it)")


def _roomy_shm() -> bool:
    shm = Path("/dev/shm")
    return shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 24e9


def _verify_summary(text: str) -> list[str]:
    """The table's header lines and its lists (failed rows, saved outputs off, jobs cut), not the
    per-backend table itself (details.tgz has it)."""
    keep, section = [], ""
    for line in text.splitlines():
        if line.startswith("- ") and not section and not line.startswith("- command:"):
            keep.append(line)
        elif line.endswith(":") and not line.startswith("|"):
            section = line
            if line.startswith(("Failed", "Saved", "Jobs")):
                keep.append(line)
        elif line.startswith("- ") and section.startswith(("Failed", "Saved", "Jobs")):
            keep.append("  " + line)
    return keep


def shipped(a) -> list[str]:
    if a.dry_run:
        return [str(ROOT / p) for p in DRY_SCENARIOS]
    import gpulib

    paths = gpulib.shipped_scenarios() + sorted((HERE / "scenarios").glob("*.yaml"))
    return [str(p) for p in paths if not gpulib.pinned_to_cpu(p)]  # the CPU scenarios are not the GPU's


def run_draws(lane: Lane, a, end: float, say) -> None:
    folder = lane.folder / "scenarios"
    sets = [(a.seed, "all", a.draws), (a.seed + 100000, "decode", max(1, a.draws // 3)),
            (a.seed + 200000, "routes", max(3, a.draws // 3))]
    if not a.resume or not folder.is_dir():
        for seed, profile, n in sets:
            rc, _ = bounded([sys.executable, str(HERE / "random_scenarios.py"), "--n", str(n), "--seed", str(seed),
                             "--profile", profile, "--max-nodes", "128", "--out", str(folder)],
                            lane.folder / "draws.log", lane_env(lane), max(10.0, end - time.time()))
            if rc:
                lane.rc, lane.summary = 1, [f"random_scenarios.py exited {rc} (draws.log)"]
                return
    files = sorted(str(p) for p in folder.glob("*.yaml"))
    say(f"{lane.title}: {len(files)} draws (seed {a.seed}: {a.draws}; seed {a.seed + 100000}, FP8 decodes: "
        f"{max(1, a.draws // 3)}; seed {a.seed + 200000}, the narrow triton routes: {max(3, a.draws // 3)})")
    run_verify(lane, a, end, files)


def run_timer(lane: Lane, a, end: float, say) -> None:
    rc, cut = bounded([sys.executable, str(HERE / "gpu_checks.py"), "--out", str(lane.folder)],
                      lane.folder / "gpu_checks.log", lane_env(lane), end - time.time())
    text = (lane.folder / "gpu_checks.log").read_text(errors="replace").splitlines()
    lane.summary = [line for line in text if line.startswith(("verdict", "gpu_checks"))] or text[-5:]
    lane.rc = 3 if cut else 1 if rc else 0


def run_lane(lane: Lane, a, end: float, say) -> None:
    lane.folder.mkdir(parents=True, exist_ok=True)
    say(f"{lane.title}: start" + (f" on GPU {lane.gpu}" if lane.gpu else ""))
    try:
        if lane.name == "tests":
            run_tests(lane, a, end, say)
        elif lane.name == "scenarios":
            run_verify(lane, a, end, shipped(a))
        elif lane.name == "draws":
            run_draws(lane, a, end, say)
        else:
            run_timer(lane, a, end, say)
    except Exception as e:  # the summary says it; the other lanes go on
        lane.rc, lane.summary = 1, [f"the lane broke: {type(e).__name__}: {e}"]
    say(f"{lane.title}: done, " + {0: "all ok", 1: "FAILED", 3: "cut or not all run"}[lane.rc])


def write_summary(lanes: list[Lane], a, t0: float) -> str:
    status = {0: "ok", 1: "**failed**", 3: "cut or not all run"}
    out = ["# GPU validation (scripts/gpu/validate.sh)", "",
           f"- command: validate.py {shlex.join(sys.argv[1:])}",
           f"- commit: {os.environ.get('HOST_COMMIT') or _git_commit()}",
           f"- wall: {time.time() - t0:.0f} s of a {a.budget_s:.0f} s budget", ""]
    for lane in lanes:
        out += [f"## {lane.title}: {status[lane.rc]}" + (f" (GPU {lane.gpu})" if lane.gpu else ""), ""]
        out += lane.summary + [""]
    out.append("Details (run folders, logs, junit xml, saved-output checks): details.tgz")
    return "\n".join(out) + "\n"


def _git_commit() -> str:
    res = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return (res.stdout.strip() or "n/a") + " (this copy's git metadata; HOST_COMMIT names the one sent)"


def pack(work: Path, out: Path) -> None:
    def keep(info: tarfile.TarInfo):
        return None if info.name.endswith(".pt") or "/tensors" in info.name else info

    with tarfile.open(out / "details.tgz", "w:gz") as tar:
        tar.add(work, arcname="details", filter=keep)


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-validate"),
                    help="where validate.log, summary.md and details.tgz go (default: $OUT, else ./gpu-validate)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/attnbench-validate"),
                    help="the lanes' folders while they run (--resume finds them there)")
    ap.add_argument("--lanes", default=None, help=f'lanes, space-separated (default "{DEFAULT_LANES}")')
    ap.add_argument("--lane", action="append", default=[], help="one lane, NAME or NAME=ARG (repeatable)")
    ap.add_argument("--lanes-file", type=Path, default=None, help="one lane a line (# comments)")
    ap.add_argument("--budget-s", type=float, default=570.0, help="seconds from the start for everything")
    ap.add_argument("--seed", type=int, default=1, help="the draws' seed (a new one: batches nobody has seen)")
    ap.add_argument("--draws", type=int, default=24, help="random scenarios in the draws lane")
    ap.add_argument("--workers", type=int, default=3, help="attnbench runs at once in a scenarios or draws lane")
    ap.add_argument("--test-workers", type=int, default=6, help="pytest-xdist workers in a tests lane")
    ap.add_argument("--test-timeout-s", type=int, default=480, help="pytest-timeout per test")
    ap.add_argument("--gpus", type=int, default=None, help="GPUs to spread the lanes over (default: nvidia-smi -L)")
    ap.add_argument("--save-flashinfer", action="store_true",
                    help="at the end, pack the FlashInfer modules built here into --out (fijit-*.tar: carry them in "
                         ".fijit/ next time, flashinfer_cache.py)")
    ap.add_argument("--resume", action="store_true", help="finish the cut jobs of an earlier call (same --work)")
    ap.add_argument("--dry-run", action="store_true", help="on the CPU: no setup, two tiny scenarios (tests)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse(argv)
    t0 = float(os.environ.get("ATTNBENCH_VALIDATE_T0") or time.time())
    a.out, a.work = a.out.absolute(), a.work.absolute()
    lanes = make_lanes(a, gpu_count(a))
    if not a.resume:
        shutil.rmtree(a.work, ignore_errors=True)
    a.work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    say = Say(t0, a.out / "validate.log")
    # the lanes end early enough for an interrupted command's grace, the summary and the packing
    end = t0 + a.budget_s - END_MARGIN_S - GRACE_S - (SAVE_FLASHINFER_S if a.save_flashinfer else 0)
    say(f"lanes: {', '.join(l.title for l in lanes)}; budget {a.budget_s:.0f} s; work in {a.work}")
    threads = [threading.Thread(target=run_lane, args=(lane, a, end, say), daemon=True) for lane in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    text = write_summary(lanes, a, t0)
    (a.out / "summary.md").write_text(text)
    pack(a.work, a.out)
    if a.save_flashinfer:
        res = subprocess.run([sys.executable, str(HERE / "flashinfer_cache.py"), "save", str(a.out), "--prefer", "pod",
                              "--max-s", str(SAVE_FLASHINFER_S)], capture_output=True, text=True, cwd=ROOT)
        say("FlashInfer modules: " + (res.stdout.strip().splitlines() or [f"none (exit {res.returncode})"])[-1])
    print(text, flush=True)
    say(f"done; in {a.out}: validate.log, summary.md, details.tgz")
    return 1 if any(l.rc == 1 for l in lanes) else 3 if any(l.rc for l in lanes) else 0


if __name__ == "__main__":
    sys.exit(main())
