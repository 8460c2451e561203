"""``attnbench import TRACE -o scenario.yaml``: an engine step trace (``workload.traces``)
turned into a scenario, one case per distinct batch shape with its step count."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attnbench.cli.app import UsageError, app, console, handle_errors
from attnbench.cli.safety import stops_on_sigterm
from attnbench.cli.numbers import check_numbers
from attnbench.store.outputs import check_write_target
from attnbench.store.runfolder import atomic_write
from attnbench.workload.traces import TraceError, read_trace, scenario_yaml


@app.command("import")
@handle_errors
@stops_on_sigterm
def import_cmd(
    trace: Path = typer.Argument(..., help="a JSONL step trace (format: docs/scenarios.md, 'Traces')"),
    out: Path = typer.Option(..., "--out", "-o", help="the scenario YAML to write"),
    name: Optional[str] = typer.Option(None, help="the scenario's name (default: the output file's stem)"),
    num_q_heads: int = typer.Option(8, help="model.num_q_heads"),
    num_kv_heads: int = typer.Option(2, help="model.num_kv_heads"),
    head_dim: int = typer.Option(64, help="model.head_dim"),
    dtype: str = typer.Option("float32", help="model.dtype"),
    page_size: int = typer.Option(16, help="kv_cache.page_size"),
    round_context: int = typer.Option(1, help="round contexts up to a multiple of this (fewer distinct shapes)"),
    max_cases: int = typer.Option(32, help="keep this many shapes, the most frequent"),
):
    """Turn a step trace into a scenario: one case per distinct batch shape, with its count."""
    check_numbers(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page_size,
                  round_context=round_context, max_cases=max_cases)
    if not trace.is_file():
        raise UsageError(f"{trace}: no such trace file")
    check_write_target(out, "--out/-o", inputs=[trace], example="scenarios/NAME.yaml")
    try:
        imp = read_trace(trace, round_context, max_cases)
    except TraceError as e:
        raise UsageError(str(e)) from None
    model = {"num_q_heads": num_q_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim, "dtype": dtype}
    text = scenario_yaml(imp, str(trace), name or out.stem, model, page_size, round_context)
    from attnbench.workload.scenario import ScenarioError, load_text  # pydantic: only when it runs
    try:
        cases = load_text(text, str(out))
    except ScenarioError as e:  # e.g. a dtype or head count the scenario format refuses
        raise UsageError(f"{trace}: the scenario it makes does not validate: {e}") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, text)
    console.print(f"wrote {out}: {len(cases.cases)} case(s) from {imp.steps} steps"
                  + (f" ({imp.dropped_steps} steps of rarer shapes left out)" if imp.dropped_steps else ""),
                  highlight=False, markup=False, soft_wrap=True)
