"""Every shipped scenario through every installed backend and every route option, with
--save-tensors, each saved output rechecked by scripts/gpu/check_saved.py; one table of
statuses per backend (route) and scenario. The scenarios and draws lanes of scripts/gpu/validate.sh
run this; on a CPU it runs as it is (``--device cpu``, tests/test_verify_all.py).

Work: one ``attnbench run`` per scenario and lane (main: reference, sdpa, triton, flash-attn,
xformers | flex: its routes | flashinfer: its routes), a pool of ``--workers`` processes sharing the GPU
(statuses are the point here, not times: docs/benchmarks.md comes from scripts/gpu/bench.sh),
the longest jobs first. FlashInfer's JIT modules are built once by
scripts/gpu/flashinfer_warmup.py, in the background while the other lanes run; FlashInfer's jobs
come last. After each job: check_saved.py on its saved tensors (then deleted).

Budget: everything ends by ``--t0 + --budget-s``. A job still running near the end (or past
``--job-max-s``) gets SIGINT: attnbench keeps every finished row and marks its folder incomplete;
jobs not started are listed. ``--resume`` (same machine, same --work) finishes incomplete jobs
with ``attnbench run --resume`` and runs those not started; finished ones are kept.

Scenarios pinned to ``device: cpu`` (CPU scenarios) are left out and listed. Cases whose inputs
exceed ``--save-max-gb`` are run without --save-tensors (every row is still checked against the
float64 reference by attnbench itself): each saved case is rewritten after every row that adds
an output, so the largest shipped cases (4 GB) would cost minutes of writes.

Exit: 0 every row ran and none failed; 1 an error or mismatch row, or a saved output off; 3 none
failed but jobs were cut or not run (run again with --resume on the same machine); 2 a scenario did not load (its
message names the file and the field).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpulib  # noqa: E402

HERE = Path(__file__).resolve().parent
LANE_WEIGHT = {"flex": 3.0, "main": 2.0, "flashinfer": 1.5}
START_MARGIN_S = 60  # no job starts this close to the end
CUT_MARGIN_S = 35  # running jobs get SIGINT this long before the end
FINAL_MARGIN_S = 12  # the table is written in the last seconds


@dataclass
class Job:
    scenario: Path
    name: str  # the scenario's name
    lane: str
    specs: list[str]
    cases: int
    save: bool
    key: str = ""
    status: str = "pending"  # pending | running | done | failed (attnbench exited > 1) | cut | not run
    rc: Optional[int] = None
    secs: float = 0.0
    note: str = ""
    check: str = ""

    @property
    def weight(self) -> float:
        return self.cases * len(self.specs) * LANE_WEIGHT.get(self.lane, 1.0)


@dataclass
class State:
    args: argparse.Namespace
    end: float
    jobs: list[Job]
    lock: threading.Lock = field(default_factory=threading.Lock)
    warm: Optional[subprocess.Popen] = None
    log: list[str] = field(default_factory=list)

    def say(self, msg: str) -> None:
        line = f"[t+{time.time() - self.args.t0:.0f}s] {msg}"
        with self.lock:
            self.log.append(line)
        print(line, flush=True)

    def left(self) -> float:
        return self.end - time.time()


def probe(device: str, backend_file: Optional[str]) -> dict[str, Optional[str]]:
    """Backend name -> why it cannot run on ``device`` (None: it can), asked in a child process
    (importing the libraries here would hold a CUDA context for the whole run)."""
    code = (
        "import json, sys\n"
        "from attnbench.backend import registry as reg\n"
        + (f"from attnbench.backend.files import load_backend_file\nload_backend_file({backend_file!r})\n"
           if backend_file else "")
        + "out = {}\n"
        "for n in reg.all_names():\n"
        "    try:\n"
        "        cls = reg.get_backend_class(n)\n"
        f"        out[n] = cls.unavailable() or cls.device_reason({device.split(':')[0]!r})\n"
        "    except Exception as e:\n"
        "        out[n] = f'{type(e).__name__}: {e}'\n"
        "print(json.dumps(out))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if res.returncode:
        raise SystemExit(f"probing the backends failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def plan_jobs(args, avail: dict[str, Optional[str]]) -> tuple[list[Job], list[str], list[str]]:
    """The jobs, the scenarios left out (why) and the backends left out (why)."""
    from attnbench.backend import BUILTIN, backend_name, canonical_spec
    from attnbench.workload.scenario import load
    from attnbench.execute.cases import select_rows

    if args.specs:  # canonical, as the rows name them (xformers -> xformers:triton_only=on where set)
        specs = list(dict.fromkeys(_canonical(canonical_spec, s) for s in args.specs.split(",") if s))
    else:
        specs = [s for n, why in avail.items() if not why and n in BUILTIN for s in gpulib.route_specs(n)]

    lanes: dict[str, list[str]] = collections.OrderedDict()
    for s in specs:
        n = backend_name(s)
        lane = "flex" if n == "flex" else "flashinfer" if n == "flashinfer" else "main"
        lanes.setdefault(lane, []).append(s)
    left_out_b = [f"{n}: {why}" for n, why in avail.items() if why and n in BUILTIN]
    paths = [Path(p) for p in args.scenarios] if args.scenarios else gpulib.shipped_scenarios()
    jobs, left_out_s = [], []
    picks = select_rows(args.pick)
    for p in paths:
        sf = load(p, args.set or None)
        if sf.scenario.device == "cpu" and not args.scenarios:
            left_out_s.append(f"{sf.name}: pinned to device: cpu (a CPU scenario)")
            continue
        cases = [c for c in sf.cases if any(picks(c.case_id, s, c.params) for s in specs)]
        if not cases:
            left_out_s.append(f"{sf.name}: --pick {args.pick!r} matches none of its cases")
            continue
        biggest = max(c.scenario.batch_spec().memory_bytes() for c in cases)
        save = biggest <= args.save_max_gb * 1e9
        for lane, ss in lanes.items():
            jobs.append(Job(p, sf.name, lane, list(ss), len(cases), save, key=f"{sf.name.replace('/', '_')}--{lane}",
                            note="" if save else f"not saved: its largest case's inputs are {biggest / 1e9:.1f} GB"))
    jobs.sort(key=lambda j: (j.lane == "flashinfer", -j.weight))
    return jobs, left_out_s, left_out_b


def _canonical(canonical_spec, spec: str) -> str:
    try:
        return canonical_spec(spec)
    except Exception:  # a --backend-file plugin: registered in the run's own process, not here
        return spec


def job_env(args) -> dict:
    env = dict(os.environ)
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # flex's compiles in-process: no pool per job
    env.setdefault("MAX_JOBS", "4")  # a FlashInfer module the warm-up did not build: 4 nvcc at a time
    return env


def run_job(st: State, job: Job) -> None:
    a = st.args
    run_dir, save_dir = a.work / "runs" / job.key, a.save_root / job.key
    log = a.work / "logs" / f"{job.key}.log"
    if a.resume and (run_dir / "manifest.json").is_file():
        status = json.loads((run_dir / "manifest.json").read_text()).get("status")
        if status == "complete":
            job.status, job.note = "done", (job.note + "; " if job.note else "") + "finished in an earlier call"
            return
        cmd = [sys.executable, "-m", "attnbench", "run", "--resume", str(run_dir), "-q"]
        if a.backend_file:
            cmd += ["--backend-file", a.backend_file]
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = [sys.executable, "-m", "attnbench", "run", str(job.scenario), "--out", str(run_dir), "-q",
               "--device", a.device, "--warmup-ms", str(a.warmup_ms), "--measure-ms", str(a.measure_ms),
               "--set", "timing.rounds=1"]
        for s in a.set:
            cmd += ["--set", s]
        if a.pick:
            cmd += ["-k", a.pick]
        for s in job.specs:
            cmd += ["-b", s]
        if a.backend_file:
            cmd += ["--backend-file", a.backend_file]
        if job.save:
            cmd += ["--save-tensors", str(save_dir)]
    limit = min(a.job_max_s, st.left() - CUT_MARGIN_S)
    t0 = time.time()
    job.status = "running"
    st.say(f"start {job.key} ({job.cases} cases x {len(job.specs)} backends; cut at {limit:.0f} s)")
    with open(log, "a") as fh:
        fh.write(" ".join(cmd) + "\n")
        fh.flush()
        p = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=job_env(a), start_new_session=True,
                             cwd=gpulib.ROOT)
        try:
            job.rc = p.wait(timeout=max(1.0, limit))
            job.status = "done" if job.rc in (0, 1) else "failed"  # 1: some row failed (the table says which)
            if job.status == "failed":
                job.note = (job.note + "; " if job.note else "") + f"attnbench exited {job.rc} (logs/{job.key}.log)"
        except subprocess.TimeoutExpired:
            # to attnbench's pid alone (its supervisor passes it on), not the group: every row an H200
            # run kept as 'Ninja build failed' was in flight in a job cut so, when the group's SIGINT
            # also reached FlashInfer's ninja; attnbench keeps the finished rows
            os.kill(p.pid, signal.SIGINT)
            try:
                job.rc = p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            try:  # what is left of the job (a worker still winding down holds the run folder's lock,
                os.killpg(p.pid, signal.SIGKILL)  # and a --resume right after would find it taken)
            except ProcessLookupError:
                pass
            job.rc = p.wait()
            job.status = "cut"
            why = "the job limit" if limit >= a.job_max_s else "the budget"
            job.note = (job.note + "; " if job.note else "") + f"cut at {limit:.0f} s ({why})"
    job.secs = time.time() - t0
    st.say(f"end {job.key}: rc={job.rc} {job.status} in {job.secs:.0f} s")
    if save_dir.is_dir() and any(save_dir.glob("*.pt")):
        check_saved(st, job, save_dir)


def check_saved(st: State, job: Job, save_dir: Path) -> None:
    """check_saved.py on the job's saved tensors (its records: checks/<job>.jsonl), then delete them."""
    a = st.args
    limit = st.left() - FINAL_MARGIN_S
    out = a.work / "checks" / f"{job.key}.jsonl"
    if limit < 5:
        job.check = "not checked (out of time)"
    else:
        with open(a.work / "logs" / f"{job.key}.check.log", "a") as fh:
            try:
                rc = subprocess.run([sys.executable, str(HERE / "check_saved.py"), str(save_dir), "--jsonl", str(out)],
                                    stdout=fh, stderr=subprocess.STDOUT, timeout=limit, cwd=gpulib.ROOT).returncode
                job.check = "checked" if rc in (0, 1) else f"check_saved.py exited {rc}"
            except subprocess.TimeoutExpired:
                job.check = "check cut (out of time)"
    if not a.keep_tensors:
        for f in save_dir.glob("*.pt"):
            f.unlink()


