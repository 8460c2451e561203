"""``attnbench scenarios``: the scenarios shipped with the package, by name, with their size
(CPU or GPU) and about how long each takes on a CPU; ``--show NAME`` prints one as a template."""
from __future__ import annotations

from typing import Optional

import typer

from attnbench.cli.app import UsageError, app, console, handle_errors


@app.command("scenarios")
@handle_errors
def list_scenarios(
    show: Optional[str] = typer.Option(
        None, "--show", metavar="NAME", help="print this built-in scenario's YAML (a template: > my.yaml, edit, run)"
    ),
):
    """List the built-in scenarios: run one by name (`attnbench run quickstart`); a path works too.

    'size' says whether a scenario is sized for a CPU (calls of a few milliseconds there, rows
    timed many times) or for a GPU (on a CPU its slow rows are timed once, n=1); 'on a CPU' is a
    rough estimate of a run with the default CPU backends (reference, sdpa, flex)."""
    from attnbench.analyze.fit import NAME, PROSE, Col, print_fitted

    from attnbench.workload.builtin import builtin_names, builtin_path, describe
    from attnbench.workload.cost import rough_duration, scenario_estimate
    from attnbench.workload.scenario import load

    if show is not None:
        path = builtin_path(show)
        if path is None:
            raise UsageError(f"--show {show}: no built-in scenario of that name; choose one of {', '.join(builtin_names())}")
        console.out(path.read_text(), end="", highlight=False)
        return
    cols = [Col("name", NAME), Col("size"), Col("on a CPU", drop=0), Col("description", PROSE, drop=1)]
    rows = []
    for name in builtin_names():
        small, secs = scenario_estimate(load(builtin_path(name), []).cases, backends=3)
        rows.append([name, "CPU" if small else "GPU", rough_duration(secs), describe(name)])
    print_fitted(console, cols, rows, "built-in scenarios (attnbench run NAME)", where="--show NAME")
    console.print("size CPU: calls of a few milliseconds on a CPU; GPU: on a CPU its slow rows are timed once "
                  "(n=1). 'on a CPU': a rough estimate for 3 backends on one core (a busy machine takes longer). "
                  "Copy one to edit: attnbench scenarios --show NAME > my.yaml", style="dim", highlight=False)
