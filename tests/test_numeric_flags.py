"""Issue 25: every numeric flag takes a finite number in its range, or the command exits 2 with
one message naming the flag (never a traceback, never a row blamed on a backend, never a NaN
threshold that lets a slowdown pass). A property test drives each flag with NaN, ±inf, 0
(where 0 means nothing), negative and huge values; another checks that no numeric flag of any
command is left out of it."""
import typing

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from attnbench.cli.app import app

cli = CliRunner()

# command line before the flag, the flag, whether 0 is refused, whether it takes integers only
FLAGS = [
    (["run", "quickstart"], "--warmup-ms", False, False),
    (["run", "quickstart"], "--measure-ms", True, False),
    (["run", "quickstart"], "--rtol", True, False),
    (["run", "quickstart"], "--threads", True, True),
    (["run", "quickstart"], "--timeout", True, False),
    (["run", "quickstart", "--executor", "dask"], "--workers", True, True),
    (["compare", "backends", "quickstart", "-b", "sdpa", "-b", "flex"], "--warmup-ms", False, False),
    (["compare", "backends", "quickstart", "-b", "sdpa", "-b", "flex"], "--measure-ms", True, False),
    (["compare", "backends", "quickstart", "-b", "sdpa", "-b", "flex", "--executor", "dask"], "--workers", True, True),
    (["compare", "backends", "quickstart", "-b", "sdpa", "-b", "flex"], "--timeout", True, False),
    (["check", "nosuchrun", "--baseline", "nosuchbase"], "--min-delta-us", False, False),
    (["check", "nosuchrun", "--baseline", "nosuchbase"], "--max-slowdown", False, False),
    (["calibrate", "quickstart"], "--runs", True, True),
    (["calibrate", "quickstart"], "--slowdown", True, False),
    (["calibrate", "quickstart"], "--min-delta-us", False, False),
    (["compare", "commits", "nosuchscenario"], "--min-delta-us", False, False),
    (["compare", "commits", "nosuchscenario"], "--rounds", True, True),
    (["compare", "commits", "nosuchscenario"], "--rounds-per-turn", True, True),
    (["compare", "commits", "nosuchscenario"], "--workers", True, True),
    (["compare", "commits", "nosuchscenario"], "--timeout", True, False),
    (["tree-costs", "nosuchrun"], "--gain", True, False),
    (["ceilings"], "--threads", True, True),
    *[(["import", "nosuchtrace", "-o", "nosuch.yaml"], f, True, True)
      for f in ("--num-q-heads", "--num-kv-heads", "--head-dim", "--page-size", "--round-context", "--max-cases")],
]


def _bad_values(zero_refused: bool, integer: bool):
    special = ["nan", "NaN", "inf", "-inf", "1e999", "-1e999"]
    neg = st.floats(max_value=-1e-6, allow_nan=False, allow_infinity=False).map(repr)
    huge = st.floats(min_value=1e13, max_value=1e300).map(repr)
    if integer:
        neg = st.integers(max_value=-1).map(str)
        huge = st.integers(min_value=10**13, max_value=10**40).map(str)
    return st.one_of(st.sampled_from(special + (["0"] if zero_refused else [])), neg, huge)


@st.composite
def flag_and_value(draw):
    prefix, flag, zero_refused, integer = draw(st.sampled_from(FLAGS))
    return prefix, flag, draw(_bad_values(zero_refused, integer))


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flag_and_value())
def test_every_numeric_flag_refuses_nan_inf_zero_negative_and_huge(case):
    prefix, flag, value = case
    r = cli.invoke(app, [*prefix, flag, value])
    out = r.output
    assert r.exit_code == 2, (prefix, flag, value, out)
    assert "Traceback" not in out and (r.exception is None or isinstance(r.exception, SystemExit)), out
    errors = [ln for ln in out.splitlines() if "error:" in ln.lower()]
    assert len(errors) == 1, out
    assert flag in out or flag.lstrip("-") in out.replace("'", ""), out


@pytest.mark.parametrize("prefix, flag, value", [
    (["run", "quickstart"], "--warmup-ms", "0"), (["check", "nosuchrun", "--baseline", "nosuchbase"], "--min-delta-us", "0"),
])
def test_zero_where_it_means_something_is_accepted(prefix, flag, value):
    r = cli.invoke(app, [*prefix, flag, value, "--list"] if prefix[0] == "run" else [*prefix, flag, value])
    assert flag not in r.output, r.output  # whatever else happens, the flag's value is not what is refused


def _is_number(param) -> bool:
    """Whether an option takes numbers (typer's own parameters or click's)."""
    desc = getattr(param, "type_descriptor", None)
    if desc is not None:
        ann = desc.annotation
        args = typing.get_args(ann) if typing.get_origin(ann) in (list, typing.List) else (ann,)
        return bool(args) and args[0] in (int, float)
    return getattr(getattr(param, "type", None), "name", "") in ("integer", "float")


def _numeric_options():
    root = typer.main.get_command(app)
    todo, out = [([], root)], set()
    while todo:
        path, cmd = todo.pop()
        subs = getattr(cmd, "commands", None)
        if subs:
            todo += [([*path, name], sub) for name, sub in subs.items()]
            continue
        for p in cmd.params:
            if p.name and getattr(p, "opts", None) and p.opts[0].startswith("-") and _is_number(p):
                out.add((" ".join(path), max(p.opts, key=len)))
    return out


def test_no_numeric_flag_is_left_out_of_the_property_test():
    covered = {(" ".join(x for x in prefix[:2] if not x.startswith(("quick", "nosuch"))), flag)
               for prefix, flag, _, _ in FLAGS}
    found = _numeric_options()
    assert len(found) >= 10, found  # the walk sees the commands' options
    missing = {(c, f) for c, f in found if (c, f) not in covered}
    assert not missing, f"numeric flags without a range check test: {sorted(missing)}"


@pytest.mark.slow
@pytest.mark.parametrize("bad", [0, -1.0, "fast", None])
def test_a_ceilings_cache_holding_zero_or_junk_is_measured_again(tmp_path, monkeypatch, bad):
    import json

    import torch

    from attnbench.measure import ceilings

    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(tmp_path))
    key = ceilings.cache_key(torch.device("cpu"))
    entry = {"device_name": "cpu", "copy_tbps": bad, "read_tbps": bad, "matmul_tflops": {"float32": bad}}
    (tmp_path / "ceilings.json").write_text(json.dumps({key: entry}))
    c = ceilings.ceilings_for(torch.device("cpu"), "float32")
    assert c.copy_tbps > 0 and c.read_tbps > 0 and c.matmul_tflops["float32"] > 0
    kept = json.loads((tmp_path / "ceilings.json").read_text())[key]
    assert kept["copy_tbps"] > 0 and kept["matmul_tflops"]["float32"] > 0  # the damaged values are replaced
    (tmp_path / "ceilings.json").write_text("[1, 2]")  # not a mapping at all
    assert ceilings.ceilings_for(torch.device("cpu"), "float32").copy_tbps > 0