def pool(st: State) -> None:
    """``--workers`` threads take the jobs in order (the longest first, FlashInfer's last: by the
    time they start, the warm-up has had the time of every other job; a kernel it is still
    building is waited for through FlashInfer's lock)."""

    def take() -> Optional[Job]:
        with st.lock:
            for j in st.jobs:
                if j.status != "pending":
                    continue
                if st.left() < START_MARGIN_S:
                    j.status = "not run"
                    continue
                j.status = "running"
                return j
        return None

    def work() -> None:
        while (job := take()) is not None:
            try:
                run_job(st, job)
            except Exception as e:  # the table says it; the other jobs go on
                job.status, job.note = "failed", f"orchestration error: {type(e).__name__}: {e}"

    threads = [threading.Thread(target=work, daemon=True) for _ in range(st.args.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def start_warmup(st: State, scenarios: list[Path], specs: list[str]) -> None:
    a = st.args
    budget = min(a.warm_s, st.left() - 120)
    if budget < 30 or not specs:
        return
    cmd = [sys.executable, str(HERE / "flashinfer_warmup.py"), "--scenarios", *map(str, scenarios), "--specs", ",".join(specs),
           "--procs", str(a.warm_procs), "--budget-s", str(int(budget)), "--log", str(a.work / "logs" / "warmup_builds.log"),
           "--jsonl", str(a.work / "checks" / "warmup.jsonl")]
    for s in a.set:
        cmd += ["--set", s]
    if getattr(a, "pick", None):
        cmd += ["--pick", a.pick]
    st.say(f"FlashInfer JIT warm-up: {a.warm_procs} processes, at most {budget:.0f} s")
    st.warm = subprocess.Popen(cmd, stdout=open(a.work / "logs" / "warmup.log", "a"), stderr=subprocess.STDOUT,
                               env=job_env(a), cwd=gpulib.ROOT, start_new_session=True)


def table(st: State, left_s: list[str], left_b: list[str], header: dict) -> tuple[str, int]:
    """The report (markdown) and the exit code."""
    a = st.args
    run_dirs = [a.work / "runs" / j.key for j in st.jobs if (a.work / "runs" / j.key).is_dir()]
    rows, _ = gpulib.read_rows(run_dirs)
    saved = []
    scen_of_key = {j.key: j.name for j in st.jobs}
    for j in st.jobs:
        f = a.work / "checks" / f"{j.key}.jsonl"
        if f.is_file():
            for line in f.read_text().splitlines():
                rec = json.loads(line)
                saved.append({**rec, "scenario": scen_of_key[j.key]})
    cells = gpulib.cells_of(rows, saved)
    for j in st.jobs:
        for s in j.specs:
            c = cells[(s, j.name)]
            c.cases = j.cases
            notes = [n for n in (j.note if j.status != "not run" else "not run (out of time)",
                                 j.check if j.check not in ("", "checked") else "") if n]
            c.note = "; ".join(notes)
    lines, ids = gpulib.status_table(cells)
    total = collections.Counter()
    for c in cells.values():
        total.update(c.counts)
    off = [s for s in saved if not s["ok"]]
    failed = gpulib.failed_rows(rows)
    cut = [j for j in st.jobs if j.status in ("cut", "not run")]
    broken = [j for j in st.jobs if j.status == "failed"]
    xf = any("triton-only" in str(r.id.mode) for r in rows) or any("triton_only=on" in r.id.backend for r in rows)
    out = ["# attnbench GPU verification (scripts/gpu/verify_all.py)", ""]
    out += [f"- {k}: {v}" for k, v in header.items()]
    if xf:
        out.append("- xformers ran in **Triton-only mode** (`xformers:triton_only=on`, ATTNBENCH_XFORMERS_TRITON_ONLY=1): its "
                   "C++/CUDA extension does not load with this torch; its rows are xformers' Triton split-K kernels")
    out += [f"- left out: {x}" for x in left_s + left_b]
    out += ["- all rows: " + ", ".join(f"{k} {total[k]}" for k in gpulib.STATUSES)
            + f"; saved outputs rechecked by check_saved.py: {len(saved) - len(off)} ok, {len(off)} off", ""]
    out += lines + ["", "Skip reasons:", ""] + (gpulib.legend(ids) or ["- none"]) + [""]
    out += ["Failed rows (error / mismatch):", ""] + ([f"- {x}" for x in failed] or ["- none"]) + [""]
    out += ["Saved outputs off (check_saved.py):", ""]
    out += [f"- {s['scenario']} | {s['case_id']} | {s['backend']}: rel err {s['rel']} [{s['variants']}]" for s in off] or ["- none"]
    out += ["", "Jobs cut or not run (run again with --resume on the same machine to finish them):", ""]
    out += [f"- {j.key}: {j.note if j.status == 'cut' else 'not run (out of time)'}" for j in cut] or ["- none"]
    out += ["", "Jobs that did not run (attnbench failed to start or crashed):", ""]
    out += [f"- {j.key}: {j.note}" for j in broken] or ["- none"]
    code = 1 if (failed or off or broken) else 3 if cut else 0
    return "\n".join(out) + "\n", code


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="where the table goes (verify_table.md, verify_rows.csv)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/verify_work"), help="run folders, logs, checks")
    ap.add_argument("--save-root", type=Path, default=None, help="where saved tensors go (default: /dev/shm if roomy, else WORK/tensors)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--scenarios", nargs="*", default=[], help="default: every shipped scenario not pinned to the CPU")
    ap.add_argument("--specs", default="", help="backend specs, comma-separated (default: every installed backend and route option)")
    ap.add_argument("--set", action="append", default=[], help="scenario override KEY=VALUE for every run (tests)")
    ap.add_argument("--backend-file", default=None)
    ap.add_argument("--pick", default=None, help="attnbench run -k EXPR for every run: only the cases it matches (finish a cut run on a fresh machine)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--warm-procs", type=int, default=3)
    ap.add_argument("--warm-s", type=float, default=300)
    ap.add_argument("--budget-s", type=float, default=560)
    ap.add_argument("--t0", type=float, default=None, help="epoch seconds the budget counts from (default: now)")
    ap.add_argument("--job-max-s", type=float, default=300)
    ap.add_argument("--warmup-ms", type=float, default=1.0)
    ap.add_argument("--measure-ms", type=float, default=3.0)
    ap.add_argument("--save-max-gb", type=float, default=0.7)
    ap.add_argument("--keep-tensors", action="store_true")
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)
    args.t0 = args.t0 or time.time()
    args.work = args.work.absolute()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.resume:
        shutil.rmtree(args.work, ignore_errors=True)
    for d in ("runs", "logs", "checks"):
        (args.work / d).mkdir(parents=True, exist_ok=True)
    if args.save_root is None:  # a folder of this script's own: emptied on a fresh start
        shm = Path("/dev/shm")
        roomy = shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 24e9
        args.save_root = shm / "attnbench_verify" if roomy else args.work / "tensors"
        if not args.resume:
            shutil.rmtree(args.save_root, ignore_errors=True)
    args.save_root = args.save_root.absolute()
    args.save_root.mkdir(parents=True, exist_ok=True)

    st = State(args, args.t0 + args.budget_s, [])
    avail = probe(args.device, args.backend_file)
    from attnbench.workload.messages import ScenarioError
    try:
        st.jobs, left_s, left_b = plan_jobs(args, avail)
    except ScenarioError as e:  # a --scenarios path that is not there, a file that does not load: no traceback
        st.say(f"verify_all: {e}")
        return 2
    specs = sorted({s for j in st.jobs for s in j.specs})
    st.say(f"{len(st.jobs)} jobs: {len({j.name for j in st.jobs})} scenarios x lanes "
           f"{', '.join(sorted({j.lane for j in st.jobs}))}; backends: {' '.join(specs)}; {args.workers} workers; "
           f"tensors saved in {args.save_root}")
    for x in left_s + left_b:
        st.say(f"left out: {x}")
    fi = [s for s in specs if s.startswith("flashinfer")]
    if fi and args.device.startswith("cuda"):
        done_before = args.resume and any(j.lane == "flashinfer" and (args.work / "runs" / j.key / "manifest.json").is_file()
                                          for j in st.jobs)
        if not done_before:
            start_warmup(st, sorted({j.scenario for j in st.jobs}), fi)
    pool(st)
    if st.warm is not None:
        if st.warm.poll() is None:
            st.warm.terminate()  # it kills its own workers (sessions of their own) on SIGTERM
            try:
                st.warm.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(st.warm.pid, signal.SIGKILL)
        st.warm.wait()
        st.say("warm-up: " + " | ".join(l for l in (args.work / "logs" / "warmup.log").read_text().splitlines()
                                        if l.startswith("flashinfer warm-up")))
    header = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "device": args.device,
              "workers": f"{args.workers} processes sharing the device (statuses, not times)",
              "timing": f"--warmup-ms {args.warmup_ms:g} --measure-ms {args.measure_ms:g}, timing.rounds=1",
              "wall": f"{time.time() - args.t0:.0f} s of a {args.budget_s:.0f} s budget"}
    env = _environment(st)
    if env:
        header["environment"] = env
    text, code = table(st, left_s, left_b, header)
    (args.out / "verify_table.md").write_text(text)
    _rows_csv(st, args.out / "verify_rows.csv")
    print(text, flush=True)
    return code


