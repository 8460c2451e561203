"""Issue 34: one typed backend identity. ``-b`` is resolved once (the runner never parses a spec
again per case and backend); a row's backend is compared by value; ``--normalize-by``, ``-k``
(a word with a colon) and ``--baseline`` resolve user text as ``-b`` does and refuse text that
names no row's backend instead of falling back."""
import json

import pytest
import torch
from typer.testing import CliRunner

from attnbench.backend import registry
from attnbench.backend.options import BackendId, pick_backend
from attnbench.cli.app import app
from attnbench.execute.options import RunOptions
from attnbench.execute.runner import Runner
from attnbench.store.row_parts import RowIdentity, RowTiming, RowWorkload
from attnbench.store.rows import Row
from attnbench.store.runfolder import RunFolder
from attnbench.workload.scenario import load_text

from .test_cli import TINY

cli = CliRunner()


def test_identity_is_compared_by_value_and_printed_canonically():
    a, b = BackendId.from_text("mine:b=2,a=1"), BackendId.from_text("mine:a=1,b=2")
    assert a == b and hash(a) == hash(b) and str(a) == "mine:a=1,b=2"
    assert registry.user_backend_id("flex:mask=blocks") == BackendId("flex")  # the declared default drops out
    assert str(registry.user_backend_id("flex:mask=dense")) == "flex:mask=dense"
    assert pick_backend(registry.user_backend_id("flex:mask=blocks"), ["sdpa", "flex", "flex:mask=dense"]) == "flex"


def test_the_runner_resolves_each_spec_once(monkeypatch):
    runner = Runner(load_text(TINY, "tiny.yaml"), RunOptions(backends=["sdpa", "reference", "sdpa"]))
    assert runner.backend_names == ["sdpa", "reference"]
    calls = []
    real = registry.resolve_spec
    monkeypatch.setattr(registry, "resolve_spec", lambda spec: calls.append(spec) or real(spec))
    rows = list(runner.rows())
    assert {r.id.backend for r in rows} == {"sdpa", "reference"} and all(r.status == "ok" for r in rows), rows
    assert calls == []  # made when the runner was: never per (case, backend)


def _folder(path, backends=("sdpa", "flex")):
    rf = RunFolder.create(path.parent, "s", path)
    rf.start({"scenario": "s", "scenario_sha256": "a" * 64, "overrides": [],
              "environment": {"device": "cpu test", "torch": torch.__version__, "backends": {}}})
    for case in ("ctx=1", "ctx=2"):
        for k, b in enumerate(backends):
            rounds = [1.0 + k + 0.01 * i for i in range(6)]
            rf.add(Row(RowIdentity("s", case, b, device="cpu test"),
                       workload=RowWorkload(params={"ctx": int(case[-1])}),
                       timing=RowTiming(median_ms=rounds[2], n=6, samples_ms=rounds, round_medians_ms=rounds,
                                        timing_method="cpu")))
    rf.finish(True)
    return str(path)


@pytest.mark.parametrize("cmd", [["check", "{a}", "--baseline", "{b}"], ["compare", "runs", "{a}", "{b}"]])
def test_normalize_by_resolves_the_spec_as_b_does(tmp_path, cmd):
    a, b = _folder(tmp_path / "a"), _folder(tmp_path / "b")
    args = [c.format(a=a, b=b) for c in cmd]
    r = cli.invoke(app, [*args, "--normalize-by", "flex:mask=blocks", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert "relative to flex" in r.stderr or "divided by flex" in r.stderr
    r = cli.invoke(app, [*args, "--normalize-by", "flex:mask=dense"])
    assert r.exit_code == 2 and "--normalize-by flex:mask=dense: not among the rows' backends (sdpa, flex)" in r.output


def test_k_backend_spec_is_its_identity(tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text(TINY)
    base = ["run", str(p), "--list", "-b", "sdpa", "-b", "flex", "--format", "json"]
    r = cli.invoke(app, [*base, "-k", "flex:mask=blocks"])
    assert r.exit_code == 0, r.output
    assert {b for x in json.loads(r.stdout) for b in x["backends"]} == {"flex"}
    r = cli.invoke(app, [*base, "-k", "flex:mask=nope"])
    assert r.exit_code == 2 and "mask" in r.output and "blocks|dense" in r.output
    a = _folder(tmp_path / "a")
    r = cli.invoke(app, ["compare", "runs", a, a, "-k", "flex:mask=blocks", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert {x["backend"] for x in json.loads(r.stdout)} == {"flex"}
