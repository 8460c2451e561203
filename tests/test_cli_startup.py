"""Commands that do not run a batch never import torch (nor pandas), so they start at once;
the backends listing agrees with the backend classes; a default run leaves out a backend
that would skip every case on this device."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attnbench.backend import registry
from attnbench.cli.backends import probed_status, quick_status
from attnbench.execute.runner import default_backends

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "attnbench" / "scenarios" / "quickstart.yaml"


def _imported_by(args: list[str]) -> list[str]:
    """Top-level modules a fresh ``python -X importtime -m attnbench ARGS`` imported."""
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "attnbench", *args],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    names = []
    for line in p.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.append(line.rsplit("|", 1)[1].strip().split(".")[0])
    assert names, "no -X importtime output"
    return names


@pytest.mark.slow
@pytest.mark.parametrize("args", [["--help"], ["--version"], ["schema"], ["validate", str(QUICKSTART)], ["backends"],
                                  ["run", str(QUICKSTART), "--list"], ["run", "tree-random-60-gqa8", "--list", "-k", "16"]])
def test_light_commands_do_not_import_torch(args):
    mods = set(_imported_by(args))
    assert "attnbench" in mods
    assert "torch" not in mods, f"`attnbench {' '.join(args)}` imported torch"
    assert "triton" not in mods


@pytest.mark.slow
def test_help_does_not_import_pandas_or_pydantic():
    mods = set(_imported_by(["--help"]))
    assert not mods & {"pandas", "pydantic", "numpy"}, mods & {"pandas", "pydantic", "numpy"}


def test_version_imports_no_command_line_package():
    mods = set(_imported_by(["--version"]))
    assert not mods & {"typer", "rich", "click", "numpy"}, mods & {"typer", "rich", "click", "numpy"}


@pytest.mark.parametrize("args, watched", [
    ([], False), (["--help"], False), (["--version"], False), (["run", "x.yaml", "--help"], False),
    (["validate", "x.yaml"], False), (["schema"], False), (["scenarios"], False), (["trees"], False),
    (["backends"], False), (["backends", "--probe"], True), (["run", "x.yaml", "--list"], False),
    (["run", "x.yaml"], True), (["compare", "backends", "x.yaml"], True), (["check", "a", "b"], True),
])
def test_only_commands_that_run_backends_are_supervised(args, watched):
    """The supervising fork (it sees a backend's os._exit) is for commands that run or import
    backends; help, the version and the listings run in the one process."""
    from attnbench.cli.supervise import supervised

    assert supervised(args) is watched


def test_list_matches_what_the_run_takes(tmp_path):
    """`run --list` finds the default backends without torch; the runner finds them with it:
    the same list."""
    from attnbench.cli.caselist import listed_backends
    from attnbench.execute.options import RunOptions
    from attnbench.execute.runner import Runner
    from attnbench.workload.scenario import load

    sf = load(QUICKSTART, [])
    for device in ("cpu", None):
        opts = RunOptions(device=device)
        assert listed_backends(sf, opts) == Runner(sf, opts).backend_names


@pytest.mark.slow
def test_commands_in_process_leave_torch_unimported(tmp_path):
    """validate, schema and backends run in one process through the real app: torch stays out."""
    code = textwrap.dedent(f"""
        import sys
        from typer.testing import CliRunner
        from attnbench.cli import app
        r = CliRunner()
        for args in (["validate", {str(QUICKSTART)!r}], ["schema"], ["backends"]):
            res = r.invoke(app, args)
            assert res.exit_code == 0, (args, res.output)
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "pandas", "triton")))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "[]"


def test_version_flag():
    from typer.testing import CliRunner

    from attnbench import __version__
    from attnbench.cli import app

    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"attnbench {__version__}"


