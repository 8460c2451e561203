"""Issue 34: ``run`` and ``compare backends`` declare their shared options once
(``cli/pipeline.py``): every flag the two have in common reads the same in both helps."""
import typer

from attnbench.cli.app import app


def _options(*path):
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return {p.name: p for p in cmd.params if p.param_type_name == "option"}


def test_shared_flags_are_declared_once():
    run, compare = _options("run"), _options("compare", "backends")
    shared = sorted(set(run) & set(compare) - {"backend"})  # -b: one runs, the other compares
    assert len(shared) >= 20, shared
    differ = [n for n in shared if (run[n].help, run[n].opts, run[n].default, run[n].metavar) !=
              (compare[n].help, compare[n].opts, compare[n].default, compare[n].metavar)]
    assert differ == []
