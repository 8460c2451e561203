"""Backend options (-b NAME:key=value): parsing, validation (exit 2 naming backend, key and allowed
values), the canonical identity string in rows, CSV, repro commands and the manifest, and
``check`` / ``compare runs`` never pairing rows whose options differ. CPU, real code paths."""
import csv
import io
import json
import shlex
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.backend import registry
from attnbench.backend.options import BackendOption, OptionError, parse_spec, resolve
from attnbench.cli import app

cli = CliRunner()
HERE = Path(__file__).resolve().parent
PLUGIN = str(HERE / "option_backends.py")

OPTS = {
    "route": BackendOption("route", "auto", choices=("auto", "fa2", "fa3"), env="ATTNBENCH_TEST_ROUTE"),
    "graphs": BackendOption("graphs", True, type=bool),
    "split": BackendOption("split", 0, type=int),
}

TINY = textwrap.dedent(
    """
    name: opts
    seed: 3
    device: cpu
    model: {num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32}
    kv_cache: {page_size: 4, layout: shuffled}
    batch:
      - {kind: decode, count: 2, context: 13}
      - {kind: tree, count: 1, context: 5, tree: {choices: [[0], [1], [0, 0]]}}
    timing: {warmup_ms: 1, measure_ms: 3, min_runs: 3}
    """
)


def test_canonical_string_lists_non_defaults_sorted(monkeypatch):
    monkeypatch.delenv("ATTNBENCH_TEST_ROUTE", raising=False)
    assert resolve("x", {}, OPTS).canonical == "x"
    assert resolve("x", {"route": "auto", "graphs": "1"}, OPTS).canonical == "x"  # defaults vanish
    r = resolve("x", {"split": "04", "route": "fa3", "graphs": "no"}, OPTS)
    assert r.canonical == "x:graphs=off,route=fa3,split=4"
    assert r.values == {"route": "fa3", "graphs": "off", "split": "4"}
    # the canonical string parses back to itself
    name, given = parse_spec(r.canonical)
    assert resolve(name, given, OPTS).canonical == r.canonical


def test_env_default_is_recorded_like_an_explicit_option(monkeypatch):
    monkeypatch.setenv("ATTNBENCH_TEST_ROUTE", "fa2")
    assert resolve("x", {}, OPTS).canonical == "x:route=fa2"
    assert resolve("x", {"route": "auto"}, OPTS).canonical == "x"  # an explicit value beats the env
    monkeypatch.setenv("ATTNBENCH_TEST_ROUTE", "fa9")
    with pytest.raises(OptionError, match="ATTNBENCH_TEST_ROUTE.*allowed: auto|fa2|fa3"):
        resolve("x", {}, OPTS)


@pytest.mark.parametrize(
    "spec, words",
    [
        ("x:route=fa9", ["'x'", "route=", "allowed: auto|fa2|fa3"]),
        ("x:colour=red", ["'x'", "no option 'colour'", "route (auto|fa2|fa3)", "graphs (on|off)"]),
        ("x:graphs=maybe", ["graphs", "on|off"]),
        ("x:split=two", ["split", "a int"]),
        ("x:route", ["not key=value"]),
        ("x:route=fa2,route=fa3", ["given twice"]),
    ],
)
def test_bad_specs_name_backend_key_and_allowed_values(spec, words):
    with pytest.raises(OptionError) as e:
        name, given = parse_spec(spec)
        resolve(name, given, OPTS)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_builtin_declarations(monkeypatch):
    for env in ("ATTNBENCH_FLASHINFER_BACKEND", "ATTNBENCH_FLASHINFER_CASCADE", "ATTNBENCH_FA2_HDIM128_ONLY",
                "ATTNBENCH_XFORMERS_TRITON_ONLY"):
        monkeypatch.delenv(env, raising=False)
    assert registry.canonical_spec("flashinfer:route=fa3") == "flashinfer:route=fa3"
    assert registry.canonical_spec("flashinfer:route=auto,cascade=on") == "flashinfer"
    monkeypatch.setenv("ATTNBENCH_FA2_HDIM128_ONLY", "1")
    assert registry.canonical_spec("flash-attn") == "flash-attn:hdim128_only=on"
    monkeypatch.setenv("ATTNBENCH_XFORMERS_TRITON_ONLY", "1")
    assert registry.canonical_spec("xformers") == "xformers:triton_only=on"
    assert registry.make_backend("xformers:triton_only=off").option("triton_only") == "off"
    with pytest.raises(registry.UnknownBackend, match="flashinfer.*route.*allowed"):
        registry.canonical_spec("flashinfer:route=fa9")
    with pytest.raises(registry.UnknownBackend, match="did you mean 'flashinfer'"):
        registry.canonical_spec("flashinfr:route=fa3")


def _run(tmp_path, name, *args):
    scen = tmp_path / "opts.yaml"
    scen.write_text(TINY)
    out = tmp_path / name
    res = cli.invoke(app, ["run", str(scen), "--out", str(out), "--backend-file", PLUGIN, "-q", *args])
    return res, out


@pytest.mark.parametrize("spec", ["flashinfer:route=fa9", "flashinfer:nope=1", "sdpa:x=1"])
def test_cli_bad_option_is_exit_2_naming_it(tmp_path, spec):
    res, _ = _run(tmp_path, "bad", "-b", spec)
    assert res.exit_code == 2, res.output
    name, given = parse_spec(spec)
    assert repr(name) in res.output and list(given)[0] in res.output
    assert "Traceback" not in res.output


