"""``attnbench run SCENARIO --list``: the cases a scenario expands to, with their batch and
the backends -k leaves them, without running anything, and without importing torch (the
default backends are found the way ``attnbench backends`` finds them without --probe)."""
from __future__ import annotations

import csv
import io
import json
import os
from typing import Callable

from rich.console import Console

from attnbench.backend import registry
from attnbench.cli.backends import guess_device_type, quick_status
from attnbench.execute.cases import backend_names_for
from attnbench.store.options import RunOptions
from attnbench.workload.scenario import ScenarioFile
from attnbench.workload.spec import describe


def _plain(name: str) -> bool:
    """A built-in name without options, none of them set from the environment: its own
    identity, known without importing the backend (and torch)."""
    info = registry.BUILTIN_INFO.get(name)
    return info is not None and not any(os.environ.get(e) for e in info.option_envs)


def listed_backends(sf: ScenarioFile, opts: RunOptions) -> list[str]:
    """The backends a run of ``sf`` with ``opts`` takes: -b, the scenario's list, or those
    that can run on its device (built-in ones judged without importing them)."""
    given = opts.backends or sf.scenario.backends
    if given and all(_plain(n) for n in given):
        return list(dict.fromkeys(given))
    if given:
        return backend_names_for(sf, opts, available=[])
    name = opts.device or sf.scenario.device
    device_type = guess_device_type() if name == "auto" else name.split(":")[0]
    here = []
    for n in registry.all_names():
        if n in registry.BUILTIN_INFO:
            ok = quick_status(n, device_type)[1] == "yes"
        else:  # a plugin: its class says
            try:
                cls = registry.get_backend_class(n)
                ok = cls.unavailable() is None and cls.device_reason(device_type) is None
            except Exception:
                ok = False
        if ok:
            here.append(n)
    return here if all(_plain(n) for n in here) else backend_names_for(sf, opts, available=here)


def case_records(sf: ScenarioFile, backends: list[str], picks: Callable[..., bool]) -> list[dict]:
    out = []
    for case in sf.cases:
        todo = [b for b in backends if picks(case.case_id, b, case.params)]
        if todo:
            out.append({"case_id": case.case_id, "params": case.params, "backends": todo,
                        "batch": describe(case.scenario.batch_spec())})
    return out


def print_case_list(recs: list[dict], fmt: str, console: Console) -> None:
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