def _environment(st: State) -> str:
    for j in st.jobs:
        m = st.args.work / "runs" / j.key / "manifest.json"
        if m.is_file():
            e = json.loads(m.read_text()).get("environment") or {}
            # the device machine gets a copy of the working tree whose git metadata need not be the
            # session's: the caller names the commit it sent (HOST_COMMIT, +dirty for uncommitted edits)
            commit = os.environ.get("HOST_COMMIT") or f"{e.get('git_commit') or 'n/a'} (the copy's git metadata)"
            return (f"{e.get('device')}; torch {e.get('torch')}, CUDA {e.get('cuda')}, triton {e.get('triton')}; "
                    f"attnbench commit {commit}")
    return ""


def _rows_csv(st: State, path: Path) -> None:
    import csv

    rows, _ = gpulib.read_rows([st.args.work / "runs" / j.key for j in st.jobs if (st.args.work / "runs" / j.key).is_dir()])
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scenario", "case_id", "backend", "status", "mode", "rel_err", "median_ms", "reason"])
        for r in rows:
            w.writerow([r.id.scenario, r.id.case_id, r.id.backend, getattr(r.status, "value", r.status), r.id.mode,
                        r.correctness.rel_err, r.timing.median_ms, r.reason])


if __name__ == "__main__":
    sys.exit(main())