def test_scenario_backends_entry_is_validated(tmp_path):
    scen = tmp_path / "s.yaml"
    scen.write_text(TINY + "backends: [reference, 'flashinfer:route=fa9']\n")
    res = cli.invoke(app, ["run", str(scen), "--out", str(tmp_path / "o"), "-q"])
    assert res.exit_code == 2, res.output
    assert "backends.1" in res.output and "allowed: auto|decode|" in res.output.replace("\n", "")
    res = cli.invoke(app, ["validate", str(scen)])
    assert res.exit_code == 2, res.output


@pytest.mark.slow
def test_option_reaches_the_instance_rows_csv_repro_and_manifest(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNBENCH_TEST_FLAVOR", raising=False)
    res, out = _run(tmp_path, "a", "-b", "reference", "-b", "sdpa-opt:flavor=fancy", "-b", "sdpa-opt:bias=0.5",
                    "--format", "csv")
    assert res.exit_code == 1, res.output  # the bias=0.5 rows mismatch: the option reached the instance
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    by = {r["backend"]: r for r in rows}
    assert by["sdpa-opt:flavor=fancy"]["status"] == "ok"
    assert by["sdpa-opt:bias=0.5"]["status"] == "mismatch"
    repro = shlex.split(by["sdpa-opt:flavor=fancy"]["repro"])
    assert repro[repro.index("-b") + 1] == "sdpa-opt:flavor=fancy"
    stored = [json.loads(x)["backend"] for x in (out / "rows.jsonl").read_text().splitlines()]
    assert "sdpa-opt:flavor=fancy" in stored
    man = json.loads((out / "manifest.json").read_text())
    assert "sdpa-opt:flavor=fancy" in json.dumps(man)


def test_env_default_shows_in_rows_and_check_never_pairs_different_options(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNBENCH_TEST_FLAVOR", raising=False)
    res, base = _run(tmp_path, "base", "-b", "sdpa-opt")
    assert res.exit_code == 0, res.output
    monkeypatch.setenv("ATTNBENCH_TEST_FLAVOR", "fancy")
    res, cur = _run(tmp_path, "cur", "-b", "sdpa-opt")
    assert res.exit_code == 0, res.output
    stored = {json.loads(x)["backend"] for x in (cur / "rows.jsonl").read_text().splitlines()}
    assert stored == {"sdpa-opt:flavor=fancy"}  # the environment's value, recorded as an option
    res = cli.invoke(app, ["check", str(cur), "--baseline", str(base), "--format", "json"])
    assert res.exit_code == 1, res.output  # nothing compared: the rows are other backends
    verdicts = {(c["backend"], c["verdict"]) for c in json.loads(res.stdout)["cases"]}
    assert verdicts == {("sdpa-opt:flavor=fancy", "new"), ("sdpa-opt", "vanished")}, verdicts
    res = cli.invoke(app, ["compare", "runs", str(base), str(cur), "--format", "json"])
    assert res.exit_code == 0, res.output
    cases = json.loads(res.stdout)
    assert {(c["backend"], c["verdict"]) for c in cases} == verdicts
    assert all(c["ratio"] is None for c in cases)  # never paired


BAD_PLUGIN = str(HERE / "bad_option_backends.py")


@pytest.fixture
def forget_bad_backends():
    """The broken backends leave the registry after the test (a later command in this process
    would take them as default backends)."""
    yield
    for name in ("bad-default", "labelled"):
        registry._EXTRA.pop(name, None)


def test_a_default_not_among_its_choices_names_backend_and_option(tmp_path, forget_bad_backends):
    """Issue 37 item 17: a plugin option whose default is not among its choices gave a traceback
    (or `error: allowed: plain|fancy`) naming neither the backend nor the option."""
    scen = tmp_path / "opts.yaml"
    scen.write_text(TINY)
    res = cli.invoke(app, ["run", str(scen), "--out", str(tmp_path / "o"), "--backend-file", BAD_PLUGIN,
                           "-b", "bad-default", "-q"])
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())
    assert "backend 'bad-default': option 'flavor' declares the default 'weird'" in said, said
    assert "allowed: plain|fancy" in said and "Traceback" not in res.output
    res = cli.invoke(app, ["backends", "--probe", "--backend-file", BAD_PLUGIN])
    assert res.exit_code == 0, res.output
    assert "bad-default:(unusable: backend 'bad-default': option 'flavor'" in " ".join(res.output.split())
    with pytest.raises(OptionError, match="option 'flavor' declares the default 'weird'"):
        resolve("bad-default", {"flavor": "plain"}, {"flavor": BackendOption("flavor", "weird", choices=("plain",))})


def test_an_env_value_with_a_comma_is_refused_so_specs_stay_parseable(tmp_path, monkeypatch, forget_bad_backends):
    """Issue 37 item 26: ATTNBENCH_TEST_LABEL='a,b' gave rows whose backend spec (and repro command)
    `labelled:label=a,b` could not be parsed back."""
    scen = tmp_path / "opts.yaml"
    scen.write_text(TINY)
    monkeypatch.setenv("ATTNBENCH_TEST_LABEL", "a,b")
    res = cli.invoke(app, ["run", str(scen), "--out", str(tmp_path / "o"), "--backend-file", BAD_PLUGIN,
                           "-b", "labelled", "-q"])
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())
    assert "backend 'labelled': environment variable ATTNBENCH_TEST_LABEL='a,b' (sets option 'label')" in said
    assert "may not hold ','" in said and not (tmp_path / "o").exists()
    monkeypatch.setenv("ATTNBENCH_TEST_LABEL", "a b=c:d")
    spec = resolve("labelled", {}, {"label": BackendOption("label", "x", env="ATTNBENCH_TEST_LABEL")}).canonical
    assert spec == "labelled:label=a b=c:d" and parse_spec(spec) == ("labelled", {"label": "a b=c:d"})
