"""The triton backend's route table and options (kernels/routes.py, backends/triton.py): the options are
declared and part of the row identity, a forced route that cannot take a batch gives skipped rows naming it and
its reasons, auto selects per batch once in ``plan`` and ``run`` launches what the plan holds."""
from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from attnbench.backend.registry import UnknownBackend, canonical_spec, make_backend
from attnbench.backends.triton import TritonBackend
from attnbench.cli.app import app
from attnbench.kernels import routes
from attnbench.workload.batch import BatchSpec, Request, materialize
from attnbench.workload.trees import parse_tree

from .test_triton_backend import need_interpreter


def _batch(*reqs, **kw):
    return materialize(BatchSpec(tuple(reqs), 4, 2, 32, dtype="float16", page_size=16, **kw), 1)


def test_every_route_is_an_option_value_and_the_options_are_declared():
    assert routes.NAMES == ("auto",) + tuple(r.name for r in routes.ROUTES)
    assert len(set(routes.NAMES)) == len(routes.NAMES)
    opts = TritonBackend.options
    assert opts["route"].choices == routes.NAMES and opts["route"].default == "auto"
    assert set(opts) == {"route"} | set(routes.Options.TUNING)
    assert make_backend("triton:route=paged,splits=2").settings() == routes.Options("paged", splits=2)


def test_the_options_are_part_of_the_row_identity():
    """``triton`` and ``triton:route=...`` are different backends in compare, baseline and check; defaults are
    left out of the identity; an unknown route names the choices."""
    assert canonical_spec("triton") == canonical_spec("triton:route=auto,splits=0") == "triton"
    assert canonical_spec("triton:route=gluon-tree") == "triton:route=gluon-tree"
    assert canonical_spec("triton:splits=3,route=paged") == "triton:route=paged,splits=3"
    with pytest.raises(UnknownBackend, match="gluon-tree"):
        canonical_spec("triton:route=tree")


def test_a_run_lists_the_shipped_and_a_forced_route_side_by_side():
    r = CliRunner().invoke(app, ["run", "tree-verify-llama3-8b", "-b", "triton", "-b", "triton:route=gluon-tree",
                                 "--list"])
    assert r.exit_code == 0, r.output
    assert "triton triton:route=gluon-tree" in r.output


def test_auto_selects_per_batch_and_the_plan_holds_the_route():
    need_interpreter()
    be = TritonBackend()
    decode, prefill = _batch(Request("decode", 1, 40)), _batch(Request("prefill", 20, 5))
    assert be.plan(decode).route is routes.BY_NAME["paged"]
    p = be.plan(prefill)
    assert p.route is routes.BY_NAME["prefill"] and p.mode.endswith("prefill (Triton prefill kernel)")
    assert TritonBackend(route="paged").plan(prefill).route is routes.BY_NAME["paged"]


def test_run_launches_the_planned_route_and_nothing_else(monkeypatch):
    """``run`` reads no option and selects nothing: it launches the route the plan holds."""
    need_interpreter()
    be = TritonBackend()
    p = be.plan(_batch(Request("decode", 1, 40)))
    seen = []
    p.route = dataclasses.replace(p.route, launch=lambda plan: seen.append(plan) or plan.out)
    assert be.run(p) is p.out and seen == [p]


@pytest.mark.slow
def test_a_forced_route_that_cannot_take_a_batch_is_skipped_with_its_reasons(tmp_path, monkeypatch):
    """Rows of a forced route the batch does not suit are skipped, the reason naming the route and why; the
    shipped backend's rows of the same cases run."""
    need_interpreter()
    import pandas as pd

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["run", "quickstart", "--device", "cpu", "-b", "triton", "-b", "triton:route=prefill",
                                 "--out", str(out), "-q", "--warmup-ms", "0", "--measure-ms", "1"])
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out / "results.csv", keep_default_na=False)
    forced = df[df.backend == "triton:route=prefill"]
    assert len(forced) and set(forced.status) == {"skipped"}
    assert all("route prefill: the Triton prefill kernel takes no tree" in why for why in forced.reason)
    assert set(df[df.backend == "triton"].status) == {"ok"}


