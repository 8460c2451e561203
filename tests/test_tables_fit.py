"""Every table a command prints fits COLUMNS (issue 58 item 4): at 60, 80 and 120 columns no
line is wider, no name a user types next (a case id, a backend spec, a scenario or preset
name) is cut, and nothing is cut with an ellipsis; what is left out is named."""
from __future__ import annotations

import shutil
import textwrap

import pytest
from rich.cells import cell_len
from rich.console import Console
from typer.testing import CliRunner

from attnbench.analyze.fit import NAME, PROSE, Col, print_fitted, word_lines
from attnbench.cli.app import app
from attnbench.store.baselines import load_rows
from attnbench.workload.builtin import builtin_names
from attnbench.workload.tree_presets import PRESETS

cli = CliRunner()
WIDTHS = (60, 80, 120)
SPEC = "flex:mask=dense"  # a backend spec with an option: typed next with -b and -k, never cut

SCENARIO = textwrap.dedent(f"""
    name: fits
    seed: 3
    device: cpu
    model: {{num_q_heads: 4, num_kv_heads: 2, head_dim: 16, dtype: float32}}
    kv_cache: {{page_size: 4, layout: shuffled}}
    batch:
      - {{kind: decode, count: 2, context: 19}}
      - {{kind: tree, count: 1, context: 7, tree: {{choices: [[0], [1], [0, 0]]}}, compare_with: [chain, decode]}}
    sweep:
      kv_cache.page_size: [4, 8]
    backends: [sdpa, "{SPEC}"]
    timing: {{warmup_ms: 1, measure_ms: 2, min_runs: 3, rounds: 6}}
    """)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs of a small sweep (6 timing rounds: check, history and decide have intervals)."""
    root = tmp_path_factory.mktemp("fits")
    (root / "fits.yaml").write_text(SCENARIO)
    for name in ("a", "b"):
        r = cli.invoke(app, ["run", str(root / "fits.yaml"), "--out", str(root / name), "-q"])
        assert r.exit_code == 0, r.output
    r = cli.invoke(app, ["history", "add", str(root / "a"), str(root / "b"), "--db", str(root / "h.sqlite")])
    assert r.exit_code == 0, r.output
    for k, name in ((1, "a"), (2, "b")):  # calibrate reuses the runs it finds in its folder
        shutil.copytree(root / name, root / "cal" / f"run-{k:03d}")
    return root


def _commands(root):
    a, b = str(root / "a"), str(root / "b")
    return {
        "show": ["show", a],
        "check": ["check", b, "--baseline", a, "--max-slowdown", "0.1%", "--min-delta-us", "0"],
        "compare runs": ["compare", "runs", a, b],
        "history show": ["history", "show", "--db", str(root / "h.sqlite")],
        "decide": ["decide", a],
        "tree-costs": ["tree-costs", a],
        "calibrate": ["calibrate", str(root / "fits.yaml"), "--runs", "2", "--out", str(root / "cal")],
        "trees": ["trees"],
        "scenarios": ["scenarios"],
        "backends": ["backends"],
    }


def _cases_and_specs(root) -> set[str]:
    rows = load_rows(root / "a").rows
    return {r.id.case_id for r in rows} | {r.id.backend for r in rows}


@pytest.mark.slow
@pytest.mark.parametrize("width", WIDTHS)
def test_every_command_fits_its_columns(runs, width):
    names = _cases_and_specs(runs)
    assert SPEC in names
    for command, argv in _commands(runs).items():
        r = cli.invoke(app, argv, env={"COLUMNS": str(width)})
        assert r.exit_code in (0, 1), (command, r.output)
        text = r.output
        wide = [ln for ln in text.splitlines() if cell_len(ln) > width]
        assert not wide, (command, width, wide)
        assert "…" not in text, (command, width, text)
        words = set(text.split())
        whole = {"trees": set(PRESETS), "scenarios": set(builtin_names()), "compare runs": names,
                 "show": {n for n in names if ":" in n}}.get(command, set())  # show: the sweep is columns
        missing = [n for n in whole if not any(n in w for w in words)]
        assert not missing, (command, width, missing, text)
        cut = [w for w in words if len(w) > 3 and any(w != n and w in n and ("=" in w or ":" in w) for n in names)
               and not any(n in w for n in names)]  # part of a case id or a backend spec, not all of it
        assert not cut or command in ("show", "tree-costs"), (command, width, cut, text)  # their own case columns


@pytest.mark.parametrize("width", WIDTHS)
def test_the_shared_policy_keeps_names_whole_and_wraps_prose_at_words(width):
    long_id = "page_size=16,context=4k,dtype=fp8-e4m3,window=128,seed=12345"
    cols = [Col("case", NAME), Col("backend", NAME), Col("verdict"), Col("baseline", justify="right", drop=1),
            Col("current", justify="right", drop=0), Col("note", PROSE)]
    rows = [[long_id, SPEC, "regressed", "1.23 ms", "2.46 ms", "slower in every round; the interval lies above 1"],
            ["", "sdpa", "unclear", "40.1 µs", "41.0 µs", "p=0.31, not significant"]]
    con = Console(width=width, record=True, file=open("/dev/null", "w"))
    print_fitted(con, cols, rows, "a title long enough to wrap at the narrower widths, " + long_id)
    text = con.export_text()
    assert all(cell_len(ln) <= width for ln in text.splitlines()), text
    for name in (long_id, SPEC, "sdpa", "regressed", "significant", "every"):
        assert any(name in ln.split() for ln in text.splitlines()), (name, text)


def test_columns_are_left_out_in_their_order_and_named():
    cols = [Col("case", NAME), Col("a", justify="right", drop=1), Col("b", justify="right", drop=0), Col("c")]
    rows = [["page_size=16", "1.000 ms", "2.000 ms", "regressed"]]
    con = Console(width=36, record=True, file=open("/dev/null", "w"))
    print_fitted(con, cols, rows)
    text = con.export_text()
    assert "not shown at 36 columns: b" in " ".join(text.split()) and "1.000 ms" in text and "2.000" not in text


def test_word_lines_break_at_spaces_only():
    path = "/a/very/long/path/" + "x" * 70
    assert word_lines(f"wrote {path} and more words here", 40) == ["wrote", path, "and more words here"]
