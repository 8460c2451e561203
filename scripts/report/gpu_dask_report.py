"""The summary of scripts/gpu/gpu_dask.sh (markdown on stdout): wall times of the local and the
2-worker Dask run of one sweep, their statuses and per-row medians side by side, and the check
of the run whose worker was killed.

    python3 scripts/report/gpu_dask_report.py RUNS_DIR VICTIM_NAME VICTIM_PID
RUNS_DIR holds the run folders local/, dask/, kill/, kill-before.jsonl (rows.jsonl of kill/
copied just before the kill) and NAME.wall files (seconds).
"""
import math
import sys
from pathlib import Path

from attnbench.store.runfolder import RunFolder, read_rows


def rows_of(folder: Path) -> list:
    return RunFolder.load(folder).rows


def keyed(rows):
    return {(r.id.case_id, r.id.backend): r for r in rows}


def wall(runs: Path, name: str) -> float:
    try:
        return float((runs / f"{name}.wall").read_text())
    except (OSError, ValueError):
        return math.nan


def timing_section(runs: Path) -> list[str]:
    t1, t2 = wall(runs, "local"), wall(runs, "dask")
    local, dask = rows_of(runs / "local"), rows_of(runs / "dask")
    cases = len({r.id.case_id for r in local})
    devices = sorted({r.id.device_id for r in dask})
    ratio = t2 / t1 if t1 else math.nan
    return [
        "## Wall time: one sweep, 1 GPU vs 2 GPUs",
        "",
        f"{cases} cases x {len({r.id.backend for r in local})} backends = {len(local)} rows; "
        f"the dask run's rows came from {len(devices)} devices: {', '.join(devices)}",
        "",
        "| run | executor | wall (s) |",
        "|---|---|---|",
        f"| 1 | local, 1 GPU | {t1:.1f} |",
        f"| 2 | dask, --workers 2 | {t2:.1f} |",
        "",
        f"**ratio dask / local = {ratio:.3f}** (target <= 0.6): {'MET' if ratio <= 0.6 else 'NOT MET'}",
        "",
    ]


def equality_section(runs: Path) -> list[str]:
    a, b = keyed(rows_of(runs / "local")), keyed(rows_of(runs / "dask"))
    out = ["## Statuses and medians, run 2 over run 1", ""]
    if set(a) != set(b):
        out.append(f"- keys differ: only local {sorted(set(a) - set(b))}, only dask {sorted(set(b) - set(a))}")
    diff = [(k, a[k].status, b[k].status) for k in sorted(set(a) & set(b)) if a[k].status != b[k].status]
    out.append(f"- same (case, backend) keys: {set(a) == set(b)}; same statuses: {not diff}"
               + "".join(f"\n  - {k}: {s1} (local) vs {s2} (dask)" for k, s1, s2 in diff))
    ratios = []
    for k in sorted(set(a) & set(b)):
        if a[k].status == b[k].status == "ok":
            ratios.append((k, b[k].timing.median_ms / a[k].timing.median_ms, a[k].timing.iqr_rel, b[k].timing.iqr_rel))
    if ratios:
        logs = [math.log(r) for _, r, _, _ in ratios]
        gm = math.exp(sum(logs) / len(logs))
        within = sum(1 for _, r, i1, i2 in ratios if abs(r - 1) <= max(0.05, i1, i2))
        out += [
            f"- {len(ratios)} ok rows: median ratio dask/local geo-mean {gm:.3f}, "
            f"min {min(r for _, r, _, _ in ratios):.3f}, max {max(r for _, r, _, _ in ratios):.3f}; "
            f"{within} of {len(ratios)} within max(5%, either row's IQR/median) of 1",
            "",
            "| case | backend | local median (ms) | dask median (ms) | dask/local | IQR/median local, dask |",
            "|---|---|---|---|---|---|",
        ]
        out += [f"| {k[0]} | {k[1]} | {a[k].timing.median_ms:.4f} | {b[k].timing.median_ms:.4f} | {r:.3f} | {i1:.1%}, {i2:.1%} |"
                for k, r, i1, i2 in ratios]
    out += ["", "(compare runs, with bootstrap intervals, is in gpu_dask.log)", ""]
    return out


def kill_section(runs: Path, victim: str, pid: str) -> list[str]:
    before, _ = read_rows(runs / "kill-before.jsonl")  # a line cut by the copy is not a finished row
    killed = RunFolder.load(runs / "kill")
    final_rows = [r.to_json() for r in killed.rows]
    before = [r.to_json() for r in before]
    final = keyed(killed.rows)
    expected = set(keyed(rows_of(runs / "local")))
    lost = [x for x in before if x not in final_rows]
    errors = [r for r in final.values() if r.status == "error"]
    naming = [r for r in errors if victim in r.reason or f"pid {pid}" in r.reason]
    man = killed.manifest
    out = [
        "## A worker SIGKILLed mid-run",
        "",
        f"- killed worker {victim!r} (pid {pid}) when {len(before)} rows were written",
        f"- rows written before the kill and missing after: {len(lost)} (must be 0); "
        f"unchanged and in place: {final_rows[:len(before)] == before}",
        f"- rows at the end: {len(final)} of {len(expected)} expected keys; missing: {sorted(expected - set(final))}",
        f"- error rows: {len(errors)}, naming the killed worker: {len(naming)}; manifest status: {man.status}",
    ]
    out += [f"  - {r.id.case_id} · {r.id.backend}: {r.reason}" for r in errors]
    if not errors:
        out.append("  (none: the worker was between two backends, or its task had not begun; the case's "
                   "unfinished backends ran on a fresh task)")
    # a backend that was running when its worker died gets an error row naming that worker;
    # no other row may be lost or turned into an error
    verdict = not lost and set(final) == expected and len(naming) == len(errors) and man.complete
    out += ["", f"**killed-worker check: {'PASS' if verdict else 'FAIL'}**", ""]
    return out


def main(argv):
    runs, victim, pid = Path(argv[1]), argv[2], argv[3]
    out = ["# --executor dask on 2 GPUs", ""]
    for section in (timing_section, equality_section):
        try:
            out += section(runs)
        except (OSError, ValueError, KeyError, ZeroDivisionError) as e:
            out += [f"({section.__name__} failed: {type(e).__name__}: {e})", ""]
    try:
        out += kill_section(runs, victim, pid)
    except (OSError, ValueError, KeyError) as e:
        out += [f"(kill_section failed: {type(e).__name__}: {e})"]
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv)