def test_a_forced_route_whose_plan_does_not_fit_raises_and_auto_falls_back(monkeypatch):
    need_interpreter()
    gluon = routes.BY_NAME["gluon-tree"]
    misfit = dataclasses.replace(gluon, fit=lambda p: "tiles")
    p = TritonBackend(route="paged").plan(_batch(Request("tree", 3, 9, (-1, 0, 0))))
    with pytest.raises(routes.RouteError, match="route gluon-tree: tiles"):
        routes.settle(misfit, p, routes.Options("gluon-tree"))
    assert routes.settle(misfit, p, routes.Options()) == (routes.BY_NAME["paged"], "tiles")
    assert routes.mode(routes.BY_NAME["paged"], misfit, "tiles") == \
        "paged (Triton paged kernel), not gluon-tree: tiles"


def _pretend_hopper(monkeypatch, problem: str):
    """The Gluon routes' reasons as on a Hopper GPU (``hopper`` true, TMA views found on these CPU tensors),
    with ``problem`` as the installed triton's Gluon API check."""
    from attnbench.kernels.decode import gluon as dg
    from attnbench.kernels.tree import gluon as tg

    for m in (dg, tg):
        monkeypatch.setattr(m, "hopper", lambda device: True)
    monkeypatch.setattr(routes.gluon_host, "api_problem", lambda: problem)


@pytest.mark.parametrize("problem", ["", "triton 9.9 removed gl.thread_barrier"])
def test_a_triton_without_the_gluon_api_sends_auto_to_the_triton_routes(monkeypatch, problem):
    """On a Hopper GPU, a tree batch the Gluon tree kernel takes goes to it; where the installed triton lacks the
    Gluon API the kernels are written in, every Gluon route refuses it with that reason and auto takes the
    Triton route instead (a compile error would have made it an error row)."""
    _pretend_hopper(monkeypatch, problem)
    shape = tuple(parse_tree({"choices": [[0], [1], [0, 0], [0, 1]]}))
    tree = materialize(BatchSpec((Request("tree", 5, 100, shape),), 8, 2, 64, dtype="float16", page_size=16), 2)
    opts = routes.Options()
    gluon = routes.BY_NAME["gluon-tree"]
    if problem:
        assert gluon.refusals(tree, opts) == [f"route gluon-tree: {problem}"]
        assert routes.select(tree, opts).name == "paged"
    else:
        assert gluon.refusals(tree, opts) == []
        assert routes.select(tree, opts).name == "gluon-tree"
    # a batch the route cannot take anyway keeps its own reasons first (the API check is only for batches it takes)
    decode = _batch(Request("decode", 1, 40))
    assert all("removed" not in w for w in gluon.refusals(decode, opts))


CHECK_API = """
import sys
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma
from attnbench.kernels.shared import gluon as sg


def removed(*a, **k):
    raise RuntimeError("async_copy_global_to_shared has been removed; call async_load instead")


for gl_ok, tma_removed in ((1, 0), (0, 0), (1, 1), (0, 1)):
    if gl_ok:
        gl.thread_barrier = lambda: None
    elif hasattr(gl, "thread_barrier"):
        del gl.thread_barrier
    tma.async_copy_global_to_shared = removed if tma_removed else (lambda: None)
    print(repr(sg.check_api()))
"""


def test_the_gluon_api_check_reads_the_installed_triton(tmp_path):
    """``check_api`` names each missing or removed name (a stub that raises 'has been removed' counts as removed)
    and says nothing on a triton with them all. In a process of its own, triton compiled (Gluon's language does not
    import under the interpreter these tests set up)."""
    import ast
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    script = tmp_path / "check_api.py"
    script.write_text(CHECK_API)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    if "No module named 'triton.experimental.gluon" in r.stderr:
        pytest.skip("this triton has no Gluon")
    assert r.returncode == 0, r.stderr[-2000:]
    got = [ast.literal_eval(line) for line in r.stdout.splitlines() if line.startswith(("'", '"'))]
    assert got[0] == ""
    assert "removed gl.thread_barrier (" in got[1]
    assert "removed tma.async_copy_global_to_shared (" in got[2]
    assert "removed gl.thread_barrier and tma.async_copy_global_to_shared (" in got[3]
