"""``attnbench decide RUN``: per backend the weighted step time of a run's cases, the dispatch
table (the fastest correct backend per batch shape) and what dispatching buys over the best
single backend (``analyze/decide.py``; how to read it: docs/decide.md)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from attnbench.analyze.fit import NAME, PROSE, VALUE
from attnbench.cli.app import UsageError, app, console, handle_errors
from attnbench.cli.safety import stops_on_sigterm
from attnbench.store.safe_text import term_text

FORMATS = ("table", "markdown", "json")


def decision_of(run: Path, include_convert: bool):
    """(decision, loaded run) of a run folder or baseline file; UsageError naming the run."""
    from attnbench.analyze.case_weights import WeightsError, run_weights
    from attnbench.analyze.decide import DecideError, decide
    from attnbench.store.baselines import BaselineError, load_rows

    try:
        loaded = load_rows(run)
        weights = run_weights(loaded.manifest, loaded.rows, str(run))
        d = decide(loaded.rows, weights.by_case, ("plan", "kernel", "convert") if include_convert else ("plan", "kernel"))
    except (BaselineError, WeightsError) as e:
        raise UsageError(str(e)) from None
    except DecideError as e:
        raise UsageError(f"{run}: {e}") from None
    d.notes[:0] = weights.notes
    return d, loaded


def _print_table(d, title: str) -> None:
    from attnbench.analyze.decide_render import BACKEND_HEAD, CASE_HEAD, headline, kernel_line, legend, tables
    from attnbench.analyze.fit import Col, print_fitted, print_words

    brows, crows = tables(d)
    for head, rows, name in ((BACKEND_HEAD, brows, "per backend"), (CASE_HEAD, crows, "dispatch table")):
        cols = [Col(h, COL_KINDS.get(h, VALUE), "left" if h in COL_KINDS else "right", COL_DROPS[name].get(h))
                for h in head]
        styles = ["bold" if name == "per backend" and i == len(rows) - 1 else "" for i in range(len(rows))]
        print_fitted(console, cols, rows, f"{title}: {name}", row_styles=styles)
    print_words(console, headline(d), "bold")
    print_words(console, kernel_line(d))
    print_words(console, legend(d), "dim")
    for n in d.notes:
        print_words(console, "note: " + n)


#: how decide's tables show their columns at a narrow width (analyze/fit.py)
COL_KINDS = {"backend": NAME, "pick": NAME, "runner-up": NAME, "shape": PROSE}
COL_DROPS = {"per backend": {"plan+convert share": 0, "plan": 1, "convert": 2, "kernel": 3, "covers": 4},
             "dispatch table": {"plan": 0, "convert": 1, "kernel": 2, "weight": 3}}


@app.command("decide")
@handle_errors
@stops_on_sigterm
def decide_cmd(
    run: Path = typer.Argument(..., help="run folder (or baseline file) of a scenario with weights, e.g. an imported trace"),
    format: str = typer.Option("table", "--format", help="table | markdown | json (the engine's dispatch document)"),
    no_convert: bool = typer.Option(False, "--no-convert", help="leave convert (SDPA/Flex's K/V gather) out of the "
                                    "step: for an engine whose cache is already in the layout the library reads"),
    export_json: Optional[Path] = typer.Option(None, "--export-json", help="also write the JSON document here"),
    export_markdown: Optional[Path] = typer.Option(None, "--export-markdown", help="also write the Markdown here"),
):
    """Which backend to run per batch shape, and what that buys: per backend the weighted step time
    (plan + kernel + convert, weighted by each case's steps) with its 99% interval over timing
    rounds, the dispatch table (the fastest ok backend per case, ≈ when its runner-up ties: check's
    verdict same or unclear), and the gain of dispatching over the best single backend. Needs
    timing.rounds >= 8 for intervals."""
    from attnbench.analyze.decide_render import json_doc, markdown
    from attnbench.store.outputs import check_write_target
    from attnbench.store.runfolder import atomic_write

    if format not in FORMATS:
        raise UsageError(f"--format {format}: choose one of {', '.join(FORMATS)}")
    for path, flag in ((export_json, "--export-json"), (export_markdown, "--export-markdown")):
        if path is not None:
            check_write_target(path, flag, inputs=[run], example=f"decide{'.json' if 'json' in flag else '.md'}")
    if export_json and export_markdown and export_json.resolve() == export_markdown.resolve():
        raise UsageError(f"--export-json and --export-markdown name one file ({export_json}): the Markdown would "
                         "replace the JSON; give each its own, e.g. decide.json and decide.md")
    d, loaded = decision_of(run, not no_convert)
    scenario = loaded.manifest.scenario or (loaded.rows[0].id.scenario if loaded.rows else "")
    title = f"decide: {term_text(scenario)} ({run})"  # a name of one line, without escape sequences
    doc = json.dumps(json_doc(d, str(run), scenario, loaded.manifest.device), indent=1, allow_nan=False)
    md = markdown(d, title)
    for path, text in ((export_json, doc + "\n"), (export_markdown, md)):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, text)
    if format == "json":
        console.out(doc, highlight=False)
    elif format == "markdown":
        console.out(md, end="", highlight=False)
    else:
        _print_table(d, title)
