"""The one command that re-runs just one row: the scenario, the options that shaped its
numbers, ``-k`` picking its case alone and ``-b`` its backend. Each row carries it
(``Row.repro``); the table shows it for failed rows."""
from __future__ import annotations

import shlex
from typing import Iterable, Iterator, Optional, Sequence

from attnbench.store.options import RunOptions
from attnbench.workload.timing_spec import TIMING_FLAGS, flag_text
from attnbench.store.rows import Row
from attnbench.workload.select import unique_selector


def repro_base(
    scenario_path: str,
    overrides: Sequence[str],
    opts: RunOptions,
    backend_files: Sequence[str] = (),
    isolate: bool = False,
    timeout: Optional[float] = None,
) -> list[str]:
    """``attnbench run SCENARIO`` and every option that shapes a row's numbers or status
    (``--timeout`` too, with ``--isolate``: a timed-out row's re-run must not wait 300 s)."""
    args = ["attnbench", "run", scenario_path]
    for o in overrides:
        args += ["--set", o]
    if opts.device:
        args += ["--device", opts.device]
    for key, flag in TIMING_FLAGS.items():
        if key in opts.timing_overrides:
            args += [flag, flag_text(key, opts.timing_overrides[key])]
    if opts.rtol is not None:
        args += ["--rtol", f"{opts.rtol:g}"]
    if opts.warm_l2:
        args.append("--warm-l2")
    if opts.no_graphs:
        args.append("--no-graphs")
    for f in backend_files:
        args += ["--backend-file", str(f)]
    if isolate:
        args.append("--isolate")
        if timeout is not None:
            args += ["--timeout", f"{timeout:g}"]
    return args


def repro_command(base: Sequence[str], case_id: str, backend: str, case_ids: Sequence[str]) -> str:
    """``base`` narrowed to one row, as a shell-quoted command line."""
    return shlex.join([*base, "-k", unique_selector(case_id, case_ids), "-b", backend])


def with_repro(rows: Iterable[Row], base: Optional[Sequence[str]], case_ids: Sequence[str]) -> Iterator[Row]:
    """Stamp each row with its re-run command as it passes (``base`` None: leave rows as they are)."""
    for row in rows:
        if base is not None:
            row.id.repro = repro_command(base, row.id.case_id, row.id.backend, case_ids)
        yield row
