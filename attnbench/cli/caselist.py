"""``attnbench run SCENARIO --list``: the cases a scenario expands to, with their batch and
the backends -k leaves them, without running anything."""
from __future__ import annotations

import csv
import io
import json

from rich.console import Console

from attnbench.execute.runner import Runner
from attnbench.workload.batch import describe


def case_records(runner: Runner) -> list[dict]:
    out = []
    for case in runner.sf.cases:
        backends = runner.todo(case)
        if backends:
            out.append({"case_id": case.case_id, "params": case.params, "backends": backends,
                        "batch": describe(case.scenario.batch_spec())})
    return out


def print_case_list(runner: Runner, fmt: str, console: Console) -> None:
    recs = case_records(runner)
    if fmt == "json":
        console.out(json.dumps(recs, indent=1, default=str), highlight=False)
        return
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["case_id", "backends", "batch"])
        for r in recs:
            w.writerow([r["case_id"], " ".join(r["backends"]), r["batch"]])
        console.out(buf.getvalue(), end="", highlight=False)
        return
    width = max((len(r["case_id"]) for r in recs), default=4)
    for r in recs:
        console.out(f"{r['case_id']:<{width}}  {' '.join(r['backends'])}  [{r['batch']}]", highlight=False)
    rows = sum(len(r["backends"]) for r in recs)
    console.out(f"{len(recs)} case(s), {rows} row(s)", highlight=False)
