"""``attnbench scenarios``: the scenarios shipped with the package, by name, with descriptions."""
from __future__ import annotations

from attnbench.cli.app import app, console


@app.command("scenarios")
def list_scenarios():
    """List the built-in scenarios: run one by name (`attnbench run quickstart`); a path works too."""
    from rich.markup import escape
    from rich.table import Table

    from attnbench.workload.builtin import builtin_names, describe

    t = Table("name", "description", title="built-in scenarios (attnbench run NAME)")
    for name in builtin_names():
        t.add_row(escape(name), escape(describe(name)))
    console.print(t)