@pytest.mark.parametrize("name", sorted(registry.BUILTIN_INFO))
def test_builtin_info_matches_the_classes(name):
    assert set(registry.BUILTIN_INFO) == set(registry.BUILTIN)
    info, cls = registry.BUILTIN_INFO[name], registry.get_backend_class(name)
    assert (info.library, info.install_hint, info.cuda_only, info.cpu_env) == (
        cls.library, cls.install_hint, cls.cuda_only, cls.cpu_env)
    assert info.distribution == (cls.distribution or cls.library)
    assert info.option_envs == tuple(sorted(o.env for o in (getattr(cls, "options", {}) or {}).values() if o.env))


@pytest.mark.parametrize("interpret", [None, "1"])
@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_quick_and_probed_listing_agree(interpret, device_type, monkeypatch):
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    for name in registry.BUILTIN_INFO:
        q, p = quick_status(name, device_type), probed_status(name, device_type)
        if p[0] == "no" and q[0] == "yes":  # installed, but does not import: only the probe sees it
            continue
        assert q[:2] == p[:2], (name, q, p)


def test_default_set_leaves_out_triton_on_a_cpu_without_the_interpreter(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    names = default_backends("cpu")
    assert "triton" not in names and {"reference", "sdpa", "flex"} <= set(names)
    assert "interpreter" not in (registry.get_backend_class("triton").device_reason("cuda") or "")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "triton" in default_backends("cpu")
    # CUDA-only libraries never join a CPU default set
    for name in ("flash-attn", "xformers", "flashinfer"):
        assert registry.get_backend_class(name).device_reason("cpu")


TINY = """
name: tiny
device: cpu
model: {num_q_heads: 2, num_kv_heads: 1, head_dim: 16, dtype: float32}
kv_cache: {page_size: 4}
batch: [{kind: decode, count: 1, context: 9}]
timing: {warmup_ms: 1, measure_ms: 2, min_runs: 2}
"""


@pytest.mark.slow
def test_default_run_has_no_triton_rows_but_naming_it_gives_skipped_rows(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from typer.testing import CliRunner

    from attnbench.cli import app

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(registry, "_EXTRA", {})  # backends other tests registered from files
    sc = tmp_path / "tiny.yaml"
    sc.write_text(TINY)
    cli = CliRunner()
    r = cli.invoke(app, ["run", str(sc), "--out", str(tmp_path / "a"), "-q"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (tmp_path / "a" / "rows.jsonl").read_text().splitlines()]
    assert {x["backend"] for x in rows} == {"reference", "sdpa", "flex"}
    r = cli.invoke(app, ["run", str(sc), "-b", "triton", "--out", str(tmp_path / "b"), "-q"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (tmp_path / "b" / "rows.jsonl").read_text().splitlines()]
    assert [(x["backend"], x["status"]) for x in rows] == [("triton", "skipped")]
    assert "TRITON_INTERPRET=1" in rows[0]["reason"]


def test_help_shows_no_bool_beside_flags_and_offers_completion():
    from typer.testing import CliRunner

    from attnbench.cli import app

    cli = CliRunner()
    top = cli.invoke(app, ["--help"]).output
    assert "--show-completion" in top and "--version" in top
    for cmd in (["run"], ["check"], ["backends"], ["compare", "backends"]):
        out = cli.invoke(app, [*cmd, "--help"]).output
        assert "--" in out and "<bool>" not in out, cmd


def test_help_shows_plain_metavars():
    """Every command's help as the console command prints it: click-style metavars (TEXT,
    PATH, FLOAT), never typer's ``<list[str]>`` or ``<float range>``."""
    from click.testing import CliRunner as ClickRunner
    from typer.main import get_command

    from attnbench.cli import app
    from attnbench.cli.app import plain_metavars

    root = plain_metavars(get_command(app))
    paths = [[n] for n in root.commands] + [["compare", n] for n in root.commands["compare"].commands]
    for path in paths:
        out = ClickRunner().invoke(root, [*path, "--help"], prog_name="attnbench").output
        assert "Usage: attnbench" in out, (path, out)
        assert "<list[" not in out and " range>" not in out and "<str>" not in out, (path, out)
